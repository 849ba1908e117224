"""The cells of notebooks/training_recipe.ipynb: FP8 training's three GEMMs (forward, dgrad, wgrad) with DeepSeek-V3's
scales, why their granularities differ, the precision of each, the wgrad kernel on the CPU emulator, and a training
step through the library on a Hopper GPU. Every number is computed by lessons.training_recipe, the library's casts
or the emulator when the notebook runs (none is written here); every cell but the GPU one runs on a CPU in seconds.

``cells()`` returns the cell list for lessons.notebooks.write.
"""
from __future__ import annotations

from lessons.notebooks.ipynb import code, markdown

INTRO = """\
# Training · forward, dgrad and wgrad in FP8

The ladder's kernel is a forward pass. Training a linear layer y = x·Wᵀ over T tokens takes three GEMMs per step,
and DeepSeek-V3 runs all three in FP8 (technical report, arXiv:2412.19437, §3.3), each with its own scaling:

| GEMM | D | A, scaled | B, scaled | K |
|---|---|---|---|---|
| forward | y = x·Wᵀ (T × O) | x (T × I), 1×128 per token | W (O × I), 128×128 | I |
| dgrad | dx = dy·W (T × I) | dy (T × O), 1×128 per token | Wᵀ (I × O), 128×128: the forward's blocks, transposed | O |
| wgrad | dW = dyᵀ·x (O × I), FP32 `+=` | dyᵀ (O × T), 1×128 along the tokens | xᵀ (I × T), 1×128 along the tokens | T |

The rule behind the column of scalings: a kernel applies the scales *after* the tensor cores have summed a 128-wide
K block, so a scale must be constant along K inside its block. This notebook shows what that rule does to each GEMM
(sections 1 and 2), measures the precision each choice buys (3), runs the wgrad kernel on the CPU emulator (4) and
a training step through the library on a Hopper GPU (5). The written account is section 5 of docs/guide.md;
`lessons/training_recipe.py` computes everything.
"""

SETUP = '''\
import os, sys
# Works from notebooks/ (Jupyter) or from the repository root (tests): make the repository importable.
ROOT = os.path.dirname(os.getcwd()) if os.path.basename(os.getcwd()) == "notebooks" else os.getcwd()
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np

from gemm.fp8 import calc_diff, per_block_cast_to_fp8, per_token_cast_to_fp8, transpose_cast_to_fp8
from gemm.testing.records import Column, format_table
from lessons import training_recipe as tr
from ptx.device import has_gpu, is_hopper

print("GPU:", "Hopper" if is_hopper() else "present, not Hopper" if has_gpu() else
      "none (the CPU emulator runs the kernel)")'''

OPERANDS_NOTE = """\
## 1 · The three GEMMs as the kernels take them

One small layer (T = 384 tokens, I = 256 in, O = 512 out features) with the study's data: activations and
gradients with outlier channels, a few massive tokens and a log-normal magnitude per token; Gaussian weights.
`tr.recipe_operands` casts each GEMM's operands the recipe's way with the library's casts: `per_token_cast_to_fp8`
for x and dy, `per_block_cast_to_fp8` for W (once), and `transpose_cast_to_fp8` for wgrad's dyᵀ and xᵀ. dgrad's B
is no cast at all: the forward's W, transposed.

Every GEMM is D = A·Bᵀ over K, with A's scales one per row per 128 of K; B's are per 128×128 block in the forward
pass and dgrad, and per row per 128 of K in wgrad. The last column is each GEMM's `calc_diff` against the float64
GEMM of the unquantized operands.
"""

OPERANDS_CELL = '''\
T, I, O = 384, 256, 512
x, w, dy = tr.training_data(T, I, O, np.random.default_rng(0))
operands = tr.recipe_operands(x, w, dy)
shape = lambda array: " x ".join(map(str, array.shape))
rows = []
for gemm, ((a, sa), (b, sb)) in operands.items():
    a_float, b_float = tr.unquantized_operands(x, w, dy)[gemm]
    a_values, b_values = tr.dequantize_operands(gemm, operands[gemm])
    exact = a_float.astype(np.float64) @ b_float.astype(np.float64).T
    rows.append({"gemm": gemm, "d": tr.GEMMS[gemm][0], "a": f"{tr.GEMMS[gemm][1].split()[0]} {shape(a)}",
                 "sa": shape(sa), "b": f"{tr.GEMMS[gemm][2].split()[0]} {shape(b)}", "sb": shape(sb),
                 "k": f"{tr.GEMMS[gemm][3]} = {a.shape[1]}", "diff": calc_diff(a_values @ b_values.T, exact)})
print(format_table([Column("gemm", "GEMM", align="left"), Column("d", "D", align="left"),
                    Column("a", "A (e4m3)", align="left"), Column("sa", "A's scales", align="left"),
                    Column("b", "B (e4m3)", align="left"), Column("sb", "B's scales", align="left"),
                    Column("k", "K", align="left"), Column("diff", "calc_diff vs float64", "{:.1e}")], rows))'''

