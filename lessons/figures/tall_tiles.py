"""Stage 11: the 256 x 128 tile's rows by (math warpgroup, wave), all against one B tile, from
gemm.kernel.math_warpgroups.tile_rows (what ``MathWarpgroups.wave_row`` adds to every address of a wave)."""
from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from lessons.figures.drawing import new_figure

WAVE_ROWS = 64  # wgmma's M: one wave of one warpgroup


def tall_tile_map(block_m: int = 256) -> dict[str, np.ndarray]:
    """Per row of a ``block_m``-row tile: ``warpgroup`` and ``wave`` that compute it and ``count`` (how many
    (warpgroup, wave) slices cover it), from gemm.kernel.math_warpgroups.tile_rows."""
    from gemm.kernel.math_warpgroups import tile_rows
    out = {"warpgroup": np.full(block_m, -1), "wave": np.full(block_m, -1), "count": np.zeros(block_m, int)}
    for group, wave, first in tile_rows(block_m):
        rows = slice(first, first + WAVE_ROWS)
        out["warpgroup"][rows], out["wave"][rows] = group, wave
        out["count"][rows] += 1
    return out


def tall_tile_waves(block_m: int = 256, block_n: int = 128, block_k: int = 128) -> Figure:
    """A (block_m x K block), the shared B tile (block_n x K block, drawn transposed) and D (block_m x block_n),
    each 64-row slice coloured by the (warpgroup, wave) that computes it."""
    from gemm.kernel.math_warpgroups import math_warpgroup_count, tile_rows
    slices = tile_rows(block_m)
    warpgroups = math_warpgroup_count(block_m)
    waves = block_m // (WAVE_ROWS * warpgroups)
    palette = {0: colormaps["Blues"], 1: colormaps["Oranges"]}

    def color(group, wave):  # a hue per warpgroup, darker for its later wave
        return palette[group % 2](0.45 + 0.3 * wave / max(waves - 1, 1))

    fig = new_figure(9.5, 8)
    ax = fig.subplots()
    gap = 24
    b_top = -block_k - gap  # B^T sits above D, A to its left: D = A . B^T
    a_left = -block_k - gap
    ax.add_patch(Rectangle((0, b_top), block_n, block_k, facecolor="0.85", edgecolor="black", lw=1.2))
    ax.text(block_n / 2, b_top + block_k / 2, f"B tile (one stage),\ntransposed:\n{block_k} bytes of K\nx {block_n} "
            "columns;\none descriptor,\nread by every wave", ha="center", va="center", fontsize=8.5)
    for group, wave, first in slices:
        for left, width in ((a_left, block_k), (0, block_n)):
            ax.add_patch(Rectangle((left, first), width, WAVE_ROWS, facecolor=color(group, wave), edgecolor="black",
                                   lw=0.8))
        ax.text(a_left + block_k / 2, first + WAVE_ROWS / 2, f"A rows {first}-{first + WAVE_ROWS - 1}",
                ha="center", va="center", fontsize=8.5)
        ax.text(block_n / 2, first + WAVE_ROWS / 2,
                f"warpgroup {group}, wave {wave}\nrows {first}-{first + WAVE_ROWS - 1}: totals[{wave}]\n"
                f"4 x wgmma m64n{block_n}k32", ha="center", va="center", fontsize=8.5)
    for wave in range(waves):  # wave w of all warpgroups: one contiguous slab
        top = min(first for _, w, first in slices if w == wave)
        ax.add_patch(Rectangle((0, top), block_n, WAVE_ROWS * warpgroups, fill=False, lw=2.4, ec="black"))
        ax.text(block_n + 4, top + WAVE_ROWS * warpgroups / 2,
                f"wave {wave}: rows {top}-{top + WAVE_ROWS * warpgroups - 1},\none {WAVE_ROWS * warpgroups}-row slab;\n"
                f"wave_row({wave}) = {top}", ha="left", va="center", fontsize=8.5)
    ax.add_patch(Rectangle((a_left, 0), block_k, block_m, fill=False, lw=1.2, ec="black"))
    ax.text(a_left + block_k / 2, -6, f"A tile: {block_m} rows x {block_k} bytes of K", ha="center", va="bottom",
            fontsize=9)
    ax.text(block_n / 2, block_m + 6, f"D tile: {block_m} x {block_n} (the epilogue stores each wave's rows)",
            ha="center", va="top", fontsize=9)
    ax.set_xlim(a_left - 8, block_n + 110)
    ax.set_ylim(block_m + 24, b_top - 8)
    ax.set_aspect("equal")
    ax.axis("off")
    handles = [Patch(facecolor=color(g, w), edgecolor="black", label=f"warpgroup {g}, wave {w}")
               for g in range(warpgroups) for w in range(waves)]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8.5)
    fig.suptitle(f"Stage 11: a {block_m} x {block_n} tile on {warpgroups} math warpgroups "
                 "(gemm.kernel.math_warpgroups.tile_rows):\nwarpgroup g's wave w covers rows 64 g + "
                 f"{WAVE_ROWS * warpgroups} w. Per K block each warpgroup runs its waves one after the other\n"
                 "against the same B tile, keeping a 64-register partial sum + one 64-register total per wave",
                 fontsize=10)
    return fig


__all__ = ["tall_tile_map", "tall_tile_waves"]
