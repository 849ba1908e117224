"""Exercise 06 (stage 06, TMA + mbarrier pipeline): the barrier parity.

Objective: derive which mbarrier phase parity a consumer and a producer wait for at any iteration of an S-stage
TMA ring, and see a wrong one deadlock.

Stage 06 keeps a ring of S shared-memory stages; K block i lives in one stage, guarded by a *full* mbarrier
(the TMA bytes landed) and an *empty* mbarrier (every math warp released it). An mbarrier does not count
uses: a waiter names the *parity* of the phase it waits for, and `mbarrier.try_wait.parity` returns once that
phase has completed. A fresh barrier is in phase 0, and waiting for parity 1 ("the phase before") returns at
once.

Fill in, in your copy of lessons/exercises/skeletons/ex06_barrier_parity.py:
  * pipeline_slot(iteration, stages) -> (stage, parity): the stage K block `iteration` uses and the parity of
    the full-barrier phase the consumers wait for before reading it;
  * producer_wait_parity(iteration, stages) -> parity: the parity of the empty-barrier phase the producer waits
    for before loading K block `iteration` into its stage (the release of the K block that used the stage
    before it).
The generator seeds its loop counters from your functions and advances them itself (stage + 1, wrapping at S;
parity flips on the wrap), so your functions must agree with that advance. Look at ptx/vocab/barriers.py's
docstring and the `mbarrier_wait_parity` helper, and at lessons/06_tma_pipeline.py's main_loop.

Grade it: ``python -m lessons grade 6 path/to/this_file.py``.
"""

# Predict, then check:
# 1. With S = 8 stages, which parity does the consumer wait for on K block 8, and which does the producer wait
#    for before loading K block 6 (its first refill)?
#    Check with `python -m lessons inspect 6` (the `mov.u32 %p_parity` and `mbarrier.try_wait.parity` lines).
# 2. If the producer's first wait used parity 0 instead, would the kernel compute a wrong answer, hang, or still
#    be right?  Check with the emulator (`EXERCISE.build(this_module).run_cpu(...)`): it names a deadlocked wait.
# 3. How many K blocks must K have before the ring wraps for a 64x64 block (S = 8, ahead = S - 2)?
#    Check with `python -m lessons inspect 6` and the emulator at K = 1024 vs 1152.


def pipeline_slot(iteration: int, stages: int) -> tuple[int, int]:
    """(stage, parity) for K block ``iteration`` of a ring of ``stages`` stages.

    ``stage``: which of the S stages holds this K block (the producer fills them in order, round and round);
    ``parity``: the parity of the *full* barrier's phase the consumers wait for before reading the stage. The
    stage's first use completes its barrier's phase 0, the second use phase 1, ...
    """
    raise NotImplementedError("pipeline_slot: which stage, and which full-barrier phase parity, for this iteration?")


def producer_wait_parity(iteration: int, stages: int) -> int:
    """The parity of the *empty* barrier's phase the producer waits for before loading K block ``iteration``.

    The stage was last used by K block ``iteration - stages``; its release completed one phase of the empty
    barrier. For the first round (iteration < stages) nothing was released yet: which parity passes at once on a
    fresh barrier?
    """
    raise NotImplementedError("producer_wait_parity: which empty-barrier phase parity must the producer wait for?")
