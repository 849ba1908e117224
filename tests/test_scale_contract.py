"""The scale contract: UE8M0 (power-of-two) scales, casts that write the kernel's sa layout, the sa layouts
fp8_gemm_nt takes (M-major; row-major torch tensors converted on the device), and the order and wording of the
argument errors. CPU tests use host arrays posing as device arrays (tc_checks.on_fake_device); the torch tests
need torch (CPU tensors), the `gpu` ones a Hopper GPU."""
import dataclasses
import os
import sys
import warnings

import numpy as np
import pytest

import gemm
from gemm import api, dispatch, torch_interop
from gemm.fp8 import (AMAX_FLOOR, E4M3_MAX, GROUP, align, calc_diff, ceil_to_ue8m0, dequantize_per_block, dequantize_per_token, e4m3_decode, per_block_cast_to_fp8, per_token_cast_to_fp8, sa_to_mn_major)
from gemm.testing.problems import random_problem, reference_gemm
from gemm.validate import check_gemm_args, sa_layout
from ptx.arrays import DeviceView, as_device_view

sys.path.insert(0, os.path.dirname(__file__))  # tests/tc_checks.py
from tc_checks import on_fake_device  # noqa: E402

BF16_NAN = 0x7FC0
F32_BITS = np.uint32


# ------------------------------------------------------------------------------------------------ UE8M0
def _reference_ceil_pow2(x):
    """2 ** ceil(log2(x)) in float64, rounded to float32 (2**128 becomes inf): the definition, not the method."""
    with np.errstate(over="ignore", divide="ignore"):
        return (2.0 ** np.ceil(np.log2(np.asarray(x, np.float32).astype(np.float64)))).astype(np.float32)


def _floats(bits):
    return np.asarray(bits, dtype=F32_BITS).view(np.float32)


def _edge_values():
    """Every power of two float32 holds (2**-149 .. 2**127), one ulp below and above each, the extremes of
    the subnormal and normal ranges, and a few values near 448-multiples the casts produce."""
    powers = np.arange(1, 255, dtype=np.uint32) << 23  # normal powers of two: exponent field 1..254
    sub_powers = np.uint32(1) << np.arange(23, dtype=np.uint32)  # subnormal powers of two
    exact = np.concatenate([powers, sub_powers])
    bits = np.concatenate([exact, exact + 1, exact[exact > 1] - 1,
                           [0x00000001, 0x00000003, 0x007FFFFF, 0x00800000, 0x00800001, 0x7F7FFFFF, 0x7F000000,
                            0x7F000001, 0x7EFFFFFF]]).astype(np.uint32)
    extra = np.array([448.0, 447.9, 448.1, 1e-4, 1e-4 / 448, 3.0, 0.75, 1e-30, 1e30], np.float32)
    return np.concatenate([_floats(bits), extra])


def test_ceil_to_ue8m0_on_edge_values():
    x = _edge_values()
    assert (x > 0).all() and np.isfinite(x).all()
    np.testing.assert_array_equal(ceil_to_ue8m0(x).view(F32_BITS), _reference_ceil_pow2(x).view(F32_BITS))


def test_ceil_to_ue8m0_on_every_subnormal_and_every_exponent():
    """All 2**23 - 1 positive subnormals, exhaustively; for each of the 254 normal exponents, mantissas 0, 1,
    the largest, and 64 random ones (the result depends only on the exponent and whether the mantissa is 0)."""
    sub = _floats(np.arange(1, 1 << 23, dtype=np.uint32))
    np.testing.assert_array_equal(ceil_to_ue8m0(sub).view(F32_BITS), _reference_ceil_pow2(sub).view(F32_BITS))
    rng = np.random.default_rng(0)  # a fixed draw: this test must not depend on the run's seed
    exponents = np.arange(1, 255, dtype=np.uint32)[:, None] << 23
    mantissas = np.concatenate([[0, 1, 0x7FFFFF], rng.integers(1, 1 << 23, 64)]).astype(np.uint32)[None, :]
    normal = _floats((exponents | mantissas).ravel())
    np.testing.assert_array_equal(ceil_to_ue8m0(normal).view(F32_BITS), _reference_ceil_pow2(normal).view(F32_BITS))