AXES_NOTE = """\
## 2 · One cast of W serves two GEMMs; x and dy are cast twice

**The weight.** A 128×128 block of W is a block of Wᵀ. Casting Wᵀ afresh gives exactly the forward's codes,
transposed, and the forward's scales, transposed: dgrad takes the forward's FP8 copy as it is. With 1×128 groups
(one scale per output channel per 128 inputs) the groups of Wᵀ run along the other axis, and most codes differ.

**The activations.** The forward pass scales x per token per 128 channels. wgrad reduces over the tokens, so what
it multiplies inside one K block is 128 *tokens* of one channel, and the forward's scales change from token to
token there: Σₜ (q_dy[t]·s_dy[t])·(q_x[t]·s_x[t]) is not (Σₜ q_dy[t]·q_x[t])·s for any one s, and the tensor
cores see only the codes. The figure plots, for the first channel group of x, the forward's scale of every token
(what a wgrad kernel would have to apply token by token) and wgrad's scale of one channel of that group, one per
128 tokens (what `transpose_cast_to_fp8` gives it).
"""

AXES_CELL = '''\
(q_w, s_w), (q_wt, s_wt) = per_block_cast_to_fp8(w), per_block_cast_to_fp8(np.ascontiguousarray(w.T))
print("128x128: cast(W^T) codes == cast(W)^T codes:", np.array_equal(q_wt.view(np.uint8), q_w.T.view(np.uint8)),
      "| scales == transposed:", np.array_equal(s_wt, s_w.T))
print("dgrad's B is the forward's, transposed:", np.array_equal(operands["dgrad"][1][0].view(np.uint8),
                                                                q_wt.view(np.uint8)))
for scaling, reuse in tr.weight_reuse(w).items():
    print(f"{scaling:>7}: {reuse['same_codes']:.1%} of cast(W^T)'s codes equal cast(W)^T's, scales equal: "
          f"{reuse['same_scales']}")

_, forward_scales = operands["forward"][0]  # (T, I/128): one per token per 128 channels
_, wgrad_scales = operands["wgrad"][1]      # (I, T/128): one per channel per 128 tokens
spread = tr.forward_scale_spread(x)
print(f"\\nwithin one 128-token K block of wgrad, the forward's scales of one channel group span a factor of "
      f"{spread['median']:.0f} (median over blocks; at most {spread['max']:.0f})")

import matplotlib.pyplot as plt

channel = int(np.argmax(np.abs(x[:, :128]).max(axis=0)))  # the group's largest channel: it sets wgrad's scale
fig, ax = plt.subplots(figsize=(7, 3.2))
ax.semilogy(np.arange(T), forward_scales[:, 0], ".", ms=3, label="forward: x's scale per token (channels 0-127)")
ax.step(np.arange(T), np.repeat(wgrad_scales[channel], 128)[:T], where="post", color="tab:red",
        label=f"wgrad: x^T's scale of channel {channel}, per 128 tokens")
for boundary in range(128, T, 128):
    ax.axvline(boundary, color="grey", lw=0.5)
ax.set_xlabel("token (wgrad's K axis; grey: its 128-token K blocks)")
ax.set_ylabel("scale (amax / 448)")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()'''

TABLE_NOTE = """\
## 3 · The precision of each GEMM, measured

`tr.study()` is what `python -m lessons precision --training` runs (T = 2048, I = O = 1024, seed 0): every GEMM
with the recipe's scales and with the alternatives, against the float64 GEMM of the unquantized operands.
`calc_diff` is DeepGEMM's measure over the whole output; *err* is, per output element, |D − exact| divided by
Σₖ|aₖbₖ|, the size of the dot product's terms (an error relative to the output itself has no bound where the terms
cancel). Only quantization is measured here: the products of the dequantized operands are summed in float64.

Read it by GEMM: per tensor, most values of x and dy flush to zero; 128×128 blocks of activations let an outlier
token spoil its block (the max column); a 1×128 weight for dgrad must be cast a second time; in wgrad the forward's
cast, applied per element, would be no more precise in the median, and no kernel can apply it; its codes with one
scale per block are wrong.
`calc_diff` is dominated by the massive tokens' outputs, so it hardly separates the schemes: the median and max
columns show the rest. The second table: wgrad's xᵀ made from the forward's FP8 copy of x (what a framework that
keeps only FP8 activations for the backward pass does) is rounded twice, unless the scales are powers of two.
"""

