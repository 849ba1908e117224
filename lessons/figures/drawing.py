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


def draw_box(ax, x0, y0, width, height, color="black", lw=2.0, ls="-"):
    ax.add_patch(Rectangle((x0 - 0.5, y0 - 0.5), width, height, fill=False, lw=lw, ec=color, ls=ls))
