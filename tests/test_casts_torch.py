"""The torch path of the casts (used for device tensors, as DeepGEMM's helpers are) matches NumPy's bit for bit."""
import numpy as np
import pytest

from gemm.fp8 import per_block_cast_to_fp8, per_token_cast_to_fp8

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
