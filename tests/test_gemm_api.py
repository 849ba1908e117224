"""The public API: clear errors for bad input (CPU), and fp8_gemm_nt correctness and JIT cost (GPU)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gemm
from gemm.fp8 import calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from gemm.validate import check_gemm_args

sys.path.insert(0, os.path.dirname(__file__))  # tests/tc_checks.py
from tc_checks import on_fake_device  # noqa: E402

BF16_NAN = 0x7FC0


def _host_problem(rng, m=70, n=200, k=256):
    a, sa, b, sb = random_problem(m, n, k, rng)
    return a, sa, b, sb, np.zeros((m, n), np.uint16)


def _fake_device_problem(rng, **shape):
    return [on_fake_device(x) for x in _host_problem(rng, **shape)]


def test_valid_arguments_pass(rng):
    args = check_gemm_args(*_fake_device_problem(rng))
    assert (args.m, args.n, args.k) == (70, 200, 256)
    assert args.sa_stride == 72  # M padded to a multiple of 4 floats


@pytest.mark.parametrize("name, bad, error, words", [
    ("a", lambda a: a.astype(np.float32), TypeError, "a must be e4m3"),
    ("b", lambda b: b.astype(np.float16), TypeError, "b must be e4m3"),
    ("sa", lambda sa: sa.astype(np.float64), TypeError, "sa must be float32"),
    ("sb", lambda sb: sb[:-1], ValueError, "sb must have shape"),
    ("sa", lambda sa: np.ascontiguousarray(sa), ValueError, "M-major"),
    ("d", lambda d: d.astype(np.float32), TypeError, "d must be BF16"),
    ("d", lambda d: d[:, :-1], ValueError, "d must have shape"),
    ("a", lambda a: a[:, ::2], ValueError, "b must have shape (N, K) with the K of a"),
    ("b", lambda b: np.asfortranarray(b), ValueError, "b must be contiguous row-major"),
    ("a", lambda a: a[0], ValueError, "a must be 2-D"),
    ("a", lambda a: [[1, 2]], TypeError, "a: expected an array"),
])
def test_bad_argument_names_it(rng, name, bad, error, words):
    args = dict(zip(("a", "sa", "b", "sb", "d"), _host_problem(rng)))
    args[name] = on_fake_device(bad(args[name]))
    args = {key: on_fake_device(value) for key, value in args.items()}
    with pytest.raises(error) as info:
        check_gemm_args(**args)
    assert words in str(info.value)


def test_fp32_output_and_c_are_checked(rng):
    """fp8_gemm_nt's d may be FP32 (out_dtypes), c needs an FP32 d of the same shape, an FP32 d needs N % 4 == 0."""
    from gemm.dispatch import OUT_DTYPES
    a, sa, b, sb, _ = _fake_device_problem(rng, n=200)
    d32 = on_fake_device(np.zeros((70, 200), np.float32))
    args = check_gemm_args(a, sa, b, sb, d32, d32, out_dtypes=OUT_DTYPES)
    assert args.c is not None and args.d.dtype == np.float32
    with pytest.raises(TypeError, match="d must be BF16 output"):  # the lessons' stages write BF16 only
        check_gemm_args(a, sa, b, sb, d32)
    bf16 = on_fake_device(np.zeros((70, 200), np.uint16))
    with pytest.raises(TypeError, match="d must be float32 when c is given"):
        check_gemm_args(a, sa, b, sb, bf16, d32, out_dtypes=OUT_DTYPES)
    with pytest.raises(ValueError, match="c must have shape"):
        check_gemm_args(a, sa, b, sb, d32, on_fake_device(np.zeros((70, 199), np.float32)), out_dtypes=OUT_DTYPES)
    with pytest.raises(TypeError, match="c must be the FP32 addend"):
        check_gemm_args(a, sa, b, sb, d32, bf16, out_dtypes=OUT_DTYPES)
    a, sa, b, sb, _ = _fake_device_problem(rng, n=202)
    with pytest.raises(ValueError, match="FP32 d needs N % 4 == 0"):
        check_gemm_args(a, sa, b, sb, on_fake_device(np.zeros((70, 202), np.float32)), out_dtypes=OUT_DTYPES)


def test_k_must_be_a_multiple_of_128(rng):
    a, sa, b, sb = random_problem(8, 8, 200, rng)
    with pytest.raises(ValueError, match="K=200 must be a multiple of 128"):
        check_gemm_args(*map(on_fake_device, (a, sa, b, sb, np.zeros((8, 8), np.uint16))))


def test_host_memory_is_refused_even_under_the_simulator(rng, monkeypatch):
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    with pytest.raises(ValueError, match="host memory"):
        check_gemm_args(*_host_problem(rng))


def test_mn_major_helper_makes_the_required_layout(rng):
    sa = rng.random((5, 3), dtype=np.float32)
    mn = gemm.get_mn_major_tma_aligned_tensor(sa)
    np.testing.assert_array_equal(mn, sa)
    assert mn.strides == (4, 8 * 4)


# ------------------------------------------------------------------------------------------------ GPU
def _device_problem(m, n, k, rng):
    torch = pytest.importorskip("torch")
    a, sa, b, sb = random_problem(m, n, k, rng)
    to = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()  # noqa: E731
    ta = to(a.view(np.uint8)).view(torch.float8_e4m3fn)
    tb = to(b.view(np.uint8)).view(torch.float8_e4m3fn)
    tsa = gemm.get_mn_major_tma_aligned_tensor(to(np.ascontiguousarray(sa)))
    tsb = to(sb)
    out = torch.full((m, n), BF16_NAN, dtype=torch.int16, device="cuda").view(torch.bfloat16)
    return (a, sa, b, sb), (ta, tsa, tb, tsb, out)


