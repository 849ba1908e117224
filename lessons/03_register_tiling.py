"""Stage 03, register tiling: each thread computes an 8 x 8 micro-tile of D from registers.

The one idea: make every value read from shared memory feed many FFMAs. A block of 16 x 16 threads owns a
128 x 128 tile of D; each thread owns 8 rows x 8 columns of it. For each k of a 32-deep shared-memory
tile, a thread loads 8 values of A and 8 of B into registers and does 8 x 8 = 64 FFMAs with them
(stage 02 did 1 FFMA per 2 values read from shared memory; here 4 per value, 16 per 128-bit load).

What changed vs stage 02:
* Tiles are 128 x 32 (BLOCK x BLOCK_K), stored transposed (k-major) so a thread's 8 values along M or N
  are contiguous and the compiler can read them with 128-bit shared loads (two per fragment).
* Global loads are wide: A and B are read as uint64 words (8 FP8 bytes per load, K % 128 == 0 keeps them
  aligned) and decoded by ``e4m3x4_to_f32`` while staging. Thread t owns row ``t % 128`` of the tile, so
  its transposed shared stores from a warp hit 32 consecutive floats (no bank conflicts); the warp's global
  loads touch 32 rows, whose other words the neighbouring warps read at the same time (L1 hits).
* The promotion is the same, but per micro-tile: 64 FP32 ``partial`` registers are scaled by
  ``sa[m, g] * sb[n // 128, g]`` and added to 64 ``total`` registers once per K group (every 4 tiles).
  BLOCK_N == 128, so one sb value covers the whole block for a group.
* A thread's 8 columns are two runs of 4 (``tx*4 + j`` and ``64 + tx*4 + j``), likewise its rows: the 16
  threads of a half-warp then read 256 contiguous bytes per 128-bit load, conflict-free.

Register budget: 64 partial + 64 total + 16 fragment values + addresses, about 170 of 255 per thread; one
256-thread block per SM fits, so latency is hidden by ILP (64 independent FFMAs) rather than occupancy.

Speed of light: the FP32 FMA units at last. Per k a warp does 32 x 64 = 2048 FFMAs on four 128-bit shared loads;
the A loads are broadcasts (two addresses: one wavefront each) and the B loads span 256 bytes (two each): 6
wavefronts, 0.19 B per flop, which the shared-memory port could serve at 178 TFLOP/s. So the FFMA pipe binds:
132 SMs x 128 lanes x 2 flop x 1.98 GHz = 66.9 TFLOP/s, a thirtieth of the FP8 tensor cores. Between this
kernel and that: the decode while staging (about ten integer instructions per byte), the promotion, two barriers
per tile and only 8 warps per SM to cover the shared-load latency.

Measured: 23.9 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 4.03x stage 02; 36% of its speed of light
(FP32 FFMA, 66.9 TFLOP/s), 1.2% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
from numba import config, cuda

from gemm.validate import check_gemm_args
from lessons.numba_fp8 import (GROUP, device_function, e4m3x4_to_f32, f32_to_bf16_bits, float32, kernel_array,
                               launch_stream, uint32, uint64)

IDEA = "each thread an 8x8 micro-tile in registers; 128-bit smem reads, 8-byte global loads of packed FP8"
KIND = "numba"

BLOCK_M = BLOCK_N = 128  # == GROUP: one sb scale per block and K group
BLOCK_K = 32
THREADS_M = THREADS_N = 16
THREADS = THREADS_M * THREADS_N
THREAD_M = BLOCK_M // THREADS_M  # 8 rows per thread, as two runs of 4 starting HALF_M apart
THREAD_N = BLOCK_N // THREADS_N  # 8 columns per thread, likewise
HALF_M, HALF_N = BLOCK_M // 2, BLOCK_N // 2
WORD_BYTES = 8  # one global load: a uint64 holding 8 FP8 codes
WORDS_PER_THREAD = BLOCK_M * BLOCK_K // WORD_BYTES // THREADS  # 2 (same for B: BLOCK_N == BLOCK_M)
TILES_PER_GROUP = GROUP // BLOCK_K  # 4 shared-memory tiles per scale group
SMEM_ALIGNMENT = None if config.ENABLE_CUDASIM else 16  # 16 bytes: room for 128-bit shared loads
assert BLOCK_M == BLOCK_N == GROUP and GROUP % BLOCK_K == 0 and THREADS % BLOCK_M == 0


@device_function
def stage_tile(words, row0, rows, word0, tile, t):
    """tile[k, r] = decoded byte k (of BLOCK_K) of row row0 + r, from uint64 word word0 on; zeros past `rows`.

    Thread t owns tile row t % 128 and its words t // 128 + 2 * step: 256 threads x 2 words = 128 rows x 4.
    """
    r = t % BLOCK_M
    for step in range(WORDS_PER_THREAD):
        w = t // BLOCK_M + step * (THREADS // BLOCK_M)
        word = words[row0 + r, word0 + w] if row0 + r < rows else uint64(0)
        v0, v1, v2, v3 = e4m3x4_to_f32(uint32(word & uint64(0xFFFFFFFF)))
        v4, v5, v6, v7 = e4m3x4_to_f32(uint32(word >> uint64(32)))
        k = w * WORD_BYTES
        tile[k, r] = v0
        tile[k + 1, r] = v1
        tile[k + 2, r] = v2
        tile[k + 3, r] = v3
        tile[k + 4, r] = v4
        tile[k + 5, r] = v5
        tile[k + 6, r] = v6
        tile[k + 7, r] = v7


@device_function
def micro_offset(i, thread):
    """Tile row (column) of a thread's i-th row (column): two runs of 4, HALF_M apart.

    Unsigned, so that Numba emits no negative-index wraparound and the compiler sees 4 consecutive floats.
    """
    return uint64((i // 4) * HALF_M + thread * 4 + i % 4)


def make_kernel(micro_offset=micro_offset):
    """The stage's kernel with ``micro_offset`` (a device function like :func:`micro_offset`) plugged in
    wherever a thread maps its i-th row / column to the tile; ``make_kernel()`` is the stage's own
    ``register_tiling_kernel``. (The hole of exercise 03: lessons/exercises.)"""

    @cuda.jit
    def register_tiling_kernel(a_words, sa, b_words, sb, d, m_size, n_size, groups):
        a_tile = cuda.shared.array((BLOCK_K, BLOCK_M), float32, alignment=SMEM_ALIGNMENT)  # k-major: A^T
        b_tile = cuda.shared.array((BLOCK_K, BLOCK_N), float32, alignment=SMEM_ALIGNMENT)
        a_frag = cuda.local.array(THREAD_M, float32)
        b_frag = cuda.local.array(THREAD_N, float32)
        partial = cuda.local.array((THREAD_M, THREAD_N), float32)
        total = cuda.local.array((THREAD_M, THREAD_N), float32)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        t = ty * THREADS_N + tx
        m0 = cuda.blockIdx.y * BLOCK_M
        n0 = cuda.blockIdx.x * BLOCK_N
        for i in range(THREAD_M):
            for j in range(THREAD_N):
                partial[i, j] = float32(0.0)
                total[i, j] = float32(0.0)
        tiles = groups * TILES_PER_GROUP
        tile = 0
        while tile < tiles:  # `while`, not `for ... range`: see numba_fp8.py (loops)
            stage_tile(a_words, m0, m_size, tile * (BLOCK_K // WORD_BYTES), a_tile, t)
            stage_tile(b_words, n0, n_size, tile * (BLOCK_K // WORD_BYTES), b_tile, t)
            cuda.syncthreads()
            k = 0
            while k < BLOCK_K:
                for i in range(THREAD_M):
                    a_frag[i] = a_tile[k, micro_offset(i, ty)]
                for j in range(THREAD_N):
                    b_frag[j] = b_tile[k, micro_offset(j, tx)]
                for i in range(THREAD_M):
                    for j in range(THREAD_N):
                        partial[i, j] += a_frag[i] * b_frag[j]
                k += 1
            cuda.syncthreads()  # the tiles are overwritten next
            if tile % TILES_PER_GROUP == TILES_PER_GROUP - 1:  # a K group is complete: promote
                g = tile // TILES_PER_GROUP
                sb_scale = sb[cuda.blockIdx.x, g]
                for i in range(THREAD_M):
                    m = m0 + micro_offset(i, ty)
                    scale = sa[m, g] * sb_scale if m < m_size else float32(0.0)
                    for j in range(THREAD_N):
                        total[i, j] += partial[i, j] * scale
                        partial[i, j] = float32(0.0)
            tile += 1
        # 64 inlined BF16 conversions are too long a loop for the compiler to unroll; indexing `total` from a
        # rolled loop would move it to local memory for the whole kernel, so the epilogue reads a copy.
        result = cuda.local.array((THREAD_M, THREAD_N), float32)
        for i in range(THREAD_M):
            for j in range(THREAD_N):
                result[i, j] = total[i, j]
        for i in range(THREAD_M):
            m = m0 + micro_offset(i, ty)
            for j in range(THREAD_N):
                n = n0 + micro_offset(j, tx)
                if m < m_size and n < n_size:
                    d[m, n] = f32_to_bf16_bits(result[i, j])

    return register_tiling_kernel


register_tiling_kernel = make_kernel()
KERNEL = register_tiling_kernel
OPERAND_DTYPE = "u8"  # how the kernel reads the FP8 bytes of A and B


def launch_config(m: int, n: int):
    return (-(-n // BLOCK_N), -(-m // BLOCK_M)), (THREADS_N, THREADS_M)


def gemm(a, sa, b, sb, d, stream=None, kernel=None):
    """D = (A*sA)(B*sB)^T, BF16; see lessons/__init__.py for the contract. Asynchronous. ``kernel``: one from
    :func:`make_kernel` (the exercises), else the stage's own."""
    args = check_gemm_args(a, sa, b, sb, d)
    grid, block = launch_config(args.m, args.n)
    (kernel or register_tiling_kernel)[grid, block, launch_stream(stream)](
        kernel_array(args.a, OPERAND_DTYPE), kernel_array(args.sa, "f4"), kernel_array(args.b, OPERAND_DTYPE),
        kernel_array(args.sb, "f4"), kernel_array(args.d, "u2"), args.m, args.n, args.k // GROUP)
