"""Stage 01, naive: one thread per output element, DeepGEMM's per-group promotion from the start.

The one idea: the FP8 GEMM contract itself. Thread (m, n) walks K in groups of 128; inside a group it
sums decoded e4m3 products in an FP32 ``partial``, then adds ``partial * sa[m, g] * sb[n // 128, g]`` to the
FP32 ``total`` (DeepGEMM's "promotion": the scales are applied once per group, not per product), and
finally rounds ``total`` to BF16.

What changed vs the previous stage: this is the first GEMM stage (stage 00 only dequantizes).

Why it is slow: every thread re-reads its whole row of A and column of B from memory (reused only
through the L1/L2 caches), and decodes every FP8 byte again for every product: two decodes of about ten
integer instructions each per FFMA. A warp's 32 threads read B from 32 different rows (the NT layout has
K contiguous), so each of its byte loads touches 32 cache lines.

Speed of light: the L1/shared-memory port, not the FP32 units. Per k, a warp's 32 threads load a[m, k] (one
address: one 128-byte L1 wavefront) and b[n, k] from 32 rows K bytes apart (32 cache lines: 32 wavefronts), for
32 FFMAs. The L1 serves one wavefront per SM per clock, so that is 33 x 128 B per 64 flop, 66 B per flop:
132 SMs x 128 B x 1.98 GHz / 66 = 0.507 TFLOP/s (the FFMA units alone would allow 66.9). The integer decode
(about 20 instructions per FFMA) overlaps with the waiting.

Measured: 0.493 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3; 97% of its speed of light (L1/smem, 0.507
TFLOP/s), 0.025% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
from numba import cuda

from gemm.validate import check_gemm_args
from lessons.numba_fp8 import (GROUP, device_function, e4m3_to_f32, f32_to_bf16_bits, float32, kernel_array,
                               launch_stream)

IDEA = "one thread per output; FP32 partial per 128-wide K group, scaled by sa*sb and added to the total"
KIND = "numba"

BLOCK_N = 32  # threads along N: a warp writes 32 consecutive outputs of one row
BLOCK_M = 8


@device_function
def output_element(block_x, block_y, tx, ty):
    """(m, n) of the element of D that thread (tx, ty) of block (block_x, block_y) computes.

    threadIdx.x runs along N, so a warp (32 consecutive x) covers 32 consecutive columns of one row.
    """
    n = block_x * BLOCK_N + tx
    m = block_y * BLOCK_M + ty
    return m, n


@device_function
def promote(total, partial, sa_value, sb_value):
    """DeepGEMM's promotion: the K group's FP32 ``partial`` sum, scaled once by sa[m, g] * sb[n // 128, g], added
    to the running FP32 ``total``; returns the new total. (The hole of exercise 01: lessons/exercises.)"""
    return total + partial * (sa_value * sb_value)


def make_kernel(promote=promote):
    """The stage's kernel with ``promote`` (a device function like :func:`promote`) plugged in at the promotion;
    ``make_kernel()`` is the stage's own ``naive_kernel``."""

    @cuda.jit
    def naive_kernel(a, sa, b, sb, d, m_size, n_size, groups):
        m, n = output_element(cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.threadIdx.y)
        if m >= m_size or n >= n_size:
            return
        total = float32(0.0)
        for g in range(groups):
            partial = float32(0.0)
            k = g * GROUP
            while k < (g + 1) * GROUP:  # `while`, not `for ... range`: see numba_fp8.py (loops)
                partial += e4m3_to_f32(a[m, k]) * e4m3_to_f32(b[n, k])
                k += 1
            total = promote(total, partial, sa[m, g], sb[n // GROUP, g])
        d[m, n] = f32_to_bf16_bits(total)

    return naive_kernel


naive_kernel = make_kernel()


KERNEL = naive_kernel
OPERAND_DTYPE = "u1"  # how the kernel reads the FP8 bytes of A and B


def launch_config(m: int, n: int):
    return (-(-n // BLOCK_N), -(-m // BLOCK_M)), (BLOCK_N, BLOCK_M)


def gemm(a, sa, b, sb, d, stream=None, kernel=None):
    """D = (A*sA)(B*sB)^T, BF16; see lessons/__init__.py for the contract. Asynchronous. ``kernel``: one from
    :func:`make_kernel` (the exercises), else the stage's own."""
    args = check_gemm_args(a, sa, b, sb, d)
    grid, block = launch_config(args.m, args.n)
    (kernel or naive_kernel)[grid, block, launch_stream(stream)](
        kernel_array(args.a, OPERAND_DTYPE), kernel_array(args.sa, "f4"), kernel_array(args.b, OPERAND_DTYPE),
        kernel_array(args.sb, "f4"), kernel_array(args.d, "u2"), args.m, args.n, args.k // GROUP)
