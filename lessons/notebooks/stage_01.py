"""Notebook 01: the naive Numba kernel, promotion from the start."""
from __future__ import annotations

from lessons.notebooks.cells import CHECK_NOTE_NUMBA, numba_notebook


INTRO = """\
# 01 · Naive: one thread per output, promotion from the start

**The one idea:** the fine-grained-scaled GEMM, written as plainly as possible. Thread (m, n) walks K in
groups of 128: it sums the 128 products of decoded e4m3 values in an FP32 *partial* sum, then adds
`partial · sA[m, g] · sB[n // 128, g]` to its FP32 total, and writes the total once, rounded to BF16.

That inner structure is DeepGEMM's *promotion* and it is in the contract from this first stage: the scale
changes every 128 elements of K, so no kernel can fold it into one long dot product. The tensor-core stages
keep exactly this loop nest; only where the partial sum is computed changes.

What to look for: the cost. Every FP8 byte of A is fetched by all N threads of its row and every byte of B
by all M threads of its column (through L1/L2), and each byte is decoded in software: this kernel is
bound by memory traffic and integer work, far from the math units.
"""


KERNEL = """\
## The kernel

The stage's `@cuda.jit` functions, then the device-side e4m3 decode and BF16 encode the Numba stages share
(`lessons/numba_fp8.py`). An e4m3 byte is sign · 2^(e−7) · (1 + m/8) for exponent e > 0, and a subnormal
sign · 2^−6 · m/8 for e = 0; the byte 0x7F/0xFF is NaN and there is no infinity. BF16 output keeps the upper
16 bits of the FP32 total after rounding to nearest even.
"""


def cells() -> list[dict]:
    return numba_notebook(
        1, INTRO, KERNEL, CHECK_NOTE_NUMBA,
        shapes_sim=[(7, 9, 256)], shapes_gpu=[(128, 256, 512), (100, 2112, 512)],
        extra_sources=("lessons.numba_fp8",))
