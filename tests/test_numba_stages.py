"""Numba stages 01-03: conversions exact, every stage right on ragged shapes (simulator on CPU, H100 on GPU).

Without a GPU, conftest.py turns on Numba's CUDA simulator, which runs each thread as Python: the shapes
here are tiny (tens of thousands of products) but still cross every edge a kernel has: ragged M and N,
a second N block of 128 (a second sb row), two K groups (the promotion), M past a 32-row tile.
"""
import ml_dtypes
import numpy as np
import pytest

import lessons  # noqa: F401  (first: its NumPy shim must precede numba-cuda)
from gemm.fp8 import align, bf16_to_float, calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from lessons.numba_fp8 import e4m3_to_f32, e4m3x4_to_f32, f32_to_bf16_bits
from numba import cuda  # conftest.py has chosen the simulator or the GPU by now

NUMBA_STAGES = [1, 2, 3]
BF16_NAN = 0x7FC0
RAGGED_GPU_SHAPES = [(1, 2112, 512), (100, 2112, 512), (257, 4096, 1024), (130, 130, 128), (4095, 7168, 2048)]


def _device_problem(m, n, k, rng):
    """Fresh inputs on the (possibly simulated) device; d poisoned with NaN so unwritten outputs show."""
    from gemm.testing.problems import device_problem  # the harness's layout: sa M-major without Numba's copying .T
    host = random_problem(m, n, k, rng)
    device = device_problem(*host)
    device.d.copy_to_device(np.full((m, n), BF16_NAN, np.uint16))
    return host, (device.a, device.sa, device.b, device.sb, device.d)


def _check(host, d_bits, rows=None):
    got = bf16_to_float(d_bits)
    assert not np.isnan(got).any(), f"{np.isnan(got).sum()} of {got.size} outputs were never written"
    a, sa, b, sb = host
    rows = slice(None) if rows is None else rows
    diff = calc_diff(got[rows], reference_gemm(a[rows], sa[rows], b, sb))
    assert diff < 1e-3, f"diff {diff:.2e}"


# ------------------------------------------------------------------------------- device conversions
def _run_elementwise(kernel, inputs, out_dtype, out_size=None):
    out = np.zeros(out_size or inputs.size, out_dtype)
    kernel[(inputs.size + 127) // 128, 128](inputs, out)
    return out


@cuda.jit
def decode_kernel(codes, out):
    i = cuda.grid(1)
    if i < codes.size:
        out[i] = e4m3_to_f32(codes[i])


@cuda.jit
def decode_words_kernel(words, out):
    i = cuda.grid(1)
    if i < words.size:
        out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3] = e4m3x4_to_f32(words[i])


@cuda.jit
def encode_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = f32_to_bf16_bits(x[i])


def test_e4m3_decode_is_exact_for_all_256_codes():
    codes = np.arange(256, dtype=np.uint8)
    expected = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    finite = ~np.isnan(expected)  # 0x7F and 0xFF: NaN, never produced by the casts
    got = _run_elementwise(decode_kernel, codes, np.float32)
    np.testing.assert_array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32))  # -0.0 too
    got_words = _run_elementwise(decode_words_kernel, codes.view(np.uint32), np.float32, 256)
    np.testing.assert_array_equal(got_words[finite].view(np.uint32), expected[finite].view(np.uint32))


