"""Grouped GEMMs for Mixture-of-Experts: two layouts, one kernel each (a topic lesson, not a stage).

**Why MoE needs a grouped GEMM.** A DeepSeek-V3 MoE layer has 256 routed experts (plus one shared expert); a
router sends every token to 8 of them. Each routed expert is the same FFN shape: its up/gate projection is
(N = 2 x 2048, K = 7168) and its down projection (N = 7168, K = 2048), so all experts' weights stack into one
B of shape (G, N, K) with one 128x128 scale block grid per expert, sb (G, N/128, K/128). Only M differs: expert g
gets the M_g tokens the router sent it, anywhere from 0 to a few thousand, and changing with every batch. Running
G separate GEMMs would launch G kernels, most of them a handful of tiles on a 132-SM GPU; one *m-grouped* GEMM runs
every expert's tiles in one launch, with the same N, K, block shape and pipeline as the dense kernel. What
changes is only where a tile's rows of A and its B come from, and which tiles exist. There are two ways to
say that, because there are two situations.

**Contiguous layout (prefill, training): the counts are known on the host.** After the dispatch (an all-to-all
that brings each token to the GPUs holding its experts) the host knows how many tokens each local expert received.
So the tokens are permuted into one A of shape (sum M, K): expert 0's tokens, then expert 1's, and so on, each
group's rows starting at a multiple of ``gemm.get_m_alignment_for_contiguous_layout()`` = 128 and padded to it.
A device array ``m_indices`` (sum M,) int32 says each row's group, -1 for a padding row. The kernel is the dense
persistent GEMM over sum M rows; each tile reads ``g = m_indices[m0]`` (one load per tile, by the producer and by
the math warpgroups, which agree because they read the same word), takes B's rows ``g*N + n0`` of the (G*N, K)
stack, and skips a tile whose first index is -1. The alignment is what makes this work: with BLOCK_M dividing 128,
no tile spans two groups, so one B serves the whole tile. Padding costs at most 127 rows per expert.

**Masked layout (decode under CUDA graphs): the counts live on the device.** Decoding replays one captured CUDA
graph per step, and a graph is a fixed list of launches with fixed arguments: nothing may read a count back to the
host (a sync) or size a grid from it. So every expert gets a fixed slab of M_max rows, A (G, M_max, K), out
(G, M_max, N), and ``masked_m`` (G,) int32 *on the device* says how many rows of each slab are real (DeepEP's
low-latency dispatch writes exactly this). The kernel reads masked_m itself: only rows below masked_m[g] are
computed and written; the graph replays with new counts in the same buffer. Since the host does not know the
counts, it passes ``expected_m`` (say, the average tokens per expert) to pick the block shape and grid; any counts
in 0..M_max still compute correctly.

**What the scheduler does differently** (gemm/kernel/tile_scheduler.py). Dense persistent: CTA c computes tiles
c, c + grid, c + 2 grid, ... of the (m blocks x n blocks) grid (``schedule``, ``tile_coords``).
*Contiguous*: exactly that walk over sum M rows (``schedule``), plus the group read and the skip
(``TileScheduler._contiguous_group``); a CTA whose tile is padding just moves on, so the walk is static and the
host-side :func:`contiguous_tiles` is the dense schedule filtered by m_indices. *Masked*: the tile count is not
known when the grid is launched, so CTA c walks *virtual* tile indices c, c + grid, ... that number group 0's
tiles, then group 1's, and so on, where group g has ceil(masked_m[g] / BLOCK_M) x n blocks of them; an empty
group has none and costs nothing. A CTA's index only grows, so it keeps a cursor (its current group and that
group's first virtual tile) and moves it forward, reading masked_m once per group it passes
(``TileScheduler._masked_tiles``; ``masked_schedule`` is the same walk in Python, which :func:`masked_tiles`
calls). Inside a group the order is the dense one, raster groups included. A row of group g lives at row
g*M_max + m of the flattened (G*M_max, K) A and out, and the epilogue stores only rows below g*M_max + masked_m[g].

**Multicast only within one group.** TMA multicast (stage 09) lets the two CTAs of a cluster share a load because
their tiles share B (same n block) or A rows. In a grouped GEMM two tiles share B only if they are in the same
group, so a pair straddling two experts could not multicast B; DeepGEMM checks that per pair. This library's grouped
kernels do not multicast at all (``KernelConfig(gemm_type=..., multicast=2)`` is refused): the scheduler would
have to keep both CTAs of a cluster in one group at every step.

**Padding rows.** Contiguous: a tile whose *first* row is -1 is skipped and its rows of out are left as they were;
the -1 rows at the end of a group's last computed tile are computed with that group's B and get meaningless
(finite) values, which :func:`combine` never reads. Masked: rows at or past masked_m[g] are never stored (the tile
still reads them, possibly the next group's rows when M_max is not a multiple of BLOCK_M, but discards them), so
the slab keeps whatever it held. Either way the rows that matter are exactly the routed tokens, and the
inverse permutation that :func:`dispatch` returns brings them back to their tokens, weighted by the router.

The helpers below are NumPy only (no GPU, no kernel): :func:`dispatch` turns a router's top-k expert ids into
both layouts, :func:`permute` builds A from the tokens, :func:`combine` sums the experts' outputs back per token,
and :func:`contiguous_tiles` / :func:`masked_tiles` list the tiles each CTA computes, in order, with the
kernel's own scheduler functions. ``notebooks/moe_grouped.ipynb`` runs them, and both grouped GEMMs, on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemm.fp8 import ceil_div
from gemm.kernel.tile_scheduler import masked_schedule, schedule

try:  # the layout rule lives with the kernel config
    from gemm.kernel.config import CONTIGUOUS_ALIGNMENT as ALIGNMENT
except ImportError:  # pragma: no cover - a checkout without the grouped kernels
    ALIGNMENT = 128

TITLE = "Grouped GEMMs for MoE: the contiguous and the masked layout"


# ------------------------------------------------------------------------------------------ routing
def random_routing(tokens: int, experts: int, top_k: int, rng=None, skew: float = 1.0):
    """A toy router: (topk_ids (T, top_k) int32, topk_weights (T, top_k) float32). Each token picks ``top_k``
    distinct experts by softmax-sampled scores; ``skew`` > 0 makes some experts popular and others rarely chosen
    (real routers are unbalanced), so some groups are large and some empty. Weights sum to 1 per token."""
    rng = np.random.default_rng() if rng is None else rng
    popularity = rng.normal(0.0, skew, experts)
    scores = popularity[None, :] + rng.gumbel(size=(tokens, experts))  # Gumbel top-k: sampling without replacement
    ids = np.argsort(-scores, axis=1)[:, :top_k].astype(np.int32)
    logits = np.take_along_axis(scores, ids, axis=1)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return ids, (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


def tokens_per_expert(topk_ids, experts: int) -> np.ndarray:
    """(G,) int64: how many (token, choice) pairs each expert received; ids < 0 (not routed here) are ignored."""
    ids = np.asarray(topk_ids).ravel()
    return np.bincount(ids[ids >= 0], minlength=experts)[:experts]


def _as_routing(routing, experts: int | None) -> tuple[np.ndarray, int]:
    """(topk_ids (T, top_k), G). A 2-D ``routing`` is top-k ids (-1: not routed to this rank); a 1-D one is
    tokens per expert, turned into a top-1 routing of sum(counts) tokens sorted by expert."""
    routing = np.asarray(routing)
    if routing.ndim == 1:
        counts = routing.astype(np.int64)
        if (counts < 0).any():
            raise ValueError(f"tokens per expert must be >= 0, got {counts.tolist()}")
        experts = len(counts) if experts is None else experts
        if len(counts) != experts:
            raise ValueError(f"{len(counts)} counts for {experts} experts")
        return np.repeat(np.arange(experts), counts).astype(np.int32)[:, None], experts
    if routing.ndim != 2:
        raise ValueError(f"routing must be top-k ids (T, top_k) or tokens per expert (G,), got shape {routing.shape}")
    if experts is None:
        experts = int(routing.max()) + 1 if routing.size and routing.max() >= 0 else 0
    if routing.size and routing.max() >= experts:
        raise ValueError(f"expert id {int(routing.max())} out of range for {experts} experts")
    return routing.astype(np.int32), experts


# ------------------------------------------------------------------------------------------ layouts
@dataclass(frozen=True)
class ContiguousLayout:
    """One A of ``len(m_indices)`` rows, every group's rows aligned to ``alignment`` and padded with -1.

    ``source`` (sum M,): the token each row of A holds, -1 for padding; ``m_indices`` (sum M,) int32: its group
    (what the kernel reads); ``position`` (T, top_k): the row of A (and of out) holding each (token, choice), -1
    where the choice was not routed here (the inverse permutation :func:`combine` uses); ``starts`` / ``counts``
    (G,): each group's first row and real row count (an empty group has no rows, its start is where it would be)."""
    source: np.ndarray
    m_indices: np.ndarray
    position: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    alignment: int

    @property
    def rows(self) -> int:
        return len(self.m_indices)

    @property
    def padding(self) -> int:
        return int((self.m_indices < 0).sum())


