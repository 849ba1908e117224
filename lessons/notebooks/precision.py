"""The cells of notebooks/precision.ipynb: where an FP8 GEMM loses precision, and what DeepSeek-V3's recipe (1x128
activation scales, 128x128 weight blocks, promotion into FP32 every 128 of K) does about it. Every number is
computed by lessons.precision or the CPU emulator when the notebook runs (none is written here); every cell runs on
a CPU in seconds.

``cells()`` returns the cell list for lessons.notebooks.write.
"""
from __future__ import annotations

from lessons.notebooks.ipynb import code, markdown

INTRO = """\
# Precision · where an FP8 GEMM loses bits

The stages made the kernel fast; this notebook is about why its answers can be trusted. An FP8 GEMM can lose
precision in two places, and DeepSeek-V3's recipe (DeepSeek-V3 technical report, arXiv:2412.19437, §3.3) has an
answer for each:

1. **Quantization: range.** E4M3 spans 2⁻⁹ (its smallest subnormal) to 448, with 3 mantissa bits. A scale maps
   a group of values onto that range by its largest magnitude (amax / 448). One scale for a whole tensor lets
   one outlier push every ordinary value down into the subnormals or to zero. The recipe: one scale per 1×128
   group of an activation row (a token's 128 channels), one per 128×128 block of the weights.
2. **Accumulation: the tensor core's adder.** Hopper's FP8 wgmma does not accumulate in full FP32: DeepSeek
   measured about 14 bits kept (§3.3.2, "Increasing Accumulation Precision"). The recipe: every 128 of K (four
   wgmma k32 steps) the kernel *promotes* the partial sum, `total += partial * (sa * sb)` on the CUDA cores in
   FP32, and the tensor cores start a fresh partial sum. The scales ride along for free.
3. **The cost side:** why the weights get 128×128 blocks and not 1×128 groups like the activations.

Everything runs on this CPU: `lessons.precision` computes the tables with the library's own casts, and the PTX
emulator runs a generated kernel. The limited-precision accumulator is a **model** (`ptx.emulate.matrix.
AccumulatorModel`), written from DeepSeek's description, not a bit-exact copy of the hardware, which NVIDIA does
not document; the emulator uses it only when asked (`with accumulator_model(14):`), and is exact otherwise.
"""

SETUP = '''\
import os, sys
# Works from notebooks/ (Jupyter) or from the repository root (tests): make the repository importable.
ROOT = os.path.dirname(os.getcwd()) if os.path.basename(os.getcwd()) == "notebooks" else os.getcwd()
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import ml_dtypes
import numpy as np

from lessons import precision
from gemm.testing.records import Column, format_table

e4m3 = ml_dtypes.finfo(ml_dtypes.float8_e4m3fn)
print(f"E4M3: max {float(e4m3.max):g}, smallest normal 2^{int(np.log2(float(e4m3.smallest_normal)))}, "
      f"smallest subnormal 2^{int(np.log2(float(e4m3.smallest_subnormal)))}, {e4m3.nmant} mantissa bits")'''

SCALING_NOTE = """\
## 1 · Per tensor, per 1×128 group, per 128×128 block

The data: activations N(0, 1) with 1% of the channels ×100 in every token (LLM.int8()'s outlier features) and 3
tokens ×1000 in every channel ("massive activations", such as the first token's); weights N(0, 0.02), smooth.
Each scheme quantizes with the library's casts (`per_token_cast_to_fp8` for 1×128, `per_block_cast_to_fp8` for
128×128; per tensor is one amax scale) and the GEMM of the dequantized operands is compared with the float64 GEMM
of the originals by DeepGEMM's measure, `calc_diff(x, y) = 1 − 2Σxy / Σ(x² + y²)` (0 for identical; 1e-3 is
the usual bar for a BF16 output). *Flushed to 0*: nonzero values whose scaled magnitude is at most half the
smallest subnormal, so their code is 0.

Read the columns together. Per tensor, the massive tokens set the scale and half of all activations vanish;
the GEMM diff over all tokens hardly shows it, because the outlier tokens dominate the output's norm, but the
ordinary tokens (the rest of the batch) are several times worse. 128×128 blocks of activations are better only
where a block holds no outlier token. 1×128 groups give every token its own scales: nothing flushes, and the
error is E4M3's rounding alone.
"""

SCALING_CELL = '''\
print(format_table(precision.SCALING_COLUMNS, precision.scaling_table(m=256, n=256, k=1024, seed=0)))'''

