"""The cells of notebooks/moe_grouped.ipynb: grouped GEMMs for MoE, why there are two layouts, how the scheduler
walks each, and how a dispatcher's output feeds them. The story is lessons/moe_grouped.py's docstring (printed, not
re-told here); every table is computed by its helpers and by the kernel's scheduler functions when the notebook
runs; both grouped GEMMs run on the CPU emulator (gemm.testing.emulated.run_grouped_gemm) and, on a Hopper GPU, for real.
Every cell runs on a CPU in seconds.

``cells()`` returns the cell list for lessons.notebooks.write.
"""
from __future__ import annotations

from lessons.notebooks.ipynb import code, markdown

INTRO = """\
# MoE · grouped GEMMs: the contiguous and the masked layout

A Mixture-of-Experts layer runs one GEMM per expert, all with the same N and K and a different M. This notebook
follows one batch of tokens from the router to the two grouped GEMMs of `gemm` and back: the router's top-k
choices, the dispatch into either layout, the tiles each CTA of the kernel computes, an emulated run of both
kernels checked expert by expert, and the combine that returns every token its weighted experts' outputs.

The story is the docstring of `lessons/moe_grouped.py`, printed by the first cell.
"""

SETUP = '''\
import os, sys
# Works from notebooks/ (Jupyter) or from the repository root (tests): make the repository importable.
ROOT = os.path.dirname(os.getcwd()) if os.path.basename(os.getcwd()) == "notebooks" else os.getcwd()
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np

from lessons import moe_grouped as mg
from ptx.device import has_gpu, is_hopper

print(mg.__doc__)
print("GPU:", "Hopper" if is_hopper() else "present, not Hopper" if has_gpu() else
      "none (the CPU emulator runs the kernels)")'''

DISPATCH_NOTE = """\
## 1 · Router → dispatch → both layouts

A toy router (`mg.random_routing`) sends each of 96 tokens to 2 of 8 experts, with skewed popularity as real
routers have, so some experts get many tokens and some none. `mg.dispatch` turns the (T, top_k) expert ids into:

* the **contiguous** layout: `source` (which token each row of A holds, -1 for padding), `m_indices` (each row's
  group, what the kernel reads), every group starting at a multiple of 128 (`gemm.get_m_alignment_for_contiguous_
  layout()`); an empty expert takes no rows at all;
* the **masked** layout: a slab of `M_max` slots per expert, `masked_m` the filled ones, `expected_m` the host's
  guess for the heuristics.

Both carry `position` (T, top_k): where each (token, choice) landed, the inverse permutation the combine uses.
"""

DISPATCH_CELL = '''\
from gemm.testing.records import Column, format_table

rng = np.random.default_rng(9)
T, G, TOP_K = 96, 8, 2
M_MAX = T  # a token picks distinct experts, so no expert gets more than T: this never overflows
topk_ids, topk_weights = mg.random_routing(T, G, TOP_K, rng, skew=1.5)
print("token 0 goes to experts", topk_ids[0].tolist(), "with weights", np.round(topk_weights[0], 3).tolist())

routed = mg.dispatch(topk_ids, G, m_max=M_MAX)
cont, masked = routed.contiguous, routed.masked
rows = [{"g": g, "tokens": int(cont.counts[g]), "start": int(cont.starts[g]),
         "rows": int(-(-cont.counts[g] // cont.alignment) * cont.alignment), "masked_m": int(masked.masked_m[g])}
        for g in range(G)]
print(format_table([Column("g", "expert"), Column("tokens", "tokens"), Column("start", "contiguous: first row"),
                    Column("rows", "rows (aligned)"), Column("masked_m", "masked_m")], rows))
print(f"\\ncontiguous A: {cont.rows} rows for {T * TOP_K} (token, choice) pairs: {cont.padding} padding rows")
print("m_indices, one entry per 128-row block (what a BLOCK_M = 128 tile reads):", cont.m_indices[::128].tolist())
print("  expert 0's block:", cont.m_indices[:cont.alignment][:cont.counts[0] + 3].tolist(), "... (-1 to row 127)")
print(f"masked A: ({G}, M_max = {M_MAX}, K) slabs, {G * M_MAX} slots; masked_m = {masked.masked_m.tolist()}, "
      f"expected_m = {masked.expected_m}")
print("token 0's rows: contiguous", cont.position[0].tolist(),
      " masked (g * M_max + slot)", masked.position[0].tolist())

# the kernel's own check of the contiguous rules (gemm.grouped, where it exists): every 128-row block one group,
# then -1 padding
try:
    from gemm.grouped import GroupedLayoutError, check_m_indices
except ImportError:
    print("\\n(gemm.grouped is not in this checkout: the kernel-side check is skipped)")
else:
    check_m_indices(cont.m_indices, G)
    shifted = np.roll(cont.m_indices, 1)  # every group one row late: its first row in the previous block's padding
    try:
        check_m_indices(shifted, G)
    except GroupedLayoutError as error:
        print("\\nshifted by one row ->", error)

# the masked slab is fixed: an expert with more tokens than M_max is an error, not a silent drop
try:
    mg.dispatch_masked(topk_ids, G, m_max=int(masked.masked_m.max()) - 1)
except ValueError as error:
    print("\\nM_max one too small ->", error)'''