def test_ceil_to_ue8m0_on_random_floats(rng):
    bits = rng.integers(1, 0x7F7FFFFF, 1_000_000, endpoint=True).astype(np.uint32)  # any positive finite
    x = np.concatenate([_floats(bits), rng.random(100_000, dtype=np.float32) + np.float32(1e-30)])
    got = ceil_to_ue8m0(x)
    np.testing.assert_array_equal(got.view(F32_BITS), _reference_ceil_pow2(x).view(F32_BITS))
    finite = np.isfinite(got)
    assert (got[finite] >= x[finite]).all() and (got[finite] < 2 * x[finite].astype(np.float64)).all()
    assert not (got.view(F32_BITS) & 0x007FFFFF)[got >= np.float32(2.0 ** -126)].any()  # a power of two


def test_ceil_to_ue8m0_outside_positive_finite():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -3.0, -2.0, 2.0 ** 127 * 1.5], np.float32)
    got = ceil_to_ue8m0(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got[:4].view(F32_BITS), _floats([0, 0, 0x7F800000, 0x7F800000]).view(F32_BITS))
    assert np.isnan(got[4])
    np.testing.assert_array_equal(got[5:], [4.0, 2.0, np.inf])  # the sign is dropped; past 2**127: +inf
    assert ceil_to_ue8m0(np.float32(3.0)) == 4.0 and np.shape(ceil_to_ue8m0(3.0)) == ()
    assert ceil_to_ue8m0(np.ones((2, 3), np.float32)).shape == (2, 3)


@pytest.mark.parametrize("m, k", [(1, 128), (70, 384), (4, 1), (33, 200)])
def test_ue8m0_per_token_cast(m, k, rng):
    x = rng.standard_normal((m, k)).astype(np.float32) * np.exp2(rng.integers(-6, 7, (m, 1))).astype(np.float32)
    q, scale = per_token_cast_to_fp8(x, ue8m0=True)
    _, plain = per_token_cast_to_fp8(x)
    np.testing.assert_array_equal(scale, ceil_to_ue8m0(plain))  # the ue8m0 scale is the plain one rounded up
    assert not (scale.view(F32_BITS) & 0x807FFFFF).any()  # positive powers of two
    q_abs = np.abs(e4m3_decode(np.pad(q, ((0, 0), (0, align(k, GROUP) - k))))).reshape(m, -1, GROUP).max(axis=2)
    x_amax = np.abs(np.pad(x, ((0, 0), (0, align(k, GROUP) - k)))).reshape(m, -1, GROUP).max(axis=2)
    assert (q_abs <= E4M3_MAX).all()
    above = x_amax >= np.float32(AMAX_FLOOR)
    assert (q_abs[above] >= E4M3_MAX / 2).all()  # a power of two at most doubles the plain scale
    restored = dequantize_per_token(q, scale)
    per_element = np.repeat(scale.astype(np.float64), GROUP, axis=1)[:, :k]
    bound = np.maximum(np.abs(x) * 2.0 ** -4, per_element * 2.0 ** -10) * 1.001
    assert (np.abs(restored - x) <= bound).all()


@pytest.mark.parametrize("n, k", [(128, 128), (130, 200), (5, 7)])
def test_ue8m0_per_block_cast(n, k, rng):
    x = rng.standard_normal((n, k)).astype(np.float32) * np.exp2(rng.integers(-6, 7, (1, k))).astype(np.float32)
    q, scale = per_block_cast_to_fp8(x, ue8m0=True)
    _, plain = per_block_cast_to_fp8(x)
    np.testing.assert_array_equal(scale, ceil_to_ue8m0(plain))
    assert not (scale.view(F32_BITS) & 0x807FFFFF).any()
    restored = dequantize_per_block(q, scale)
    per_element = np.repeat(np.repeat(scale.astype(np.float64), GROUP, 0), GROUP, 1)[:n, :k]
    bound = np.maximum(np.abs(x) * 2.0 ** -4, per_element * 2.0 ** -10) * 1.001
    assert (np.abs(restored - x) <= bound).all()
    assert (np.abs(e4m3_decode(q)) <= E4M3_MAX).all()


def test_ue8m0_gemm_accuracy(rng):
    """Power-of-two scales cost almost nothing: e4m3's relative step is the same at any scale, so only values
    pushed into e4m3's subnormal range lose more. The measured diff of either cast is about 7e-4 here."""
    m, n, k = 64, 256, 512
    x = rng.standard_normal((m, k), dtype=np.float32) * np.exp2(rng.integers(-4, 5, (m, 1))).astype(np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32) * np.exp2(rng.integers(-4, 5, (1, k))).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    diffs = [calc_diff(reference_gemm(*per_token_cast_to_fp8(x, ue8m0=u), *per_block_cast_to_fp8(w, ue8m0=u)),
                       exact) for u in (False, True)]
    assert diffs[1] < 2e-3 and diffs[1] < 2 * diffs[0], diffs


