"""Exercise 03 - the micro-tile offsets (lessons/03_register_tiling.py).

Learning objective: map threads to an 8x8 register micro-tile so every output is owned once and the fragment loads
become 128-bit, conflict-free shared loads.

Stage 03 gives each of 16 x 16 threads an 8 x 8 micro-tile of the block's 128 x 128 tile of D, held in registers.
Per k, thread (tx, ty) loads its 8 values of A (rows micro_offset(i, ty)) and its 8 values of B (columns
micro_offset(j, tx)) from k-major shared tiles, then does 64 FFMAs. Write `micro_offset(i, thread)`: the tile row
(column) of a thread's i-th row (column), for i in 0..7 and thread in 0..15. Every row must belong to exactly one
(thread, i); and for 128-bit shared loads a thread's 8 offsets should be two runs of 4 consecutive words (16-byte
aligned), laid out so that the 16 threads of a half-warp read 256 contiguous bytes. Use integer arithmetic only
(// % * +): it runs inside the kernel. Read lessons/03_register_tiling.py and its figure in
lessons/figures/numba_threads.py.

Grade it: python -m lessons grade 3 this_file.py
"""
from numpy import uint64  # noqa: F401  (the stage returns uint64: no negative-index wraparound in Numba)


def micro_offset(i, thread):
    """Row (or column) of the 128-wide block tile that ``thread`` (0..15 along M or N) owns as its ``i``-th
    (0..7) row (column). Every row of 0..127 must belong to exactly one (thread, i)."""
    raise NotImplementedError("micro_offset: return the tile row of the thread's i-th row (two runs of 4)")


# Predict, then check:
# 1. Predict: how many ld.shared.v4.f32 per k does the kernel issue with the two-runs-of-4 layout? With
#    micro_offset(i, t) = 8*t + i?
#    Check with `python -m lessons inspect 3` (ld.shared.v4.f32 in the PTX, LDS.128 in the SASS) for the stage;
#    for yours, Exercise.build(solution).sass().
# 2. Predict: with 8*t + i, how many 16-byte chunks do the 16 threads of a half-warp touch per load, and how many
#    bank conflicts follow?
#    Check with the micro-tile figure of lessons/figures/numba_threads.py (bank of each word a half-warp reads).
# 3. Predict: how many registers does a thread need (partials, totals, fragments)?
#    Check with `python -m lessons inspect 3` (registers, spills).
