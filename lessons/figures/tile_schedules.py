"""Which CTA computes which tile: stage 08's persistent raster, stage 09's 2-CTA cluster pairs and the MoE
grouped layouts' walks, all from gemm.kernel.tile_scheduler (the walks the kernels' PTX computes)."""
from __future__ import annotations

from itertools import zip_longest

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from lessons.figures.drawing import draw_box, new_figure


def raster_map(m_blocks: int, n_blocks: int, grid: int, group: int) -> dict[str, np.ndarray]:
    """(m_blocks x n_blocks) arrays ``owner`` (CTA), ``step`` (its index in that CTA's walk), ``count`` (times the
    tile is computed), from gemm.kernel.tile_scheduler.schedule: the walk the persistent kernel's PTX computes."""
    from gemm.kernel.tile_scheduler import schedule
    out = {"owner": np.full((m_blocks, n_blocks), -1), "step": np.full((m_blocks, n_blocks), -1),
           "count": np.zeros((m_blocks, n_blocks), int)}
    for cta in range(grid):
        for step, (mb, nb) in enumerate(schedule(cta, grid, m_blocks, n_blocks, group)):
            out["owner"][mb, nb], out["step"][mb, nb] = cta, step
            out["count"][mb, nb] += 1
    return out


def wave_footprint(m_blocks: int, n_blocks: int, grid: int, group: int) -> float:
    """Mean over waves of (distinct A row blocks + distinct B column blocks) the wave's tiles read."""
    from gemm.kernel.tile_scheduler import tile_coords
    coords = [tile_coords(t, m_blocks, n_blocks, group) for t in range(m_blocks * n_blocks)]
    waves = [coords[w:w + grid] for w in range(0, len(coords), grid)]
    return float(np.mean([len({mb for mb, _ in wave}) + len({nb for _, nb in wave}) for wave in waves]))


def tile_raster(m_blocks: int = 12, n_blocks: int = 20, grid: int = 13, groups=(0, 4)) -> Figure:
    """The persistent schedule of a toy GPU: tiles coloured by CTA, labelled with the step; boxed, the first wave."""
    from gemm.kernel.tile_scheduler import tile_coords
    fig = new_figure(7 * len(groups), 4.8)
    for ax, group in zip(np.atleast_1d(fig.subplots(1, len(groups))), groups):
        data = raster_map(m_blocks, n_blocks, grid, group)
        ax.imshow(data["owner"], cmap=colormaps["tab20"].resampled(20), vmin=-0.5, vmax=19.5, interpolation="nearest")
        for (mb, nb), step in np.ndenumerate(data["step"]):
            ax.text(nb, mb, step, ha="center", va="center", fontsize=7)
        for t in range(grid):
            mb, nb = tile_coords(t, m_blocks, n_blocks, group)
            draw_box(ax, nb, mb, 1, 1)
        name = "row-major (G = 0)" if group == 0 else f"grouped, G = {group}"
        ax.set_title(f"{name}: {wave_footprint(m_blocks, n_blocks, grid, group):.1f} A+B blocks read per wave",
                     fontsize=10)
        ax.set_xlabel("n block")
        ax.set_ylabel("m block")
    fig.suptitle(f"Stage 08: gemm.kernel.tile_scheduler.schedule, {m_blocks} x {n_blocks} tiles on {grid} CTAs "
                 "(colour = CTA, number = its step; boxed: the first wave, the tiles in flight together)", fontsize=10)
    return fig


