"""Exercise 09 (stage 09, TMA multicast across 2-CTA clusters): the cluster barrier counts.

Objective: count who must release a shared-memory stage when a TMA multicast fills it in two CTAs at once.

Stage 09 pairs CTAs into clusters of two that compute tiles with the same rows: rank 0 loads A once and
multicasts it into both CTAs' shared memory. So a stage of one CTA is now read by the math warps of *both*
CTAs, and the producer may refill it only when all of them are done: each math warp releases the stage in both
CTAs (lanes 0 and 1 arrive, through `mapa` + `mbarrier.arrive.shared::cluster`, on CTA 0's and CTA 1's empty
barrier); when the peer has no tile at that step, both lanes arrive on the warp's own CTA.

Fill in, in your copy of lessons/exercises/skeletons/ex09_cluster_barriers.py:
  * empty_arrivals(multicast, math_warps) -> int: the arrival count of every stage's empty mbarrier, for
    clusters of `multicast` CTAs (1: no cluster) whose CTAs have `math_warps` math warps each.
The generator initialises the barriers with it (gemm/kernel/generator.py setup; releases in
_Kernel.release, the drain in gemm/kernel/producer.py WarpgroupProducer).

Grade it: ``python -m lessons grade 9 path/to/this_file.py``.
"""

# Predict, then check:
# 1. How many arrivals complete one phase of an empty barrier with 2 math warpgroups and multicast 2?
#    Check with `python -m lessons inspect 9` (the `mbarrier.init` lines of the PTX).
# 2. What does the kernel do with one arrival too many per phase? one too few?
#    Check with the emulator (`EXERCISE.build(this_module).run_cpu(...)`; gemm.testing.emulated.run_gemm takes seed=).
# 3. Which SASS instructions does the cluster add over stage 08?
#    Check with `python -m lessons diff 8 9` (UCGABAR_ARV / UCGABAR_WAIT).


def empty_arrivals(multicast: int, math_warps: int) -> int:
    """The arrival count every stage's *empty* mbarrier is initialised with: one phase completes when this many
    arrivals have come. ``multicast``: CTAs per cluster (1 = no cluster); ``math_warps``: math warps per CTA.
    Count every warp that reads the stage (in this CTA and in the peer) and how many times each arrives."""
    raise NotImplementedError("empty_arrivals: how many arrivals release one stage?")
