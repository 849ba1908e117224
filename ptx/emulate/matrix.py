"""Warp-collective matrix instructions (ldmatrix, stmatrix, mma.sync), evaluated per warp from the PTX ISA's
definitions, written independently of ptx.vocab.mma_sync: a wrong fragment or address role in a generator shows up as
a wrong answer; and the arithmetic of one wgmma (:func:`wgmma_accumulate`, called by ptx.emulate.async_proxy),
exact by default, or under an optional *model* of Hopper's limited-precision FP8 accumulator
(:class:`AccumulatorModel`, switched on by :func:`accumulator_model`)."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from .common import E4M3, EmulationError, _gather, _to_bytes, _vector


def warps(mask, what: str) -> list[int]:
    """The warps executing a warp-collective instruction; each must execute it with all 32 lanes."""
    lanes = mask.reshape(-1, 32)
    involved = np.flatnonzero(lanes.any(1))
    if not lanes[involved].all():
        raise EmulationError(f"{what} executed by only some lanes of a warp")
    return involved.tolist()


def ldmatrix(cta, ops, mask):  # PTX ISA "ldmatrix", .m8n8 .x1/.x2/.x4 .b16
    dests = _vector(ops[0])
    addresses = cta.address(ops[1])
    results = [np.zeros(cta.n, np.int64) for _ in dests]
    for warp in warps(mask, "ldmatrix"):
        lanes = np.arange(32) + 32 * warp
        for j in range(len(dests)):
            # lane L receives row L//4 of matrix j, bytes 4*(L%4)..+3; row r's address came from lane 8j+r
            rows = cta._shared(addresses[32 * warp + 8 * j + np.arange(32) // 4], 16)
            starts = rows + 4 * (np.arange(32) % 4)
            results[j][lanes] = _gather(cta.smem, starts, 4).copy().view(np.uint32)[:, 0]
    for name, value in zip(dests, results):
        cta.write(name, value, mask)


def stmatrix(cta, opcode, ops, mask):  # PTX ISA "stmatrix", .m8n8 .x1/.x2/.x4 .b16: ldmatrix reversed
    sources = _vector(ops[1])
    addresses = cta.address(ops[0])
    for warp in warps(mask, "stmatrix"):
        for j, name in enumerate(sources):
            row_addresses = addresses[32 * warp + 8 * j:32 * warp + 8 * j + 8]
            if (row_addresses % 16).any():
                raise EmulationError(f"stmatrix row addresses must be 16-byte aligned: "
                                     f"{row_addresses[row_addresses % 16 != 0][:4]}")
            words = cta.value(name)[32 * warp:32 * warp + 32]
            halves = _to_bytes(words, 4).reshape(32, 2, 2)  # lane, 16-bit half, byte
            for start, half in stmatrix_targets(row_addresses, ".trans" in opcode):
                cta.smem[cta._shared(start, 2)[:, None] + np.arange(2)] = halves[:, half]


def stmatrix_targets(row_addresses, transpose: bool):
    """Where one 8x8 matrix of an stmatrix goes: [(start, half)], the shared address per lane (32,) at which the
    lane's 16-bit ``half`` (0: its column 2(L % 4), 1: the next) of (row L // 4) is stored. Plain: row L // 4's
    address + 4 (L % 4) + 2 half. ``.trans`` (PTX ISA: the matrix is stored column-major): element (r, c) goes to
    row c's address + 2 r."""
    lane = np.arange(32)
    row, column = lane // 4, 2 * (lane % 4)
    if transpose:
        return [(row_addresses[column + half] + 2 * row, half) for half in (0, 1)]
    return [(row_addresses[row] + 2 * column + 2 * half, half) for half in (0, 1)]


