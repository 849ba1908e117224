"""Exercise 14: which full barrier, with which parity, the math warps test right after releasing a stage.

Hole: ``next_full(stage, parity, stages) -> (stage, parity)``: having waited on slot ``stage``'s full barrier for
the phase of parity ``parity`` and released the slot, the slot and parity whose full barrier the warps test
(``mbarrier.test_wait``) before their promotion FFMAs; when it says "complete", the next K block skips its blocking
wait. The seam: ``_Kernel._next_full_table`` in :mod:`gemm.kernel.generator` (:mod:`gemm.kernel.seams`), which
evaluates it for every slot and parity of the ring and keeps the answers as a ``.const`` table; it refuses what
names no barrier (a slot outside the ring, a parity other than 0 or 1, not a pair of ints). A rule that names
the wrong barrier or phase can make the test vouch for data that is not there: the wait is skipped, the warps read
a stage the producer has not filled and the ring falls out of step (wrong D, or a deadlock the emulator names),
whenever the producer is not already far enough ahead, which the graded runs may or may not show. So the rule
itself is checked, for every ring size and slot, the first difference named: that check does not depend on luck.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 14
PROMPT = """\
The ring has S slots. The producer fills slot s for K block j = s, s + S, s + 2S, ...; each fill completes one
phase of the slot's full barrier, and the phases alternate parity 0, 1, 0, ... The math warps wait on slot s's
full barrier for the phase of parity p (mbarrier.try_wait.parity), compute, release the slot, and move on to the
next K block's slot. Stage 14 tests that next slot's full barrier right after the release, with mbarrier.test_wait
(which does not block), and skips the next blocking wait when the test says the phase has completed.

Fill in, in your copy of lessons/exercises/skeletons/ex14_next_full.py:
  * next_full(stage, parity, stages) -> (stage, parity): the slot of the next K block, and the parity of the full
    phase the warps will wait for there. Both ints; the slot in 0..stages-1, the parity 0 or 1.
The generator evaluates it for every (stage, parity) of the ring and emits the answers as a table
(gemm/kernel/generator.py _Kernel._next_full_table); the ring's own waits keep the ring's rule."""

QUESTIONS = (
    ("Predict: with 4 slots, after the warps waited on slot 3 for parity 0, which slot and parity come next?",
     "check with the ring's own rule, _Kernel's Ring.advance in gemm/kernel/producer.py (the parity flips on the "
     "wrap to slot 0)"),
    ("Predict: if the test named the slot just released (with its parity), how often would it say 'complete'?",
     "check: always (the warps just waited for that phase), so every next wait is skipped. Whether a run shows it "
     "depends on the schedule: run_cpu's default keeps the producer ahead and computes D right; "
     "gemm.testing.emulated.run_gemm(..., seed=0), 1, 2 ends wrong or deadlocked (tests/test_exercises_06_10.py)"),
    ("Predict: where does ptxas put the test in the SASS, relative to the release's arrive and the promotion FFMAs?",
     "check with `python -m lessons inspect 14` or the figure 14_early_poll: SYNCS.PHASECHK.TRANS64 right after the "
     "SYNCS.ARRIVE, before most of the FFMAs"),
    ("Predict: does this change help decode (M = 16) or prefill (M = 4096) more?",
     "check with results/early_poll.json and results/early_poll_reversed.json"),
)


def reference():
    return SimpleNamespace(next_full=lambda stage, parity, stages: ((stage + 1) % stages,
                                                                    parity ^ (stage + 1 == stages)))


def check_rule(solution) -> None:
    """Raise AssertionError at the first (stages, stage, parity) whose answer is not the ring's next slot and phase."""
    for stages in range(2, 17):
        for stage in range(stages):
            for parity in (0, 1):
                got = solution.next_full(stage, parity, stages)
                want = ((stage + 1) % stages, parity ^ (stage + 1 == stages))
                if (not isinstance(got, (tuple, list)) or len(got) != 2 or not all(type(x) is int for x in got)
                        or tuple(got) != want):
                    raise AssertionError(f"next_full({stage}, {parity}, stages={stages}) = {got!r}; the next K block "
                                         f"waits on slot {want[0]} for parity {want[1]}")


def next_slot_and_phase(solution) -> list[str]:
    """The tested barrier is the next K block's slot, and its phase the one that K block will wait for, for every
    ring size 2-16 (the graded shapes run one ring size; the rule is the technique)."""
    return failures(check_rule, solution)


def build(solution):
    import lessons
    from lessons.exercises.holed import HoledKernel
    stage = lessons.stage(STAGE)
    return HoledKernel(stage.config, lambda m, n, k: dict(next_full=solution.next_full), cpu_stages=2,
                       sm_count_cpu=2)  # a 2-slot ring over 3-8 K blocks: the test finds stages both full and not


EXERCISE = Exercise(
    stage=STAGE,
    name="next_full",
    objective="Test the next stage's barrier early, naming the slot and the phase the next K block will wait for.",
    prompt=PROMPT,
    holes=("next_full",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("UTMALDG", "QGMMA", "SYNCS"),
    # stage 13's 256-row tiles: ragged M inside the second wave, ragged N; K = 384 and 1024: the ring (2 slots)
    # wraps once and three times per tile
    shapes_cpu=((250, 136, 384), (300, 256, 1024)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    extra={"checks": (next_slot_and_phase,)},
    answer_sites={"gemm/kernel/producer.py": ("advance",),
                  "ptx/vocab/barriers.py": ("advance", "pipeline_slot", "producer_wait_parity")},
)