# ------------------------------------------------------------------------------------------------ sa layouts
@pytest.mark.parametrize("m, k", [(1, 128), (5, 384), (8, 256), (70, 256), (4, 128)])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_per_token_cast_writes_the_kernel_layout(m, k, ue8m0, rng):
    x = rng.standard_normal((m, k), dtype=np.float32)
    q, sa = per_token_cast_to_fp8(x, mn_major=True, ue8m0=ue8m0)
    q_row, sa_row = per_token_cast_to_fp8(x, ue8m0=ue8m0)
    np.testing.assert_array_equal(q.view(np.uint8), q_row.view(np.uint8))
    np.testing.assert_array_equal(sa, sa_row)
    kb = k // GROUP
    assert sa.shape == (m, kb) and sa.strides == (4, 4 * align(m, 4))
    assert sa.base is not None and sa.base.shape == (kb, align(m, 4)) and sa.base.flags.c_contiguous
    assert sa_layout(as_device_view(sa), m, kb) == "m_major"


def _strided(x, strides):
    """A DeviceView of x's bytes with the given element strides (layouts no NumPy call makes on its own)."""
    return DeviceView(x.ctypes.data, x.shape, strides, x.dtype, 0, x)


@pytest.mark.parametrize("m, kb", [(1, 1), (1, 4), (3, 1), (4, 2), (5, 3), (70, 2), (128, 56)])
def test_sa_layout_classifies(m, kb, rng):
    values = rng.random((m, kb), dtype=np.float32)
    row = np.ascontiguousarray(values)
    # A row-major (M, 1) array is also M-major (stride 1 along M): the kernel reads it as is.
    assert sa_layout(as_device_view(row), m, kb) == ("m_major" if kb == 1 else "row_major")
    assert sa_layout(as_device_view(sa_to_mn_major(values)), m, kb) == "m_major"
    if kb > 1:
        # M-major but unpadded (stride M, not a multiple of 4), or padded short of M: neither layout.
        unpadded = np.ascontiguousarray(values.T).T  # for M = 1 these are the row-major bytes
        assert sa_layout(as_device_view(unpadded), m, kb) == (
            "m_major" if m % 4 == 0 else "row_major" if m == 1 else None)
        storage = np.zeros((kb, align(m, 4) + 4), np.float32)
        assert sa_layout(_strided(storage, (1, align(m, 4) + 4)), m, kb) == "m_major"  # extra padding is fine
        if m > 4:
            assert sa_layout(_strided(storage, (1, 4)), m, kb) is None  # K groups overlap
        wide = np.zeros((m, 2 * kb), np.float32)[:, :kb]  # a column slice: strides (2*kb, 1)
        assert sa_layout(as_device_view(wide), m, kb) == ("row_major" if m == 1 else None)


# ------------------------------------------------------------------------------------------------ error order
def _problem(rng, m=70, n=200, k=256):
    a, sa, b, sb = random_problem(m, n, k, rng)
    return dict(a=a, sa=sa, b=b, sb=sb, d=np.zeros((m, n), np.uint16))


def _check(args, error=ValueError, **kwargs):
    with pytest.raises(error) as info:
        check_gemm_args(**args, **kwargs)
    return str(info.value)


@pytest.mark.parametrize("name", ["a", "sa", "b", "sb", "d"])
def test_host_memory_is_named_before_any_other_problem(name, rng):
    """Each argument left on the host is named, whatever else is wrong with the others (fact 2 of the issue:
    A on the host was reported as sa's layout)."""
    args = {key: on_fake_device(value) for key, value in _problem(rng).items()}
    args[name] = _problem(rng)[name]  # a plain host array
    args["sa"] = on_fake_device(np.ascontiguousarray(_problem(rng)["sa"])) if name != "sa" else args["sa"]
    if name != "d":
        args["d"] = on_fake_device(np.zeros((3, 3), np.float32))  # wrong dtype and shape too
    message = _check(args)
    assert message.startswith(f"{name} is in host memory (numpy.ndarray")
    assert "must be on one CUDA device" in message and f"{name}.cuda()" in message


