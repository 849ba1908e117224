"""The torch paths of gemm/fp8.py (used for device tensors, as DeepGEMM's helpers are): the casts match NumPy's bit
for bit, calc_diff gives NumPy's float64 value without converting a tensor to NumPy."""
import numpy as np
import pytest

from gemm.fp8 import calc_diff, per_block_cast_to_fp8, per_token_cast_to_fp8

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("cast", [per_token_cast_to_fp8, per_block_cast_to_fp8])
@pytest.mark.parametrize("rows, cols", [(70, 300), (128, 256), (1, 130)])
def test_torch_cast_matches_numpy(cast, rows, cols, rng):
    x = rng.standard_normal((rows, cols), dtype=np.float32) * 10
    q_t, s_t = cast(torch.from_numpy(x))
    q_n, s_n = cast(x)
    assert q_t.dtype == torch.float8_e4m3fn and s_t.dtype == torch.float32
    np.testing.assert_array_equal(s_t.numpy(), s_n)
    np.testing.assert_array_equal(q_t.view(torch.uint8).numpy(), q_n.view(np.uint8))


@pytest.fixture
def tensors_refuse_numpy(monkeypatch):
    """A torch tensor that reaches NumPy fails the test: a CUDA tensor could not get there without a host copy."""
    def refuse(self, *args, **kwargs):
        raise AssertionError("calc_diff converted a torch tensor to NumPy")
    monkeypatch.setattr(torch.Tensor, "__array__", refuse)
    monkeypatch.setattr(torch.Tensor, "numpy", refuse)


def test_calc_diff_of_tensors_is_numpys_float64_value(rng, tensors_refuse_numpy):
    x = rng.standard_normal(4096)
    y = x + 1e-3 * rng.standard_normal(4096)
    got = calc_diff(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32)))
    assert type(got) is float
    assert got == pytest.approx(calc_diff(x.astype(np.float32), y.astype(np.float32)), rel=1e-9)
    assert calc_diff(torch.from_numpy(x), y) == pytest.approx(calc_diff(x, y), rel=1e-9)  # a tensor and an array


def test_calc_diff_of_bf16_against_float32_tensors(rng, tensors_refuse_numpy):
    """DeepGEMM's tests compare a BF16 output with a BF16 or float32 reference: both are widened to float64."""
    reference = torch.from_numpy(rng.standard_normal((64, 256), dtype=np.float32))
    rounded = reference.to(torch.bfloat16)
    widened = rounded.to(torch.float64).contiguous()
    assert calc_diff(rounded, reference) == pytest.approx(calc_diff(widened, reference.double()), rel=1e-12)
    assert 0 < calc_diff(rounded, reference) < 1e-4  # BF16 keeps 8 mantissa bits: a relative error of ~2**-9
    assert calc_diff(rounded, widened) == 0.0


def test_calc_diff_of_tensors_nan_and_zeros(tensors_refuse_numpy):
    x = torch.randn(100)
    poisoned = x.clone()
    poisoned[17] = float("nan")
    assert np.isnan(calc_diff(poisoned, x)) and np.isnan(calc_diff(x.to(torch.bfloat16), poisoned))
    assert calc_diff(torch.zeros(3, dtype=torch.bfloat16), torch.zeros(3)) == 0.0
    assert calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