TABLE_CELL = '''\
from lessons import results_store

result = tr.study(seed=0)
tr.print_study(result)

committed = results_store.find(tr.RESULT_NAME)
if committed is None:
    print(f"\\nno results/{tr.RESULT_NAME}: `{tr.COMMAND}` writes it")
else:
    import json
    rows = json.loads(committed.read_text())["rows"]
    same = all(f"{new[key]:.2e}" == f"{old[key]:.2e}" for new, old in zip(result["rows"], rows)
               for key in ("diff", "err_median", "err_max")) and len(rows) == len(result["rows"])
    print(f"\\nthe same numbers (3 digits) as the committed {results_store.shown(committed)}: {same}")'''

EMULATOR_NOTE = """\
## 4 · The wgrad kernel on the CPU emulator

The production generator with `b_scales="1x128"`: B's scales arrive with every ring stage (one per column of the
tile), each accumulator is promoted with `sa[row] · sb[column]` (one FMUL and one FFMA), K is a kernel parameter
and need only be a multiple of 16, and D is FP32, accumulated in place. Here on a ragged shape: O = 200 output
features (M), I = 136 input features (N), T = 400 tokens (K, not a multiple of 128), added onto the gradient of an
earlier micro-batch.

Three references: the float64 GEMM of the *dequantized* operands (what the kernel should compute: the emulator's
exact wgmma leaves only FP32 rounding); the same under `accumulator_model(14)`, the precision notebook's model of
the tensor cores' limited accumulator; and the float64 GEMM of the *unquantized* dy and x (what training wants:
quantization included). Errors are per element, relative to the size of everything added into it (the earlier
gradient's |value| plus Σ|ab|, as in section 3).
"""

EMULATOR_CELL = '''\
from gemm.fp8 import dequantize_per_token
from gemm.kernel import KernelConfig
from gemm.testing.emulated import run_gemm
from ptx.emulate.matrix import accumulator_model

rng = np.random.default_rng(1)
T_E, I_E, O_E = 400, 136, 200
x_e, _, dy_e = tr.training_data(T_E, I_E, O_E, rng)
(a, sa), (b, sb) = transpose_cast_to_fp8(dy_e), transpose_cast_to_fp8(x_e)  # dy^T (O, T), x^T (I, T)
earlier = rng.standard_normal((O_E, I_E)).astype(np.float32)  # the gradient of an earlier micro-batch
config = KernelConfig(block_m=128, block_n=64, stages=2, out_dtype="f32", accumulate=True, b_scales="1x128")
print(config.describe(), f"| A {a.shape}, sa {sa.shape}, B {b.shape}, sb {sb.shape}")

d_exact = run_gemm(config, a, sa, b, sb, c=earlier, sm_count=2)
with accumulator_model(14):
    d_model = run_gemm(config, a, sa, b, sb, c=earlier, sm_count=2)

a_values, b_values = dequantize_per_token(a, sa), dequantize_per_token(b, sb)
dy64, x64 = dy_e.T.astype(np.float64), x_e.astype(np.float64)
terms = np.abs(earlier) + np.abs(dy64) @ np.abs(x64)  # the size of everything added into an element
dequantized = (earlier + a_values @ b_values.T, np.abs(earlier) + np.abs(a_values) @ np.abs(b_values).T)
unquantized = (earlier + dy64 @ x64, terms)
rows = [{"run": run, "ref": ref, **tr.errors(d, *reference)}
        for run, d in (("exact wgmma", d_exact), ("14-bit accumulator model", d_model))
        for ref, reference in (("dequantized operands", dequantized), ("unquantized dy, x", unquantized))]
print(format_table([Column("run", "emulated kernel", align="left"), Column("ref", "float64 reference of", align="left"),
                    Column("diff", "calc_diff", "{:.1e}"), Column("err_median", "err, median", "{:.1e}"),
                    Column("err_max", "err, max", "{:.1e}")], rows))
assert rows[0]["err_max"] < 1e-6, "the kernel must compute the GEMM of its operands"'''

GPU_NOTE = """\
## 5 · A training step on a Hopper GPU

The three GEMMs through the library, with torch tensors: the weight is cast once per step and serves the forward
pass and dgrad (`fp8_gemm_nt`, dgrad's B the forward's codes and scales transposed); wgrad casts dy and x again
along the tokens and accumulates into an FP32 weight gradient (`fp8_wgrad_gemm_nt`, DeepGEMM 2507's
`wgrad_gemm_fp8_fp8_fp32_nt`). Then an MoE layer's k-grouped wgrad: every expert's tokens stacked, one gradient per
expert (`k_grouped_wgrad_gemm_fp8_fp8_fp32_nt`, operands from `k_grouped_transpose_cast_to_fp8`). Each output is
compared with float64 on the GPU. Without a Hopper GPU this cell only says so; the timings are
`python -m gemm bench wgrad`'s.
"""