@pytest.mark.gpu
def test_fp8_gemm_nt_numba_arrays(rng):
    from numba import cuda
    from gemm.testing.problems import mn_major_view
    m, n, k = 130, 2112, 512
    a, sa, b, sb = random_problem(m, n, k, rng)
    storage = np.zeros((sa.shape[1], 132), np.float32)
    storage[:, :m] = sa.T
    d_sa = mn_major_view(cuda.to_device(storage), m)
    out = cuda.to_device(np.full((m, n), BF16_NAN, np.uint16))
    gemm.fp8_gemm_nt((cuda.to_device(a.view(np.uint8)), d_sa), (cuda.to_device(b.view(np.uint8)),
                     cuda.to_device(sb)), out)
    got = gemm.fp8.bf16_to_float(out.copy_to_host())
    assert not np.isnan(got).any()
    assert calc_diff(got, reference_gemm(a, sa, b, sb)) < 1e-3


@pytest.mark.gpu
def test_errors_on_gpu_tensors(rng):
    torch = pytest.importorskip("torch")
    _, (ta, tsa, tb, tsb, out) = _device_problem(64, 256, 256, rng)
    with pytest.raises(ValueError, match="host memory"):
        gemm.fp8_gemm_nt((ta.cpu(), tsa), (tb, tsb), out)
    with pytest.raises(TypeError, match="d must be BF16 or FP32 output"):
        gemm.fp8_gemm_nt((ta, tsa), (tb, tsb), out.half())
    with pytest.raises(TypeError, match="d must be float32 when c is given"):
        gemm.fp8_gemm_nt((ta, tsa), (tb, tsb), out, c=out.float())
    with pytest.raises(ValueError, match="M-major"):  # neither M-major nor row-major (which is converted)
        gemm.fp8_gemm_nt((ta, torch.zeros((64, 4), device="cuda")[:, :2]), (tb, tsb), out)
    with pytest.raises(ValueError, match="aligned"):
        flat = torch.empty(64 * 256 + 1, dtype=torch.uint8, device="cuda")[1:].view(64, 256)
        gemm.fp8_gemm_nt((flat, tsa), (tb, tsb), out)


@pytest.mark.gpu
def test_first_call_compiles_fast_and_second_call_compiles_nothing(tmp_path):
    script = textwrap.dedent("""
        import time, numpy as np, torch, gemm
        from gemm.testing.problems import random_problem
        m, n, k = 320, 4096, 7168
        a, sa, b, sb = random_problem(m, n, k)
        cuda = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()
        ta, tb = cuda(a.view(np.uint8)), cuda(b.view(np.uint8))
        tsa, tsb = gemm.get_mn_major_tma_aligned_tensor(cuda(np.ascontiguousarray(sa))), cuda(sb)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter(); gemm.fp8_gemm_nt((ta, tsa), (tb, tsb), out); torch.cuda.synchronize()
        t1 = time.perf_counter(); gemm.fp8_gemm_nt((ta, tsa), (tb, tsb), out); torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"FIRST {t1 - t0:.3f} SECOND {t2 - t1:.4f}")
    """)
    env = dict(os.environ, FP8LADDER_CACHE_DIR=str(tmp_path), PYTHONPATH=os.getcwd())
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    first, second = (float(x) for x in result.stdout.split()[1::2])
    print(result.stdout)
    assert first < 2.0, f"first call (generate + assemble + load) took {first:.2f} s"
    assert second < 0.05, f"second call took {second:.3f} s: it should only launch"


@pytest.mark.gpu
def test_fp8_gemm_nt_cupy_arrays(rng):
    """CuPy has no FP8 or BF16 dtype: e4m3 bytes as uint8 and BF16 bits as uint16, zero-copy."""
    cp = pytest.importorskip("cupy")
    m, n, k = 200, 2112, 512
    a, sa, b, sb = random_problem(m, n, k, rng)
    storage = cp.zeros((sa.shape[1], 200), dtype=cp.float32)
    storage[:, :m] = cp.asarray(np.ascontiguousarray(sa.T))
    out = cp.full((m, n), BF16_NAN, dtype=cp.uint16)
    gemm.fp8_gemm_nt((cp.asarray(a.view(np.uint8)), storage[:, :m].T), (cp.asarray(b.view(np.uint8)),
                     cp.asarray(sb)), out)
    got = gemm.fp8.bf16_to_float(cp.asnumpy(out))
    assert not np.isnan(got).any()
    assert calc_diff(got, reference_gemm(a, sa, b, sb)) < 1e-3


def test_the_hot_path_leaves_every_other_call_to_the_checks(rng, monkeypatch):
    """fp8_gemm_nt's hot path (a torch out, a signature prepared before) never answers for a call it has not
    prepared: host tensors, a non-tensor argument and a c still get the checks' errors once a CUDA call has set the
    hot path up (and a CPU-only torch, which never sets it up, gets them too)."""
    torch = pytest.importorskip("torch")
    a8, sa, b8, sb = random_problem(64, 128, 256, rng)
    a, b = (torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn) for x in (a8, b8))
    sa, sb = torch.from_numpy(sa), torch.from_numpy(sb)
    out = torch.empty(64, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="host memory"):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    if gemm.api._HOT_PATH is None:  # what a CUDA call sets up (a CPU-only torch has no CUDA stream getter)
        monkeypatch.setattr(gemm.api, "_HOT_PATH", (torch.Tensor, torch.compiler.is_compiling, lambda device: 0))
    for _ in range(2):
        with pytest.raises(ValueError, match="host memory"):
            gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    with pytest.raises((TypeError, ValueError)):
        gemm.fp8_gemm_nt((a, "not a tensor"), (b, sb), out)
    with pytest.raises(ValueError, match="host memory|float32"):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out, c=out)
