"""Stage 00 (warm-up) - PTX from Python: FP8 per-token dequantization, y = e4m3(x) * s, written in raw PTX.

The one idea: a GPU kernel can be *text that Python writes*. Every later PTX stage follows this path:

1. Python -> PTX text. :func:`generate` builds the kernel with :class:`ptx.builder.KernelBuilder` and the
   named idioms of :mod:`ptx.vocab.core`; the shape (M, K) is substituted as constants, as DeepGEMM's JIT
   substitutes its template parameters.
2. PTX -> cubin. :func:`ptx.compile.compile_ptx` hands the text to nvJitLink (ptxas inside a pip wheel; no
   GPU, no CUDA toolkit) for ``sm_90a`` and parses its report: registers, spills, shared memory.
3. cubin -> SASS. :func:`ptx.sass.disassemble` runs nvdisasm: here one ``cvt.rn.f16x2.e4m3x2`` becomes one
   ``F2FP.F16.E4M3.UNPACK_B``, each ``cvt.f32.f16`` a ``HADD2.F32`` and each ``cvt.rn.bf16x2.f32`` an
   ``F2FP.BF16.F32.PACK_AB``.
4. Launch. :func:`ptx.runtime.load_kernel` loads the cubin with cuda.core; ``Kernel.launch`` passes the
   device pointers of Numba / torch arrays to ``cuLaunchKernelEx``.

The kernel: x (M, K) e4m3 bytes, s (M, ceil(K/128)) float32 row-major (one scale per 1x128 group, as
``gemm.per_token_cast_to_fp8`` makes), y (M, K) BF16. Each thread loads 16 bytes of x with one 16-byte
vector load (16 elements never straddle a 128-wide group), converts pairs of e4m3 to f16 with one
instruction each, widens to f32, multiplies by its group's scale and packs pairs into BF16, then writes its
32 bytes with two 16-byte stores. ``y`` is bit-identical to NumPy's ``(e4m3 -> f32) * s`` rounded to BF16.

What changed vs the previous stage: there is none; stage 01 (Numba) starts the GEMM ladder.

Speed of light: HBM, since the kernel moves bytes and does almost no math. Each element reads 1 byte and writes 2,
plus 4 bytes of scale per 128: at M=4096, K=7168 that is 89 MB, 26.6 us at HBM3's 3.35 TB/s (lessons.ladder.UNITS).
Its notebook times it in GB/s against that rate.

Measured: not a ladder stage (no GEMM); its GPU test checks it bit for bit against NumPy.
"""
from __future__ import annotations

import functools

import numpy as np

from gemm.fp8 import GROUP, ceil_div
from ptx.builder import KernelBuilder, module
from ptx.vocab import core

IDEA = "a kernel is text Python writes: PTX -> nvJitLink cubin -> SASS -> cuda-python launch (FP8 dequant)"
KIND = "ptx"

BYTES_PER_THREAD = 16  # one ld.global.v4.b32
THREADS = 256
KERNEL_NAME = "fp8_dequant"


def _shape_from(m: int, dims: tuple[int, ...]) -> tuple[int, int]:
    # generate(m, k); the GEMM stages' generate(m, n, k) form also works (dequantizing the (m, k) activation)
    if len(dims) not in (1, 2):
        raise TypeError("generate(m, k) (or generate(m, n, k))")
    return m, dims[-1]


def dequantize_pair(kb: KernelBuilder, pair: str, scale: str) -> str:
    """Emit the PTX for two elements: ``pair`` (a .b16 register) holds two e4m3 codes, the first in its low byte;
    ``scale`` (.f32) is their group's scale. Returns the .b32 register holding bf16(e4m3 * scale) of both, the
    first in its low half (so the 16-byte stores keep memory order). The hole of exercise 00 (lessons/exercises)."""
    halves_f16x2, low, high = kb.reg("b32"), kb.reg("b16"), kb.reg("b16")
    first, second, out = kb.reg("f32"), kb.reg("f32"), kb.reg("b32")
    kb.emit(core.cvt_e4m3x2_to_f16x2(halves_f16x2, pair),
            core.unpack_b32(low, high, halves_f16x2),
            core.cvt_f16_to_f32(first, low),
            core.cvt_f16_to_f32(second, high),
            f"mul.rn.f32 {first}, {first}, {scale};",
            f"mul.rn.f32 {second}, {second}, {scale};",
            core.cvt_f32x2_to_bf16x2(out, second, first))
    return out