def test_host_a_with_row_major_sa_names_a_through_fp8_gemm_nt(rng):
    p = _problem(rng)
    sa = on_fake_device(np.ascontiguousarray(p["sa"]))
    with pytest.raises(ValueError, match=r"^a is in host memory"):
        gemm.fp8_gemm_nt((p["a"], sa), (on_fake_device(p["b"]), on_fake_device(p["sb"])), on_fake_device(p["d"]))


def test_arrayness_comes_first(rng):
    args = _problem(rng)  # all on the host
    args["b"] = [[1, 2]]
    assert _check(args, TypeError).startswith("b: expected an array")


def test_device_mismatch_names_every_device(rng):
    args = {key: on_fake_device(value) for key, value in _problem(rng).items()}
    b = _problem(rng)["b"]
    args["b"] = DeviceView(b.ctypes.data, b.shape, (b.shape[1], 1), b.dtype, 1, b)
    args["sa"] = on_fake_device(np.ascontiguousarray(_problem(rng)["sa"]))  # a layout problem, reported later
    message = _check(args)
    assert "one CUDA device" in message and "b on cuda:1" in message and "a on cuda:0" in message


@pytest.mark.parametrize("first, second, error, words", [
    # dtype before shape, shape before layout, layout before alignment, dtype before K's shape
    (("a", lambda a: a.astype(np.float32)), ("sb", lambda sb: sb[:-1]), TypeError, "a must be e4m3 FP8"),
    (("sb", lambda sb: sb[:-1]), ("sa", np.ascontiguousarray), ValueError, "sb must have shape (2, 2)"),
    (("sa", np.ascontiguousarray), ("d", lambda d: np.zeros(d.size + 1, np.uint16)[1:].reshape(d.shape)),
     ValueError, "sa must be stored M-major"),
    (("d", lambda d: d.astype(np.float32)), ("a", lambda a: a[:, :128]), TypeError, "d must be BF16"),
])
def test_checks_run_in_order(first, second, error, words, rng):
    problem = _problem(rng)
    alone = dict(problem, **{second[0]: second[1](problem[second[0]])})
    alone = {key: on_fake_device(value) for key, value in alone.items()}
    assert words not in _check(alone, (TypeError, ValueError))  # the later problem is an error of its own
    args = dict(problem)
    for name, bad in (second, first):
        args[name] = bad(args[name])
    args = {key: on_fake_device(value) for key, value in args.items()}
    assert words in _check(args, error)


@pytest.mark.parametrize("name, bad, error, words", [
    ("a", lambda a: a.astype(np.float32), TypeError, ["a must be e4m3 FP8 (float8_e4m3fn or uint8)",
                                                      "got dtype float32", "gemm.per_token_cast_to_fp8(x)"]),
    ("b", lambda b: b.astype(np.float16), TypeError, ["b must be e4m3 FP8", "gemm.per_block_cast_to_fp8(w)"]),
    ("sa", lambda sa: sa.astype(np.float64), TypeError, ["sa must be float32 scales (float32)", "got dtype float64"]),
    ("d", lambda d: d.astype(np.float32), TypeError, ["d must be BF16 output (bfloat16 or uint16)", "torch.bfloat16"]),
    ("sa", lambda sa: np.ascontiguousarray(sa[:, :1]), ValueError, ["sa must have shape (70, 2)", "got (70, 1)",
                                                                   "gemm.per_token_cast_to_fp8(x)"]),
    ("sb", lambda sb: sb[:1], ValueError, ["sb must have shape (2, 2)", "one per 128x128 block",
                                           "gemm.per_block_cast_to_fp8(w)"]),
    ("d", lambda d: d[:, :-1], ValueError, ["d must have shape (70, 200)"]),
    ("sb", lambda sb: np.asfortranarray(sb), ValueError, [
        "sb must be contiguous row-major (strides (2, 1) for shape (2, 2))", "got strides (1, 2)", "contiguous()"]),
    ("a", lambda a: a[0], ValueError, ["a must be 2-D, (M, K) activations", "got shape (256,)"]),
])
def test_errors_name_the_tensor_what_was_expected_and_the_helper(name, bad, error, words, rng):
    args = _problem(rng)
    args[name] = bad(args[name])
    args = {key: on_fake_device(value) for key, value in args.items()}
    message = _check(args, error)
    for word in words:
        assert word in message, message


