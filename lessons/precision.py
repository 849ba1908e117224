"""Where an FP8 GEMM loses precision, measured on the CPU (NumPy + ml_dtypes, no GPU): the numbers of
notebooks/precision.ipynb. ``python -m lessons precision`` prints every table.

1. **Scaling granularity** (:func:`scaling_table`): one scale per tensor, per 1x128 group (a token's 128
   channels) or per 128x128 block, on activations with outlier channels and outlier tokens, cast with the
   library's own casts (gemm.fp8). Measured: the fraction of nonzero values flushed to zero (their scaled
   magnitude is at most half of E4M3's smallest subnormal, 2**-9, and rounds to 0) and the error of the GEMM of
   the dequantized operands, with DeepGEMM's measure ``calc_diff`` (1 - 2*sum(xy) / sum(x*x + y*y)).
2. **Accumulation** (:func:`accumulation_table`): the same e4m3 operands summed over K by a limited-precision
   accumulator (:class:`ptx.emulate.matrix.AccumulatorModel`, the very function the emulator's wgmma uses under
   ``accumulator_model``), once over the whole K and once promoted into FP32 every 128 of K (DeepGEMM's rule),
   against the float64 sum. A model of the hardware, not the hardware: see ptx.emulate.matrix.
3. **Why 128x128 weight blocks** (:func:`transpose_table`, :func:`scale_loads_table`): the same codes and scales
   serve W and W^T (the backward pass multiplies by W^T), and a 128-wide N tile needs one weight scale per K
   block instead of one per column.

:func:`without_promotion` deletes the promotion from a generated kernel's PTX, so the emulator can run (``run_gemm(...,
ptx=without_promotion(generate(config, n, k)))``) the
kernel a student would get by deleting it (valid for scales that are uniform along K).
"""
from __future__ import annotations

import re

import numpy as np

from gemm.fp8 import (AMAX_FLOOR, E4M3_MAX, GROUP, calc_diff, ceil_div, dequantize_per_block, dequantize_per_token,
                      e4m3_decode, e4m3_encode, per_block_cast_to_fp8, per_token_cast_to_fp8)
from gemm.testing.records import Column, format_table
from ptx.emulate.matrix import AccumulatorModel

E4M3_MIN_SUBNORMAL = 2.0 ** -9  # anything scaled to half of it or below rounds to zero
K_STEP = 32  # products per wgmma k32 step: one fused sum of the accumulator model
PROMOTE_EVERY = GROUP  # DeepGEMM promotes every K block of 128: 4 wgmma k32 steps

# The outlier data of experiment 1. LLM activations have a few feature channels that are large in every token
# (LLM.int8(): ~20-100x) and a few tokens that are huge in every channel ("massive activations", up to 10^3-10^4x
# the median, e.g. the first token); the weights are smooth.
OUTLIER_CHANNELS, CHANNEL_GAIN = 0.01, 100.0  # 1% of the K channels, 100x
OUTLIER_TOKENS, TOKEN_GAIN = 3, 1000.0  # 3 tokens, 1000x
WEIGHT_STD = 0.02


# ------------------------------------------------------------------------------------- 1. scaling granularity