ACCUMULATION_NOTE = """\
## 2 · The accumulator, with and without the promotion

**The model** (`ptx.emulate.matrix.AccumulatorModel`, `bits=14`). For each output element one wgmma m64nNk32
adds 32 exact products and, after its first k32 step, the accumulator it already holds. The model aligns those
33 terms to the largest one's exponent e, keeps each term's bits of weight ≥ 2^(e − 13) (the 14 highest, counted
from the largest term's leading bit), truncates the rest toward zero, and adds what is left exactly. This is
DeepSeek-V3's description (§3.3.2 and its hardware suggestions, §3.5): products aligned by right-shifting to the
maximum exponent, the highest 14 bits kept, and the addition into the register also at 14 bits. The consequence
is *swamping*: once the running sum is 2¹⁰ times a product, that product keeps about 4 bits, and below 2⁻¹³ of
the sum it is gone. Promotion caps the sum at four k32 steps; the FP32 total does the long addition.

The tables sum the same e4m3 operands three ways, against the float64 sum: the model over the whole K (the
promotion deleted), the model promoted into FP32 every 128 (DeepGEMM's choice), and an exact FP32 accumulator
(the emulator's default) over the whole K. One per-tensor scale per operand, so promoting or not changes only
the accumulation. *Zero-mean* data (N(0,1) × N(0,1)) lets truncation errors partly cancel; *same-sign* data
(|N(0,1)| × |N(0,1)|: every product positive) is the worst case, the sum growing linearly with K.
"""

ACCUMULATION_CELL = '''\
from ptx.emulate.matrix import limited_precision_sum

# the mechanism in one line: 256 in the accumulator, then 32 products of 1/64 each (exact sum: 256.5)
print("256 + 32 x 1/64 with a 14-bit accumulator:", limited_precision_sum(np.full(32, 2.0 ** -6), np.float64(256.0)))
print("256 + 32 x 1/32 with a 14-bit accumulator:", limited_precision_sum(np.full(32, 2.0 ** -5), np.float64(256.0)))

tables = {}
for data in ("zero-mean", "same-sign"):
    tables[data] = precision.accumulation_table(precision.ACCUMULATION_KS, m=32, n=32, data=data, seed=0)
    print(f"\\n{data} operands, M = N = 32:")
    print(format_table(precision.ACCUMULATION_COLUMNS, tables[data]))

import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6.5, 3.5))
for (data, rows), color in zip(tables.items(), ("tab:blue", "tab:red")):
    ks = [r["k"] for r in rows]
    ax.loglog(ks, [r["rel_whole"] for r in rows], "o-", color=color, label=f"{data}, no promotion")
    ax.loglog(ks, [r["rel_promoted"] for r in rows], "s--", color=color, label=f"{data}, promoted every 128")
ax.set_xlabel("K")
ax.set_ylabel("||D - exact|| / ||exact||")
ax.set_title("14-bit accumulator model: the error without promotion grows with K")
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()'''

EMULATOR_NOTE = """\
## 2b · The same model inside the emulator: delete the promotion and watch

`ptx.emulate` runs the generated PTX; `with accumulator_model(14):` makes each of its wgmmas use the model above
(the same function: `lessons.precision.accumulate` reproduces the emulated kernel bit for bit, and
tests/test_precision.py checks it). `lessons.precision.without_promotion` is the edit a student would make to the
kernel: the wgmma accumulators are zeroed once per tile and never restarted (every wgmma gets scale-d = true),
and the promotion `total += acc * scale` becomes `total = acc * scale`, so the whole K stays in the tensor cores'
accumulator. That is the same GEMM only when the scales do not change along K, so the operands here have one
scale per tensor. `run_gemm(..., ptx=edited)` runs the edited PTX with the config's maps and grid.

The output is BF16, whose rounding (≈ 2⁻⁹ relative) is the floor of every column: with the promotion, the model's
error stays under it (most outputs are the exact kernel's bits); without it, the error grows with K, matching
the same-sign table above.
"""

