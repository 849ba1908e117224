"""Notebook 00: PTX from Python, an FP8 dequantization kernel (generated, assembled, disassembled, checked)."""
from __future__ import annotations

from lessons.notebooks.cells import PTX_HELPERS, setup_cell
from lessons.notebooks.ipynb import code, markdown


INTRO = """\
# 00 · PTX from Python: an FP8 dequantization kernel

**The one idea:** a kernel can be *text that Python writes*. `generate(m, k)` builds PTX with
`ptx.builder.KernelBuilder` and the named idioms of `ptx.vocab`, with the shape substituted as constants;
`ptx.compile.compile_ptx` assembles it for `sm_90a` through nvJitLink (ptxas inside a pip wheel: no CUDA
toolkit, no GPU) and returns ptxas's resource report as data; `ptx.sass.disassemble` lists the SASS with
nvdisasm; `ptx.runtime.load_kernel(...).launch(...)` runs it with cuda-python. Every tensor-core stage of the
ladder takes this path.

The kernel is small and its answer exact: y = e4m3(x) · s per 1×128 group, in BF16, each thread handling
16 bytes. What to look for: how each PTX conversion becomes one SASS instruction —
`cvt.rn.f16x2.e4m3x2` (two FP8 values to two FP16 in one go) → `F2FP.F16.E4M3.UNPACK_B`, `cvt.f32.f16` →
`HADD2.F32`, `cvt.rn.bf16x2.f32` → `F2FP.BF16.F32.PACK_AB` — and the resource report, available before
anything runs.
"""


def cells() -> list[dict]:
    return [
        markdown(INTRO),
        code(setup_cell(0)),
        markdown("## The generated PTX\n\nThe header, then the first lines of each step: load 16 bytes, "
                 "convert pairs, scale, pack to BF16, store."),
        code(PTX_HELPERS + '''\


ptx_text = stage.generate(4096, 7168)  # (M, K) baked in
show_excerpt(ptx_text, ["ld.global", "cvt.rn.f16x2.e4m3x2", "cvt.f32.f16", "mul.rn.f32", "cvt.rn.bf16x2.f32",
                        "st.global"], per_keyword=2)'''),
        markdown("## Resources and SASS\n\nAssembled for `sm_90a` on this machine, GPU or not. Count the "
                 "conversions: 8 unpacks (16 FP8 bytes → 16 FP16) and 8 packs (16 FP32 → 16 BF16) per thread."),
        code('''\
cubin = compile_ptx(ptx_text)
instructions = show_resources(cubin, ["F2FP", "HADD2", "FMUL", "LDG", "STG"])
show_sass(instructions, "F2FP")
show_sass(instructions, "HADD2")'''),
        markdown("""\
## Is it right?

On the host, `stage.reference` says what the kernel must produce: bf16(f32(e4m3) · s), rounded to nearest
even. On a Hopper GPU the kernel's output must match it bit for bit (the output is poisoned first)."""),
        code('''\
from gemm.fp8 import BF16, dequantize_per_token, per_token_cast_to_fp8

x = np.random.default_rng().standard_normal((64, 512), dtype=np.float32)
q, scale = per_token_cast_to_fp8(x)
expected = stage.reference(q, scale)
print("first values, float64 dequantized:", np.round(dequantize_per_token(q, scale)[0, :4], 5))
print("first values, BF16 (reference):   ", expected[0, :4].view(BF16).astype(np.float32))

if is_hopper():
    from numba import cuda
    y = cuda.to_device(np.full(q.shape, 0x7FC0, np.uint16))  # NaN poison
    stage.dequantize(cuda.to_device(q.view(np.uint8)), cuda.to_device(scale), y)
    cuda.synchronize()
    got = y.copy_to_host()
    print("bit-identical to the reference:", bool(np.array_equal(got, expected)))
    assert np.array_equal(got, expected)
else:
    print("Launching needs a Hopper GPU (sm_90a); above, the kernel was generated, assembled and disassembled.")'''),
        markdown("""\
## Timing

Dequantization moves bytes and does almost no math, so it is measured in GB/s: 1 byte read and 2 written per
element, plus the scales. Compare with the H100's ~3 TB/s device-to-device copy."""),
        code('''\
if is_hopper():
    from numba import cuda
    from gemm.testing.timer import bench_kernel
    m, k = 4096, 7168
    q, scale = per_token_cast_to_fp8(np.random.default_rng().standard_normal((m, k), dtype=np.float32))
    x_d, s_d = cuda.to_device(q.view(np.uint8)), cuda.to_device(scale)
    y = cuda.device_array((m, k), np.uint16)
    timing = bench_kernel(lambda stream: stage.dequantize(x_d, s_d, y, stream=stream))
    moved = 3 * m * k + 4 * scale.size
    print(f"M={m} K={k}: {timing.median_us:.1f} us, {timing.gbps(moved):.0f} GB/s")
else:
    print("Timings need a Hopper GPU (there is none here).")'''),
    ]