def outlier_activations(m: int, k: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(M, K) float32 N(0, 1) activations with OUTLIER_CHANNELS of the channels x CHANNEL_GAIN and OUTLIER_TOKENS
    rows x TOKEN_GAIN; returns (x, the outlier rows)."""
    x = rng.standard_normal((m, k), dtype=np.float32)
    channels = rng.choice(k, max(1, round(k * OUTLIER_CHANNELS)), replace=False)
    tokens = np.sort(rng.choice(m, min(OUTLIER_TOKENS, m), replace=False))
    x[:, channels] *= CHANNEL_GAIN
    x[tokens] *= TOKEN_GAIN
    return x, tokens


def per_tensor_cast_to_fp8(x) -> tuple[np.ndarray, np.float32]:
    """The baseline the library does not ship: one amax-based scale for the whole tensor (amax / 448)."""
    x = np.asarray(x, np.float32)
    scale = np.float32(max(float(np.abs(x).max()), AMAX_FLOOR) / E4M3_MAX)
    return e4m3_encode(x / scale), scale


def quantize(x, scaling: str) -> tuple[np.ndarray, float]:
    """x (rows, K) through the library's cast for ``scaling`` ("tensor", "1x128" or "128x128") and back:
    (the dequantized float64 values, the fraction of nonzero values flushed to zero)."""
    if scaling == "tensor":
        q, scale = per_tensor_cast_to_fp8(x)
        back = e4m3_decode(q).astype(np.float64) * np.float64(scale)
    elif scaling == "1x128":
        q, scale = per_token_cast_to_fp8(x)
        back = dequantize_per_token(q, scale)
    elif scaling == "128x128":
        q, scale = per_block_cast_to_fp8(x)
        back = dequantize_per_block(q, scale)
    else:
        raise ValueError(f"scaling must be 'tensor', '1x128' or '128x128', got {scaling!r}")
    return back, flushed_fraction(q, x)


def flushed_fraction(q, x) -> float:
    """The fraction of x's nonzero values whose e4m3 code is zero (underflow)."""
    x = np.asarray(x)
    return float(((e4m3_decode(q) == 0) & (x != 0)).sum() / max(1, np.count_nonzero(x)))


SCHEMES = [  # (activations, weights)
    ("tensor", "tensor"),
    ("128x128", "128x128"),
    ("1x128", "1x128"),
    ("1x128", "128x128"),  # DeepSeek-V3 and this library
]


def scaling_table(m: int = 256, n: int = 256, k: int = 1024, seed: int = 0) -> list[dict]:
    """One row per (activation, weight) scaling of SCHEMES on outlier_activations x N(0, WEIGHT_STD) weights."""
    rng = np.random.default_rng(seed)
    x, tokens = outlier_activations(m, k, rng)
    w = rng.standard_normal((n, k), dtype=np.float32) * np.float32(WEIGHT_STD)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    ordinary = np.setdiff1d(np.arange(m), tokens)
    rows = []
    for x_scaling, w_scaling in SCHEMES:
        xq, x_flushed = quantize(x, x_scaling)
        wq, w_flushed = quantize(w, w_scaling)
        y = xq @ wq.T
        rows.append({"activations": x_scaling, "weights": w_scaling, "x_flushed": x_flushed,
                     "w_flushed": w_flushed, "diff": calc_diff(y, exact),
                     "diff_ordinary": calc_diff(y[ordinary], exact[ordinary]),
                     "worst_token": max(calc_diff(y[i], exact[i]) for i in ordinary)})
    return rows


SCALING_COLUMNS = [
    Column("activations", "activations", align="left"), Column("weights", "weights", align="left"),
    Column("x_flushed", "x flushed to 0", "{:.2%}"), Column("w_flushed", "w flushed to 0", "{:.2%}"),
    Column("diff", "GEMM diff", "{:.1e}"), Column("diff_ordinary", "diff, ordinary tokens", "{:.1e}"),
    Column("worst_token", "worst token's diff", "{:.1e}"),
]


# ------------------------------------------------------------------------------------------- 2. accumulation

def accumulation_operands(m: int, n: int, k: int, data: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """(M, K), (N, K) e4m3 operands (as float64) from one per-tensor scale each, so that promoting or not changes
    the accumulation only. ``data``: "zero-mean" (N(0, 1) both) or "same-sign" (|N(0, 1)| both: every product
    is positive, the worst case for a truncating accumulator)."""
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    if data == "same-sign":
        x, w = np.abs(x), np.abs(w)
    elif data != "zero-mean":
        raise ValueError(f"data must be 'zero-mean' or 'same-sign', got {data!r}")
    return tuple(e4m3_decode(per_tensor_cast_to_fp8(v)[0]).astype(np.float64) for v in (x, w))


def accumulate(a, b, model: AccumulatorModel | None, promote_every: int | None, snapshots=(), scale: float = 1.0):
    """D = a @ b.T summed k32 step by k32 step as a wgmma kernel does: each step's 32 products go into the
    accumulator (under ``model``, or exactly, rounded to FP32 per step, like the emulator's default); every
    ``promote_every`` of K (a multiple of 32; None: never, one accumulator over the whole K) the accumulator is
    promoted, ``total = fma(acc, scale, total)`` in FP32 (exact product and sum, one rounding, as the emulator's
    fma.rn.f32), and restarts from zero. Returns {K: the result after the first K} for K in ``snapshots``
    (multiples of promote_every), or the result over all of K when no snapshots are asked for."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    k = a.shape[1]
    if k % K_STEP or (promote_every and promote_every % K_STEP):
        raise ValueError(f"K ({k}) and promote_every ({promote_every}) must be multiples of {K_STEP}")
    wanted = set(snapshots) or {k}
    total = np.zeros((a.shape[0], b.shape[0]), np.float32)
    acc, out = None, {}
    for step in range(k // K_STEP):
        window = slice(K_STEP * step, K_STEP * (step + 1))
        products = a[:, None, window] * b[None, :, window]  # (M, N, 32), exact
        if model is not None:
            acc = model.accumulate(products, acc)
        else:
            acc = (products.sum(-1) + (0.0 if acc is None else acc)).astype(np.float32)
        done = K_STEP * (step + 1)
        if promote_every and done % promote_every == 0:
            total = (acc.astype(np.float64) * np.float64(np.float32(scale)) + total).astype(np.float32)
            acc = None
        if done in wanted:
            out[done] = total if promote_every else acc
    return out if snapshots else out[k]


ACCUMULATION_KS = (512, 1024, 2048, 4096, 8192, 16384)


def accumulation_table(ks=ACCUMULATION_KS, m: int = 32, n: int = 32, data: str = "zero-mean", bits: int = 14,
                       seed: int = 0) -> list[dict]:
    """Per K: the error of the limited-precision accumulator (AccumulatorModel(bits)) over the whole K and
    promoted every 128, and of an FP32 accumulator over the whole K, against the float64 sum (one pass over
    max(ks); smaller K are its prefixes). diff = calc_diff; rel = ||D - exact|| / ||exact||."""
    rng = np.random.default_rng(seed)
    a, b = accumulation_operands(m, n, max(ks), data, rng)
    model = AccumulatorModel(bits)
    whole = accumulate(a, b, model, None, ks)
    promoted = accumulate(a, b, model, PROMOTE_EVERY, ks)
    fp32 = accumulate(a, b, None, None, ks)
    rows = []
    for k in ks:
        exact = a[:, :k] @ b[:, :k].T
        norm = np.linalg.norm(exact)
        row = {"k": k}
        for key, result in (("whole", whole[k]), ("promoted", promoted[k]), ("fp32", fp32[k])):
            row[f"diff_{key}"] = calc_diff(result, exact)
            row[f"rel_{key}"] = float(np.linalg.norm(result - exact) / norm)
        rows.append(row)
    return rows


ACCUMULATION_COLUMNS = [
    Column("k", "K"),
    Column("diff_whole", "diff, no promotion", "{:.1e}"), Column("diff_promoted", "diff, promoted /128", "{:.1e}"),
    Column("rel_whole", "rel err, no promotion", "{:.1e}"), Column("rel_promoted", "rel err, promoted /128", "{:.1e}"),
    Column("diff_fp32", "diff, FP32 accumulator", "{:.1e}"),
]


# ----------------------------------------------------------------------------- 3. why 128x128 weight blocks

def transpose_table(n: int = 512, k: int = 1024, seed: int = 0) -> list[dict]:
    """The backward pass multiplies by W^T (dX = dY @ W), which the kernel reads as a (K, N) operand grouped along
    N. With 128x128 blocks, casting W^T gives exactly cast(W)^T (the same blocks, transposed): the forward's FP8
    copy, transposed, serves. With 1x128 groups the groups run along the other axis: the codes differ, so W^T must
    be cast again from the high-precision master weights or requantized from the forward's FP8 copy (quantized
    twice). Per scaling: the fraction of cast(W^T)'s codes equal to cast(W)^T's, and the error (calc_diff against
    the exact W^T) of cast(W^T) and of the W^T made from the forward's FP8 copy (128x128: its transpose; 1x128:
    dequantized and cast again)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k), dtype=np.float32) * np.float32(WEIGHT_STD)
    rows = []
    for scaling, cast, dequantize in (("128x128", per_block_cast_to_fp8, dequantize_per_block),
                                      ("1x128", per_token_cast_to_fp8, dequantize_per_token)):
        q, s = cast(w)
        qt, st = cast(np.ascontiguousarray(w.T))
        same_codes = float(np.mean(qt.view(np.uint8) == q.T.view(np.uint8)))
        same_scales = s.shape[::-1] == st.shape and np.array_equal(s.T, st)
        if same_codes == 1.0 and same_scales:
            from_fp8 = dequantize(np.ascontiguousarray(q.T), np.ascontiguousarray(s.T))  # a transpose, no rounding
        else:
            from_fp8 = dequantize(*cast(np.ascontiguousarray(dequantize(q, s).T, np.float32)))  # a second rounding
        rows.append({"scaling": scaling, "w_scales": "x".join(map(str, s.shape)),
                     "wt_scales": "x".join(map(str, st.shape)) + (" (= W's, transposed)" if same_scales else ""),
                     "same_codes": same_codes, "diff_cast": calc_diff(dequantize(qt, st), w.T),
                     "diff_from_fp8": calc_diff(from_fp8, w.T)})
    return rows


