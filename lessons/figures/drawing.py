"""What every figure module shares: the ladder's shape, an empty figure, a grid of labelled cells, a box.

Figures are :class:`matplotlib.figure.Figure` objects made without pyplot (nothing global, any backend).
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

LADDER_SHAPE = (4096, 4096, 7168)  # the ladder's benchmark shape: the configs the figures show are this shape's


def python_function(function):
    """The Python function behind a Numba device function (in the CUDA simulator it already is one)."""
    return getattr(function, "py_func", function)


def new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def draw_cells(ax, values, cmap, vmin=None, vmax=None, labels=None, fontsize=6, extent=None):
    """imshow of a 2-D array with an optional text label per cell (row, col order)."""
    ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest", extent=extent)
    if labels is not None:
        for (r, c), text in np.ndenumerate(labels):
            if text is not None and text != "" and not (isinstance(text, (int, np.integer)) and text < 0):
                ax.text(c, r, text, ha="center", va="center", fontsize=fontsize)


def instruction_strips(strips: list[tuple[str, list[int]]], classes, title: str) -> Figure:
    """SASS instruction streams as horizontal strips, one cell per instruction coloured by its class: ``strips`` are
    (caption, class indices) pairs, top to bottom; ``classes`` are (name, colour, ...) tuples, the legend."""
    from matplotlib.patches import Patch
    fig = new_figure(11, 3.2)
    ax = fig.add_axes((0.02, 0.32, 0.96, 0.56))
    for band, (caption, cells) in enumerate(strips):
        y = 1.6 * (len(strips) - 1 - band)
        for x, cls in enumerate(cells):
            ax.add_patch(Rectangle((x, y), 1, 1, facecolor=classes[cls][1], edgecolor="white", lw=0.3))
        ax.text(0, y + 1.15, caption, fontsize=8.5, va="bottom")
    ax.set_xlim(0, max(len(cells) for _, cells in strips))
    ax.set_ylim(-0.2, 1.6 * len(strips))
    ax.axis("off")
    ax.set_title(title, fontsize=9)
    fig.legend(handles=[Patch(facecolor=c[1], label=c[0]) for c in classes], loc="lower center", ncol=3, fontsize=8,
               frameon=False)
    return fig


def draw_box(ax, x0, y0, width, height, color="black", lw=2.0, ls="-"):
    ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), width, height, fill=False, lw=lw, ec=color, ls=ls))
