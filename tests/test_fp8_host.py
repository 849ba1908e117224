"""gemm/fp8.py, the host-side FP8 basics every stage is checked against: codes, casts, reference, measure."""
import ml_dtypes
import numpy as np
import pytest

from gemm.fp8 import (AMAX_FLOOR, BF16, E4M3, E4M3_MAX, GROUP, align, bf16_to_float, calc_diff, ceil_div, dequantize_per_block, dequantize_per_token, e4m3_decode, e4m3_encode, per_block_cast_to_fp8, per_token_cast_to_fp8, sa_to_mn_major)
from gemm.testing.problems import flops, gemm_bytes, random_problem, reference_gemm

# e4m3 keeps 3 mantissa bits: rounding to nearest moves a normal number by at most 2**-4 of its magnitude;
# below the smallest normal (2**-6) the step is fixed at 2**-9, so the error is at most 2**-10 (in units
# of the scale). The float32 division by the scale adds a rounding of its own, hence the 1.001 slack.
REL_STEP, SUBNORMAL_HALF_STEP = 2.0 ** -4, 2.0 ** -10


def test_decode_matches_ml_dtypes_for_all_codes():
    codes = np.arange(256, dtype=np.uint8)
    expected = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(e4m3_decode(codes), expected)  # uint8 bits
    np.testing.assert_array_equal(e4m3_decode(codes.view(E4M3)), expected)  # float8 values
    with pytest.raises(TypeError, match="float8_e4m3fn or uint8"):
        e4m3_decode(codes.astype(np.int16))


