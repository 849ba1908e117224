"""Stage 16: how many tiles load each byte of B, from stage 16's configs and ``gemm.heuristics.b_reads`` (what the
stage's rule asks): at its decode shape one row of tiles, so every B tile is loaded once and goes to L2 evict_first;
at the ladder's shape sixteen rows of tiles load each B tile, and its loads keep the normal priority."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from lessons.figures.drawing import LADDER_SHAPE, new_figure

EVICT_SHAPE = (32, 4096, 7168)  # stage 16's home shape (lessons/16_evict_first.py SHAPE)
PRIORITY_COLORS = {"first": "tab:orange", "normal": "0.75"}


def b_read_map(m: int, n: int, k: int) -> dict:
    """Stage 16's tile grid at (m, n, k): its config, the rows and columns of tiles, how many tiles load each byte
    of B (:func:`gemm.heuristics.b_reads`) and the L2 priority the stage gives B's loads."""
    import lessons
    from gemm.fp8 import ceil_div
    from gemm.heuristics import b_reads
    config = lessons.stage(16).config(m, n, k)
    return {"config": config, "rows": ceil_div(m, config.block_m), "columns": ceil_div(n, config.block_n),
            "b_reads": b_reads(m, config), "priority": config.b_eviction}


def _grid(ax, shape, grid):
    rows, columns, priority = grid["rows"], grid["columns"], grid["priority"]
    for row in range(rows):
        for column in range(columns):
            ax.add_patch(Rectangle((column, rows - 1 - row), 1, 1, facecolor=PRIORITY_COLORS[priority],
                                   edgecolor="black", lw=0.4))
    ax.set_xlim(-0.5, columns + 0.5)
    ax.set_ylim(-0.5, rows + 0.5)
    ax.set_aspect("equal")
    ax.set_xticks([]), ax.set_yticks([])
    config, (m, n, k) = grid["config"], shape
    ax.set_title(f"{m}x{n}x{k}: {rows} x {columns} tiles of {config.block_m}x{config.block_n}"
                 f"{' (swapped)' if config.swap_ab else ''}\neach byte of B loaded by {grid['b_reads']} "
                 f"tile{'s' * (grid['b_reads'] != 1)} (one per row): B's loads evict_{priority}", fontsize=9)
    ax.set_xlabel("columns of tiles (N / block_n): each loads its own rows of B", fontsize=8.5)
    ax.set_ylabel("rows of tiles", fontsize=8.5)


def evict_first(decode=EVICT_SHAPE, prefill=LADDER_SHAPE) -> Figure:
    """The tile grid of stage 16 at its decode shape and at the ladder's, coloured by B's L2 priority."""
    fig = new_figure(11, 5.2)
    top, bottom = fig.subplots(2, 1, height_ratios=(1, 2.2))
    _grid(top, decode, b_read_map(*decode))
    _grid(bottom, prefill, b_read_map(*prefill))
    bottom.legend(handles=[Patch(facecolor=color, edgecolor="black", label=f"B loaded evict_{priority}")
                           for priority, color in PRIORITY_COLORS.items()], loc="upper left",
                  bbox_to_anchor=(1.02, 1.0), fontsize=9)
    fig.suptitle("B read once is loaded evict_first: its lines are the first their L2 set gives up", fontsize=11)
    return fig


__all__ = ["EVICT_SHAPE", "b_read_map", "evict_first"]
