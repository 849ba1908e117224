"""Exercise 07: the producer/consumer roles and the register split of warp specialization.

Holes: ``register_split(math_warpgroups) -> (producer registers, math registers)`` (the ``setmaxnreg`` counts,
plugged in as the stage's ``KernelConfig.registers``, which checks the SM's 65536-register budget) and
``producer_warpgroup(math_warpgroups) -> index`` (0: the producer is the first warpgroup; ``math_warpgroups``:
the last, the generator's own layout), read by :meth:`gemm.kernel.generator._Kernel.warp_specialized_body`
through the generator's seams (:mod:`gemm.kernel.seams`).
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise

STAGE = 7
PROMPT = """\
Stage 07 gives the TMA producer a warpgroup of its own. One thread of it issues every copy, so it needs few
registers; the math warpgroups hold a 64 x BLOCK_N FP32 accumulator per warpgroup (plus the promoted totals)
and need many. `setmaxnreg` moves registers between warpgroups at run time: the producer gives some back
(`setmaxnreg.dec`), the math warpgroups take them (`setmaxnreg.inc`). An SM has 65536 32-bit registers; a
count must be a multiple of 8 in 24..256.

Fill in, in your copy of lessons/exercises/skeletons/ex07_warp_roles.py:
  * register_split(math_warpgroups) -> (producer, math): the per-thread register counts of the producer
    warpgroup and of each math warpgroup (128 threads each), with 128 * producer + 128 * math_warpgroups * math
    <= 65536;
  * producer_warpgroup(math_warpgroups) -> index: which warpgroup of the CTA (1 + math_warpgroups of them)
    produces: the first (0) or the last (math_warpgroups). The math warpgroups must stay consecutive (a math
    thread's index is then %tid.x, or %tid.x - 128).
The generator emits the role branch and both setmaxnreg instructions from your answers
(gemm/kernel/generator.py warp_specialized_body, gemm/kernel/producer.py WarpgroupProducer)."""

QUESTIONS = (
    ("Predict: with two math warpgroups and 40 producer registers, what is the most a math thread may ask for?",
     "check with `python -m lessons inspect 7` (the setmaxnreg lines of the PTX, USETMAXREG in the SASS) and "
     "gemm.kernel.KernelConfig(registers=...) (it refuses a split over 65536)"),
    ("Predict: what changes in the PTX between stage 06 and 07: which new instructions, and which barrier no "
     "longer appears in the math K loop?",
     "check with `python -m lessons diff 6 7`"),
    ("Predict: does putting the producer first or last change the result? the instruction count?",
     "check with the emulator (`EXERCISE.build(solution).run_cpu(...)` for both answers) and `.sass()`"),
)


def reference():
    from gemm.kernel import KernelConfig
    registers = KernelConfig().registers  # (40, 232): DeepGEMM's split
    return SimpleNamespace(register_split=lambda math_warpgroups: registers,
                           producer_warpgroup=lambda math_warpgroups: math_warpgroups)


def _split(solution, config):
    split = solution.register_split(config.math_threads // 128)
    if (not isinstance(split, tuple) or len(split) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in split)):
        raise ValueError(f"register_split must return a pair of ints (producer, math), got {split!r}")
    return config.replace(registers=split)  # KernelConfig checks multiples of 8, 24..256 and the 65536 budget


def build(solution):
    import lessons
    from lessons.exercises.holed import HoledKernel
    stage = lessons.stage(STAGE)

    def cpu_config(m, n, k):  # 128-row blocks (two math warpgroups) where M allows; 3 stages: the ring wraps
        config = stage.config(m, n, k)
        return _split(solution, config.replace(block_m=128 if m > 64 else config.block_m,
                                                stages=min(config.stages, 3)))

    return HoledKernel(lambda m, n, k: _split(solution, stage.config(m, n, k)),
                       lambda m, n, k: dict(producer_warpgroup=solution.producer_warpgroup),
                       cpu_config_of=cpu_config)


EXERCISE = Exercise(
    stage=STAGE,
    name="warp_roles",
    objective="Split a CTA into a producer warpgroup and math warpgroups and divide the SM's registers between "
              "them with setmaxnreg.",
    prompt=PROMPT,
    holes=("register_split", "producer_warpgroup"),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("USETMAXREG", "UTMALDG", "SYNCS", "QGMMA"),
    # ragged M and N; 3-5 K blocks on a 3-stage ring; 64- and 128-row blocks (one and two math warpgroups)
    shapes_cpu=((130, 136, 384), (200, 264, 512), (60, 72, 384)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    answer_sites={"gemm/heuristics.py": ("REGISTERS",), "gemm/kernel/config.py": ("KernelConfig.registers",),
                  "gemm/kernel/generator.py": ("warp_specialized_body",)},
)
