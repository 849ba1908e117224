"""Exercise 16 (stage 16, B read once loaded evict_first): how many tiles load each byte of B.

Objective: count how many tiles load each byte of B, and so where B's TMA loads may be marked evict_first in L2.

Stage 16 loads B (the weight) into L2 as evict_first where no other tile will read the same bytes again: those
lines are then the first their L2 set gives up, and the weight stream replaces its own lines instead of evicting
(and writing back) what the L2 held. So the stage needs, for a config and M, how many tiles load each byte of B.

Fill in, in your copy of lessons/exercises/skeletons/ex16_b_reads.py:
  * b_reads(m, n, k, block_m, block_n, split_k, multicast) -> int: how many tiles load each byte of B from L2
    when tiles of block_m rows of A (and D) by block_n rows of B cover an M = m by N = n output, K = k deep.
    Mind what each argument means: a swapped tile (stage 15) has block_m token rows still; split_k > 1 gives
    each of that many CTAs of a cluster its own K blocks of one tile; multicast == 2 has the two CTAs of a pair
    share A; a masked grouped GEMM passes one group's expected tokens as m.
Stage 16 sets b_eviction="first" where your answer is 1 (lessons/16_evict_first.py, hinted).

Grade it: ``python -m lessons grade 16 path/to/this_file.py``.
"""

# Predict, then check:
# 1. At 32 x 4096 x 7168, how many times is each byte of B loaded? At the ladder's 4096 x 4096 x 7168?
#    Check with `python -m lessons inspect 16` (the configs: block_m against M) and the figure 16_evict_first.
# 2. After a 256 MiB fill leaves the L2 dirty, how many MB does a call at 64 x 7168 x 16384 write back to HBM,
#    without the hint and with it (D itself is 0.9 MB)?
#    Check with results/ncu_l2_eviction_64x7168x16384.txt.
# 3. After the timer's clean flush (an L2 full of clean lines), does the hint still pay?
#    Check with results/sweep_l2_eviction_clean.json against sweep_l2_eviction_memset.json.
# 4. How many SASS instructions does the hint add to the producer's loop?
#    Check with `python -m lessons diff 15 16` at 32 x 4096 x 7168.


def b_reads(m: int, n: int, k: int, block_m: int, block_n: int, split_k: int, multicast: int) -> int:
    """How many tiles load each byte of B from L2 when block_m x block_n tiles cover an m x n output, k deep."""
    raise NotImplementedError("b_reads: how many tiles of the walk read the same rows of B?")