COMBINE_NOTE = """\
## 2 · Permute, "run the experts", combine

`mg.permute` builds A from the tokens (padding rows zero); `mg.combine` sums each token's rows of out back,
weighted by the router. Here each expert is a stand-in, out = (g + 1) · A, so the result must be
Σₖ wₜₖ (idsₜₖ + 1) xₜ for both layouts. The FP8 1×128 activation scales are per token: `permute` moves them with
their rows (casting before or after the dispatch gives the same bytes, which is why DeepEP can dispatch FP8).
"""

COMBINE_CELL = '''\
x = rng.normal(size=(T, 16))
want = np.einsum("tk,tn->tn", topk_weights * (topk_ids + 1), x)
for name, layout in (("contiguous", cont), ("masked", masked)):
    a = mg.permute(x, layout)
    group = layout.m_indices if name == "contiguous" else np.repeat(np.arange(G), M_MAX)
    out = a * (np.asarray(group).reshape(a.shape[:-1])[..., None] + 1)  # expert g multiplies by g + 1
    y = mg.combine(out, layout, topk_weights)
    print(f"{name:10s}: A {a.shape}, max |combine - expected| = {np.abs(y - want).max():.1e}")
    assert np.allclose(y, want)'''

WALK_NOTE = """\
## 3 · The tile walks

Which (group, m block, n block) tiles each CTA computes, in order, from the kernel's own scheduler functions
(gemm/kernel/scheduler.py): `mg.contiguous_tiles` runs the dense `schedule` over ΣM rows and drops the tiles whose
`m_indices[m0]` is -1 (here kept and shown as `skip`, since the CTA spends a step on them); `mg.masked_tiles` is
`masked_schedule`, the virtual-tile walk over the groups' tiles in order. The shape: N = 384 in 128-wide n blocks,
BLOCK_M = 64 (a 64-row block of a group's padding starts with -1), on 5 CTAs.

In the contiguous walk every CTA passes the padding blocks; in the masked one a CTA never sees an empty group or a
block past masked_m: the virtual indices count only real tiles. Then the heuristics: the masked kernel is chosen
from `expected_m`, since the counts are known on the device only.
"""