EMULATOR_CELL = '''\
import difflib, re

import lessons
from gemm.testing.emulated import run_gemm
from gemm.testing.problems import reference_gemm
from gemm.kernel import generate
from ptx.emulate.matrix import accumulator_model

config_of = lessons.stage(8).config  # the production generator's config for a shape
m = n = 64
original = generate(config_of(m, n, 512), n, 512)
edited = precision.without_promotion(original)
changes = [line for line in difflib.unified_diff(original.splitlines(), edited.splitlines(), lineterm="", n=0)
           if line[:1] in "+-" and line[:3] not in ("+++", "---")]
print(f"deleting the promotion changes {len(changes)} PTX lines, of these kinds:")
seen = set()
for line in changes:
    kind = re.sub(r"%\\w+?_\\d+", "%r", re.sub(r"\\{[^}]*\\}", "{...}", line))
    if kind not in seen:
        seen.add(kind)
        print("   ", re.sub(r"\\{[^}]*\\}", "{...}", line).strip())

rows = []
for k in (512, 1024, 2048, 4096):
    a, sa, b, sb = precision.per_tensor_problem(m, n, k, "same-sign", seed=0)
    want = reference_gemm(a, sa, b, sb)
    config = config_of(m, n, k)
    exact = run_gemm(config, a, sa, b, sb, sm_count=1)
    with accumulator_model(14):
        promoted = run_gemm(config, a, sa, b, sb, sm_count=1)
        whole = run_gemm(config, a, sa, b, sb, sm_count=1,
                         ptx=precision.without_promotion(generate(config, n, k)))
    error = lambda d: float(np.linalg.norm(d - want) / np.linalg.norm(want))
    rows.append({"k": k, "exact": error(exact), "promoted": error(promoted), "whole": error(whole),
                 "same": float(np.mean(promoted == exact))})
print(f"\\n{config.describe()}, same-sign data, ||D - exact|| / ||exact|| of the BF16 output:")
print(format_table([Column("k", "K"), Column("exact", "exact wgmma", "{:.1e}"),
                    Column("promoted", "model, promoted /128", "{:.1e}"),
                    Column("whole", "model, promotion deleted", "{:.1e}"),
                    Column("same", "promoted outputs = exact's", "{:.0%}")], rows))
assert rows[-1]["whole"] > 10 * rows[-1]["promoted"], "deleting the promotion should cost precision"'''

WEIGHTS_NOTE = """\
## 3 · Why the weights get 128×128 blocks

Activations need 1×128 groups (section 1), and a 1×128 scale costs the kernel nothing extra: each thread's
accumulators cover two rows, so per K block it multiplies its two `sa` by the tile's `sb` once and then does
one FFMA per accumulator. Weights could have 1×128 groups too (one scale per output channel per 128 of K), but
two things favour blocks:

* **The backward pass multiplies by Wᵀ** (dX = dY · W). The kernel reads its second operand grouped along the
  reduction axis, which for Wᵀ is N. A 128×128 block is a block of Wᵀ as well: casting Wᵀ gives exactly the
  forward's codes and scales, transposed, so one FP8 copy serves both passes. 1×128 groups run along the other
  axis: casting Wᵀ gives different codes, which must be cast again from the high-precision weights, or made from
  the forward's FP8 copy by quantizing twice (the last column: twice the error).
* **One scale per tile and K block.** A 128-wide N tile sits in one 128×128 block, so all 256 math threads use
  one `sb` per K block. With a scale per column each thread needs the `sb` of each of its 32 columns (wgmma's
  fragment layout) and one more multiply per accumulator, and the CTA fetches 128 times more scale bytes.
"""

WEIGHTS_CELL = '''\
print("W (N=512, K=1024) and its transpose, cast both ways:")
print(format_table(precision.TRANSPOSE_COLUMNS, precision.transpose_table(n=512, k=1024, seed=0)))
print("\\nWeight scales for one 128 x 128 tile, K = 7168 (56 K blocks); activations 1x128 in both:")
print(format_table(precision.SCALE_LOAD_COLUMNS, precision.scale_loads_table(128, 128, 7168)))'''

OUTRO = """\
## Try it

* `precision.accumulation_table(bits=13)` or `bits=16`: how sensitive is the picture to the model's width?
* `precision.accumulate(a, b, AccumulatorModel(14), 512)` (`a, b = precision.accumulation_operands(32, 32, 4096,
  "zero-mean", np.random.default_rng())`, `AccumulatorModel` from `ptx.emulate.matrix`): promote less often.
  DeepGEMM promotes every 128 because the scales change every 128 of K anyway; what would 256 or 512 cost?
* Change `precision.TOKEN_GAIN` or `CHANNEL_GAIN` and rerun section 1: at what outlier size does per-tensor
  scaling start flushing ordinary values?
* Run any generated kernel (`gemm.testing.emulated.run_gemm`) under `accumulator_model(14)`: every config promotes every
  128, so all stay within BF16's rounding of the exact result.
"""


def cells() -> list[dict]:
    return [
        markdown(INTRO), code(SETUP),
        markdown(SCALING_NOTE), code(SCALING_CELL),
        markdown(ACCUMULATION_NOTE), code(ACCUMULATION_CELL),
        markdown(EMULATOR_NOTE), code(EMULATOR_CELL),
        markdown(WEIGHTS_NOTE), code(WEIGHTS_CELL),
        markdown(OUTRO),
    ]


__all__ = ["cells"]