def test_encode_rounds_like_ml_dtypes_and_saturates(rng):
    x = rng.standard_normal(10000).astype(np.float32) * np.exp2(rng.integers(-12, 10, 10000)).astype(np.float32)
    inside = np.abs(x) <= E4M3_MAX
    np.testing.assert_array_equal(e4m3_encode(x[inside]).view(np.uint8),
                                  x[inside].astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
    assert e4m3_encode(x).dtype == E4M3
    np.testing.assert_array_equal(e4m3_decode(e4m3_encode([1e6, -1e6, 449.0, -500.0])), [448, -448, 448, -448])
    assert not np.isnan(e4m3_decode(e4m3_encode(x))).any()  # saturation, never the NaN code


def test_bf16_to_float_reads_bits_and_values():
    values = np.array([1.0, -2.5, 3.0e38, 2.0 ** -130], np.float32).astype(BF16)
    np.testing.assert_array_equal(bf16_to_float(values.view(np.uint16)), values.astype(np.float32))
    np.testing.assert_array_equal(bf16_to_float(values), values.astype(np.float32))


def _assert_round_trip(x, restored, scales_per_element):
    bound = np.maximum(np.abs(x) * REL_STEP, scales_per_element * SUBNORMAL_HALF_STEP) * 1.001
    excess = np.abs(restored - x) - bound
    assert excess.max() <= 0, f"round-trip error exceeds the e4m3 bound by {excess.max():.3g}"


def _assert_amax_scaling(x_amax, q_amax, scale):
    """A group whose amax reaches the floor has scale amax/448 and its largest magnitude on 448; a group below
    the floor (DeepGEMM's clamp, which keeps all-zero groups finite) is scaled by floor/448, so its largest
    magnitude maps to e4m3(amax / scale) <= 448 (448 itself only within rounding of the floor). Small groups
    (a lone element, a ragged K tail) land below the floor with some seeds: the property holds for both."""
    floor = np.float32(AMAX_FLOOR)
    above = x_amax >= floor
    np.testing.assert_array_equal(scale[above], (x_amax / np.float32(E4M3_MAX))[above])
    np.testing.assert_array_equal(scale[~above], floor / np.float32(E4M3_MAX))
    np.testing.assert_array_equal(q_amax[above], E4M3_MAX)
    # Rounding to nearest is monotone, so the largest code is the rounded largest value, in both regimes.
    np.testing.assert_array_equal(q_amax, e4m3_decode(e4m3_encode(x_amax / scale)))


@pytest.mark.parametrize("m, k", [(1, 128), (7, 200), (33, 384), (4, 1)])
def test_per_token_cast_shapes_and_round_trip(m, k, rng):
    x = rng.standard_normal((m, k)).astype(np.float32) * np.exp2(rng.integers(-6, 7, (m, 1))).astype(np.float32)
    q, scale = per_token_cast_to_fp8(x)
    assert q.shape == (m, k) and q.dtype == E4M3 and q.flags.c_contiguous
    assert scale.shape == (m, ceil_div(k, GROUP)) and scale.dtype == np.float32
    restored = dequantize_per_token(q, scale)
    per_element = np.repeat(scale.astype(np.float64), GROUP, axis=1)[:, :k]
    _assert_round_trip(x, restored, per_element)
    q_amax = np.abs(e4m3_decode(np.pad(q, ((0, 0), (0, align(k, GROUP) - k)))).reshape(m, -1, GROUP)).max(axis=2)
    x_amax = np.abs(np.pad(x, ((0, 0), (0, align(k, GROUP) - k)))).reshape(m, -1, GROUP).max(axis=2)
    _assert_amax_scaling(x_amax, q_amax, scale)


@pytest.mark.parametrize("n, k", [(128, 128), (130, 200), (2112, 256), (5, 7)])
def test_per_block_cast_shapes_and_round_trip(n, k, rng):
    x = rng.standard_normal((n, k)).astype(np.float32) * np.exp2(rng.integers(-6, 7, (1, k))).astype(np.float32)
    q, scale = per_block_cast_to_fp8(x)
    assert q.shape == (n, k) and q.dtype == E4M3 and q.flags.c_contiguous
    assert scale.shape == (ceil_div(n, GROUP), ceil_div(k, GROUP)) and scale.dtype == np.float32
    restored = dequantize_per_block(q, scale)
    per_element = np.repeat(np.repeat(scale.astype(np.float64), GROUP, 0), GROUP, 1)[:n, :k]
    _assert_round_trip(x, restored, per_element)
    def block_amax(values):
        padded = np.zeros((align(n, GROUP), align(k, GROUP)), np.float32)
        padded[:n, :k] = np.abs(values)
        return padded.reshape(scale.shape[0], GROUP, scale.shape[1], GROUP).max(axis=(1, 3))
    _assert_amax_scaling(block_amax(x), block_amax(e4m3_decode(q)), scale)


@pytest.mark.parametrize("cast", [per_token_cast_to_fp8, per_block_cast_to_fp8])
def test_groups_below_the_amax_floor_are_scaled_by_the_floor(cast):
    """The regime the seeds above reach only by chance (seed 2253831287 put a lone 1.7e-5 in a group), always."""
    x = np.zeros((4, 256), np.float32)
    x[0, 0], x[1, 5], x[2, 200], x[3, 130] = 1.7438295e-05, -3e-5, 9.99e-5, 2.0  # three groups below the floor
    q, scale = cast(x)
    restored = dequantize_per_token(q, scale) if cast is per_token_cast_to_fp8 else dequantize_per_block(q, scale)
    floored = np.float32(AMAX_FLOOR) / np.float32(E4M3_MAX)
    if cast is per_token_cast_to_fp8:
        assert scale[0, 0] == scale[1, 0] == scale[2, 1] == floored
        np.testing.assert_array_equal(e4m3_decode(q)[[0, 1, 2, 3], [0, 5, 200, 130]], [80, -128, 448, 448])
        per_element = np.repeat(scale.astype(np.float64), GROUP, axis=1)
    else:
        assert scale[0, 0] == floored and scale[0, 1] == np.float32(2.0) / np.float32(E4M3_MAX)
        per_element = np.repeat(np.repeat(scale.astype(np.float64), GROUP, 0), GROUP, 1)[:4]
    _assert_round_trip(x, restored, per_element)


def test_zero_groups_stay_finite():
    q, scale = per_token_cast_to_fp8(np.zeros((2, 256), np.float32))
    assert np.isfinite(scale).all() and (scale > 0).all() and not e4m3_decode(q).any()
    q, scale = per_block_cast_to_fp8(np.zeros((130, 128), np.float32))
    assert np.isfinite(scale).all() and (scale > 0).all() and not e4m3_decode(q).any()


def test_casts_reject_non_matrices():
    with pytest.raises(ValueError, match="2-D"):
        per_token_cast_to_fp8(np.zeros(128, np.float32))
    with pytest.raises(ValueError, match="2-D"):
        per_block_cast_to_fp8(np.zeros((1, 2, 128), np.float32))


def test_calc_diff_properties(rng):
    x = rng.standard_normal(1000)
    assert calc_diff(x, x) == 0.0
    assert calc_diff(x, -x) == pytest.approx(2.0)
    assert calc_diff(x, 2 * x) == pytest.approx(0.2)  # 1 - 2*2/(1+4): scale errors are seen
    y = x + 1e-3 * rng.standard_normal(1000)
    assert calc_diff(x, y) == pytest.approx(calc_diff(y, x)) and 0 < calc_diff(x, y) < 1e-5
    assert calc_diff(np.zeros(3), np.zeros(3)) == 0.0
    poisoned = x.copy()
    poisoned[17] = np.nan
    assert np.isnan(calc_diff(poisoned, x))


def test_reference_gemm_is_the_scaled_sum(rng):
    m, n, k = 5, 130, 256
    a, sa, b, sb = random_problem(m, n, k, rng)
    qa, qb = e4m3_decode(a).astype(np.float64), e4m3_decode(b).astype(np.float64)
    direct = np.zeros((m, n))
    for i in range(m):
        for j in range(n):
            direct[i, j] = sum(qa[i, kk] * sa[i, kk // GROUP] * qb[j, kk] * sb[j // GROUP, kk // GROUP]
                               for kk in range(k))
    np.testing.assert_allclose(reference_gemm(a, sa, b, sb), direct, rtol=1e-12, atol=1e-12 * np.abs(direct).max())


@pytest.mark.parametrize("m, kb", [(5, 3), (8, 1), (1, 4), (130, 2)])
def test_sa_to_mn_major_layout(m, kb, rng):
    sa = rng.random((m, kb), dtype=np.float32)
    mn = sa_to_mn_major(sa)
    np.testing.assert_array_equal(mn, sa)
    assert mn.dtype == np.float32 and mn.strides == (4, 4 * align(m, 4))  # M-major, M padded to 4 floats
    assert mn.base is not None and mn.base.flags.c_contiguous and mn.ctypes.data % 16 == 0


def test_random_problem_follows_the_contract(rng):
    m, n, k = 70, 200, 384
    a, sa, b, sb = random_problem(m, n, k, rng)
    assert a.shape == (m, k) and b.shape == (n, k) and a.dtype == b.dtype == E4M3
    assert sa.shape == (m, 3) and sa.strides == (4, 4 * 72) and sb.shape == (2, 3)
    assert e4m3_decode(a).any() and e4m3_decode(b).any()
    # Magnitudes vary per group (a collision of two blocks' float32 amax is possible, so not sb.size distinct).
    assert len(np.unique(sa)) > 10 and len(np.unique(sb)) > sb.size // 2
    a2, *_ = random_problem(m, n, k, rng)
    assert not np.array_equal(a.view(np.uint8), a2.view(np.uint8))  # fresh inputs each call


def test_flops_and_bytes():
    assert flops(64, 2112, 7168) == 2 * 64 * 2112 * 7168
    m, n, k = 100, 130, 256
    assert gemm_bytes(m, n, k) == m * k + n * k + 4 * (m * 2 + 2 * 2) + 2 * m * n