WALK_CELL = '''\
BLOCK_M, N, BLOCK_N, GRID = 64, 384, 128, 5
walks = mg.contiguous_tiles(cont.m_indices, BLOCK_M, N, BLOCK_N, grid=GRID, skipped=True)
print(f"contiguous: {cont.rows // BLOCK_M} m blocks x {N // BLOCK_N} n blocks on {GRID} CTAs "
      f"(g = group, m = m block over sum M, n = n block)")
print(mg.walk_table(walks))
skips = sum(t[0] < 0 for w in walks for t in w)
print(f"-> {sum(map(len, walks)) - skips} tiles computed, {skips} CTA steps spent on padding blocks\\n")

walks = mg.masked_tiles(masked.masked_m, M_MAX, BLOCK_M, N // BLOCK_N, GRID)
print(f"masked: masked_m = {masked.masked_m.tolist()}, M_max = {M_MAX} (m = m block inside the group)")
print(mg.walk_table(walks))
tiles = sorted(t for w in walks for t in w)
need = sorted((g, mb, nb) for g in range(G) for mb in range(-(-int(masked.masked_m[g]) // BLOCK_M))
              for nb in range(N // BLOCK_N))
print(f"-> {len(tiles)} tiles, each needed tile exactly once: {tiles == need}; empty groups "
      f"{[g for g in range(G) if masked.masked_m[g] == 0]} cost no step")

try:
    from gemm.heuristics import H100, choose_grouped_config
except ImportError:
    print("\\n(gemm.heuristics has no choose_grouped_config in this checkout)")
else:
    print("\\nDeepSeek-V3 decode, 32 local experts, up/gate projection N = 4096, K = 7168, on an H100:")
    for expected_m in (8, 64, 256):
        config = choose_grouped_config("masked", expected_m, 4096, 7168, 32, device=H100)
        print(f"  expected_m = {expected_m:3d}: {config.describe()}")'''

FIGURE_NOTE = """\
## 4 · The figure

The same two layouts and walks for 4 experts with 150, 0, 40 and 90 tokens (`lessons.figures.moe_layouts`, written
by `python -m lessons figures` to docs/figures/moe_grouped_layouts.png): cells are coloured by CTA and outlined
by group; hatched tiles are skipped padding, blank ones are not tiles at all.

![moe_grouped_layouts](../docs/figures/moe_grouped_layouts.png)
"""

EMULATOR_NOTE = """\
## 5 · Both grouped GEMMs on the CPU emulator

A small MoE layer end to end: the tokens are cast to FP8 with 1×128 scales (`per_token_cast_to_fp8`), each
expert's weight with 128×128 blocks (`per_block_cast_to_fp8`), the codes and scales are dispatched into both
layouts, and `gemm.testing.emulated.run_grouped_gemm` runs the generated PTX of each grouped kernel (contiguous, then
masked) on the CPU PTX emulator, with 3 CTAs standing in for the SMs. The output starts as NaN, so every row the
kernel leaves alone shows. Each expert's rows are compared with the float64 reference
(`gemm.fp8.reference_gemm`, DeepGEMM's `calc_diff`; a BF16 output lands near 1e-6, the bar is 1e-3), and the
combined outputs of the two layouts with each other and with the float64 MoE layer.
"""