GPU_CELL = '''\
if not is_hopper():
    print("no Hopper GPU: skipped (it needs an sm_90 GPU and torch with CUDA)")
else:
    import torch
    import gemm

    T, I, O = 4096, 7168, 1536  # tokens, in and out features (DeepSeek-V3's q_a projection)
    x = torch.randn(T, I, device="cuda")
    w = torch.randn(O, I, device="cuda") * 0.02
    dy = torch.randn(T, O, device="cuda")

    x_fp8 = gemm.per_token_cast_to_fp8(x, mn_major=True)  # 1x128 per token, along I
    w_fp8 = gemm.per_block_cast_to_fp8(w)                 # 128x128, once per step
    y = torch.empty(T, O, dtype=torch.bfloat16, device="cuda")
    gemm.fp8_gemm_nt(x_fp8, w_fp8, y)                      # forward: y = x W^T

    dy_fp8 = gemm.per_token_cast_to_fp8(dy, mn_major=True)            # 1x128 per token, along O
    w_t_fp8 = (w_fp8[0].t().contiguous(), w_fp8[1].t().contiguous())  # the same blocks, transposed
    dx = torch.empty(T, I, dtype=torch.bfloat16, device="cuda")
    gemm.fp8_gemm_nt(dy_fp8, w_t_fp8, dx)                  # dgrad: dx = dy W

    w_grad = torch.zeros(O, I, dtype=torch.float32, device="cuda")
    gemm.fp8_wgrad_gemm_nt(gemm.transpose_cast_to_fp8(dy, mn_major=True),  # dy^T, 1x128 along the tokens
                           gemm.transpose_cast_to_fp8(x, mn_major=True),   # x^T, likewise
                           w_grad)                         # wgrad: w_grad += dy^T x
    for name, got, want in (("forward", y, x.double() @ w.double().T), ("dgrad", dx, dy.double() @ w.double()),
                            ("wgrad", w_grad, dy.double().T @ x.double())):
        print(f"{name:8s} {tuple(got.shape)}: calc_diff vs float64 of the unquantized operands "
              f"{gemm.calc_diff(got, want):.1e}")

    sizes = [1024, 0, 272, 2048]  # tokens per expert: uneven, one expert idle, one not a multiple of 128
    dy_experts = torch.randn(sum(sizes), O, device="cuda")
    x_experts = torch.randn(sum(sizes), I, device="cuda")
    grads = torch.zeros(len(sizes), O, I, dtype=torch.float32, device="cuda")
    gemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(gemm.k_grouped_transpose_cast_to_fp8(dy_experts, sizes),
                                              gemm.k_grouped_transpose_cast_to_fp8(x_experts, sizes), grads, sizes)
    first = 0
    for expert, tokens in enumerate(sizes):
        want = dy_experts[first:first + tokens].double().T @ x_experts[first:first + tokens].double()
        first += tokens
        note = f"calc_diff {gemm.calc_diff(grads[expert], want):.1e}" if tokens else \
            f"no tokens, gradient untouched: max |grad| {float(grads[expert].abs().max())}"
        print(f"expert {expert}: {tokens:4d} tokens, {note}")'''

OUTRO = """\
## Try it

* `tr.recipe_operands(x, w, dy, ue8m0=True)`: power-of-two scales everywhere (DeepSeek-V3's UE8M0). What happens
  to section 1's `calc_diff`, and to the recast table's "values the second cast moves"?
* Raise `tr.DY_TOKEN_SIGMA` to 3 and rerun `tr.study()`: which GEMM's per-tensor row suffers most, and why does
  wgrad's recipe row hardly move?
* Put x's massive tokens in every 128-token block (`precision.OUTLIER_TOKENS = 16`, `from lessons import
  precision`): how much does wgrad's grouping along the tokens cost then, against the forward's per-token cast?
* Run section 4 with `block_n=48` or `block_m=256` (tests/test_wgrad.py lists the tile shapes the 1x128 promotion
  is checked on): the exact run must still match the dequantized reference to FP32 rounding.
"""


def cells() -> list[dict]:
    return [
        markdown(INTRO), code(SETUP),
        markdown(OPERANDS_NOTE), code(OPERANDS_CELL),
        markdown(AXES_NOTE), code(AXES_CELL),
        markdown(TABLE_NOTE), code(TABLE_CELL),
        markdown(EMULATOR_NOTE), code(EMULATOR_CELL),
        markdown(GPU_NOTE), code(GPU_CELL),
        markdown(OUTRO),
    ]


__all__ = ["cells"]
