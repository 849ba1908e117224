"""Stage 19: each split CTA's K blocks with even shares (stage 18) and with rank 0's lead (stage 19), at the stage's
shape (256 x 64 tiles over two) and as production splits the swapped decode tiles of 16 x 2112 x 7168 (over three),
from the configs and the shares the kernels compute (gemm.kernel.config.k_share with the config's
``split_k_lead``)."""
from __future__ import annotations

from matplotlib import colormaps
from matplotlib.figure import Figure

from lessons.figures.drawing import new_figure

LEAD_SHAPE = (64, 2112, 7168)  # stage 19's home shape (lessons/19_split_k_lead.py SHAPE)
DECODE_SHAPE = (16, 2112, 7168)  # production splits its swapped tiles over three, with the lead
RANK_COLORS = colormaps["tab10"]  # cluster rank r: colour r, as in the figures 12_split_k_cluster and 18


def lead_shares(config, k: int) -> dict:
    """A split ``config``'s K shares at K = ``k``: the config, the K blocks a tile has, and ``shares`` as
    (rank, first, end) in rank order."""
    from gemm.kernel.config import k_share
    blocks = -(-k // 128)
    return {"config": config, "k_blocks": blocks,
            "shares": [(rank, *k_share(rank, config.split_k, blocks, config.split_k_lead))
                       for rank in range(config.split_k)]}


def _panel(ax, rows: list[tuple[str, dict]], title: str) -> None:
    """One bar per rank and row, over the tile's K blocks, and how many blocks' time the peers' pushes have to land
    before rank 0's K loop ends (all ranks start together; each runs its own share)."""
    y = 0
    ticks = []
    for label, plan in rows:
        lengths = [end - first for _, first, end in plan["shares"]]
        for rank, first, end in plan["shares"]:
            ax.barh(y, end - first, left=first, color=RANK_COLORS(rank), edgecolor="black", lw=0.5)
            ax.text((first + end) / 2, y, f"rank {rank}: {end - first}", ha="center", va="center", fontsize=8,
                    color="white")
            ticks.append((y, f"{label}, rank {rank}"))
            y += 1
        ahead = lengths[0] - max(lengths[1:])
        verdict = (f"the peers end {ahead} K block{'s' * (ahead != 1)} before rank 0:\ntheir pushes land while it "
                   "multiplies") if ahead > 0 else (f"rank 0 ends {-ahead} K block{'s' * (ahead != -1)} before its "
                                                   "last peer:\nit waits for the whole exchange" if ahead else
                                                   "every rank ends together:\nrank 0 waits for the whole exchange")
        ax.text(plan["k_blocks"] + 1, y - len(lengths) / 2 - 0.5, verdict, va="center", fontsize=7.5)
        y += 0.6
    ax.set_yticks([t for t, _ in ticks], [text for _, text in ticks], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, rows[0][1]["k_blocks"] * 2.1)
    ax.set_xlabel("the tile's K blocks (128 of K each)")
    ax.set_title(title, fontsize=9.5)


def split_k_lead(shape: tuple[int, int, int] = LEAD_SHAPE, decode: tuple[int, int, int] = DECODE_SHAPE) -> Figure:
    """Even shares against rank 0's lead: stages 18 and 19 at ``shape``, and production's split of ``decode``'s
    swapped tiles over three, without and with its lead."""
    import lessons
    from gemm.heuristics import choose_config
    m, n, k = shape
    fig = new_figure(13, 4.6)
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    stage_rows = [(f"stage {number}", lead_shares(lessons.stage(number).config(m, n, k), k)) for number in (18, 19)]
    production = choose_config(*decode)
    three = [("even", lead_shares(production.replace(split_k_lead=0), decode[2])),
             ("lead", lead_shares(production, decode[2]))]
    tiles = stage_rows[1][1]["config"]
    _panel(left, stage_rows, f"{m} x {n} x {k}: the stage's {tiles.block_m} x {tiles.block_n} tiles over "
                             f"{tiles.split_k}")
    _panel(right, three, f"{' x '.join(map(str, decode))}: production's {production.block_m} x "
                         f"{production.block_n} swapped tiles over {production.split_k}")
    fig.suptitle(f"Stage 19: rank 0, which waits for its peers' pushed totals, takes {tiles.split_k_lead} K blocks "
                 f"more than an even share of {stage_rows[0][1]['k_blocks']};\nthe peers finish first, and their "
                 "partials land while rank 0 still multiplies", fontsize=10)
    return fig


__all__ = ["LEAD_SHAPE", "DECODE_SHAPE", "lead_shares", "split_k_lead"]
