"""Stage 12: split-K over a thread-block cluster at the decode shape: the SMs stages 11 and 12 keep busy, which
K blocks of a tile each cluster rank computes (gemm.kernel.config.k_share, what ``_Kernel.setup`` emits) and how
the ranks' FP32 totals meet in rank 0 (``_Kernel.gather_partials``)."""
from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from lessons.figures.drawing import new_figure

RANK_COLORS = colormaps["tab10"]  # cluster rank r: colour r, in every panel


def split_k_map(k_blocks: int, split_k: int) -> dict[str, np.ndarray]:
    """Per K block of one tile: ``rank`` (the cluster rank that computes it, -1: none) and ``count`` (how many
    ranks' shares hold it), from gemm.kernel.config.k_share."""
    from gemm.kernel.config import k_share
    out = {"rank": np.full(k_blocks, -1), "count": np.zeros(k_blocks, int)}
    for rank in range(split_k):
        first, end = k_share(rank, split_k, k_blocks)
        out["rank"][first:end] = rank
        out["count"][first:end] += 1
    return out


def split_k_occupancy(m: int, n: int, k: int) -> dict:
    """``sm_count`` and, per stage (11, 12), its config's tiles, split_k and the CTAs it launches
    (gemm.kernel.launch.grid: what the launch asks for) at m x n x k."""
    import lessons
    from gemm.heuristics import device_facts
    from gemm.kernel.config import tiles
    from gemm.kernel.launch import grid
    sm_count = device_facts().sm_count
    out = {"sm_count": sm_count}
    for number in (11, 12):
        config = lessons.stage(number).config(m, n, k)
        out[number] = {"config": config, "tiles": tiles(config, m, n), "split_k": config.split_k,
                       "ctas": grid(config, m, n, sm_count)}
    return out


