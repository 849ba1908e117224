"""Exercise 08 (stage 08, persistent scheduler + TMA store): the raster order.

Objective: map a persistent CTA's tile index to an output tile in a grouped (L2-friendly) raster order.

Stage 08 is persistent: the grid is one CTA per SM, and CTA c computes tiles c, c + grid, c + 2*grid, ...
Which (m block, n block) tile number t is decides which A rows and B columns the ~132 CTAs read at the same
time, and so how often they hit L2. Row-major order (n fastest over all n blocks) streams all of B past every
A row block. The stage uses a grouped raster: the n blocks are cut into groups of `raster_group` consecutive
n blocks (the last group may be narrower); the tiles of group 0 come first, then those of group 1, ...; inside a
group the tiles go m-block by m-block, with n varying fastest across the group's width. raster_group = 0 means
plain row-major.

Fill in, in your copy of lessons/exercises/skeletons/ex08_raster_order.py:
  * tile_coords(tile, m_blocks, n_blocks, raster_group) -> (m_block, n_block), for 0 <= tile < m_blocks*n_blocks.
The generator turns your function into the kernel's tile map (gemm/kernel/tile_scheduler.py TileScheduler).

Grade it: ``python -m lessons grade 8 path/to/this_file.py``.
"""

# Predict, then check:
# 1. With 4 m blocks, 5 n blocks and raster_group 2, which tiles are tiles 0..9?
#    Check with gemm.kernel.tile_scheduler.schedule, or `python -m lessons figures` (the raster figure).
# 2. If tile_coords sends two tiles to the same (m_block, n_block), what does D look like?
#    Check with the emulator: run_cpu returns NaN where no tile wrote.
# 3. What does stage 08 add to the SASS over stage 07 (the epilogue's store)?
#    Check with `python -m lessons diff 7 8` (UTMASTG).


def tile_coords(tile: int, m_blocks: int, n_blocks: int, raster_group: int) -> tuple[int, int]:
    """(m_block, n_block) of tile number ``tile`` (0 <= tile < m_blocks * n_blocks).

    ``raster_group`` = G > 0: group g holds n blocks g*G .. min(g*G + G, n_blocks) - 1 and all m blocks, so
    G * m_blocks tiles (fewer for a narrower last group); inside it, n varies fastest. G = 0: row-major.
    Every tile must map to a different (m_block, n_block), and every (m_block, n_block) must be some tile's.
    """
    raise NotImplementedError("tile_coords: which output tile is tile number `tile`?")
