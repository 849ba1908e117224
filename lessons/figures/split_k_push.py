"""Stage 18: split-K's two exchanges side by side at the decode shape (stage 17 gathers the peers' totals between
two cluster-barrier phases, stage 18's peers push them into rank 0's inbox), and rank 0's shared memory with the
inbox, from the byte plan the kernels are built from (gemm.kernel.config.SharedPlan) and the K shares
(gemm.kernel.config.k_share)."""
from __future__ import annotations

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from lessons.figures.drawing import new_figure

PUSH_SHAPE = (16, 2112, 7168)  # stage 18's home shape (lessons/18_split_k_push.py SHAPE)
RING_SHAPE = (64, 2112, 7168)  # stage 17's 256 x 64 tiles split over two: a 64 KiB inbox costs a ring stage
RANK_COLORS = colormaps["tab10"]  # cluster rank r: colour r, as in the figure 12_split_k_cluster
REGION_COLORS = {"A ring": "tab:blue", "B ring": "tab:orange", "scales": "tab:olive", "D tile": "tab:purple",
                 "barriers": "0.3", "inbox": "tab:red"}


def shared_map(number: int, m: int, n: int, k: int) -> dict:
    """Stage ``number``'s rank 0 shared memory at (m, n, k): its config, ``regions`` as (name, first byte, end) in
    address order, the inbox cut into one slot per peer (``slots``: (peer rank, first, end)), and the bytes in all."""
    import lessons
    from gemm.kernel.config import SharedPlan
    config = lessons.stage(number).config(m, n, k)
    plan = SharedPlan(config, n, k)
    barriers_end = plan.inbox_barrier + 8 if config.split_k_push else plan.empty_region + 8 * config.stages
    regions = [("A ring", 0, plan.b_region), ("B ring", plan.b_region, plan.sa_region),
               ("scales", plan.sa_region, plan.d_region), ("D tile", plan.d_region, plan.sb_region),
               ("scales", plan.sb_region, plan.full_region), ("barriers", plan.full_region, barriers_end)]
    slots = []
    if config.split_k_push:
        regions.append(("inbox", plan.inbox_region, plan.inbox_region + plan.inbox_bytes))
        slots = [(peer, plan.inbox_region + (peer - 1) * plan.partials_bytes,
                  plan.inbox_region + peer * plan.partials_bytes) for peer in range(1, config.split_k)]
    return {"config": config, "regions": [r for r in regions if r[2] > r[1]], "slots": slots,
            "partials_bytes": plan.partials_bytes, "shared_bytes": plan.shared_bytes}


def _step(ax, x, y, text, rank):
    ax.text(x, y, text, ha="center", va="center", fontsize=8,
            bbox=dict(boxstyle="round", fc=RANK_COLORS(rank), alpha=0.35, ec="black"))


def _phase(ax, y, text):
    ax.plot([1, 99], [y, y], "k--", lw=1.2)
    ax.text(1, y - 0.08, text, ha="left", va="bottom", fontsize=8, style="italic")


