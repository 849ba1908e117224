"""Exercise 09: the empty barrier's arrival count with TMA multicast across a 2-CTA cluster.

Hole: ``empty_arrivals(multicast, math_warps) -> int``, the count every stage's *empty* mbarrier is initialised
with. The seam: :meth:`gemm.kernel.generator._Kernel.setup` reads it through
:mod:`gemm.kernel.seams` (default: ``multicast * math_threads // 32``). Too many arrivals
deadlock the producer (the emulator names the wait); too few let it refill a stage the peer CTA still reads.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise

STAGE = 9
PROMPT = """\
Stage 09 pairs CTAs into clusters of two that compute tiles with the same rows: rank 0 loads A once and
multicasts it into both CTAs' shared memory. So a stage of one CTA is now read by the math warps of *both*
CTAs, and the producer may refill it only when all of them are done: each math warp releases the stage in both
CTAs (lanes 0 and 1 arrive, through `mapa` + `mbarrier.arrive.shared::cluster`, on CTA 0's and CTA 1's empty
barrier); when the peer has no tile at that step, both lanes arrive on the warp's own CTA.

Fill in, in your copy of lessons/exercises/skeletons/ex09_cluster_barriers.py:
  * empty_arrivals(multicast, math_warps) -> int: the arrival count of every stage's empty mbarrier, for
    clusters of `multicast` CTAs (1: no cluster) whose CTAs have `math_warps` math warps each.
The generator initialises the barriers with it (gemm/kernel/generator.py setup; releases in
_Kernel.release, the drain in gemm/kernel/producer.py WarpgroupProducer)."""

QUESTIONS = (
    ("Predict: how many arrivals complete one phase of an empty barrier with 2 math warpgroups and multicast 2?",
     "check with `python -m lessons inspect 9` (the `mbarrier.init` lines of the PTX)"),
    ("Predict: what does the kernel do with one arrival too many per phase? one too few?",
     "check with the emulator (`gemm.testing.emulated.run_gemm(..., seams=gemm.kernel.seams.Seams(empty_arrivals=...))`"
     ", with `seed=` for random schedules)"),
    ("Predict: which SASS instructions does the cluster add over stage 08?",
     "check with `python -m lessons diff 8 9` (UCGABAR_ARV / UCGABAR_WAIT, the cluster barrier)"),
)


def reference():
    return SimpleNamespace(empty_arrivals=lambda multicast, math_warps: multicast * math_warps)


def build(solution):
    import lessons
    from lessons.exercises.holed import HoledKernel
    stage = lessons.stage(STAGE)
    return HoledKernel(stage.config, lambda m, n, k: dict(empty_arrivals=solution.empty_arrivals),
                       cpu_stages=2, sm_count_cpu=4)  # the ring wraps every other K block


EXERCISE = Exercise(
    stage=STAGE,
    name="cluster_barriers",
    objective="Count who must release a shared-memory stage when a TMA multicast fills it in two CTAs at once.",
    prompt=PROMPT,
    holes=("empty_arrivals",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("UCGABAR", "UTMALDG", "UTMASTG", "USETMAXREG", "QGMMA"),
    # 4 CTAs = 2 pairs; odd tile counts (a lone CTA), pairs split by a row edge, the ring wrapping
    shapes_cpu=((200, 200, 384), (300, 416, 640)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    answer_sites={"gemm/kernel/generator.py": ("setup",)},
)
