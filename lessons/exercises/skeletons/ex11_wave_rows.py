"""Exercise 11 (stage 11, tall 256 x 128 tiles): the rows of each math warpgroup's waves.

Objective: lay out a 256-row tile's 64-row waves over two math warpgroups so one B tile serves twice the rows.

Stage 11 gives each CTA a 256 x 128 tile, but there are still only two math warpgroups, and one wgmma m64n128k32
covers 64 rows. So each warpgroup computes its rows in two 64-row *waves*, one after the other, against the
same B tile. The stage's rule: warpgroup g's wave w covers rows 64*g + 64*warpgroups*w of the tile (warpgroups =
2: warpgroup 0 owns rows 0-63 and 128-191, warpgroup 1 rows 64-127 and 192-255), so that wave w of both
warpgroups is one contiguous 128-row slab. Wave 0 of warpgroup g starts at row 64*g as in stages 07-10; what
you decide is how much further down wave w starts.

Fill in, in your copy of lessons/exercises/skeletons/ex11_wave_rows.py:
  * wave_offset(wave, warpgroups) -> int: the rows from a warpgroup's wave 0 to its wave `wave` (the same for
    every warpgroup), for `warpgroups` math warpgroups. It must be a multiple of 64 (wgmma's M) in [0, 256).
The generator adds it to every address of the wave (gemm/kernel/math_warpgroups.py MathWarpgroups.k_block: the
A tile and the A scales; the epilogue's shared tile in gemm/kernel/epilogue.py TmaEpilogue, and D).

Grade it: ``python -m lessons grade 11 path/to/this_file.py``.
"""

# Predict, then check:
# 1. Which rows of the 256-row tile do warpgroup 1's two waves compute?
#    Check with gemm.kernel.math_warpgroups.tile_rows(256), or `python -m lessons figures` (the tall-tile figure).
# 2. If both waves of a warpgroup sit 64 rows apart (offset 64 * wave), what does D look like?
#    Check with the emulator (`EXERCISE.build(this_module).run_cpu(...)` at M = 250): rows 64-127 are computed
#    twice, rows 192-255 never, and the TMA store copies out what the shared D tile held there (not NaN).
# 3. How many FP32 registers does a math thread keep for a 256 x 128 tile (partial sum + totals)?
#    Check: 64 accumulators + 2 x 64 totals = 192 of the 232 setmaxnreg gives (`python -m lessons inspect 11`).
# 4. How many 256 x 128 stages fit in shared memory, where 128 x 128 tiles had 5?
#    Check with gemm.kernel.config.max_stages, or `python -m lessons inspect 11` (the config line).


def wave_offset(wave: int, warpgroups: int) -> int:
    """Rows from a math warpgroup's wave 0 to its wave ``wave`` in the tile (0 for wave 0), with ``warpgroups``
    math warpgroups sharing the tile. A multiple of 64, at least 0 and below the tile's 256 rows; every
    (warpgroup, wave) must get its own 64 rows, and together they must cover the tile."""
    raise NotImplementedError("wave_offset: how far below its first wave does a warpgroup's wave `wave` start?")