EMULATOR_CELL = '''\
from gemm.fp8 import (calc_diff, dequantize_per_block, dequantize_per_token, per_block_cast_to_fp8, per_token_cast_to_fp8)
from gemm.testing.problems import reference_gemm

try:
    from gemm.testing.emulated import run_grouped_gemm
    from gemm.kernel import KernelConfig
    KernelConfig(gemm_type="masked")
except (ImportError, ValueError) as error:
    run_grouped_gemm = None
    print(f"skipped: this checkout's gemm has no grouped kernels ({error}); the cell needs "
          "gemm.testing.emulated.run_grouped_gemm and KernelConfig(gemm_type='contiguous' / 'masked')")

if run_grouped_gemm is not None:
    rng = np.random.default_rng(6)
    T, G, TOP_K, N, K = 24, 5, 2, 128, 256  # this seed leaves expert 2 without tokens
    ids, weights = mg.random_routing(T, G, TOP_K, rng, skew=1.0)
    x = rng.normal(size=(T, K)).astype(np.float32)
    w = rng.normal(0, 0.05, size=(G, N, K)).astype(np.float32)
    a_tok, sa_tok = per_token_cast_to_fp8(x)
    b, sb = zip(*(per_block_cast_to_fp8(w[g]) for g in range(G)))
    b, sb = np.stack(b), np.stack(sb)
    routed = mg.dispatch(ids, G)
    print("tokens per expert:", routed.contiguous.counts.tolist())

    # contiguous: one A of sum M rows; BLOCK_M = 64, so the second half of a 128-row block can be all padding
    cont = routed.contiguous
    a, sa = mg.permute(a_tok, cont), mg.permute(sa_tok, cont)
    config = KernelConfig(gemm_type="contiguous", block_m=64, block_n=64, stages=2, raster_group=0)
    d_cont = run_grouped_gemm(config, a, sa, b, sb, cont.m_indices, sm_count=3)
    print(f"\\n{config.describe()}: out {d_cont.shape}")
    for g in range(G):
        rows = np.flatnonzero(cont.m_indices == g)
        if rows.size:
            diff = calc_diff(d_cont[rows], reference_gemm(a[rows], sa[rows], b[g], sb[g]))
            print(f"  expert {g}: rows {rows[0]}..{rows[-1]}, diff {diff:.1e}")
            assert diff < 1e-3
        else:
            print(f"  expert {g}: no tokens, no rows")
    first = cont.m_indices[::64]
    print(f"  64-row blocks starting with -1 (skipped): {int((first < 0).sum())}, their rows all still NaN: "
          f"{bool(np.isnan(d_cont[np.repeat(first < 0, 64)]).all())}")

    # masked: (G, M_max, K) slabs, masked_m on the "device"; M_max = 40 is not a multiple of BLOCK_M
    masked = mg.dispatch_masked(ids, G, m_max=40)
    a, sa = mg.permute(a_tok, masked), mg.permute(sa_tok, masked)
    config = KernelConfig(gemm_type="masked", block_m=64, block_n=64, stages=2, raster_group=0)
    d_mask = run_grouped_gemm(config, a, sa, b, sb, masked.masked_m, sm_count=3)
    print(f"\\n{config.describe()}: out {d_mask.shape}, masked_m {masked.masked_m.tolist()}")
    for g, count in enumerate(masked.masked_m):
        untouched = bool(np.isnan(d_mask[g, count:]).all())
        diff = calc_diff(d_mask[g, :count], reference_gemm(a[g, :count], sa[g, :count], b[g], sb[g])) if count else 0.0
        print(f"  expert {g}: {count:2d} rows, diff {diff:.1e}; rows past masked_m untouched: {untouched}")
        assert diff < 1e-3 and untouched

    # combine: both layouts give every token the same answer, and it is the MoE layer's
    y_cont, y_mask = mg.combine(d_cont, cont, weights), mg.combine(d_mask, masked, weights)
    x_deq = dequantize_per_token(a_tok, sa_tok)  # (T, K) float64
    w_deq = np.stack([dequantize_per_block(b[g], sb[g]) for g in range(G)])  # (G, N, K)
    want = np.einsum("tk,tkn->tn", weights, np.einsum("tc,tknc->tkn", x_deq, w_deq[ids]))
    print(f"\\ncombined (T, N) = {y_cont.shape}: contiguous vs masked max |diff| {np.abs(y_cont - y_mask).max():.1e}; "
          f"vs the float64 MoE layer calc_diff {calc_diff(y_cont, want):.1e}")
    assert calc_diff(y_cont, y_mask) < 1e-6 and calc_diff(y_cont, want) < 1e-3'''

GPU_NOTE = """\
## 6 · On a Hopper GPU

The same layer through the library's calls with torch tensors: `gemm.m_grouped_fp8_gemm_nt_contiguous` with
`m_indices` on the device, and `gemm.m_grouped_fp8_gemm_nt_masked` captured once in a CUDA graph and replayed with
new counts written into the same `masked_m` buffer (nothing is read back to the host). Without a Hopper GPU this
cell only says so.
"""