def generate(m: int = 4096, *dims: int, dequantize_pair=None) -> str:
    """PTX for dequantizing an (m, k) e4m3 tensor: ``generate(m, k)``. Needs k % 16 == 0. ``dequantize_pair``:
    a function like :func:`dequantize_pair` that emits each pair's PTX (exercise 00); default the stage's own."""
    pair_body = globals()["dequantize_pair"] if dequantize_pair is None else dequantize_pair
    if not dims:
        dims = (7168,)
    m, k = _shape_from(m, dims)
    if k % BYTES_PER_THREAD:
        raise ValueError(f"K must be a multiple of {BYTES_PER_THREAD}, got {k}")
    chunks_per_row = k // BYTES_PER_THREAD
    total_chunks = m * chunks_per_row
    groups_per_row = ceil_div(k, GROUP)

    kb = KernelBuilder(KERNEL_NAME, [("u64", "x"), ("u64", "s"), ("u64", "y")], max_threads=THREADS)
    chunk, scratch = kb.reg("u32"), kb.reg("u32")
    out_of_range = kb.reg("pred")
    done = kb.label("done")
    kb.comment(f"thread -> 16-byte chunk of x; {total_chunks} chunks ({m} x {k} bytes)")
    kb.emit(core.global_thread_index(chunk, scratch))
    kb.emit(core.setp("ge", "u32", out_of_range, chunk, str(total_chunks)))
    kb.emit(core.exit_if(out_of_range, done))

    x, s, y = kb.reg("u64"), kb.reg("u64"), kb.reg("u64")
    kb.emit(core.global_pointer_param(x, kb.param("x")),
            core.global_pointer_param(s, kb.param("s")),
            core.global_pointer_param(y, kb.param("y")))

    row, group, scale_index = kb.reg("u32"), kb.reg("u32"), kb.reg("u32")
    chunks_per_group_log2 = (GROUP // BYTES_PER_THREAD).bit_length() - 1
    if k % GROUP == 0:
        kb.comment("s[row, col // 128]: rows of s tile rows of x exactly, so it is s[chunk // 8]")
        kb.emit(f"shr.u32 {scale_index}, {chunk}, {chunks_per_group_log2};")
    else:
        kb.comment("s[row, col // 128] with a ragged last group: split chunk into (row, column)")
        kb.emit(f"div.u32 {row}, {chunk}, {chunks_per_row};",
                f"mul.lo.u32 {group}, {row}, {chunks_per_row};",
                f"sub.u32 {group}, {chunk}, {group};",
                f"shr.u32 {group}, {group}, {chunks_per_group_log2};",
                f"mad.lo.u32 {scale_index}, {row}, {groups_per_row}, {group};")
    scale_address, scale = kb.reg("u64"), kb.reg("f32")
    kb.emit(core.element_address(scale_address, s, scale_index, 4),
            core.ld_global("f32", scale, scale_address, cache=".nc"))

    kb.comment("16 e4m3 bytes in, 16 bf16 out")
    x_address, y_address = kb.reg("u64"), kb.reg("u64")
    words = kb.regs("b32", 4)
    kb.emit(core.element_address(x_address, x, chunk, BYTES_PER_THREAD),
            core.ld_global_v4(words, x_address))
    packed = []
    for word in words:
        pairs = kb.regs("b16", 2)
        kb.emit(core.unpack_b32(*pairs, word))
        for pair in pairs:
            packed.append(pair_body(kb, pair, scale))
    kb.emit(core.element_address(y_address, y, chunk, 2 * BYTES_PER_THREAD),
            core.st_global_v4(y_address, packed[:4]),
            core.st_global_v4(y_address, packed[4:], offset=16))
    kb.place(done)
    return module([kb])


# -- launching ---------------------------------------------------------------------------------------
def _check_args(x, s, y):
    from ptx.arrays import as_device_view
    views = {}
    for name, obj, dtypes in (("x", x, ("uint8", "float8_e4m3fn")), ("s", s, ("float32",)),
                              ("y", y, ("uint16", "bfloat16"))):
        view = as_device_view(obj)
        if view.dtype.name not in dtypes:
            raise TypeError(f"dequantize: {name} must have dtype {' or '.join(dtypes)}, got {view.dtype.name}")
        if len(view.shape) != 2:
            raise ValueError(f"dequantize: {name} must be 2-D, got shape {view.shape}")
        if not view.is_row_major():
            raise ValueError(f"dequantize: {name} must be row-major contiguous, got strides {view.strides}")
        if not view.on_device:
            raise ValueError(f"dequantize: {name} is in host memory; pass a device array (Numba, torch, CuPy)")
        views[name] = view
    m, k = views["x"].shape
    if k % BYTES_PER_THREAD:
        raise ValueError(f"dequantize: x's K must be a multiple of {BYTES_PER_THREAD}, got {k}")
    if views["s"].shape != (m, ceil_div(k, GROUP)):
        raise ValueError(f"dequantize: s must have shape (M, ceil(K/128)) = {(m, ceil_div(k, GROUP))}, "
                         f"got {views['s'].shape}")
    if views["y"].shape != (m, k):
        raise ValueError(f"dequantize: y must have shape (M, K) = {(m, k)}, got {views['y'].shape}")
    for name in ("x", "y"):
        if views[name].ptr % 16:
            raise ValueError(f"dequantize: {name} must be 16-byte aligned (16-byte vector accesses)")
    if views["s"].ptr % 4:
        raise ValueError("dequantize: s must be 4-byte aligned")
    return views, m, k


@functools.lru_cache(maxsize=64)
def _kernel(m: int, k: int):
    from ptx.compile import compile_ptx
    from ptx.runtime import load_kernel
    return load_kernel(compile_ptx(generate(m, k)), KERNEL_NAME)


def dequantize(x, s, y, stream=None):
    """y = e4m3(x) * s (per 1x128 group), BF16, on the GPU. Device arrays in, asynchronous; returns y."""
    views, m, k = _check_args(x, s, y)
    if m == 0 or k == 0:
        return y
    kernel = _kernel(m, k)
    blocks = ceil_div(m * k // BYTES_PER_THREAD, THREADS)
    kernel.launch(blocks, THREADS, [views["x"].ptr, views["s"].ptr, views["y"].ptr], stream=stream)
    return y


def reference(x, s) -> np.ndarray:
    """What the kernel computes, on the host: bf16(f32(e4m3) * s) with round-to-nearest-even, as uint16 bits."""
    from gemm.fp8 import BF16, e4m3_decode
    values = e4m3_decode(np.asarray(x))
    k = values.shape[1]
    scales = np.repeat(np.asarray(s, dtype=np.float32), GROUP, axis=1)[:, :k]
    return (values * scales).astype(BF16).view(np.uint16)