def test_bf16_encode_rounds_to_nearest_even_like_ml_dtypes(rng):
    random_bits = rng.integers(0, 2 ** 32, 3000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2 ** 16, 1500, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000  # exact halfway
    near_ties = ties + rng.choice(np.array([-1, 1], np.int64), ties.size).astype(np.uint32)
    special = np.array([0.0, 1.0, 1.00390625, 1.01171875, 2.0 ** -126, 2.0 ** -127, 2.0 ** -133, 2.0 ** -149,
                        3.3961776e38, 3.4028235e38, np.inf, 1.1754942e-38], np.float32)
    x = np.concatenate([random_bits.view(np.float32), ties.view(np.float32), near_ties.view(np.float32),
                        special, -special, rng.standard_normal(1000, dtype=np.float32)])
    x = x[~np.isnan(x)]
    got = _run_elementwise(encode_kernel, x, np.int32)
    expected = x.astype(ml_dtypes.bfloat16).view(np.uint16).astype(np.int32)
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, [(float(x[i]), hex(got[i]), hex(expected[i])) for i in bad[:5]]


# ------------------------------------------------------------------------------ stages, simulator/GPU
SIMULATOR_SHAPES = [
    (5, 130, 128),  # ragged M; N crosses the 128 boundary: sb row 1 and a ragged second N tile
    (33, 9, 256),  # M past stage 02's 32-row tile; two K groups: the promotion runs twice
]


@pytest.mark.parametrize("number", NUMBA_STAGES)
def test_stage_contract(number):
    stage = lessons.stage(number)
    assert stage.KIND == "numba" and stage.IDEA and "Measured:" in stage.__doc__


@pytest.mark.parametrize("m, n, k", SIMULATOR_SHAPES)
@pytest.mark.parametrize("number", NUMBA_STAGES)
def test_stage_matches_reference(number, m, n, k, rng):
    host, (a, sa, b, sb, d) = _device_problem(m, n, k, rng)
    lessons.stage(number).gemm(a, sa, b, sb, d)
    _check(host, d.copy_to_host())


def test_host_arrays_are_refused_in_the_simulator_too(rng):
    """The simulator never relaxes argument checks: NumPy arguments are host memory there as on a GPU."""
    m, n, k = 3, 10, 128
    a, sa, b, sb = random_problem(m, n, k, rng)
    d = np.full((m, n), BF16_NAN, np.uint16).view(ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="a is in host memory"):
        lessons.stage(1).gemm(a, sa, b, sb, d)


@pytest.mark.parametrize("number", NUMBA_STAGES)
def test_bad_arguments_are_named(number, rng):
    """Host arrays posing as device arrays: the device check comes first, these are the checks after it."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(__file__))  # tests/tc_checks.py
    from tc_checks import on_fake_device

    def call(*args):
        stage.gemm(*map(on_fake_device, args))
    stage = lessons.stage(number)
    a, sa, b, sb = random_problem(4, 8, 256, rng)
    d = np.zeros((4, 8), np.uint16)
    with pytest.raises(TypeError, match="a must be e4m3"):
        call(a.astype(np.float32), sa, b, sb, d)
    with pytest.raises(TypeError, match="d must be BF16"):
        call(a, sa, b, sb, d.astype(np.float32))
    with pytest.raises(ValueError, match="sb must have shape"):
        call(a, sa, b, sb[:, :1], d)
    with pytest.raises(ValueError, match="d must have shape"):
        call(a, sa, b, sb, d[:3])
    a, sa, b, sb = random_problem(4, 8, 200, rng)
    with pytest.raises(ValueError, match="K=200 must be a multiple of 128"):
        call(a, sa, b, sb, d)


# --------------------------------------------------------------------------------------------- GPU
def _gpu_shape_params():
    params = []
    for shape in RAGGED_GPU_SHAPES:  # the 18 DeepSeek shapes: tests/test_deepseek_shapes.py
        marks = [pytest.mark.gpu] + ([pytest.mark.slow] if shape[0] >= 4000 else [])  # host side: seconds
        params.append(pytest.param(*shape, marks=marks))
    return params


@pytest.mark.parametrize("m, n, k", _gpu_shape_params())
def test_stages_on_gpu(m, n, k, rng):
    """All three stages on one fresh problem (generating and checking it costs more than the kernels)."""
    host, (a, sa, b, sb, d) = _device_problem(m, n, k, rng)
    rows = np.sort(rng.choice(m, size=min(m, 128), replace=False))  # the float64 reference is the slow part
    poison = np.full((m, n), BF16_NAN, np.uint16)
    failures = []
    for number in NUMBA_STAGES:
        d.copy_to_device(poison)
        lessons.stage(number).gemm(a, sa, b, sb, d)
        cuda.synchronize()
        try:
            _check(host, d.copy_to_host(), rows)
        except AssertionError as error:
            failures.append(f"stage {number}: {error}")
    assert not failures, "; ".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("number", NUMBA_STAGES)
def test_host_memory_is_refused_on_gpu(number, rng):
    a, sa, b, sb = random_problem(8, 16, 128, rng)
    with pytest.raises(ValueError, match="host memory"):
        lessons.stage(number).gemm(a, sa, b, sb, np.zeros((8, 16), np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("number", NUMBA_STAGES)
def test_torch_tensors_streams_and_graph_capture(number, rng):
    """float8/bfloat16 torch tensors, a non-default stream, and replay of a captured CUDA graph."""
    torch = pytest.importorskip("torch")
    m, n, k = 200, 2112, 512
    a, sa, b, sb = random_problem(m, n, k, rng)
    to = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()  # noqa: E731
    ta = to(a.view(np.uint8)).view(torch.float8_e4m3fn)
    tb = to(b.view(np.uint8)).view(torch.float8_e4m3fn)
    storage = torch.zeros((sa.shape[1], align(m, 4)), dtype=torch.float32, device="cuda")
    storage[:, :m] = to(np.ascontiguousarray(sa.T))
    tsa, tsb = storage[:, :m].t(), to(sb)
    out = torch.full((m, n), BF16_NAN, dtype=torch.int16, device="cuda").view(torch.bfloat16)
    stage = lessons.stage(number)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the inputs and the poison were written on the default stream
    with torch.cuda.stream(side):
        stage.gemm(ta, tsa, tb, tsb, out, stream=side.cuda_stream)  # first call compiles, outside capture
    side.synchronize()
    _check((a, sa, b, sb), out.view(torch.int16).cpu().numpy().view(np.uint16))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        stage.gemm(ta, tsa, tb, tsb, out, stream=side.cuda_stream)
    out.view(torch.int16).fill_(BF16_NAN)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    _check((a, sa, b, sb), out.view(torch.int16).cpu().numpy().view(np.uint16))


# ------------------------------------------------------------------------------- compiled for sm_90
_PTX_SCRIPT = """
import json, re, sys
import lessons
from lessons.numba_fp8 import kernel_ptx
report = {}
for number in (1, 2, 3):
    stage = lessons.stage(number)
    ptx = kernel_ptx(stage.KERNEL, stage.OPERAND_DTYPE)
    report[number] = {op: len(re.findall(r"^\\s+" + re.escape(op) + r"\\s", ptx, re.M))
                      for op in ("ld.global.u64", "ld.shared.f32", "ld.shared.v4.f32", "fma.rn.f32", "st.local.v4.f32")}
    report[number]["local_bytes"] = sum(int(x) for x in re.findall(r"__local_depot\\d+\\[(\\d+)\\]", ptx))
print(json.dumps(report))
"""


def test_kernels_compile_for_hopper_with_the_intended_loads():
    """NVVM (no GPU needed) in a fresh process without the simulator: what the PTX of each stage uses."""
    import json
    import os
    import subprocess
    import sys
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=os.getcwd())
    result = subprocess.run([sys.executable, "-c", _PTX_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=300)
    if result.returncode != 0 and "nvvm" in result.stderr.lower() and "found" in result.stderr.lower():
        pytest.skip("libNVVM not installed")
    assert result.returncode == 0, result.stderr[-3000:]
    report = {int(k): v for k, v in json.loads(result.stdout.strip().splitlines()[-1]).items()}
    assert report[1]["local_bytes"] == report[2]["local_bytes"] == 0  # everything in registers
    assert report[2]["ld.shared.f32"] >= 2 and report[2]["fma.rn.f32"] >= 2
    stage3 = report[3]
    assert stage3["ld.global.u64"] >= 4  # 8 FP8 bytes per global load (2 words each of A and B)
    assert stage3["ld.shared.v4.f32"] == 4  # per k: two 128-bit loads of A values, two of B
    assert stage3["fma.rn.f32"] >= 128  # 64 in the k loop, 64 in the promotion
    # only the epilogue's copy of the 8x8 totals may live in local memory (see the kernel's comment)
    assert stage3["local_bytes"] <= 256 and stage3["st.local.v4.f32"] <= 16
