"""Stage 00 (FP8 dequantization in PTX): assembled and inspected on the CPU, bit-exact against NumPy on the GPU."""
import numpy as np
import pytest

import lessons
from gemm.fp8 import E4M3, GROUP, ceil_div, per_token_cast_to_fp8
from ptx.compile import compile_ptx
from ptx.sass import disassemble, opcode_counts

stage = lessons.stage(0)

SHAPES = [(1, 128), (7, 144), (100, 512), (257, 2048), (129, 7168), (64, 16)]


def test_contract():
    assert stage.KIND == "ptx" and stage.IDEA
    assert "Measured:" in stage.__doc__


@pytest.mark.parametrize("m, k", [(100, 512), (7, 144), (4096, 7168)])
def test_assembles_without_spills(m, k):
    cubin = compile_ptx(stage.generate(m, k))
    res = cubin.resources[stage.KERNEL_NAME]
    assert 0 < res.registers <= 64
    assert res.spills == 0 and res.stack_frame == 0 and res.local_bytes == 0


def test_gemm_style_generate_signature():
    assert stage.generate(100, 4096, 512) == stage.generate(100, 512)
    with pytest.raises(ValueError, match="multiple of 16"):
        stage.generate(4, 120)


def test_sass_uses_the_fp8_conversion_instructions():
    instructions = disassemble(compile_ptx(stage.generate(256, 1024)), function=stage.KERNEL_NAME)
    texts = [i.text.split()[0] for i in instructions]
    # 16 bytes per thread: 8 e4m3x2 -> f16x2 unpacks, 16 f16 -> f32 widenings, 8 f32x2 -> bf16x2 packs.
    assert texts.count("F2FP.F16.E4M3.UNPACK_B") == 8
    assert texts.count("HADD2.F32") == 16
    assert texts.count("F2FP.BF16.F32.PACK_AB") == 8
    assert opcode_counts(instructions)["FMUL"] == 16
    # One 16-byte load of x, two 16-byte stores of y.
    assert sum(t.startswith("LDG.E.128") for t in texts) == 1
    assert texts.count("STG.E.128") == 2


def test_reference_rounds_like_the_kernel():
    # bf16(f32(e4m3) * s) with round-to-nearest-even, ties to even: 1 + 2**-8 is a tie between bf16 1 and
    # 1 + 2**-7 and must round down to 1.0 (0x3F80); 1 + 3 * 2**-8 rounds up to 0x3F82.
    x = np.full((1, 128), 1.0, dtype=np.float32).astype(E4M3)
    for scale, bits in [(1 + 2**-8, 0x3F80), (1 + 3 * 2**-8, 0x3F82)]:
        s = np.array([[scale]], dtype=np.float32)
        assert stage.reference(x, s)[0, 0] == bits


def test_bad_arguments_get_clear_errors():
    from numba import cuda  # the simulator on the CPU: device-looking arrays
    x = np.zeros((4, 256), np.uint8)
    s = np.ones((4, 2), np.float32)
    y = np.zeros((4, 256), np.uint16)
    with pytest.raises(ValueError, match="host memory"):
        stage.dequantize(x, s, y)
    dx, ds, dy = cuda.to_device(x), cuda.to_device(s), cuda.to_device(y)
    with pytest.raises(TypeError, match="x must have dtype"):
        stage.dequantize(cuda.to_device(x.astype(np.int8)), ds, dy)
    with pytest.raises(TypeError, match="y must have dtype"):
        stage.dequantize(dx, ds, cuda.to_device(y.astype(np.float32)))
    with pytest.raises(ValueError, match="s must have shape"):
        stage.dequantize(dx, cuda.to_device(np.ones((4, 3), np.float32)), dy)
    with pytest.raises(ValueError, match="y must have shape"):
        stage.dequantize(dx, ds, cuda.to_device(np.zeros((4, 128), np.uint16)))
    with pytest.raises(ValueError, match="multiple of 16"):
        stage.dequantize(cuda.to_device(np.zeros((4, 8), np.uint8)), cuda.to_device(np.ones((4, 1), np.float32)),
                         cuda.to_device(np.zeros((4, 8), np.uint16)))
    with pytest.raises(ValueError, match="row-major"):
        stage.dequantize(cuda.to_device(np.zeros((256, 4), np.uint8)).T, ds, dy)


# -- GPU ---------------------------------------------------------------------------------------------
def random_inputs(m, k, rng):
    """Realistic activations (per-token cast) with per-row magnitudes spanning 2**-8 .. 2**8."""
    magnitudes = np.exp2(rng.integers(-8, 9, (m, 1))).astype(np.float32)
    values = rng.standard_normal((m, k), dtype=np.float32) * magnitudes
    q, s = per_token_cast_to_fp8(values)
    return q.view(np.uint8), np.ascontiguousarray(s)


def all_codes_inputs(m, k, rng):
    """Every finite e4m3 code (incl. subnormals and -0; not the NaN codes 0x7F/0xFF) and random scales."""
    x = rng.integers(0, 256, (m, k), dtype=np.uint8)
    x[(x & 0x7F) == 0x7F] = 0x3C
    s = np.exp2(rng.uniform(-20, 20, (m, ceil_div(k, GROUP)))).astype(np.float32)
    return x, s


def _check(x, s, stream=None):
    from numba import cuda
    y = np.full(x.shape, 0xFFFF, np.uint16)  # NaN in BF16: any element not written stays NaN
    dx, ds, dy = cuda.to_device(x), cuda.to_device(s), cuda.to_device(y)
    stage.dequantize(dx, ds, dy, stream=stream)
    cuda.synchronize()
    got, want = dy.copy_to_host(), stage.reference(x, s)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} of {got.size} differ, first at {bad[0].tolist()}: " \
                          f"got {got[tuple(bad[0])]:#06x} want {want[tuple(bad[0])]:#06x}"


@pytest.mark.gpu
@pytest.mark.parametrize("m, k", SHAPES)
def test_dequantize_matches_numpy_exactly(m, k, rng):
    _check(*random_inputs(m, k, rng))


@pytest.mark.gpu
@pytest.mark.parametrize("m, k", [(33, 256), (5, 144)])
def test_dequantize_every_e4m3_code(m, k, rng):
    _check(*all_codes_inputs(m, k, rng))


@pytest.mark.gpu
def test_dequantize_on_a_stream(rng):
    from numba import cuda
    stream = cuda.stream()
    _check(*random_inputs(65, 1024, rng), stream=stream)  # a Numba stream object; ints work too


@pytest.mark.gpu
def test_dequantize_torch_tensors(rng):
    torch = pytest.importorskip("torch")
    m, k = 77, 896
    x, s = random_inputs(m, k, rng)
    tx = torch.from_numpy(x).cuda().view(torch.float8_e4m3fn)
    ts = torch.from_numpy(s).cuda()
    ty = torch.full((m, k), float("nan"), dtype=torch.bfloat16, device="cuda")
    stage.dequantize(tx, ts, ty, stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    got = ty.view(torch.int16).cpu().numpy().view(np.uint16)
    np.testing.assert_array_equal(got, stage.reference(x, s))