GPU_CELL = '''\
if not is_hopper():
    print("no Hopper GPU: skipped (it needs an sm_90 GPU, torch with CUDA, and gemm.m_grouped_fp8_gemm_nt_*)")
else:
    import torch
    import gemm
    from gemm.fp8 import calc_diff, per_block_cast_to_fp8, per_token_cast_to_fp8
    from gemm.testing.problems import reference_gemm

    rng = np.random.default_rng(0)
    T, G, TOP_K, N, K = 512, 8, 2, 4096, 7168
    ids, weights = mg.random_routing(T, G, TOP_K, rng)
    x = rng.normal(size=(T, K)).astype(np.float32)
    w = rng.normal(0, 0.02, size=(G, N, K)).astype(np.float32)
    a_tok, sa_tok = per_token_cast_to_fp8(x)
    b, sb = zip(*(per_block_cast_to_fp8(w[g]) for g in range(G)))
    b, sb = np.stack(b), np.stack(sb)
    cuda = lambda array, dtype=None: torch.from_numpy(np.ascontiguousarray(array)).cuda() if dtype is None \\
        else torch.from_numpy(np.ascontiguousarray(array).view(np.uint8)).cuda().view(dtype)
    b_dev, sb_dev = cuda(b, torch.float8_e4m3fn), cuda(sb)

    cont = mg.dispatch_contiguous(ids, G)
    a, sa = mg.permute(a_tok, cont), mg.permute(sa_tok, cont)
    out = torch.empty((cont.rows, N), dtype=torch.bfloat16, device="cuda")
    sa_dev = cuda(sa.T).T  # M-major, as the kernel reads it (a row-major one is converted, with a warning)
    gemm.m_grouped_fp8_gemm_nt_contiguous((cuda(a, torch.float8_e4m3fn), sa_dev), (b_dev, sb_dev), out,
                                          cuda(cont.m_indices))
    d = out.float().cpu().numpy()
    diffs = [calc_diff(d[r], reference_gemm(a[r], sa[r], b[g], sb[g]))
             for g in range(G) if (r := np.flatnonzero(cont.m_indices == g)).size]
    print(f"contiguous, {cont.rows} rows, N={N}, K={K}: worst expert diff {max(diffs):.1e}")

    M_MAX = T  # the worst case: every token picks this expert
    masked = mg.dispatch_masked(ids, G, m_max=M_MAX)
    a, sa = mg.permute(a_tok, masked), mg.permute(sa_tok, masked)
    a_dev, sa_dev = cuda(a, torch.float8_e4m3fn), gemm.masked_sa_to_mn_major(cuda(sa))
    masked_m = cuda(masked.masked_m)
    out = torch.zeros((G, M_MAX, N), dtype=torch.bfloat16, device="cuda")
    call = lambda: gemm.m_grouped_fp8_gemm_nt_masked((a_dev, sa_dev), (b_dev, sb_dev), out, masked_m,
                                                     masked.expected_m)
    call()  # compile and load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for counts in (masked.masked_m, rng.integers(0, M_MAX + 1, G).astype(np.int32)):
        out.zero_()
        masked_m.copy_(torch.from_numpy(counts))
        graph.replay()
        d = out.float().cpu().numpy()
        worst = max((calc_diff(d[g, :c], reference_gemm(a[g, :c], sa[g, :c], b[g], sb[g])) for g, c in
                     enumerate(counts) if c), default=0.0)
        print(f"masked graph replay, masked_m {counts.tolist()}: worst expert diff {worst:.1e}")'''

OUTRO = """\
## Try it

* `mg.dispatch(topk_ids, G, alignment=64)`: half the padding, but what would a BLOCK_M = 128 tile of the kernel
  then read? (`gemm.grouped.check_m_indices` says.)
* Give `mg.contiguous_tiles` `grid=132` and a realistic routing (T = 4096, G = 32, top-8): how many CTA steps go to
  padding blocks with BLOCK_M = 128, and with 64?
* Route with `skew=3`: how large must M_max be so that `dispatch_masked` never overflows, and how many of the
  masked slab's tiles does the kernel then actually walk?
* Redraw the figure for your own routing: `lessons.figures.moe_layouts(counts=..., grid=...)`.
"""


def cells() -> list[dict]:
    return [
        markdown(INTRO), code(SETUP),
        markdown(DISPATCH_NOTE), code(DISPATCH_CELL),
        markdown(COMBINE_NOTE), code(COMBINE_CELL),
        markdown(WALK_NOTE), code(WALK_CELL),
        markdown(FIGURE_NOTE),
        markdown(EMULATOR_NOTE), code(EMULATOR_CELL),
        markdown(GPU_NOTE), code(GPU_CELL),
        markdown(OUTRO),
    ]


__all__ = ["cells"]
