"""Exercise 19 (stage 19, rank 0 two K blocks ahead): the K blocks each CTA of a split computes.

Objective: split a tile's K blocks so that rank 0, which waits for the others' partials, takes a lead.

Stage 19 gives a split tile's rank 0 more of the K loop: rank 0 waits for its peers' pushed totals, adds them and
stores D, so if the peers finish first their messages land while rank 0 still multiplies, and its wait at the end
finds its inbox full. With split_k CTAs sharing k_blocks K blocks and a lead of `lead` blocks, rank 0 takes
E = k_blocks // split_k + lead of them (but never so many that a peer is left with none), and ranks 1 .. split_k - 1
share the other k_blocks - E evenly, in rank order, rounding down as stage 12's even shares do.

Fill in, in your copy of lessons/exercises/skeletons/ex19_lead_shares.py:
  * lead_share(rank, split_k, k_blocks, lead) -> (first, end): the K blocks [first, end) that rank computes. The
    shares must tile [0, k_blocks) in rank order, none empty.
Stage 19 builds its kernels with those shares (gemm/kernel/generator.py: _Kernel._lead_shares emits them in PTX).

Grade it: ``python -m lessons grade 19 path/to/this_file.py``.
"""

# Predict, then check:
# 1. At 64 x 2112 x 7168 (56 K blocks), which K blocks does each CTA compute in stage 18 and in stage 19 (256 x 64
#    tiles over two), and at 16 x 2112 x 7168 in production's kernel (over three, lead 2)?
#    Check with gemm.kernel.config.k_share, or the figure 19_split_k_lead.
# 2. Why does stage 19 give no lead to swapped 16 x 64 tiles split over a pair, and why is a lead of 4 slower than 2
#    at 16 x 2112 x 7168 but not at 128 x 4096 x 7168?
#    Check with results/sweep_split_k_lead_pairs_memset.json and sweep_split_k_lead_memset.json (notebook 19).
# 3. What does the PTX spend on the shares, and where does it run?
#    Check with `python -m lessons diff 18 19 --m 64 --n 2112 --k 7168`.
# 4. What happens at 16 x 2112 x 384 (3 K blocks over two CTAs) with a lead of 2?
#    Check with gemm.kernel.config.k_share(rank, 2, 3, 2).


def lead_share(rank: int, split_k: int, k_blocks: int, lead: int) -> tuple[int, int]:
    """The K blocks [first, end) that cluster rank ``rank`` of ``split_k`` computes of a tile's ``k_blocks`` when
    rank 0 takes ``lead`` blocks beyond an even share."""
    raise NotImplementedError("lead_share: how many does rank 0 take, and how do the peers share the rest?")