@dataclass(frozen=True)
class MaskedLayout:
    """A slab of ``m_max`` rows per group: A (G, M_max, K), out (G, M_max, N).

    ``source`` (G, M_max): the token each slot holds, -1 for an empty slot; ``masked_m`` (G,) int32: the filled
    slots of each group (what the kernel reads, on the device); ``position`` (T, top_k): the flattened slot
    g*M_max + i of each (token, choice), -1 where not routed here; ``expected_m``: the host's guess for the
    heuristics (the mean count of the groups that got tokens, at least 1)."""
    source: np.ndarray
    masked_m: np.ndarray
    position: np.ndarray
    m_max: int
    expected_m: int


@dataclass(frozen=True)
class Dispatch:
    """Both layouts of one routing. ``topk_ids`` (T, top_k) as given (or made from counts)."""
    topk_ids: np.ndarray
    experts: int
    contiguous: ContiguousLayout
    masked: MaskedLayout | None


def _order(topk_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Routed (token, choice) pairs sorted by expert, stably (token order inside an expert): (flat index, expert)."""
    flat = topk_ids.ravel()
    routed = np.flatnonzero(flat >= 0)
    order = routed[np.argsort(flat[routed], kind="stable")]
    return order, flat[order]


def dispatch_contiguous(topk_ids, experts: int | None = None, alignment: int = ALIGNMENT) -> ContiguousLayout:
    """The contiguous layout of a routing (top-k ids (T, top_k), or tokens per expert (G,))."""
    topk_ids, experts = _as_routing(topk_ids, experts)
    top_k = topk_ids.shape[1]
    counts = tokens_per_expert(topk_ids, experts)
    padded = ceil_div(counts, alignment) * alignment  # an empty group takes no rows
    starts = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64)
    total = int(padded.sum())
    source = np.full(total, -1, np.int64)
    m_indices = np.full(total, -1, np.int32)
    position = np.full(topk_ids.size, -1, np.int64)
    order, expert = _order(topk_ids)
    rank = np.arange(len(order)) - np.concatenate([[0], np.cumsum(counts)[:-1]])[expert]  # index inside the group
    rows = starts[expert] + rank
    source[rows] = order // top_k
    m_indices[rows] = expert
    position[order] = rows
    return ContiguousLayout(source, m_indices, position.reshape(topk_ids.shape), starts, counts, alignment)


def dispatch_masked(topk_ids, experts: int | None = None, m_max: int | None = None) -> MaskedLayout:
    """The masked layout of a routing: each group's (token, choice) pairs in slots 0..count-1 of its M_max slab.
    ``m_max`` None: the largest count (a real decode sizes it once, for the worst case, before capturing the
    graph). A group with more than M_max pairs is an error: the slab cannot hold them."""
    topk_ids, experts = _as_routing(topk_ids, experts)
    counts = tokens_per_expert(topk_ids, experts)
    m_max = max(int(counts.max(initial=0)), 1) if m_max is None else int(m_max)
    if m_max <= 0:
        raise ValueError(f"m_max must be positive, got {m_max}")
    over = np.flatnonzero(counts > m_max)
    if over.size:
        g = int(over[0])
        raise ValueError(f"expert {g} received {int(counts[g])} tokens but the masked layout has M_max = {m_max} slots "
                         f"per expert ({over.size} expert(s) overflow, the largest needs {int(counts.max())}): raise "
                         "m_max (DeepEP's low-latency dispatch sizes it num_max_dispatch_tokens_per_rank x num_ranks) "
                         "or drop the excess tokens before the GEMM")
    top_k = topk_ids.shape[1]
    source = np.full((experts, m_max), -1, np.int64)
    position = np.full(topk_ids.size, -1, np.int64)
    order, expert = _order(topk_ids)
    slot = np.arange(len(order)) - np.concatenate([[0], np.cumsum(counts)[:-1]])[expert]
    source[expert, slot] = order // top_k
    position[order] = expert * m_max + slot
    busy = counts[counts > 0]
    expected = max(ceil_div(int(busy.sum()), len(busy)), 1) if busy.size else 1
    return MaskedLayout(source, counts.astype(np.int32), position.reshape(topk_ids.shape), m_max, expected)


def dispatch(routing, experts: int | None = None, *, alignment: int = ALIGNMENT, m_max: int | None = None,
             masked: bool = True) -> Dispatch:
    """A router's top-k assignment -> both grouped-GEMM layouts.

    ``routing``: top-k expert ids (T, top_k) (ids < 0: the choice is not routed to this rank, as DeepEP marks it),
    or tokens per expert (G,) (a top-1 routing of that many tokens is made, tokens sorted by expert).
    ``experts``: G (default: the largest id + 1). ``alignment``: the contiguous layout's row alignment (the
    kernel's is 128). ``m_max``: the masked layout's slots per expert (default: the largest count); ``masked=False``
    skips the masked layout (e.g. when a count would overflow ``m_max``)."""
    topk_ids, experts = _as_routing(routing, experts)
    return Dispatch(topk_ids, experts, dispatch_contiguous(topk_ids, experts, alignment),
                    dispatch_masked(topk_ids, experts, m_max) if masked else None)


def permute(x, layout) -> np.ndarray:
    """The grouped GEMM's A from the tokens: x (T, ...) -> (sum M, ...) rows (contiguous) or (G, M_max, ...)
    slabs (masked), padding rows zero. Works for the FP8 codes and for their 1x128 scales alike: the activation
    scales are per token, so casting before or after the dispatch gives the same bytes (DeepEP dispatches FP8)."""
    x = np.asarray(x)
    source = layout.source
    out = np.zeros(source.shape + x.shape[1:], x.dtype)
    filled = source >= 0
    out[filled] = x[source[filled]]
    return out


def combine(out, layout, topk_weights=None) -> np.ndarray:
    """y (T, N) = sum over each token's routed choices of weight x its expert's output row. ``out``: the grouped
    GEMM's output, (sum M, N) or (G, M_max, N) (any float dtype; padding rows are never read). ``topk_weights``
    (T, top_k): the router's weights (default 1). Choices not routed here (position -1) add nothing."""
    out = np.asarray(out, np.float64)
    flat = out.reshape(-1, out.shape[-1])
    position = layout.position
    weights = np.ones(position.shape) if topk_weights is None else np.asarray(topk_weights, np.float64)
    if weights.shape != position.shape:
        raise ValueError(f"topk_weights must have shape {position.shape} (T, top_k), got {weights.shape}")
    y = np.zeros((position.shape[0], flat.shape[1]))
    for choice in range(position.shape[1]):  # only the routed rows are read: padding may hold anything, NaN too
        tokens = np.flatnonzero(position[:, choice] >= 0)
        y[tokens] += weights[tokens, choice, None] * flat[position[tokens, choice]]
    return y


# ------------------------------------------------------------------------------------------ the tile walks
Tile = tuple[int, int, int]  # (group, m block, n block); for contiguous the m block counts over all sum M rows


def contiguous_tiles(m_indices, block_m: int, n: int, block_n: int, *, grid: int | None = None,
                     raster_group: int = 0, groups: int | None = None, skipped: bool = False) -> list[list[Tile]]:
    """The (group, m block, n block) tiles each CTA of a contiguous grouped GEMM computes, in order: ``[cta][step]``.

    The kernel's walk (gemm/kernel/tile_scheduler.py): the dense ``schedule(cta, grid, m_blocks, n_blocks,
    raster_group)`` over sum M rows, and per tile ``g = m_indices[m0]``, skipped unless 0 <= g < G
    (``TileScheduler._contiguous_group``). ``grid`` None: one CTA per tile (a non-persistent launch). ``groups``:
    G (default: the largest index + 1). ``skipped=True`` keeps the skipped tiles, as (-1, m block, n block): the
    steps a CTA spends on padding (a load of m_indices and a branch)."""
    m_indices = np.asarray(m_indices)
    if block_m <= 0 or ALIGNMENT % block_m:
        raise ValueError(f"block_m must divide the alignment {ALIGNMENT} (no tile may span two groups), got {block_m}")
    groups = int(m_indices.max(initial=-1)) + 1 if groups is None else groups
    m_blocks, n_blocks = ceil_div(len(m_indices), block_m), ceil_div(n, block_n)
    grid = m_blocks * n_blocks if grid is None else grid
    walks = []
    for cta in range(grid):
        walk = []
        for mb, nb in schedule(cta, grid, m_blocks, n_blocks, raster_group):
            g = int(m_indices[mb * block_m])
            if 0 <= g < groups:
                walk.append((g, mb, nb))
            elif skipped:
                walk.append((-1, mb, nb))
        walks.append(walk)
    return walks


def masked_tiles(masked_m, m_max: int, block_m: int, n_blocks: int, grid: int, raster_group: int = 0
                 ) -> list[list[Tile]]:
    """The (group, m block inside the group, n block) tiles each CTA of a masked grouped GEMM computes, in order:
    ``[cta][step]``. Calls the scheduler's own Python walk, ``gemm.kernel.tile_scheduler.masked_schedule`` (virtual tile
    indices c, c + grid, ... over the groups' tiles in order; group g has ceil(clamp(masked_m[g], 0, M_max) /
    BLOCK_M) x n_blocks of them)."""
    return [masked_schedule(cta, grid, masked_m, m_max, block_m, n_blocks, raster_group) for cta in range(grid)]


def walk_table(walks: list[list[Tile]], width: int = 12) -> str:
    """The walks as text: one line per CTA, ``g2 m1 n0`` per step (``skip m3 n1`` for a skipped tile)."""
    def cell(tile):
        g, mb, nb = tile
        return (f"skip m{mb} n{nb}" if g < 0 else f"g{g} m{mb} n{nb}").ljust(width)
    steps = max((len(w) for w in walks), default=0)
    lines = ["CTA  " + "".join(f"step {s}".ljust(width) for s in range(steps))]
    lines += [f"{cta:3d}  " + "".join(cell(t) for t in walk) for cta, walk in enumerate(walks)]
    return "\n".join(line.rstrip() for line in lines)


__all__ = ["ALIGNMENT", "TITLE", "random_routing", "tokens_per_expert", "ContiguousLayout", "MaskedLayout", "Dispatch",
           "dispatch", "dispatch_contiguous", "dispatch_masked", "permute", "combine", "contiguous_tiles",
           "masked_tiles", "walk_table"]