def _sm_panel(ax, use: dict, rows: int = 4) -> None:
    """Each stage's SMs as a rows x (sm_count / rows) grid (schematic placement): grey = one CTA computing all of
    its tile's K blocks, rank colours = split-K CTAs (a cluster's ranks stacked), white = idle."""
    columns = -(-use["sm_count"] // rows)
    for band, number in enumerate((11, 12)):
        top, stage = band * (rows + 2), use[number]
        for sm in range(use["sm_count"]):
            row, column = sm % rows, sm // rows  # column-major: a cluster's ranks sit one above the other
            color = ("white" if sm >= stage["ctas"] else "0.45" if stage["split_k"] == 1
                     else RANK_COLORS(sm % stage["split_k"]))
            ax.add_patch(Rectangle((column, top + row), 1, 1, facecolor=color, edgecolor="0.6", lw=0.6))
        c = stage["config"]
        # a persistent grid rounded down to whole clusters leaves some CTA more than one tile
        several = " (persistent: a CTA may take several tiles)" if stage["ctas"] < stage["tiles"] else ""
        ax.text(0, top - 0.3, f"stage {number}: {stage['tiles']} tiles of {c.block_m} x {c.block_n}, split_k = "
                f"{stage['split_k']}: {stage['ctas']} CTAs{several} on {use['sm_count']} SMs, {stage['ctas']} busy, "
                f"{use['sm_count'] - stage['ctas']} idle", fontsize=9, va="bottom")
    ax.set_xlim(-0.5, columns + 0.5)
    ax.set_ylim(2 * rows + 2.5, -1.6)
    ax.set_aspect("equal")
    ax.axis("off")


def _k_block_panel(ax, strips) -> None:
    """One strip per (k_blocks, split_k): the tile's K blocks coloured by rank, each share labelled; every strip
    is drawn the same width, so a short K shows its uneven shares as wide cells."""
    width = max(kb for kb, _ in strips)
    for row, (k_blocks, split_k) in enumerate(strips):
        cell, ranks, y = width / k_blocks, split_k_map(k_blocks, split_k)["rank"], 2.2 * row
        for block, rank in enumerate(ranks):
            ax.add_patch(Rectangle((block * cell, y), cell, 1, facecolor=RANK_COLORS(rank), edgecolor="white", lw=0.5))
        for rank in range(split_k):
            blocks = np.flatnonzero(ranks == rank)
            named = f"block {blocks[0]}" if len(blocks) == 1 else f"blocks {blocks[0]}-{blocks[-1]}"
            ax.text((blocks[0] + len(blocks) / 2) * cell, y + 1.15, f"rank {rank}: {named} ({len(blocks)})",
                    ha="center", va="top", fontsize=8.5)
        ax.text(-1, y + 0.5, f"Kb = {k_blocks}, S = {split_k}", ha="right", va="center", fontsize=9)
    ax.set_xlim(-12, width + 0.5)
    ax.set_ylim(2.2 * len(strips) - 0.2, -0.3)
    ax.axis("off")


def _exchange_panel(ax, config, k_blocks: int) -> None:
    """gather_partials as two lanes in time order (down): what each rank runs, the two cluster-barrier phases
    across both, and the DSMEM read (arrow) from the peer's ring into rank 0."""
    peers, peers_own = (("rank 1", "rank 1's") if config.split_k == 2
                        else (f"ranks 1-{config.split_k - 1}", f"ranks 1-{config.split_k - 1}'"))
    kib = config.block_m * config.block_n * 4 // 1024  # one rank's FP32 totals of the tile

    def step(x, y, text, rank):
        ax.text(x, y, text, ha="center", va="center", fontsize=8.5,
                bbox=dict(boxstyle="round", fc=RANK_COLORS(rank), alpha=0.35, ec="black"))
    ranks = split_k_map(k_blocks, config.split_k)["rank"]
    for x, rank, who in ((25, 0, "rank 0"), (75, 1, peers)):
        share = np.flatnonzero(ranks == rank)
        ax.text(x, 0, f"CTA {who}", ha="center", va="center", fontsize=10, weight="bold")
        step(x, 0.9, f"K loop over blocks {share[0]}-{share[-1]}\n-> FP32 totals in registers", rank)
    step(75, 2.0, f"st.shared.v4: totals -> its own ring\n(idle by now; {kib} KiB)", 1)
    for y, text in ((2.8, "cluster barrier, phase 1 (arrive + wait): the peers' totals are written"),
                    (4.6, "phase 2: rank 0 arrives only after its reads; the peers wait for it, then exit "
                          "(a CTA's shared memory vanishes with it)")):
        ax.plot([2, 98], [y, y], "k--", lw=1.2)
        ax.text(2, y - 0.08, text, ha="left", va="bottom", fontsize=8.5, style="italic")
    step(25, 3.7, f"mapa + ld.shared::cluster.v4: read {peers_own} totals\nthrough distributed shared memory, "
         "add.f32 into its own", 0)
    ax.annotate("", xy=(39, 3.65), xytext=(66, 2.05), arrowprops=dict(arrowstyle="->", lw=2, color=RANK_COLORS(1)))
    ax.text(51, 3.35, "read over DSMEM", fontsize=9, color=RANK_COLORS(1), weight="bold")
    step(25, 5.3, f"epilogue alone: scale, convert,\nTMA store of the {config.block_m} x {config.block_n} D tile", 0)
    step(75, 5.3, "exit", 1)
    ax.set_xlim(0, 100)
    ax.set_ylim(5.8, -0.3)
    ax.axis("off")


def split_k_cluster(shape: tuple[int, int, int] | None = None) -> Figure:
    """At stage 12's SHAPE: the SMs stages 11 and 12 keep busy, one tile's K blocks by cluster rank (and a short
    K that does not divide by 4), and the exchange of the ranks' totals."""
    import lessons
    m, n, k = shape or lessons.stage(12).SHAPE
    use = split_k_occupancy(m, n, k)
    config, k_blocks = use[12]["config"], -(-k // 128)
    fig = new_figure(13, 11)
    sms, blocks, exchange = fig.subplots(3, 1, height_ratios=[1.25, 0.55, 1.3])
    _sm_panel(sms, use)
    sms.set_title(f"{m} x {n} x {k}: the SMs each stage keeps busy", fontsize=10)
    _k_block_panel(blocks, [(k_blocks, config.split_k), (7, 4)])
    blocks.set_title("one tile's K blocks by the cluster rank that computes them (k_share: rank r gets "
                     "[r Kb / S, (r + 1) Kb / S))", fontsize=10)
    _exchange_panel(exchange, config, k_blocks)
    exchange.set_title("gather_partials: the ranks' totals meet in rank 0", fontsize=10)
    handles = [Patch(facecolor="0.45", edgecolor="0.6", label="one CTA per tile, all its K blocks"),
               *(Patch(facecolor=RANK_COLORS(r), edgecolor="0.6", label=f"cluster rank {r}") for r in range(4)),
               Patch(facecolor="white", edgecolor="0.6", label="idle SM")]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8.5)
    fig.suptitle(f"Stage 12: split-K over a cluster of {config.split_k} CTAs (gemm.kernel.config.k_share, "
                 "_Kernel.gather_partials): where the tiles are\nfewer than the SMs, each tile's K blocks are shared "
                 "by a cluster's CTAs and summed through distributed shared memory", fontsize=11)
    return fig


__all__ = ["split_k_map", "split_k_occupancy", "split_k_cluster"]
