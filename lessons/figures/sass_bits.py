"""Stage 10: the yield and Rb-reuse control bits of every promotion FFMA, before and after the interleave pass
(stage 09 and 10 cubins, assembled and disassembled on the CPU; ptx.passes reads the bits)."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import lessons
from lessons.figures.drawing import LADDER_SHAPE, new_figure


DECODE_SHAPE = (64, 7168, 16384)  # one math warpgroup (256 threads): ptxas writes no yields there


def ffma_listings(shapes=(LADDER_SHAPE, DECODE_SHAPE)) -> dict:
    """{(m, n, k): (stage 09 SASS, stage 10 SASS, threads)}: the cubins assembled (ptxas/nvJitLink, no GPU) and
    disassembled (nvdisasm)."""
    from lessons.diff_stages import stage_cubin
    from ptx.sass import disassemble
    return {shape: (disassemble(stage_cubin(9, *shape)), disassemble(stage_cubin(10, *shape)),
                    lessons.stage(10).config(*shape).threads) for shape in shapes}


def ffma_bits(before, after) -> dict[str, np.ndarray]:
    """Per FFMA of the listings, in order: the yield and Rb-reuse bits before and after, and which changed."""
    from ptx.passes import is_yield, reuse_b
    old = [i for i in before if i.opcode == "FFMA"]
    new = [i for i in after if i.opcode == "FFMA"]
    if [(i.function, i.offset) for i in old] != [(i.function, i.offset) for i in new]:
        raise ValueError("the two listings do not have the same FFMAs at the same offsets")
    return {"yield_before": np.array([is_yield(i.encoding) for i in old], bool),
            "yield_after": np.array([is_yield(i.encoding) for i in new], bool),
            "reuse_before": np.array([reuse_b(i.encoding) for i in old], bool),
            "reuse_after": np.array([reuse_b(i.encoding) for i in new], bool),
            "changed": np.array([x.encoding != y.encoding for x, y in zip(old, new)], bool)}


def ffma_yield_bits(listings: dict | None = None) -> Figure:
    """``listings``: {(m, n, k): (before, after, threads)} (ffma_listings() when None)."""
    from ptx.passes import FLIP_MASK, NO_YIELD_BIT, REUSE_B_BIT, ffma_runs
    listings = ffma_listings() if listings is None else listings
    fig = new_figure(15, 1.6 + 2.3 * len(listings))
    axes = fig.subplots(len(listings) + 1, 1, gridspec_kw={"height_ratios": [0.55] + [1] * len(listings)})
    ax = axes[0]
    for bit in range(64):
        special = {NO_YIELD_BIT: ("tab:green", "45: no-yield (inverted)"), REUSE_B_BIT: ("tab:orange", "59: Rb reuse")}
        color, label = special.get(bit, ("0.93", None))
        ax.add_patch(Rectangle((63 - bit, 0), 1, 1, fc=color, ec="white"))
        ax.text(63 - bit + 0.5, 0.5, str(FLIP_MASK >> bit & 1), ha="center", va="center", fontsize=6)
        if label:
            ax.text(63 - bit + 0.5, 1.15, label, ha="center", va="bottom", fontsize=7)
        elif bit % 8 == 0:
            ax.text(63 - bit + 0.5, -0.15, str(bit), ha="center", va="top", fontsize=6)
    ax.set_xlim(-0.5, 64.5)
    ax.set_ylim(-0.8, 2.0)
    ax.axis("off")
    ax.set_title(f"high 64-bit word of a Hopper instruction: the pass clears FLIP_MASK = {FLIP_MASK:#018x} "
                 "(1 = flipped): yield on, Rb reuse off", fontsize=9)
    on = {"yield": np.array([0.17, 0.63, 0.17]), "reuse": np.array([1.0, 0.5, 0.05])}
    for ax, ((m, n, k), (before, after, threads)) in zip(axes[1:], listings.items()):
        bits = ffma_bits(before, after)
        rows = [("yield, 09", "yield", bits["yield_before"]), ("yield, 10", "yield", bits["yield_after"]),
                ("Rb reuse, 09", "reuse", bits["reuse_before"]), ("Rb reuse, 10", "reuse", bits["reuse_after"])]
        count = bits["changed"].size
        image = np.full((len(rows), count, 3), 0.93)
        for r, (_, kind, values) in enumerate(rows):
            image[r, values] = on[kind]
        ax.imshow(image, aspect="auto", extent=(-0.5, count - 0.5, len(rows) - 0.5, -0.5), interpolation="nearest")
        ax.vlines(np.arange(count - 1) + 0.5, -0.5, len(rows) - 0.5, color="white", lw=0.5)
        ax.hlines(np.arange(len(rows) - 1) + 0.5, -0.5, count - 0.5, color="white", lw=0.8)
        for c in np.flatnonzero(bits["changed"]):
            ax.add_patch(Rectangle((c - 0.5, -0.5), 1, len(rows), fill=False, lw=1.5, ec="red"))
        ffma = [i for i in before if i.opcode == "FFMA"]
        column = {(i.function, i.offset): c for c, i in enumerate(ffma)}
        for run in ffma_runs(before):
            first, last = column[run[0].function, run[0].offset], column[run[-1].function, run[-1].offset]
            ax.plot([first - 0.4, last + 0.4], [len(rows) - 0.3] * 2, color="black", lw=3, clip_on=False)
            ax.plot([first - 0.4, first - 0.4 + len(run) * 9 // 16], [len(rows) - 0.15] * 2, color="0.5", lw=2,
                    clip_on=False)
        ax.set_yticks(range(len(rows)), [label for label, *_ in rows])
        ax.set_xticks(range(0, count, 8))
        ax.tick_params(labelsize=7)
        ax.set_title(f"M={m} N={n} K={k}, {threads} threads: {count} FFMAs in listing order (green: yields, orange: "
                     f"keeps Rb; red box: flipped by the pass, {int(bits['changed'].sum())})", fontsize=9)
    axes[-1].set_xlabel("FFMA index in the kernel (black bar: a run of >= 8; grey: its first 9/16, where DeepGEMM's "
                        "rule may flip)")
    fig.suptitle("Stage 10: the FFMA interleave pass (ptx.passes), stage 09's cubin before and stage 10's after",
                 fontsize=10)
    return fig
