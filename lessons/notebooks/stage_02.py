"""Notebook 02: shared-memory tiling."""
from __future__ import annotations

from lessons.notebooks.cells import CHECK_NOTE_NUMBA, numba_notebook


INTRO = """\
# 02 · Shared-memory tiling

**The one idea:** threads that need the same data load it once, together. A block computes a tile of D;
for each 128-wide K group it first copies the slices of A and B that the tile needs into shared memory,
then every thread computes its partial sum from there. Each FP8 byte now leaves global memory once per
block instead of once per thread, and (in this implementation) is decoded once per block too, while
staging. The K tile is exactly one scale group, so the promotion boundary and the tile boundary coincide:
stage the group, synchronize, accumulate, promote, synchronize, next group.

**What changed vs 01:** where the operands come from. The arithmetic and the promotion are stage 01's.

What to look for: the two `cuda.syncthreads()` per K group (one before reading the tiles, one before the
next group overwrites them); coalesced staging (consecutive threads read consecutive bytes); how the tile
layout avoids shared-memory bank conflicts (a warp reading one address is a broadcast; 32 different rows of
a row-major tile would all hit the same bank unless the row pitch is padded). And what did not improve:
each thread still loads two shared-memory values per FMA, which is what stage 03 attacks.
"""


KERNEL = """\
## The kernel

Shared tiles are declared with `cuda.shared.array` and sized by module constants (compile-time for Numba).
Each thread still owns one output; what moved is where its operands come from.
"""


def cells() -> list[dict]:
    return numba_notebook(
        2, INTRO, KERNEL, CHECK_NOTE_NUMBA,
        shapes_sim=[(20, 24, 256)], shapes_gpu=[(256, 256, 512), (100, 2112, 512)])
