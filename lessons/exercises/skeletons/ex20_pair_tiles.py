"""Exercise 20 (stage 20, tiles as tall as M, split over pairs): the tiles a pair of CTAs splits.

Objective: Choose the tiles a pair of CTAs splits at M = 33-128: as tall as M, narrow enough to fill the SMs.

Stage 20 sizes the tile to a GEMM of 33-128 rows. A tile of 256 rows (stage 11's) is mostly zero-fill there, and a
wave of narrow 64-row tiles, one per SM, makes every CTA read all of A over K for a thin slice of B. So the stage
takes tiles chosen for half the SMs (twice as wide, or as tall) and splits each tile's K blocks over a pair of
CTAs: as many CTAs, half the reads of A.

Fill in, in your copy of lessons/exercises/skeletons/ex20_pair_tiles.py:
  * pair_tiles(m, n, sms, one_wave, half_wave) -> (block_m, block_n) or None. one_wave and half_wave are the cost
    model's tiles (block_m, block_n) at this shape for sms CTAs and for sms // 2 CTAs: use them as given (the
    rule check also sends made-up answers, which the rule must hold for). Split over pairs only where
    32 < m <= 128, sms >= 2, and one_wave is at most 32 columns wide; then the pair takes half_wave's tiles, but
    only if two CTAs for each of them (ceil(m / block_m) * ceil(n / block_n) tiles) still fit in sms. Else None.
Stage 20 builds its kernels with those tiles (lessons/20_narrow_pair_tiles.py, narrowed).

Grade it: ``python -m lessons grade 20 path/to/this_file.py``.
"""

# Predict, then check:
# 1. At 64 x 2112 x 7168 on 132 SMs, what tiles does the model choose for one CTA per SM, what does stage 20 take,
#    and how many bytes of A does each wave read from L2 in the two cases?
#    Check with gemm.heuristics.choose_blocks(64, 2112, 132) and (..., 66), or the figure 20_narrow_pair_tiles.
# 2. Which is faster at 64 x 2112 x 7168: stage 20, its 64 x 16 tiles one per SM, or 64 x 64 tiles over pairs?
#    Check with `python -m lessons ablate 20 --m 64 --n 2112 --k 7168` (results/ablation_20.json).
# 3. Why does the rule not split at 64 x 7168 x 16384?
#    Check with gemm.heuristics.choose_blocks(64, 7168, 132, k=16384).
# 4. How deep is stage 20's ring at 64 x 2112 x 7168, against stage 19's?
#    Check with `python -m lessons diff 19 20 --m 64 --n 2112 --k 7168`.


def pair_tiles(m: int, n: int, sms: int, one_wave: tuple[int, int],
               half_wave: tuple[int, int]) -> tuple[int, int] | None:
    """The tiles (block_m, block_n) whose K blocks a pair of CTAs splits at this shape, or None where one CTA per
    tile stays. ``one_wave`` / ``half_wave``: the cost model's tiles for ``sms`` CTAs and for ``sms // 2``."""
    raise NotImplementedError("pair_tiles: when do narrow tiles pay for a pair, and which tiles does the pair take?")
