"""Stage 20: the tiles over D at 64 x 2112 x 7168 for stage 19 (256-row tiles over pairs), one 64-row tile per SM
(the stage's ablation without the pair) and stage 20 (64-row tiles chosen for half the SMs, over pairs), drawn from
the configs (lessons.stage(19 / 20).config, the ablation's fields) with what each costs: CTAs, zero-fill rows the
tensor cores multiply, and the bytes of A and B the CTAs read (each CTA its tile's rows over its share of K)."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from lessons.figures.drawing import new_figure

PAIR_SHAPE = (64, 2112, 7168)  # stage 20's home shape (lessons/20_narrow_pair_tiles.py SHAPE)
TILE_COLORS = ("tab:blue", "tab:orange")  # neighbouring tiles told apart


def tile_costs(config, m: int, n: int, k: int) -> dict:
    """What a config's tiles cost at (m, n, k): tiles, CTAs (tiles x split), the rows a tile multiplies that lie
    past M (TMA zero-fill) as a share of its rows, and the bytes of A and B read from L2 over the whole grid (each
    CTA reads its tile's in-bounds rows of A and columns of B over its share of K: FP8, one byte each)."""
    from gemm.fp8 import ceil_div
    rows, columns = ceil_div(m, config.block_m), ceil_div(n, config.block_n)
    tiles = rows * columns
    multiplied_rows = rows * config.block_m
    return {"config": config, "rows": rows, "columns": columns, "tiles": tiles, "ctas": tiles * config.split_k,
            "zero_fill": (multiplied_rows - m) / multiplied_rows,
            "a_bytes": columns * m * k,  # every column of tiles reads all M rows over the whole of K (split or not)
            "b_bytes": rows * n * k}


def pair_tile_variants(m: int = PAIR_SHAPE[0], n: int = PAIR_SHAPE[1], k: int = PAIR_SHAPE[2]) -> dict:
    """{label: tile_costs}: stage 19's config, stage 20's without its pair (its ablation), and stage 20's."""
    import lessons
    stage20 = lessons.stage(20)
    unpaired = stage20.config(m, n, k).replace(**stage20.ABLATIONS["one 64 x 16 tile per SM, no pair"])
    return {"stage 19": tile_costs(lessons.stage(19).config(m, n, k), m, n, k),
            "one tile per SM, no pair": tile_costs(unpaired, m, n, k),
            "stage 20": tile_costs(stage20.config(m, n, k), m, n, k)}


def _row(ax, label: str, costs: dict, m: int, n: int) -> None:
    config = costs["config"]
    height = costs["rows"] * config.block_m
    for column in range(costs["columns"]):
        x0 = column * config.block_n
        width = min(config.block_n, n - x0)
        ax.add_patch(Rectangle((x0, 0), width, min(m, height), facecolor=TILE_COLORS[column % 2], alpha=0.55,
                               edgecolor="black", lw=0.3))
        if height > m:
            ax.add_patch(Rectangle((x0, m), width, height - m, facecolor="none", hatch="////", edgecolor="0.6",
                                   lw=0.3))
    ax.axhline(m, color="black", lw=0.8, ls="--")
    ax.set_xlim(0, n)
    ax.set_ylim(0, 256)
    ax.set_ylabel("rows", fontsize=8)
    pair = f", each split over {config.split_k} CTAs" if config.split_k > 1 else ", one CTA each"
    ax.set_title(f"{label}: {costs['tiles']} tiles of {config.block_m} x {config.block_n}{pair}: {costs['ctas']} "
                 f"CTAs, {config.stages} ring stages; {costs['zero_fill']:.0%} of the rows multiplied are zero-fill; "
                 f"A read {costs['a_bytes'] / 1e6:.0f} MB, B {costs['b_bytes'] / 1e6:.0f} MB", fontsize=8.5)
    ax.tick_params(labelsize=7)


def narrow_pair_tiles(shape: tuple[int, int, int] = PAIR_SHAPE) -> Figure:
    """The three tilings of D at ``shape``, to scale: M rows below the dashed line, zero-fill hatched above it."""
    m, n, k = shape
    variants = pair_tile_variants(m, n, k)
    fig = new_figure(13, 6.4)
    axes = fig.subplots(len(variants), 1, sharex=True)
    for ax, (label, costs) in zip(axes, variants.items()):
        _row(ax, label, costs, m, n)
    axes[-1].set_xlabel(f"columns of D (N = {n}); alternate tiles shaded apart")
    fig.suptitle(f"Stage 20 at {m} x {n} x {k}: tiles as tall as M, chosen for half the SMs and split over pairs: "
                 "as many CTAs as one tile per SM, half its reads of A, no zero-fill", fontsize=10)
    return fig


__all__ = ["PAIR_SHAPE", "tile_costs", "pair_tile_variants", "narrow_pair_tiles"]