def test_row_major_sa_error_names_the_helpers(rng):
    args = {key: on_fake_device(value) for key, value in _problem(rng).items()}
    args["sa"] = on_fake_device(np.ascontiguousarray(_problem(rng)["sa"]))
    message = _check(args)
    for word in ["sa must be stored M-major", "strides (1, 72) for shape (70, 2)", "got strides (2, 1)",
                 "gemm.get_mn_major_tma_aligned_tensor(sa)", "gemm.per_token_cast_to_fp8(x, mn_major=True)",
                 "not a Numba or CuPy array"]:
        assert word in message, message
    accepted = check_gemm_args(**args, accept_row_major_sa=True)
    assert accepted.sa_layout == "row_major"
    with pytest.raises(ValueError, match="convert it to the M-major layout before launching"):
        accepted.sa_stride  # noqa: B018  (a launch must not read a row-major sa as M-major)


def test_other_sa_layouts_are_refused_even_when_row_major_is_accepted(rng):
    args = {key: on_fake_device(value) for key, value in _problem(rng, m=70).items()}
    args["sa"] = on_fake_device(np.ascontiguousarray(_problem(rng)["sa"].T).T)  # M-major, stride 70
    message = _check(args, accept_row_major_sa=True)
    assert "got strides (1, 70)" in message and "not a Numba" not in message


def test_fp8_gemm_nt_refuses_a_row_major_non_torch_sa(rng):
    p = {key: on_fake_device(value) for key, value in _problem(rng).items()}
    sa = on_fake_device(np.ascontiguousarray(_problem(rng)["sa"]))
    with pytest.raises(ValueError, match="not a Numba or CuPy array"):
        gemm.fp8_gemm_nt((p["a"], sa), (p["b"], p["sb"]), p["d"])


# ------------------------------------------------------------------------------------------------ conversion
class _RecordingLaunch:
    def __init__(self):
        self.calls = []

    def launch(self, config, args, *, sm_count, stream=None):
        self.calls.append((config, args, stream))


