"""Notebook 03: register tiling."""
from __future__ import annotations

from lessons.notebooks.cells import CHECK_NOTE_NUMBA, numba_notebook


INTRO = """\
# 03 · Register tiling

**The one idea:** make every value read from shared memory feed many FMAs. Each thread computes a
micro-tile of outputs (here 8 rows × 8 columns) held in registers: per k it loads 8 values of A and 8 of B
and does 64 FFMAs with them, where stage 02 did one FFMA per two shared-memory loads.

**What changed vs 02:** a thread owns a micro-tile; the block tile grows (128 × 128 here) while the
shared-memory tile gets shallower in K (32), so one scale group now spans several tiles and the promotion
happens every few tiles rather than every tile; tiles are stored k-major so a thread's values along M or N
are contiguous (wide shared loads); and global loads are wide: 8 FP8 bytes per load, decoded while staging.

What to look for: the partial sums and totals as constant-size `cuda.local.array`s (Numba keeps them in
registers when their sizes are compile-time constants and every loop over them unrolls), the scale
product `sA·sB` computed once per row and column of the micro-tile per K group, and the register budget:
64 partials + 64 totals + the fragments is most of the 255 registers a thread may have, so one block per
SM, with latency hidden by 64 independent FFMAs rather than by occupancy.
"""


KERNEL = """\
## The kernel

The staging helper, the kernel, and the promotion; compare the inner loop with stage 02's single FFMA.
"""


def cells() -> list[dict]:
    return numba_notebook(
        3, INTRO, KERNEL, CHECK_NOTE_NUMBA,
        shapes_sim=[(20, 24, 256)], shapes_gpu=[(256, 256, 512), (100, 2112, 512)])
