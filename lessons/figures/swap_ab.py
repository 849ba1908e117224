"""Stage 15: what one SM's ring holds at decode before and after the swap (from the stages' configs and
gemm.kernel.config.SharedPlan, the byte plan the kernels are built from), and where the scales sit in the tile
wgmma accumulates: per row unswapped, per column swapped (``MathWarpgroups._swapped_k_block``)."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from lessons.figures.drawing import new_figure

SWAP_SHAPE = (16, 2112, 7168)  # stage 15's home shape (lessons/15_swap_ab.py SHAPE)
PARTS = (("A: token rows", "tab:blue"), ("A: TMA zero-fill (rows past M)", "0.8"), ("B: weight rows", "tab:orange"))


def ring_bytes(m: int, n: int, k: int) -> dict[str, dict]:
    """Per ring (stage 14, stage 15 with stage 14's depth, stage 15): its config and the bytes one CTA's ring holds,
    split as :data:`PARTS`: A's rows that hold tokens, A's zero-filled rows, B's rows (SharedPlan's tiles x stages)."""
    import lessons
    from gemm.kernel.config import SharedPlan
    ours = lessons.stage(15).config(m, n, k)
    before = lessons.stage(14).config(m, n, k)
    configs = {"stage 14": before, "stage 15, stage 14's ring depth": ours.replace(stages=before.stages),
               "stage 15": ours}
    out = {}
    for label, config in configs.items():
        plan = SharedPlan(config, n, k)
        token_share = min(m, config.block_m) / config.block_m
        out[label] = {"config": config, "parts": (plan.a_tile * token_share * config.stages,
                                                  plan.a_tile * (1 - token_share) * config.stages,
                                                  plan.b_tile * config.stages)}
    return out


def _tile(ax, left, rows, columns, real_rows, title, row_scale, column_scale):
    """A tile of ``rows`` x ``columns`` as wgmma accumulates it, its first ``real_rows`` rows holding products."""
    ax.add_patch(Rectangle((left, 0), columns, rows, facecolor="0.8", edgecolor="black", lw=1))
    ax.add_patch(Rectangle((left, 0), columns, real_rows, facecolor="tab:blue", alpha=0.6, edgecolor="black", lw=1))
    ax.text(left + columns / 2, -4, title, ha="center", va="bottom", fontsize=8.5)
    ax.text(left - 3, rows / 2, row_scale, ha="right", va="center", fontsize=8, rotation=90)
    ax.text(left + columns / 2, rows + 4, column_scale, ha="center", va="top", fontsize=8)


def swap_ab(m: int = SWAP_SHAPE[0], n: int = SWAP_SHAPE[1], k: int = SWAP_SHAPE[2]) -> Figure:
    """Left: one CTA's ring in KiB by part, for stage 14, the swap alone and stage 15. Right: the tile each
    accumulates per K block, the rows that hold products shaded, and which scale goes along which side."""
    rings = ring_bytes(m, n, k)
    fig = new_figure(11, 4.4)
    bars, tiles = fig.subplots(1, 2, width_ratios=(1.3, 1))
    for y, (label, ring) in enumerate(reversed(list(rings.items()))):
        left = 0.0
        for (part, color), size in zip(PARTS, ring["parts"]):
            bars.barh(y, size / 1024, left=left, color=color, edgecolor="black", lw=0.6)
            left += size / 1024
        config = ring["config"]
        bars.text(left + 3, y, f"{config.block_m} x {config.block_n} tiles x {config.stages} stages",
                  va="center", fontsize=8)
    bars.set_yticks(range(len(rings)), list(reversed(rings)), fontsize=8.5)
    bars.set_xlabel("KiB of one CTA's ring (SharedPlan: tiles x stages)")
    bars.set_xlim(0, 1.6 * max(sum(ring["parts"]) for ring in rings.values()) / 1024)
    bars.set_ylim(-0.5, len(rings) + 0.3)
    bars.legend(handles=[Patch(facecolor=c, edgecolor="black", label=p) for p, c in PARTS], fontsize=8,
                loc="upper right", ncols=3, columnspacing=0.8)
    bars.set_title(f"M={m} N={n} K={k}: what the ring holds", fontsize=9.5)
    before, ours = rings["stage 14"]["config"], rings["stage 15"]["config"]
    scale = 64 / before.block_m  # the 256-row tile drawn at a quarter of its size, as tall as the swapped one
    _tile(tiles, 0, before.block_m * scale, before.block_n * scale, min(m, before.block_m) * scale,
          f"stage 14:\n{before.block_m} token rows\nx {before.block_n} weight rows\n(at 1/4 size)",
          "sa[token] per row", "one sb")
    _tile(tiles, 50, ours.block_n, ours.block_m, ours.block_n,
          f"stage 15:\n{ours.block_n} weight rows\nx {ours.block_m} tokens\n(D transposed)",
          "one sb for every row", "sa[token]\nper column")
    tiles.set_xlim(-14, 50 + ours.block_m + 8)
    tiles.set_ylim(80, -30)
    tiles.set_aspect("equal")
    tiles.axis("off")
    tiles.set_title("per K block, the tile wgmma accumulates\n(shaded: rows that hold products)", fontsize=9.5)
    fig.suptitle("Stage 15: swap AB. The weight's rows are wgmma's 64-row side, the tokens its N: no zero-filled "
                 "rows, room for a deeper ring,\nand each token's A scale moves from a row of the accumulator to a "
                 "column", fontsize=10)
    return fig


__all__ = ["ring_bytes", "swap_ab", "SWAP_SHAPE"]
