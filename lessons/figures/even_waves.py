"""Stage 17: how many tiles each CTA of a persistent walk computes, with one CTA per SM (stage 16) and with even
waves (stage 17), from the stages' configs, ``gemm.kernel.launch.grid`` and the walk itself
(``gemm.kernel.tile_scheduler.schedule``): at the ladder's shape 116 CTAs walk four tiles and 16 walk three, or 128
walk four."""
from __future__ import annotations

from matplotlib.figure import Figure

from lessons.figures.drawing import LADDER_SHAPE, new_figure

SM_COUNT = 132  # the H100's and H200's SMs, as the heuristics assume without a GPU
WALK_COLORS = {"full": "tab:blue", "short": "tab:orange"}


def walk_lengths(number: int, m: int, n: int, k: int, sm_count: int = SM_COUNT) -> dict:
    """Stage ``number``'s persistent walk at (m, n, k): its config, the CTAs launched and the tiles each computes."""
    import lessons
    from gemm.fp8 import ceil_div
    from gemm.kernel.launch import grid
    from gemm.kernel.tile_scheduler import schedule
    config = lessons.stage(number).config(m, n, k)
    m_blocks, n_blocks = ceil_div(m, config.block_m), ceil_div(n, config.block_n)
    ctas = grid(config, m, n, sm_count)
    lengths = [len(schedule(cta, ctas, m_blocks, n_blocks, config.raster_group)) for cta in range(ctas)]
    return {"config": config, "tiles": m_blocks * n_blocks, "ctas": ctas, "lengths": lengths}


def _bars(ax, walk: dict, title: str, sm_count: int) -> None:
    lengths, longest = walk["lengths"], max(walk["lengths"])
    colors = [WALK_COLORS["full" if length == longest else "short"] for length in lengths]
    ax.bar(range(len(lengths)), lengths, width=1.0, color=colors, edgecolor="white", lw=0.3)
    ax.set_xlim(-0.5, sm_count - 0.5)
    ax.set_ylim(0, longest + 0.9)
    ax.set_ylabel("tiles walked", fontsize=9)
    short = sum(length < longest for length in lengths)
    ax.set_title(f"{title}: {walk['ctas']} CTAs for {walk['tiles']} tiles, {longest} waves; "
                 f"{walk['ctas'] - short} walk {longest} tiles, {short} walk fewer", fontsize=9.5)


def even_waves(shape=LADDER_SHAPE, sm_count: int = SM_COUNT) -> Figure:
    """Tiles walked per CTA at ``shape``: stage 16 (one CTA per SM) above, stage 17 (even waves) below."""
    from matplotlib.patches import Patch
    fig = new_figure(11, 5.0)
    top, bottom = fig.subplots(2, 1, sharex=True)
    _bars(top, walk_lengths(16, *shape, sm_count), "stage 16, one CTA per SM", sm_count)
    _bars(bottom, walk_lengths(17, *shape, sm_count), "stage 17, even waves", sm_count)
    bottom.set_xlabel(f"CTA (one per SM; {sm_count} SMs)", fontsize=9)
    top.legend(handles=[Patch(color=WALK_COLORS["full"], label="walks the longest: sets the kernel's time"),
                        Patch(color=WALK_COLORS["short"], label="walks fewer: idle through the last wave")],
               loc="lower left", fontsize=8.5)
    m, n, k = shape
    fig.suptitle(f"Even waves at {m}x{n}x{k}: the same number of waves from fewer CTAs", fontsize=11)
    return fig


__all__ = ["SM_COUNT", "walk_lengths", "even_waves"]
