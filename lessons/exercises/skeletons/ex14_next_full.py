"""Exercise 14 (stage 14, the next stage's barrier tested early): which barrier and phase to test.

Objective: test the next stage's barrier early, naming the slot and the phase the next K block will wait for.

The ring has S slots. The producer fills slot s for K block j = s, s + S, s + 2S, ...; each fill completes one
phase of the slot's full barrier, and the phases alternate parity 0, 1, 0, ... The math warps wait on slot s's
full barrier for the phase of parity p (mbarrier.try_wait.parity), compute, release the slot, and move on to the
next K block's slot. Stage 14 tests that next slot's full barrier right after the release, with mbarrier.test_wait
(which does not block), and skips the next blocking wait when the test says the phase has completed.

Fill in, in your copy of lessons/exercises/skeletons/ex14_next_full.py:
  * next_full(stage, parity, stages) -> (stage, parity): the slot of the next K block, and the parity of the full
    phase the warps will wait for there. Both ints; the slot in 0..stages-1, the parity 0 or 1.
The generator evaluates it for every (stage, parity) of the ring and emits the answers as a table
(gemm/kernel/generator.py _Kernel._next_full_table); the ring's own waits keep the ring's rule.

Grade it: ``python -m lessons grade 14 path/to/this_file.py``.
"""

# Predict, then check:
# 1. With 4 slots, after the warps waited on slot 3 for parity 0, which slot and parity come next?
#    Check with the ring's own rule (Ring.advance in gemm/kernel/producer.py).
# 2. If the test named the slot just released (with its parity), how often would it say "complete"?
#    Check: whether a run shows it depends on the schedule; run_cpu's default keeps the producer ahead, while
#    gemm.testing.emulated.run_gemm(..., seed=0) (or 1, 2) ends wrong or deadlocked.
# 3. Where does ptxas put the test in the SASS, relative to the release's arrive and the promotion FFMAs?
#    Check with `python -m lessons inspect 14` or the figure 14_early_poll.
# 4. Does this change help decode (M = 16) or prefill (M = 4096) more?
#    Check with results/early_poll.json and results/early_poll_reversed.json.


def next_full(stage: int, parity: int, stages: int) -> tuple[int, int]:
    """The slot and full-phase parity of the next K block, after waiting on slot ``stage`` for parity ``parity`` in
    a ring of ``stages`` slots."""
    raise NotImplementedError("next_full: which slot does the next K block use, and which phase will it wait for?")
