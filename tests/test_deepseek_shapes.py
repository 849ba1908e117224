"""Every GEMM stage and the public API on the 18 DeepSeek-V3 shapes plus ragged ones (GPU).

Inputs are drawn and quantized on the GPU (torch, same recipe as gemm.fp8.random_problem, fresh seed per
test) and the float64 reference of the dequantized inputs is computed there too, over all rows: the host
path would spend ~10 s per large shape in NumPy. The output is poisoned with NaN before the launch.
"""
import os

import numpy as np
import pytest

import gemm
from gemm.testing.problems import random_problem, reference_gemm
import lessons
from gemm.fp8 import GROUP, dequantize_per_block, dequantize_per_token

DEEPSEEK_SHAPES = [(m, n, k) for m in (64, 128, 4096) for (n, k) in
                   ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))]
RAGGED_SHAPES = [(1, 2112, 512), (100, 2112, 512), (257, 4096, 1024), (4095, 7168, 2048), (300, 2111, 256),
                 (65, 130, 128)]
# production's 128 x 112 tiles (gemm.heuristics.fuller_wave_block_n), two B scales in most tiles; M ragged in one
FULLER_WAVE_SHAPES = [(256, 7168, 2048), (200, 7168, 7168)]
# production's even waves (gemm.heuristics.EVEN_WAVES_MIN_K): 128 and 124 CTAs walk 3 tiles each, M, K ragged
EVEN_WAVES_SHAPES = [(2999, 4000, 4224), (3001, 3968, 4160)]
# TEST_STAGES=4,5,6 narrows a GPU run to some stages (all by default).
STAGES = [int(s) for s in os.environ.get("TEST_STAGES", "").split(",") if s] or lessons.GEMM_STAGES


def torch_problem(m, n, k, rng):
    import torch
    g = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**62)))
    magnitude = lambda shape: torch.exp2(torch.randint(-4, 5, shape, generator=g, device="cuda").float())  # noqa: E731
    x = torch.randn(m, k, generator=g, device="cuda") * magnitude((m, 1))
    w = torch.randn(n, k, generator=g, device="cuda") * magnitude((1, k))
    a, sa = gemm.per_token_cast_to_fp8(x)
    b, sb = gemm.per_block_cast_to_fp8(w)
    return a, sa, b, sb


def reference(a, sa, b, sb):
    """float64 (a*sa)(b*sb)^T of the dequantized FP8 inputs, on the GPU."""
    m, k = a.shape
    n = b.shape[0]
    a64 = a.double() * sa.double().repeat_interleave(GROUP, dim=1)[:, :k]
    b64 = b.double() * sb.double().repeat_interleave(GROUP, dim=0)[:n].repeat_interleave(GROUP, dim=1)[:, :k]
    return a64 @ b64.T


def calc_diff(x, y) -> float:
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def run_and_check(call, m, n, k, rng):
    torch = pytest.importorskip("torch")
    a, sa, b, sb = torch_problem(m, n, k, rng)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    call(a, gemm.get_mn_major_tma_aligned_tensor(sa), b, sb, out)
    torch.cuda.synchronize()
    unwritten = torch.isnan(out).sum().item()
    assert unwritten == 0, f"{unwritten} outputs never written"
    diff = calc_diff(out, reference(a, sa, b, sb))
    assert diff < 1e-3, f"diff {diff:.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", DEEPSEEK_SHAPES + RAGGED_SHAPES)
@pytest.mark.parametrize("number", STAGES)
def test_stage(number, m, n, k, rng):
    stage = lessons.stage(number)
    run_and_check(lambda a, sa, b, sb, out: stage.gemm(a, sa, b, sb, out), m, n, k, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", DEEPSEEK_SHAPES + RAGGED_SHAPES + FULLER_WAVE_SHAPES + EVEN_WAVES_SHAPES)
def test_fp8_gemm_nt(m, n, k, rng):
    run_and_check(lambda a, sa, b, sb, out: gemm.fp8_gemm_nt((a, sa), (b, sb), out), m, n, k, rng)


def test_reference_helper_matches_numpy_reference(rng):
    """The GPU-side reference is the same function as gemm.fp8.reference_gemm (checked on CPU torch)."""
    torch = pytest.importorskip("torch")
    a, sa, b, sb = random_problem(70, 200, 384, rng)
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))  # noqa: E731
    got = reference(t(a.view(np.uint8)).view(torch.float8_e4m3fn), t(np.ascontiguousarray(sa)),
                    t(b.view(np.uint8)).view(torch.float8_e4m3fn), t(sb))
    want = reference_gemm(a, sa, b, sb)
    # Two float64 dot products that sum in different orders differ by up to K * eps * sum|a_i b_i| (not by a fixed
    # relative amount: an element near cancellation, 0.95 out of terms of 300, moved 3e-12 relatively in one seed).
    magnitude = np.abs(dequantize_per_token(a, sa)) @ np.abs(dequantize_per_block(b, sb)).T
    bound = a.shape[1] * np.finfo(np.float64).eps * magnitude
    assert (np.abs(got.numpy() - want) <= bound).all(), np.max(np.abs(got.numpy() - want) / bound)