def test_row_major_sa_is_converted_before_launch_and_warned_once(rng, monkeypatch):
    """The plumbing, on the CPU: a convertible row-major sa reaches the launch M-major, with one warning per
    process. (torch's conversion itself is checked on the GPU below; here a NumPy one stands in for it.)"""
    recorder = _RecordingLaunch()
    monkeypatch.setattr(dispatch, "kernel_launch", recorder)
    monkeypatch.setattr(dispatch, "_warned_row_major_sa", set())
    p = _problem(rng)
    values = np.ascontiguousarray(p["sa"])
    row = on_fake_device(values)
    monkeypatch.setattr(dispatch, "is_torch_tensor", lambda x: x is row)  # only sa poses as a torch tensor
    seen = []
    monkeypatch.setattr(torch_interop, "sa_to_m_major",
                        lambda sa, stream: seen.append(stream) or on_fake_device(sa_to_mn_major(sa)))
    dev = {key: on_fake_device(value) for key, value in p.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            gemm.fp8_gemm_nt((dev["a"], row), (dev["b"], dev["sb"]), dev["d"], stream=7)
        gemm.fp8_gemm_nt((dev["a"], dev["sa"]), (dev["b"], dev["sb"]), dev["d"], stream=7)
    relevant = [w for w in caught if issubclass(w.category, gemm.ScaleLayoutWarning)]
    assert len(relevant) == 1 and relevant[0].filename == __file__  # attributed to the caller's line
    text = str(relevant[0].message)
    assert "per_token_cast_to_fp8(x, mn_major=True)" in text and "get_mn_major_tma_aligned_tensor" in text
    assert seen == [7, 7, 7]  # converted on the launch's stream, at every call
    assert len(recorder.calls) == 4
    for _, args, stream in recorder.calls:
        assert stream == 7 and args.sa_layout == "m_major" and args.sa_stride == 72
        assert args.sa.strides == (1, 72)
        np.testing.assert_array_equal(args.sa.obj, values)


# ------------------------------------------------------------------------------------------------ torch
def _torch():
    return pytest.importorskip("torch")


def test_torch_ceil_to_ue8m0_matches_numpy(rng):
    torch = _torch()
    bits = rng.integers(0, 0xFFFFFFFF, 200_000, endpoint=True).astype(np.uint32)  # every class, both signs
    x = np.concatenate([_floats(bits), _edge_values()])
    got = ceil_to_ue8m0(torch.from_numpy(x.copy())).numpy()
    want = ceil_to_ue8m0(x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(F32_BITS), want[~nan].view(F32_BITS))


@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("rows, cols", [(70, 300), (1, 130), (5, 128)])
def test_torch_casts_match_numpy(rows, cols, ue8m0, rng):
    torch = _torch()
    x = rng.standard_normal((rows, cols), dtype=np.float32) * 10
    q_t, s_t = per_token_cast_to_fp8(torch.from_numpy(x), mn_major=True, ue8m0=ue8m0)
    q_n, s_n = per_token_cast_to_fp8(x, mn_major=True, ue8m0=ue8m0)
    assert s_t.stride() == (1, align(rows, 4)) and tuple(s_t.shape) == s_n.shape
    np.testing.assert_array_equal(s_t.numpy(), s_n)
    np.testing.assert_array_equal(q_t.view(torch.uint8).numpy(), q_n.view(np.uint8))
    qb_t, sb_t = per_block_cast_to_fp8(torch.from_numpy(x), ue8m0=ue8m0)
    qb_n, sb_n = per_block_cast_to_fp8(x, ue8m0=ue8m0)
    np.testing.assert_array_equal(sb_t.numpy(), sb_n)
    np.testing.assert_array_equal(qb_t.view(torch.uint8).numpy(), qb_n.view(np.uint8))


def test_torch_host_tensors_are_named(rng):
    torch = _torch()
    x = torch.from_numpy(rng.standard_normal((64, 256), dtype=np.float32))
    a, sa = per_token_cast_to_fp8(x)
    b, sb = per_block_cast_to_fp8(x)
    out = torch.empty((64, 64), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^a is in host memory \(torch.Tensor on cpu\)"):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)  # out is on the host too: no stream lookup fails first


def test_torch_row_major_sa_conversion_on_cpu_tensors(rng, monkeypatch):
    """fp8_gemm_nt's torch path up to the launch, with CPU tensors posing as device ones (the stream lookup
    needs CUDA: no stream here, which is what torch.cuda.stream(None) means)."""
    torch = _torch()
    import ptx.arrays
    real = ptx.arrays._from_torch
    monkeypatch.setattr(ptx.arrays, "_from_torch", lambda t: dataclasses.replace(real(t), device_id=0))
    monkeypatch.setattr(torch_interop, "torch_stream_of", lambda handle, device: None)
    monkeypatch.setattr(dispatch, "_warned_row_major_sa", set())
    recorder = _RecordingLaunch()
    monkeypatch.setattr(dispatch, "kernel_launch", recorder)
    m, n, k = 70, 200, 256
    x = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32))
    a, sa = per_token_cast_to_fp8(x)
    b, sb = per_block_cast_to_fp8(torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32)))
    out = torch.empty((m, n), dtype=torch.bfloat16)
    assert sa.stride() == (2, 1)
    with pytest.warns(api.ScaleLayoutWarning):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    (_, args, stream), = recorder.calls
    assert stream is None and args.sa_layout == "m_major" and args.sa_stride == 72
    converted = args.sa.obj
    assert converted.stride() == (1, 72) and converted.data_ptr() != sa.data_ptr()
    assert torch.equal(converted, sa) and sa.stride() == (2, 1)  # the caller's tensor is left as it was


# ------------------------------------------------------------------------------------------------ GPU
def _cuda_problem(m, n, k, rng):
    torch = _torch()
    x = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32)).cuda()
    w = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32)).cuda()
    a, sa = per_token_cast_to_fp8(x)  # row-major sa, as a DeepGEMM user passes it
    b, sb = per_block_cast_to_fp8(w)
    return a, sa, b, sb


def _bits(out):
    return out.view(_torch().int16).cpu().numpy()


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(1, 2112, 512), (70, 384, 256), (130, 2112, 512), (256, 4096, 7168)])
def test_row_major_sa_gives_the_m_major_result_bit_for_bit(m, n, k, rng, monkeypatch):
    torch = _torch()
    monkeypatch.setattr(dispatch, "_warned_row_major_sa", set())
    a, sa, b, sb = _cuda_problem(m, n, k, rng)
    assert sa.is_contiguous()
    out_row = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    out_mn = out_row.clone()
    with pytest.warns(api.ScaleLayoutWarning, match="mn_major=True"):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out_row)
    gemm.fp8_gemm_nt((a, gemm.get_mn_major_tma_aligned_tensor(sa)), (b, sb), out_mn)
    torch.cuda.synchronize()
    assert not torch.isnan(out_row).any()
    np.testing.assert_array_equal(_bits(out_row), _bits(out_mn))
    assert sa.is_contiguous()  # the caller's tensor is left as it was
    got = out_row.float().cpu().numpy()
    host = lambda t: t.cpu().numpy()  # noqa: E731
    want = reference_gemm(host(a.view(torch.uint8)), host(sa), host(b.view(torch.uint8)), host(sb))
    assert calc_diff(got, want) < 1e-3