def cluster_steps(grid: int, m_blocks: int, n_blocks: int, group: int, along_m: bool = False) -> list[tuple]:
    """[(cluster, step, rank 0's tile, rank 1's tile or None, multicast)]: CTAs 2c and 2c + 1 walk their
    ``schedule`` side by side; TileScheduler.pair_flags multicasts A when both have a tile and the tiles share
    their m block (the pair's tiles are t and t + 1, t even: the same rule from the pair's first tile), or, with
    ``along_m`` (``multicast_operand="b"``: the walk along M), B when they share their n block."""
    from gemm.kernel.tile_scheduler import schedule
    shared_coordinate = 1 if along_m else 0
    steps = []
    for cluster in range(grid // 2):
        walks = [schedule(2 * cluster + rank, grid, m_blocks, n_blocks, group, along_m) for rank in (0, 1)]
        for step, (first, second) in enumerate(zip_longest(*walks)):
            steps.append((cluster, step, first, second,
                          second is not None and first[shared_coordinate] == second[shared_coordinate]))
    return steps


def census(steps) -> tuple[int, int, int]:
    """(pairs that multicast A, pairs split across rows, steps where rank 0 has no peer tile)."""
    shared = sum(s[4] for s in steps)
    lone = sum(s[3] is None for s in steps)
    return shared, len(steps) - shared - lone, lone


def cluster_multicast(cases=((6, 10), (5, 9)), grid: int = 8, group: int = 4, along_m: bool = False) -> Figure:
    """Stage 09's pairs, A multicast (the walk along N); ``along_m``: B multicast (the walk along M)."""
    operand, edge = ("B", "columns") if along_m else ("A", "rows")
    fig = new_figure(15, 4.6)
    axes = fig.subplots(1, len(cases), gridspec_kw={"width_ratios": [n for _, n in cases]})
    colors = colormaps["tab10"]
    for ax, (m_blocks, n_blocks) in zip(np.atleast_1d(axes), cases):
        steps = cluster_steps(grid, m_blocks, n_blocks, group, along_m)
        image = np.ones((m_blocks, n_blocks, 3))
        for cluster, step, first, second, shared in steps:
            for rank, tile in enumerate((first, second)):
                if tile is not None:
                    color = np.array(colors(cluster)[:3])
                    image[tile] = color if rank == 0 else 0.55 * color + 0.45  # rank 1: the same hue, lighter
            if shared:
                left, top = min(first[1], second[1]), min(first[0], second[0])
                width, height = (0.9, 1.9) if along_m else (1.9, 0.9)
                ax.add_patch(Rectangle((left - 0.45, top - 0.45), width, height, fill=False, lw=2.2, ec="black"))
            elif second is not None:
                ax.plot([first[1] + 0.3, second[1] + 0.3], [first[0], second[0]], "k--", lw=1.6)
            else:
                ax.add_patch(Rectangle((first[1] - 0.45, first[0] - 0.45), 0.9, 0.9, fill=False, lw=2, ls=":",
                                       ec="black"))
        ax.imshow(image, interpolation="nearest")
        for cluster, step, first, second, _ in steps:
            for rank, tile in enumerate((first, second)):
                if tile is not None:
                    ax.text(tile[1], tile[0] + 0.25, f"{rank}·{step}", ha="center", va="center", fontsize=7)
        shared, split, lone = census(steps)
        ax.set_title(f"{m_blocks} x {n_blocks} tiles, {grid} CTAs = {grid // 2} clusters, G = {group}:\n"
                     f"{shared} pairs multicast {operand}, {split} split across {edge}, lone CTA steps: {lone}",
                     fontsize=10)
        ax.set_xlabel("n block")
        ax.set_ylabel("m block")
    if along_m:
        fig.suptitle("B multicast (multicast_operand='b'): the walk runs along M, G m-blocks per group. Boxed pair: "
                     "same n block, rank 0 multicasts B to both; dashed: columns differ, each loads its own B; "
                     "dotted: no peer tile", fontsize=10)
    else:
        fig.suptitle("Stage 09: 2-CTA clusters (colour = cluster, lighter = rank 1, label rank·step). Boxed pair: "
                     "same m block, rank 0 multicasts A to both; dashed: rows differ, each loads its own A; dotted: "
                     "no peer tile", fontsize=10)
    return fig


def cluster_multicast_b(cases=((6, 10), (5, 9)), grid: int = 8, group: int = 4) -> Figure:
    """The pairs of a B multicast walk (``multicast_operand="b"``) on stage 09's two toy grids."""
    return cluster_multicast(cases, grid, group, along_m=True)


MOE_EXAMPLE = dict(counts=(150, 0, 40, 90), block_m=64, n_blocks=3, grid=5, m_max=192)


def moe_walk_map(walks, m_blocks: int, n_blocks: int) -> dict[str, np.ndarray]:
    """(m_blocks x n_blocks) arrays ``owner`` (CTA, -1: no CTA visits it), ``step`` (its index in that CTA's walk),
    ``group`` (-1: a skipped padding tile, -2: not visited) and ``count`` (visits), from the walks of
    lessons.moe_grouped (contiguous: m blocks over sum M; masked: ``g * blocks per slab + m block``, pass the
    walks through :func:`slab_rows` first)."""
    out = {"owner": np.full((m_blocks, n_blocks), -1), "step": np.full((m_blocks, n_blocks), -1),
           "group": np.full((m_blocks, n_blocks), -2), "count": np.zeros((m_blocks, n_blocks), int)}
    for cta, walk in enumerate(walks):
        for step, (g, mb, nb) in enumerate(walk):
            out["owner"][mb, nb], out["step"][mb, nb], out["group"][mb, nb] = cta, step, g
            out["count"][mb, nb] += 1
    return out


def slab_rows(walks, slab_blocks: int):
    """Masked walks (group, m block in the group, n block) -> (group, row of blocks in the flattened slabs, n)."""
    return [[(g, g * slab_blocks + mb, nb) for g, mb, nb in walk] for walk in walks]


def moe_layouts(counts=MOE_EXAMPLE["counts"], block_m: int = MOE_EXAMPLE["block_m"],
                n_blocks: int = MOE_EXAMPLE["n_blocks"], grid: int = MOE_EXAMPLE["grid"],
                m_max: int = MOE_EXAMPLE["m_max"]) -> Figure:
    """Both grouped-GEMM layouts of one routing (``counts`` tokens per expert) and the tiles each CTA computes:
    lessons.moe_grouped.dispatch for the layouts, contiguous_tiles / masked_tiles (the kernel's scheduler
    functions) for the walks."""
    from gemm.fp8 import ceil_div
    from lessons import moe_grouped as mg
    layout = mg.dispatch(np.asarray(counts), len(counts), m_max=m_max)
    contiguous, masked = layout.contiguous, layout.masked
    group_colors = [colormaps["tab10"](g % 10) for g in range(len(counts))]
    cta_colors = colormaps["Pastel1"].resampled(9)
    fig = new_figure(12, 9.5)
    axes = fig.subplots(2, 2, width_ratios=[1, 2.6])

    def rows_column(ax, groups_of_rows, boundaries, labels, title):
        """One bar of rows, coloured by group (hatched grey: padding / empty slot), a line per block."""
        for row, g in enumerate(groups_of_rows):
            ax.add_patch(Rectangle((0, row), 1, 1, facecolor=group_colors[g] if g >= 0 else "0.92", lw=0,
                                   hatch=None if g >= 0 else "///", edgecolor="0.7"))
        for y in boundaries:
            ax.axhline(y, color="black", lw=0.6)
        for y, text in labels:
            ax.text(1.08, y, text, fontsize=7.5, va="center", ha="left")
        ax.set_xlim(0, 2.6)
        ax.set_ylim(len(groups_of_rows), 0)
        ax.set_xticks([])
        ax.set_ylabel("row of A (and of out)")
        ax.set_title(title, fontsize=9.5)
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)

    def tile_grid(ax, data, row_height, title, blank):
        m_blocks = data["owner"].shape[0]
        for (mb, nb), cta in np.ndenumerate(data["owner"]):
            y = mb * row_height
            g = data["group"][mb, nb]
            if cta < 0:
                ax.add_patch(Rectangle((nb, y), 1, row_height, facecolor="white", edgecolor="0.8", lw=0.5))
                ax.text(nb + 0.5, y + row_height / 2, blank, ha="center", va="center", fontsize=7, color="0.6")
                continue
            skipped = g < 0
            ax.add_patch(Rectangle((nb, y), 1, row_height, facecolor="0.9" if skipped else cta_colors(cta % 9),
                                   edgecolor=group_colors[g] if g >= 0 else "0.6", lw=2 if g >= 0 else 0.8,
                                   hatch="xx" if skipped else None))
            text = f"CTA {cta}, step {data['step'][mb, nb]}" + (" (skip)" if skipped else f"\ngroup {g}")
            ax.text(nb + 0.5, y + row_height / 2, text, ha="center", va="center", fontsize=7.5)
        ax.set_xlim(0, n_blocks)
        ax.set_ylim(m_blocks * row_height, 0)
        ax.set_xticks([nb + 0.5 for nb in range(n_blocks)], [f"n block {nb}" for nb in range(n_blocks)])
        ax.set_yticks([])
        ax.set_title(title, fontsize=9.5)

    # contiguous: one A, groups back to back, each aligned to the layout's alignment and padded with -1
    m_blocks = ceil_div(contiguous.rows, block_m)
    labels = [(mb * block_m + block_m / 2, f"m_indices[{mb * block_m}] = {int(contiguous.m_indices[mb * block_m])}")
              for mb in range(m_blocks)]
    rows_column(axes[0, 0], contiguous.m_indices, [mb * block_m for mb in range(m_blocks + 1)], labels,
                f"contiguous A: {contiguous.rows} rows, groups\naligned to {contiguous.alignment} "
                f"({contiguous.padding} padding rows, hatched)")
    walks = mg.contiguous_tiles(contiguous.m_indices, block_m, n_blocks * 128, 128, grid=grid, skipped=True,
                                groups=len(counts))
    tile_grid(axes[0, 1], moe_walk_map(walks, m_blocks, n_blocks), block_m,
              f"contiguous walk: the dense schedule over sum M on {grid} CTAs;\na tile whose m_indices[m0] is -1 "
              "is skipped (hatched: the CTA spends the step on a load and a branch)", "")

    # masked: a slab of M_max rows per group, masked_m[g] of them real
    slab_blocks = ceil_div(m_max, block_m)
    slab = np.where(masked.source >= 0, np.arange(len(counts))[:, None], -1).ravel()
    labels = [(g * m_max + m_max / 2, f"group {g}: masked_m = {int(masked.masked_m[g])}") for g in range(len(counts))]
    rows_column(axes[1, 0], slab, [g * m_max for g in range(len(counts) + 1)], labels,
                f"masked A: G = {len(counts)} slabs of M_max = {m_max} rows\n(hatched: slots no token fills)")
    walks = mg.masked_tiles(masked.masked_m, m_max, block_m, n_blocks, grid)
    data = moe_walk_map(slab_rows(walks, slab_blocks), len(counts) * slab_blocks, n_blocks)
    tile_grid(axes[1, 1], data, block_m, f"masked walk: CTA c takes virtual tiles c, c + {grid}, ... of the groups' "
              "tiles in order (masked_schedule);\nblocks past masked_m are not tiles, an empty group has none",
              "no tile")
    axes[1, 1].set_ylim(len(counts) * m_max, 0)
    for g in range(len(counts) + 1):
        axes[1, 1].axhline(g * m_max, color="black", lw=1.2)
    handles = [Patch(facecolor=group_colors[g], label=f"group (expert) {g}: {c} tokens") for g, c in enumerate(counts)]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(counts), fontsize=8.5)
    fig.suptitle(f"MoE grouped GEMMs (lessons/moe_grouped.py): one routing, two layouts, BLOCK_M = {block_m}, "
                 f"{n_blocks} n blocks, {grid} CTAs (cell colour = CTA, outline = group)", fontsize=10.5)
    return fig
