"""Exercise 15 (stage 15, swap AB at decode): which token each accumulator of a swapped tile holds.

Objective: promote a swapped tile's accumulators with their own tokens' scales: read the wgmma fragment's columns.

Stage 15 swaps A and B at decode: each math warpgroup multiplies 64 rows of the weight tile (wgmma's A, M = 64)
by the tile's T token rows (wgmma's B, N = T = 8, 16 or 32), so its accumulators hold D transposed: a row of the
fragment is a weight row, a column is a token. All 64 weight rows share one 128 x 128 block scale sb; each token
has its own activation scale sa[token] per K block. So per K block the promotion is
total[register] += partial[register] * (sb * sa[token of register]).

Fill in, in your copy of lessons/exercises/skeletons/ex15_token_columns.py:
  * token_column(register, lane) -> int: the token (column of the m64nTk32 fragment, 0 .. T - 1) that accumulator
    `register` (0 .. T/2 - 1) of `lane` (0 .. 31) holds. The warp a lane belongs to does not change its column.
The generator evaluates it for every lane and register and emits the answers as a table
(gemm/kernel/math_warpgroups.py MathWarpgroups._token_column_offsets); the epilogue keeps its own layout.

Grade it: ``python -m lessons grade 15 path/to/this_file.py``.
"""

# Predict, then check:
# 1. At 16 x 2112 x 7168, how many rows of stage 14's 256 x 64 tile hold a token, and how many of stage 15's 16 x 64?
#    Check with `python -m lessons inspect 15` and the figure 15_swap_ab.
# 2. Which accumulators of lane 5 hold token 3?
#    Check with the PTX ISA's wgmma "Register Fragments" figure for the m64nNk32 .f32 D matrix, or the figure
#    05_wgmma_accumulator.
# 3. Unswapped, a thread reads two A scales per K block (its two rows); swapped, how many?
#    Check with `python -m lessons inspect 15`, against stage 14.
# 4. At M = 1, is swap AB with a 64-token tile faster than the unswapped 64 x 64 tile?
#    Check with results/sweep_swap_ab_tile_rows.json.


def token_column(register: int, lane: int) -> int:
    """The token (column of the wgmma fragment) that accumulator ``register`` of ``lane`` holds in a swapped tile."""
    raise NotImplementedError("token_column: which column of the m64nTk32 accumulator fragment is this register?")