def mma_sync(cta, ops, mask):  # PTX ISA "Matrix Fragments for mma.m16n8k32", 8-bit A/B, f32 C/D
    if not mask.all():
        raise EmulationError("mma under a partial predicate")
    d, a, b, c = (_vector(x) for x in ops)
    a_regs = np.stack([cta.value(x) for x in a], 1).astype(np.uint32)  # (threads, 4)
    b_regs = np.stack([cta.value(x) for x in b], 1).astype(np.uint32)
    c_vals = np.stack([cta.value(x) for x in c], 1).astype(np.float64)
    out = np.zeros((cta.n, 4), np.float32)
    lane = np.arange(32)
    group, tig = lane >> 2, lane % 4
    for warp in range(cta.n // 32):
        sl = slice(32 * warp, 32 * warp + 32)
        a_bytes = a_regs[sl].copy().view(np.uint8).reshape(32, 16)  # element i = byte i (low to high)
        b_bytes = b_regs[sl].copy().view(np.uint8).reshape(32, 8)
        A, B, C = np.zeros((16, 32)), np.zeros((32, 8)), np.zeros((16, 8))
        for i in range(16):
            row = np.where((i < 4) | ((8 <= i) & (i < 12)), group, group + 8)
            col = tig * 4 + (i & 3) + (16 if i >= 8 else 0)
            A[row, col] = a_bytes[:, i].view(E4M3).astype(np.float64)
        for i in range(8):
            row = tig * 4 + (i & 3) + (16 if i >= 4 else 0)
            B[row, group] = b_bytes[:, i].view(E4M3).astype(np.float64)
        for i in range(4):
            C[np.where(i < 2, group, group + 8), tig * 2 + (i & 1)] = c_vals[sl, i]
        D = A @ B + C
        for i in range(4):
            out[sl, i] = D[np.where(i < 2, group, group + 8), tig * 2 + (i & 1)]
    for i, name in enumerate(d):
        cta.write(name, out[:, i], mask)


# -- the wgmma accumulator: exact, or a model of the limited-precision hardware accumulator -------------------
# This is a MODEL, not the hardware. NVIDIA does not document the internal accumulator of its FP8 tensor cores.
# The public account is the DeepSeek-V3 technical report (arXiv:2412.19437): section 3.3.2, "Increasing
# Accumulation Precision", measured that FP8 GEMM accumulation on H800 keeps only about 14 bits (a maximum
# relative error near 2% at K = 4096 in their test); their hardware suggestions (section 3.5, compute hardware)
# describe the mechanism: the 32 mantissa products of one tensor-core step are aligned by right-shifting to the
# largest exponent, only the highest 14 bits of each are added and the bits below are truncated, and the addition
# into the accumulator register is done at 14 bits too. Their fix, which DeepGEMM and every kernel here use, is
# the promotion: every 128 of K (4 wgmma k32 steps) the partial sum is scaled and added into FP32 registers by FFMA.


@dataclass(frozen=True)
class AccumulatorModel:
    """One wgmma k32 step under a ``bits``-bit aligned, truncating accumulator (a model; see above).

    For each accumulator element, one ``wgmma m64nNk32 .f32.e4m3.e4m3`` has 32 products p_0..p_31 (each exact:
    an e4m3 times an e4m3 fits in 8 significant bits) and, when scale-d is true, the incoming accumulator c.
    Those 32 (or 33) terms are added as one fused sum:

    1. alignment: e = the exponent of the largest-magnitude term (2**e <= max|t| < 2**(e+1));
    2. truncation: every term keeps only its bits of weight >= u = 2**(e - bits + 1), i.e. the ``bits`` highest
       bits counting from the largest term's leading bit; the rest is cut off toward zero (t -> trunc(t/u)*u);
    3. the truncated terms are added exactly and the sum is written to the FP32 register (it has at most
       bits + 6 significant bits, so for bits <= 18 that write is exact).

    So a product more than ``bits`` binades below the largest term vanishes, and, because the accumulator
    takes part in the alignment, once the running sum is large every product added to it keeps only its
    top few bits: the error grows with the number of k32 steps accumulated without a promotion. ``bits=14``
    is DeepSeek-V3's figure (13 fraction bits + the leading one). Not modelled: rounding modes other than
    truncation, extra carry or guard bits, the exact grouping inside the tensor core, subnormal corner cases.
    """
    bits: int = 14

    def __post_init__(self):
        if not 2 <= self.bits <= 40:
            raise ValueError(f"bits must be in 2..40 (the sum of 33 terms must stay exact in float64), got {self.bits}")

    def accumulate(self, products, current=None) -> np.ndarray:
        """products (..., k) float64, current (...) or None (scale-d false) -> the new accumulators, float32."""
        return limited_precision_sum(products, current, self.bits)


def limited_precision_sum(products, current=None, bits: int = 14) -> np.ndarray:
    """The fused sum of :class:`AccumulatorModel` over the last axis of ``products`` (plus ``current``, the
    incoming accumulator, when given), as float32. One home for the model: the emulator's wgmma and
    lessons.precision both call it."""
    terms = np.asarray(products, np.float64)
    if current is not None:
        terms = np.concatenate([np.asarray(current, np.float64)[..., None], terms], axis=-1)
    _, exponent = np.frexp(np.abs(terms).max(axis=-1))  # max|t| = f * 2**exponent, f in [0.5, 1); 0 -> 0
    unit = np.ldexp(1.0, exponent - bits)[..., None]  # 2**(e - bits + 1) with e = exponent - 1
    return (np.trunc(terms / unit) * unit).sum(axis=-1).astype(np.float32)  # the sum is exact: < 2**(bits+6) units


_MODEL: ContextVar[AccumulatorModel | None] = ContextVar("wgmma_accumulator_model", default=None)


@contextmanager
def accumulator_model(model: AccumulatorModel | int | None = 14):
    """Within the block, every wgmma the emulator runs uses ``model`` (an AccumulatorModel, or its bit count);
    ``None`` is the exact default. Off unless asked for: nothing else (no environment variable) switches it.

        with accumulator_model(14):
            d = gemm.testing.emulated.run_gemm(config, a, sa, b, sb)
    """
    if isinstance(model, int):
        model = AccumulatorModel(model)
    token = _MODEL.set(model)
    try:
        yield model
    finally:
        _MODEL.reset(token)


def active_accumulator_model() -> AccumulatorModel | None:
    return _MODEL.get()


def wgmma_accumulate(a, b, sign, rows, cols, current) -> np.ndarray:
    """The accumulators after one wgmma m64nNk32: ``a`` (64, 32) and ``b`` (N, 32) e4m3 values as float64,
    ``sign`` the product of the imm-scales, (``rows``, ``cols``) the fragment layout (each (128, N/2): the D
    element of accumulator i of thread t), ``current`` (128, N/2) float64 or None (scale-d false).

    Exact by default (the emulator's arithmetic before the model existed, bit for bit): the 32 products are summed
    exactly in float64 (e4m3 products span 36 binades, so no bit is lost), the accumulator is added in float64 and
    the result rounded to FP32. Under :func:`accumulator_model`: the model's fused sum."""
    model = _MODEL.get()
    if model is None:
        fragment = (sign * (a @ b.T))[rows, cols]
        return (fragment + (0.0 if current is None else current)).astype(np.float32)
    return model.accumulate(sign * a[rows] * b[cols], current)
