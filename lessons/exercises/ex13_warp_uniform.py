"""Exercise 13: which of a math thread's values to broadcast from lane 0, so ptxas keeps them uniform.

Hole: ``warp_uniform(values) -> names``: of the per-thread values the math warpgroups compute from ``%tid``
(:data:`gemm.kernel.math_warpgroups.PER_THREAD_VALUES`: ``lane``, ``warp``, ``fragment_row``,
``warpgroup_offset``), the ones to broadcast from lane 0 of each warp (``shfl.sync.idx``). The seam:
:meth:`gemm.kernel.math_warpgroups.MathWarpgroups.warp_uniform_values` (:mod:`gemm.kernel.seams`), which refuses
anything but distinct names from that list. Broadcasting a value the lanes of a warp do *not* share (a lane's own
index or its own row of the accumulator fragment) gives every lane lane 0's: scales and stores land on the wrong
rows, D is wrong (or the run hangs: a release meant for lane 0 comes from all 32), a correctness failure. Leaving the
warpgroup's offset out computes D right and leaves the A descriptors on the vector datapath: the technique check
finds ``R2UR`` in the K loop's SASS and says so.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise

STAGE = 13
PROMPT = """\
Since stage 05 each math warpgroup finds its 64 rows of the A tile from %tid: wg_a = (tid >> 7) * 8192 bytes. A
math thread also keeps its lane (tid & 31), its warp (tid >> 5) and its first row of the accumulator fragment
(16 * warp + lane / 4). ptxas cannot prove any of them equal across a warp, because they come from %tid, so it
keeps them per thread, in R registers, and so is every wgmma descriptor built from one, moved to a uniform
register (R2UR) before each wgmma. A value read with shfl.sync from a fixed lane is provably warp-uniform.

Fill in, in your copy of lessons/exercises/skeletons/ex13_warp_uniform.py:
  * warp_uniform(values) -> tuple of names: which of `values` (the names above: "lane", "warp", "fragment_row",
    "warpgroup_offset") the generator broadcasts from lane 0 of each warp. Broadcast only what every lane of a
    warp shares; broadcast what the descriptors are made from.
The generator emits one shfl.sync.idx.b32 per name (gemm/kernel/math_warpgroups.py MathWarpgroups.__init__)."""

QUESTIONS = (
    ("Predict: which of lane, warp, fragment_row and warpgroup_offset are equal in all 32 lanes of a warp?",
     "check: tid = 32 * w + l for lane l of warp w; compute each for l = 0..31 (a warpgroup is 4 warps)"),
    ("Predict: how many R2UR does the K loop of stage 12's SASS hold, and how many of stage 13's?",
     "check with `python -m lessons inspect 12` and `inspect 13`, or the notebook's count between the first and the "
     "last QGMMA (13 and 0 at the ladder's shape)"),
    ("Predict: if fragment_row is broadcast too, which rows of D are right?",
     "check with the emulator (`EXERCISE.build(...).run_cpu(...)`): every lane reads lane 0's activation scales, "
     "rows 16w + l/4 get row 16w's scales: only the rows of lanes 0-3 are right"),
    ("Predict: where does this stage gain, decode (M = 16) or prefill (M = 4096)?",
     "check with results/uniform_offsets.json (`python -m gemm bench configs ... production:uniform_offsets=False`): "
     "it saves issue slots of the math warps, so where they are the limit"),
)


def reference():
    return SimpleNamespace(warp_uniform=lambda values: ("warpgroup_offset",))


def uniform_descriptors(instructions) -> list[str]:
    """The K loop (first to last QGMMA) moves nothing from the vector to the uniform datapath: the A descriptors
    are built in UR registers, which needs the warpgroup's offset broadcast. (A correct D says nothing about it.)"""
    from ptx.sass import opcode_counts, span
    moves = opcode_counts(span(instructions, "QGMMA"))["R2UR"]
    if moves:
        return [f"the K loop's SASS holds {moves} R2UR: a wgmma descriptor is still built per thread and moved to a "
                "uniform register before its wgmma. Which value are the A descriptors made from?"]
    return []


def build(solution):
    import lessons
    from lessons.exercises.holed import HoledKernel
    stage = lessons.stage(STAGE)
    return HoledKernel(stage.config, lambda m, n, k: dict(warp_uniform=solution.warp_uniform), cpu_stages=2,
                       sm_count_cpu=4)  # the ring wraps at small K


EXERCISE = Exercise(
    stage=STAGE,
    name="warp_uniform",
    objective="Tell the compiler which values a warp shares, so the wgmma descriptors stay on the uniform datapath.",
    prompt=PROMPT,
    holes=("warp_uniform",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("UTMALDG", "QGMMA", "SHFL"),
    # stage 12's 256-row tiles at these shapes (no split: enough tiles): ragged M inside the second wave, ragged N,
    # the ring (2 stages) wraps; a broadcast lane or fragment row shows in the whole-D diff
    shapes_cpu=((250, 136, 384), (300, 200, 384)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    extra={"sass_checks": (uniform_descriptors,)},
    answer_sites={"gemm/kernel/math_warpgroups.py": ("warp_uniform_values",)},
)
