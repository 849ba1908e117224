"""Warp-collective matrix instructions (ldmatrix, stmatrix, mma.sync), evaluated per warp from the PTX ISA's
definitions, written independently of ptx.vocab.mma: a wrong fragment or address role in a generator shows up as
a wrong answer."""
from __future__ import annotations

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
    if ".trans" in opcode:
        raise EmulationError("stmatrix .trans is not modelled")
    sources = _vector(ops[1])
    addresses = cta.address(ops[0])
    for warp in warps(mask, "stmatrix"):
        for j, name in enumerate(sources):
            rows = addresses[32 * warp + 8 * j + np.arange(32) // 4]
            if (rows % 16).any():
                raise EmulationError(f"stmatrix row addresses must be 16-byte aligned: {rows[rows % 16][:4]}")
            starts = cta._shared(rows + 4 * (np.arange(32) % 4), 4)
            words = cta.value(name)[32 * warp:32 * warp + 32]
            cta.smem[starts[:, None] + np.arange(4)] = _to_bytes(words, 4)


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
