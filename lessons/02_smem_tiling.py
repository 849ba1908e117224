"""Stage 02, shared-memory tiling: a block stages one K group of A and B in shared memory, decoded once.

The one idea: threads that need the same data load it once, together. A block of 32 x 32 threads owns a
32 x 32 tile of D. For each 128-wide K group it copies the 32 x 128 slice of A and of B from global memory
into shared memory (coalesced: a warp reads 32 consecutive bytes), then every thread computes its
group partial from shared memory, and the promotion is exactly stage 01's.

What changed vs stage 01: the K loop now runs over shared-memory tiles instead of global memory, and the
FP8 bytes are decoded to float32 *while staging* (each byte once per block) instead of once per product.
We keep float32 (not bytes) in shared memory because decoding costs about ten integer instructions and
would otherwise be repeated 32 times per byte; the price is 4x the shared memory (about 32 KiB a block).
The K tile is exactly one scale group (128), so the promotion happens once per tile.

Bank conflicts: thread (ty, tx) reads a_tile[ty, k] (one address per warp: a broadcast) and
b_tile[tx, k]; b_tile rows are padded to 129 floats so the 32 threads of a warp hit 32 different banks.

Speed of light: still the L1/shared-memory port, with 16.5x fewer bytes per flop. Per k a warp reads
a_tile[ty, k] (one address, a broadcast: one wavefront) and b_tile[tx, k] (32 banks: one wavefront) for 32
FFMAs: 2 x 128 B per 64 flop, so 33.45 TB/s / 4 B per flop = 8.36 TFLOP/s. Staging (the global loads, the
decode, two barriers per K group) comes on top, which is where the rest of the time goes.

Measured: 5.94 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 12.03x stage 01; 71% of its speed of light
(L1/smem, 8.36 TFLOP/s), 0.3% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
from numba import cuda

from gemm.validate import check_gemm_args
from lessons.numba_fp8 import (GROUP, device_function, e4m3_to_f32, f32_to_bf16_bits, float32, kernel_array,
                               launch_stream)

IDEA = "stage a K group of A and B through shared memory, decoded to float32 once per block"
KIND = "numba"

TILE = 32  # BLOCK_M = BLOCK_N = 32 threads on each side, one output each
BLOCK_K = GROUP  # one scale group per shared-memory tile
B_PITCH = BLOCK_K + 1  # padding: b_tile[tx, k] across a warp lands in 32 different banks
BANKS = 32  # shared memory: 32 banks of 4-byte words; word w is in bank w % 32


@device_function
def output_element(block_x, block_y, tx, ty):
    """(m, n) of the element of D that thread (tx, ty) of block (block_x, block_y) computes (warp = one row)."""
    return block_y * TILE + ty, block_x * TILE + tx


@device_function
def staged_k(step, tx):
    """The K byte (0..127 of the group) that thread x ``tx`` decodes into the tiles in staging step ``step``."""
    return step * TILE + tx


def shared_word(row: int, k: int, pitch: int) -> int:
    """Word offset of ``tile[row, k]`` in a ``cuda.shared.array((rows, pitch), float32)``: Numba's arrays are
    C-ordered, so a_tile (pitch BLOCK_K) and b_tile (pitch B_PITCH) put it at row * pitch + k, in bank % BANKS."""
    return row * pitch + k


def b_tile_pitch() -> int:
    """Row pitch of b_tile in float32 words: BLOCK_K + 1, so b_tile[tx, k] across a warp lands in 32 different
    banks (the hole of exercise 02: lessons/exercises)."""
    return B_PITCH


def make_kernel(b_pitch=None):
    """The stage's kernel with b_tile rows ``b_pitch`` words apart (a compile-time constant; default
    :func:`b_tile_pitch`); ``make_kernel()`` is the stage's own ``smem_tiling_kernel``."""
    b_pitch = b_tile_pitch() if b_pitch is None else int(b_pitch)

    @cuda.jit
    def smem_tiling_kernel(a, sa, b, sb, d, m_size, n_size, groups):
        a_tile = cuda.shared.array((TILE, BLOCK_K), float32)
        b_tile = cuda.shared.array((TILE, b_pitch), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        m0 = cuda.blockIdx.y * TILE
        n0 = cuda.blockIdx.x * TILE
        m, n = output_element(cuda.blockIdx.x, cuda.blockIdx.y, tx, ty)
        total = float32(0.0)
        for g in range(groups):
            k0 = g * GROUP
            # Stage: thread (ty, tx) decodes bytes tx, tx+32, tx+64, tx+96 of row ty of both tiles.
            for step in range(BLOCK_K // TILE):
                k = staged_k(step, tx)
                a_tile[ty, k] = e4m3_to_f32(a[m0 + ty, k0 + k]) if m0 + ty < m_size else float32(0.0)
                b_tile[ty, k] = e4m3_to_f32(b[n0 + ty, k0 + k]) if n0 + ty < n_size else float32(0.0)
            cuda.syncthreads()
            partial = float32(0.0)
            k = 0
            while k < BLOCK_K:  # `while`, not `for ... range`: see numba_fp8.py (loops)
                partial += a_tile[ty, k] * b_tile[tx, k]
                k += 1
            if m < m_size and n < n_size:
                total += partial * (sa[m, g] * sb[n // GROUP, g])
            cuda.syncthreads()  # the tiles are overwritten by the next group
        if m < m_size and n < n_size:
            d[m, n] = f32_to_bf16_bits(total)

    return smem_tiling_kernel


smem_tiling_kernel = make_kernel()
KERNEL = smem_tiling_kernel
OPERAND_DTYPE = "u1"  # how the kernel reads the FP8 bytes of A and B


def launch_config(m: int, n: int):
    return (-(-n // TILE), -(-m // TILE)), (TILE, TILE)


def gemm(a, sa, b, sb, d, stream=None, kernel=None):
    """D = (A*sA)(B*sB)^T, BF16; see lessons/__init__.py for the contract. Asynchronous. ``kernel``: one from
    :func:`make_kernel` (the exercises), else the stage's own."""
    args = check_gemm_args(a, sa, b, sb, d)
    grid, block = launch_config(args.m, args.n)
    (kernel or smem_tiling_kernel)[grid, block, launch_stream(stream)](
        kernel_array(args.a, OPERAND_DTYPE), kernel_array(args.sa, "f4"), kernel_array(args.b, OPERAND_DTYPE),
        kernel_array(args.sb, "f4"), kernel_array(args.d, "u2"), args.m, args.n, args.k // GROUP)