TRANSPOSE_COLUMNS = [
    Column("scaling", "W scaling", align="left"), Column("w_scales", "scales of W", align="left"),
    Column("wt_scales", "scales of W^T", align="left"), Column("same_codes", "cast(W^T) == cast(W)^T", "{:.1%}"),
    Column("diff_cast", "diff, W^T cast afresh", "{:.1e}"),
    Column("diff_from_fp8", "diff, W^T from the forward's FP8 W", "{:.1e}"),
]


def accumulator_columns(block_n: int) -> int:
    """Distinct columns of D one thread's wgmma accumulators cover (ptx.vocab.wgmma.accumulator_coords)."""
    from ptx.vocab.wgmma import accumulator_coords
    return len({accumulator_coords(0, 0, i)[1] for i in range(block_n // 2)})


def scale_loads_table(block_m: int = 128, block_n: int = 128, k: int = 7168) -> list[dict]:
    """Scale traffic and promotion work of one (block_m x block_n) CTA tile, per K block and over K, for 128x128
    and 1x128 weight scales (activations 1x128 in both). With one B scale per tile and K block the promotion is
    total += acc * (sa[row] * sb): two multiplies per thread (its two rows) then one FFMA per accumulator. With a
    scale per column, every accumulator needs its own sa[row] * sb[col]: one more multiply each, and each thread
    must fetch the sb of all its columns."""
    k_blocks = ceil_div(k, GROUP)
    per_thread = block_n // 2  # accumulators per thread per 64-row wave
    columns = accumulator_columns(block_n)
    rows = []
    for scaling, b_scales, thread_scales, multiplies in (
            ("128x128", ceil_div(block_n, GROUP), ceil_div(block_n, GROUP), 2 * ceil_div(block_n, GROUP)),
            ("1x128", block_n, columns, per_thread)):
        rows.append({"scaling": scaling, "a_scales": block_m, "b_scales": b_scales, "thread_scales": thread_scales,
                     "ops": f"{multiplies} FMUL + {per_thread} FFMA", "b_bytes": 4 * b_scales * k_blocks})
    return rows


SCALE_LOAD_COLUMNS = [
    Column("scaling", "weight scaling", align="left"), Column("a_scales", "A scales / K block"),
    Column("b_scales", "B scales / K block"), Column("thread_scales", "B scales each thread needs"),
    Column("ops", "promotion / thread / K block", align="left"), Column("b_bytes", "B scale bytes / tile"),
]


# ------------------------------------------------------------------------ the emulator without the promotion

_PROMOTE = re.compile(r"fma\.rn\.f32 (%tot_\d+), (%acc_\d+), (%\w+), \1;")
_ZERO_TOTAL = re.compile(r"^(\s*)mov\.f32 (%tot_\d+), 0f00000000;$", re.M)


def without_promotion(ptx: str) -> str:
    """A generated kernel's PTX with the promotion deleted: the wgmma accumulators are zeroed where the totals
    are (each tile) and never restarted (every wgmma accumulates, scale-d true), and where the kernel promoted,
    ``total += acc * scale`` becomes ``total = acc * scale``: the whole K stays in the tensor cores' accumulator
    and is scaled once. Equal to the real GEMM only when every K block has the same scales (per-tensor scaling);
    for configs with one 64-row wave per math warpgroup (block_m <= 128)."""
    pairs = dict((tot, acc) for tot, acc, _ in _PROMOTE.findall(ptx))
    if not pairs:
        raise ValueError("no promotion (fma.rn.f32 %tot, %acc, scale, %tot) found in the PTX")
    if len(set(pairs.values())) != len(pairs):
        raise ValueError("an accumulator is promoted into several totals (several waves, block_m > 128): the whole "
                         "K cannot stay in one accumulator")
    ptx = _PROMOTE.sub(r"mul.f32 \1, \2, \3;", ptx)
    ptx = _ZERO_TOTAL.sub(lambda z: f"{z.group(0)}\n{z.group(1)}mov.f32 {pairs[z.group(2)]}, 0f00000000;", ptx)
    fresh = set(re.findall(r"wgmma\.mma_async[^;]*?, (%p_fresh_\d+), ", ptx))
    accumulate = re.search(r"setp\.eq\.u32 (%p_acc_\d+),", ptx)
    if not fresh or accumulate is None:
        raise ValueError("no wgmma with a scale-d = false predicate (%p_fresh) found in the PTX")
    for name in fresh:
        ptx = re.sub(rf"(wgmma\.mma_async[^;]*?, ){re.escape(name)}, ", rf"\g<1>{accumulate.group(1)}, ", ptx)
    return ptx


def per_tensor_problem(m: int, n: int, k: int, data: str = "same-sign", seed: int = 0):
    """(a, sa, b, sb) in the gemm.fp8 contract with one scale per tensor (sa, sb filled with it), so a kernel
    without the promotion computes the same GEMM; ``data`` as in :func:`accumulation_operands`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    if data == "same-sign":
        x, w = np.abs(x), np.abs(w)
    (a, s_a), (b, s_b) = per_tensor_cast_to_fp8(x), per_tensor_cast_to_fp8(w)
    sa = np.full((m, ceil_div(k, GROUP)), s_a, np.float32)
    sb = np.full((ceil_div(n, GROUP), ceil_div(k, GROUP)), s_b, np.float32)
    return a, sa, b, sb


# ------------------------------------------------------------------------------------------------- printing

def print_tables(seed: int = 0) -> None:
    print(f"1. Scaling granularity: activations N(0,1), {OUTLIER_CHANNELS:.0%} of channels x{CHANNEL_GAIN:g}, "
          f"{OUTLIER_TOKENS} tokens x{TOKEN_GAIN:g}; weights N(0, {WEIGHT_STD}); M=256 N=256 K=1024")
    print(format_table(SCALING_COLUMNS, scaling_table(seed=seed)))
    for data in ("zero-mean", "same-sign"):
        print(f"\n2. Accumulation, {data} e4m3 operands, M=N=32: a 14-bit truncating accumulator (a model) over the "
              "whole K vs promoted into FP32 every 128")
        print(format_table(ACCUMULATION_COLUMNS, accumulation_table(data=data, seed=seed)))
    print("\n3a. W and W^T (the backward pass), N=512 K=1024")
    print(format_table(TRANSPOSE_COLUMNS, transpose_table(seed=seed)))
    print("\n3b. Weight scales per 128x128 tile, K=7168 (56 K blocks)")
    print(format_table(SCALE_LOAD_COLUMNS, scale_loads_table()))


__all__ = [
    "E4M3_MIN_SUBNORMAL", "PROMOTE_EVERY", "SCHEMES", "outlier_activations", "per_tensor_cast_to_fp8", "quantize",
    "flushed_fraction", "scaling_table", "accumulation_operands", "accumulate", "accumulation_table",
    "transpose_table", "accumulator_columns", "scale_loads_table", "without_promotion",
    "per_tensor_problem", "print_tables",
]

if __name__ == "__main__":
    print_tables()