@pytest.mark.gpu
def test_mn_major_cast_runs_without_conversion_or_warning(rng, monkeypatch):
    torch = _torch()
    monkeypatch.setattr(dispatch, "_warned_row_major_sa", set())
    m, n, k = 100, 2112, 512
    x = torch.randn(m, k, device="cuda")
    a, sa = per_token_cast_to_fp8(x, mn_major=True, ue8m0=True)
    b, sb = per_block_cast_to_fp8(torch.randn(n, k, device="cuda"), ue8m0=True)
    assert sa.is_cuda and sa.stride() == (1, align(m, 4))
    monkeypatch.setattr(torch_interop, "sa_to_m_major", None)  # any conversion would fail
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.ScaleLayoutWarning)
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    torch.cuda.synchronize()
    host = lambda t: t.cpu().numpy()  # noqa: E731
    want = reference_gemm(host(a.view(torch.uint8)), host(sa), host(b.view(torch.uint8)), host(sb))
    assert calc_diff(out.float().cpu().numpy(), want) < 1e-3


@pytest.mark.gpu
def test_row_major_sa_on_a_side_stream(rng):
    torch = _torch()
    m, n, k = 200, 2112, 512
    a, sa, b, sb = _cuda_problem(m, n, k, rng)
    want = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    gemm.fp8_gemm_nt((a, gemm.get_mn_major_tma_aligned_tensor(sa)), (b, sb), want)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    outs = []
    for explicit in (True, False):
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        if explicit:  # stream= names the side stream while torch's current one is the default stream
            gemm.fp8_gemm_nt((a, sa), (b, sb), out, stream=side.cuda_stream)
        else:
            with torch.cuda.stream(side):
                gemm.fp8_gemm_nt((a, sa), (b, sb), out)
        outs.append(out)
    side.synchronize()
    for out in outs:
        np.testing.assert_array_equal(_bits(out), _bits(want))


@pytest.mark.gpu
def test_row_major_sa_under_cuda_graph_capture(rng):
    """The conversion is captured with the GEMM: replaying after new scales are written into the row-major sa
    gives what a direct call with those scales gives."""
    torch = _torch()
    m, n, k = 256, 384, 512
    a, sa, b, sb = _cuda_problem(m, n, k, rng)
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    gemm.fp8_gemm_nt((a, sa), (b, sb), out)  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    new_sa = sa * torch.exp2(torch.randint(-2, 3, sa.shape, device="cuda").float())
    sa.copy_(new_sa)
    out.fill_(float("nan"))
    graph.replay()
    want = torch.empty_like(out)
    gemm.fp8_gemm_nt((a, gemm.get_mn_major_tma_aligned_tensor(new_sa)), (b, sb), want)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(_bits(out), _bits(want))


@pytest.mark.gpu
def test_torch_ceil_to_ue8m0_on_the_device(rng):
    torch = _torch()
    x = np.concatenate([_floats(rng.integers(0, 0xFFFFFFFF, 100_000, endpoint=True).astype(np.uint32)),
                        _edge_values()])
    got = ceil_to_ue8m0(torch.from_numpy(x.copy()).cuda()).cpu().numpy()
    want = ceil_to_ue8m0(x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(F32_BITS), want[~nan].view(F32_BITS))


@pytest.mark.gpu
def test_host_tensor_errors_on_gpu(rng):
    torch = _torch()
    a, sa, b, sb = _cuda_problem(64, 256, 256, rng)
    out = torch.empty((64, 256), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"^a is in host memory \(torch.Tensor on cpu\)"):
        gemm.fp8_gemm_nt((a.cpu(), sa), (b, sb), out)  # sa row-major too: a is named, not sa's layout
    with pytest.raises(ValueError, match=r"^d is in host memory"):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out.cpu())