def _lanes(ax, config, k: int, title: str) -> None:
    """The two CTAs' columns (rank 0 left, the peers right) with their K shares from k_share; time runs down."""
    from gemm.kernel.config import k_share
    blocks = -(-k // 128)
    peers = "rank 1" if config.split_k == 2 else f"ranks 1-{config.split_k - 1}"
    for x, rank, who in ((25, 0, "rank 0"), (75, 1, peers)):
        first, end = k_share(rank, config.split_k, blocks)
        ax.text(x, 0, f"CTA {who}", ha="center", va="center", fontsize=9.5, weight="bold")
        _step(ax, x, 1.5, f"K blocks {first}-{end - 1} -> FP32 totals", rank)
    ax.set_xlim(0, 100)
    ax.set_ylim(6.4, -0.4)
    ax.axis("off")
    ax.set_title(title, fontsize=9.5)


def _gathered(ax, config, k: int, kib: float) -> None:
    _lanes(ax, config, k, "stage 17, gathered (_Kernel.gather_partials): two cluster-barrier phases")
    _step(ax, 75, 2.4, f"st.shared.v4: totals into its own ring ({kib:g} KiB)", 1)
    _phase(ax, 3.0, "phase 1: every thread of every CTA (producers too) arrives and waits")
    _step(ax, 25, 3.7, "mapa + ld.shared::cluster.v4: read the\npeer's totals over DSMEM, add.f32", 0)
    ax.annotate("", xy=(41, 3.65), xytext=(64, 2.45), arrowprops=dict(arrowstyle="->", lw=2, color=RANK_COLORS(1)))
    _phase(ax, 4.6, "phase 2: rank 0 arrives after its reads; the peers wait for it, then exit")
    _step(ax, 25, 5.4, "epilogue: the D tile", 0)
    _step(ax, 75, 5.4, "exit", 1)


def _pushed(ax, config, k: int, kib: float, expected: int) -> None:
    _lanes(ax, config, k, "stage 18, pushed (_Kernel.push_partials): one phase, at the start")
    _phase(ax, 1.0, f"start: each rank inits its inbox barrier; rank 0's thread 0 arrives on its own, expecting "
           f"{expected:,} bytes\n(every peer's); then every thread arrives on the cluster barrier (.relaxed), none waits")
    _step(ax, 75, 2.6, f"cluster wait (the inbox barrier is ready),\nst.async: totals into rank 0's inbox ({kib:g} "
          "KiB),\ncomplete_tx on rank 0's inbox barrier", 1)
    _step(ax, 25, 3.9, "try_wait.parity.acquire.cluster,\nthen ld.shared.v4 from its own inbox, add.f32", 0)
    ax.annotate("", xy=(41, 3.8), xytext=(59, 2.95), arrowprops=dict(arrowstyle="->", lw=2, color=RANK_COLORS(1)))
    _step(ax, 75, 3.9, "exit", 1)
    _step(ax, 25, 5.4, "epilogue: the D tile", 0)


def _memory(ax, maps: list[tuple[str, dict]]) -> None:
    """One bar per (label, shared_map), in KiB, the inbox's slots outlined, with the block's shared-memory limit."""
    from gemm.kernel.config import SHARED_LIMIT
    for row, (label, plan) in enumerate(maps):
        for name, first, end in plan["regions"]:
            ax.barh(row, (end - first) / 1024, left=first / 1024, color=REGION_COLORS[name], edgecolor="black", lw=0.4)
        for peer, first, end in plan["slots"]:
            if end - first < 12 * 1024:  # too narrow to hold its label
                continue
            ax.text((first + end) / 2048, row, f"rank {peer}", ha="center", va="center", fontsize=7, color="white")
        config = plan["config"]
        ax.text(plan["shared_bytes"] / 1024 + 2, row, f"{config.block_m} x {config.block_n} tiles, "
                f"{config.stages} stages, {plan['shared_bytes']:,} B", va="center", fontsize=8,
                bbox=dict(fc="white", ec="none", pad=0.5))
    ax.axvline(SHARED_LIMIT / 1024, color="black", lw=1, ls=":")
    ax.text(SHARED_LIMIT / 1024, -0.75, f"a block's limit, {SHARED_LIMIT // 1024} KiB", ha="center", fontsize=8)
    ax.set_yticks(range(len(maps)), [label for label, _ in maps], fontsize=8.5)
    ax.set_ylim(len(maps) - 0.5, -1)
    ax.set_xlim(0, 330)
    ax.set_xlabel("KiB of a CTA's dynamic shared memory (SharedPlan; the same in every rank), in address order")
    ax.legend(handles=[Patch(facecolor=c, edgecolor="black", label=name) for name, c in REGION_COLORS.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=8, ncols=len(REGION_COLORS))


def split_k_push(shape: tuple[int, int, int] = PUSH_SHAPE, ring_shape: tuple[int, int, int] = RING_SHAPE) -> Figure:
    """The gathered and the pushed exchange at ``shape`` (stage 17 against 18), then rank 0's shared memory for both
    at ``shape`` and at ``ring_shape``, where the inbox takes a ring stage."""
    m, n, k = shape
    gathered, pushed = shared_map(17, m, n, k), shared_map(18, m, n, k)
    kib = pushed["partials_bytes"] / 1024
    fig = new_figure(13, 9.5)
    grid = fig.add_gridspec(2, 2, height_ratios=(1.5, 1))
    left, right, bottom = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
    _gathered(left, gathered["config"], k, kib)
    _pushed(right, pushed["config"], k, kib, sum(end - first for _, first, end in pushed["slots"]))
    _memory(bottom, [(f"stage {number}, {'x'.join(map(str, where))}", shared_map(number, *where))
                                for where in (shape, ring_shape) for number in (17, 18)])
    fig.suptitle(f"Stage 18 at {m} x {n} x {k}: the peers push their partial totals into rank 0's inbox with "
                 f"st.async and exit; rank 0 expects their bytes\n(split over {pushed['config'].split_k}: one peer, "
                 f"{kib:g} KiB), one cluster-barrier phase instead of two around the exchange", fontsize=10.5)
    return fig


__all__ = ["PUSH_SHAPE", "RING_SHAPE", "shared_map", "split_k_push"]
