"""The weight-gradient GEMMs (1x128 scales on both operands, FP32 D += A*B^T): the kernel on the emulator (exact on
integer problems, ragged M, N and K, every element written), k-grouped slicing with uneven and empty groups, the
backward-pass casts, argument errors (CPU); the public functions against float64 on the H100 (GPU)."""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

from gemm.fp8 import E4M3, GROUP, calc_diff, ceil_div, dequantize_per_token
from gemm.kernel import KernelConfig
from gemm.validate import check_wgrad_args

sys.path.insert(0, os.path.dirname(__file__))  # tests/tc_checks.py
from tc_checks import on_fake_device  # noqa: E402


def integer_wgrad_problem(m, n, k, rng):
    """Integers in [-4, 4] (exact in e4m3) and power-of-two 1x128 scales on both sides: every product sa*sb and
    every total is exact in FP32, so the kernel must match the float64 reference bit for bit, for every seed."""
    kb = ceil_div(k, GROUP)
    a = rng.integers(-4, 5, (m, k)).astype(np.float32).astype(E4M3)
    b = rng.integers(-4, 5, (n, k)).astype(np.float32).astype(E4M3)
    sa = np.exp2(rng.integers(-1, 2, (m, kb))).astype(np.float32)
    sb = np.exp2(rng.integers(-1, 2, (n, kb))).astype(np.float32)
    return a, sa, b, sb


def reference_wgrad(a, sa, b, sb) -> np.ndarray:
    return dequantize_per_token(a, sa) @ dequantize_per_token(b, sb).T


WGRAD_CONFIGS = {  # tile shapes the 1x128 promotion must hold for: one or two warpgroups, two waves, wide N
    "128x128": dict(block_m=128, block_n=128, stages=3),
    "64x48 (unswizzled D rows)": dict(block_m=64, block_n=48, stages=2),
    "256x64 (two waves share the column scales)": dict(block_m=256, block_n=64, stages=2),
    "128x160": dict(block_m=128, block_n=160, stages=2),
    "128x152 (no B-scale block boundary: any multiple of 8)": dict(block_m=128, block_n=152, stages=2),
    "128x128, A multicast to a pair": dict(block_m=128, block_n=128, stages=2, multicast=2),
    "128x128, B and its row scales multicast to a pair": dict(block_m=128, block_n=128, stages=2, multicast=2,
                                                               multicast_operand="b"),
    "128x64, D in two passes": dict(block_m=128, block_n=64, stages=2, d_buffer=(128, 32)),
}
SHAPES = [(200, 232, 384), (70, 96, 272), (129, 40, 16), (256, 136, 1040)]  # ragged M, N; K % 128 != 0 too


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("name", list(WGRAD_CONFIGS))
def test_wgrad_kernel_is_exact_on_the_emulator(name, m, n, k, rng):
    """D = C + A*B^T with per-column B scales, bit for bit, over several tiles per CTA and a wrapping ring."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(**WGRAD_CONFIGS[name], out_dtype="f32", accumulate=True, b_scales="1x128", raster_group=2)
    problem = integer_wgrad_problem(m, n, k, rng)
    c = rng.integers(-64, 65, (m, n)).astype(np.float32) / 4
    got = run_gemm(config, *problem, c=c, sm_count=3, seed=int(rng.integers(1000)))
    want = (c + reference_wgrad(*problem)).astype(np.float32)
    assert np.array_equal(got, want), np.argwhere(got != want)[:5].tolist()


@pytest.mark.parametrize("m, n, k", SHAPES[:2])
def test_every_element_is_written_without_accumulation(m, n, k, rng):
    """The same kernel storing instead of adding: D starts NaN, so an element no tile wrote shows."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(block_m=128, block_n=64, stages=2, out_dtype="f32", b_scales="1x128", raster_group=2)
    problem = integer_wgrad_problem(m, n, k, rng)
    got = run_gemm(config, *problem, sm_count=2, seed=int(rng.integers(1000)))
    assert not np.isnan(got).any(), f"{np.isnan(got).sum()} elements never written"
    assert np.array_equal(got, reference_wgrad(*problem).astype(np.float32))


def test_one_kernel_serves_every_k():
    """K is a kernel parameter: the PTX of a 1x128 config does not depend on K, and asking for a K is an error."""
    from gemm.kernel.generator import compiled_k, generate, kernel_params
    config = KernelConfig(out_dtype="f32", accumulate=True, b_scales="1x128", stages=3)
    assert compiled_k(config, 4096) is None and compiled_k(KernelConfig(), 4096) == 4096
    assert ("u32", "k_blocks") in kernel_params(config) and ("tmap", "tmap_sb") in kernel_params(config)
    assert ("u64", "sb") not in kernel_params(config)
    with pytest.raises(ValueError, match="takes K at run time"):
        generate(config, 256, 4096)
    assert "ld.shared.v2.f32" in generate(config, 256, None)


def test_k_grouped_groups_are_sliced_as_deepgemm_lays_them_out(rng):
    """Uneven token counts, an empty group and K % 128 != 0: each group's slice of DeepGEMM's flat layout, run on
    the emulator, adds exactly that expert's dW into its D; the empty group's D is untouched."""
    from gemm import k_grouped_transpose_cast_to_fp8
    from gemm.testing.emulated import run_gemm
    from gemm.wgrad import k_grouped_operands
    m, n, sizes = 72, 40, [256, 0, 144, 16]
    # token-stacked dy (T, M) and x (T, N) of 0, +-1, +-2, +-4 with power-of-two (ue8m0) scales: the casts are
    # exact, so the dequantized operands are these values and every D must match the float64 dy^T x bit for bit
    values = np.array([0, 1, -1, 2, -2, 4, -4], np.float32)
    grad, x = rng.choice(values, (sum(sizes), m)), rng.choice(values, (sum(sizes), n))
    lhs = k_grouped_transpose_cast_to_fp8(grad, sizes, ue8m0=True)
    rhs = k_grouped_transpose_cast_to_fp8(x, sizes, ue8m0=True)
    assert lhs[0].shape == (m * sum(sizes),) and lhs[1].shape == (sum(ceil_div(t, GROUP) for t in sizes), m)
    out = rng.integers(-64, 65, (len(sizes), m, n)).astype(np.float32) / 4
    before = out.copy()
    config = KernelConfig(block_m=64, block_n=40, stages=2, out_dtype="f32", accumulate=True, b_scales="1x128")
    seen = []
    for (a, sa), (b, sb), d in k_grouped_operands(lhs, rhs, out, sizes):
        d[...] = run_gemm(config, a, sa.T, b, sb.T, c=d, sm_count=2)  # sa_g comes (Kb, M): its transpose is (M, Kb)
        seen.append(a.shape[1])
    assert seen == [t for t in sizes if t]
    start = 0
    for group, tokens in enumerate(sizes):
        dy, xs = grad[start:start + tokens], x[start:start + tokens]
        start += tokens
        assert np.array_equal(out[group], before[group] + (dy.T.astype(np.float64) @ xs).astype(np.float32)), group


def test_transpose_cast_scales_along_the_token_axis(rng):
    from gemm import transpose_cast_to_fp8
    x = rng.standard_normal((300, 72)).astype(np.float32) * np.exp2(rng.integers(-8, 8, (300, 1)))
    q, scale = transpose_cast_to_fp8(x)
    assert q.shape == (72, 300) and q.flags.c_contiguous and scale.shape == (72, 3)
    # e4m3: half a unit of its 3 mantissa bits relative, or of its subnormal spacing 2^-9 (times the scale)
    spacing = np.repeat(scale, GROUP, axis=1)[:, :300] * 2.0 ** -9
    assert (np.abs(dequantize_per_token(q, scale) - x.T) <= 2.0 ** -4 * np.abs(x.T) + spacing).all()
    # each scale covers 128 tokens of one column: its amax over those tokens maps to 448
    assert np.allclose(scale[:, 0], np.abs(x[:128]).max(axis=0) / 448)
    q_mn, scale_mn = transpose_cast_to_fp8(x, mn_major=True)
    assert np.array_equal(q_mn, q) and np.array_equal(np.asarray(scale_mn), scale) and scale_mn.strides[0] == 4


def _fake_wgrad_args(rng, m=72, n=40, k=272, **changes):
    a, sa, b, sb = integer_wgrad_problem(m, n, k, rng)
    from gemm.fp8 import sa_to_mn_major
    args = dict(a=a, sa=sa_to_mn_major(sa), b=b, sb=sa_to_mn_major(sb), d=np.zeros((m, n), np.float32))
    for name, change in changes.items():
        args[name] = change(args[name])
    return {name: on_fake_device(value) for name, value in args.items()}


def test_valid_wgrad_arguments_pass(rng):
    args = check_wgrad_args(**_fake_wgrad_args(rng))
    assert (args.m, args.n, args.k, args.b_scales) == (72, 40, 272, "1x128")
    assert args.sb_stride == 40 and args.c is args.d  # accumulated in place


@pytest.mark.parametrize("name, bad, error, words", [
    ("d", lambda d: d.astype(np.uint16), TypeError, "d must be the FP32 weight gradient"),
    ("sb", lambda sb: sb[:1], ValueError, "sb must have shape (40, 3)"),  # a 128x128 weight's scales
    ("sa", lambda sa: np.ascontiguousarray(sa), ValueError, "sa must be stored M-major"),
    ("sb", lambda sb: np.ascontiguousarray(sb), ValueError, "gemm.transpose_cast_to_fp8(x, mn_major=True)"),
    ("b", lambda b: b[:, :256], ValueError, "K (tokens) of a (272)"),
    ("a", lambda a: a.astype(np.float32), TypeError, "gemm.transpose_cast_to_fp8(grad_output) makes it"),
    ("d", lambda d: d[:, :36], ValueError, "d must have shape (72, 40)"),
])
def test_bad_wgrad_argument_names_it(rng, name, bad, error, words):
    with pytest.raises(error) as info:
        check_wgrad_args(**_fake_wgrad_args(rng, **{name: bad}))
    assert words in str(info.value)


def test_wgrad_k_must_be_a_multiple_of_16(rng):
    with pytest.raises(ValueError, match="K=200 .* multiple of 16"):
        check_wgrad_args(**_fake_wgrad_args(rng, k=200))


def test_configs_refuse_what_the_registers_cannot_hold():
    with pytest.raises(ValueError, match="1x128 B scales need .* 224 registers"):
        KernelConfig(block_m=256, block_n=128, b_scales="1x128", out_dtype="f32")
    KernelConfig(block_m=256, block_n=128)  # the forward tile still fits (192)
    with pytest.raises(ValueError, match="producer='warpgroup' and gemm_type='normal'"):
        KernelConfig(b_scales="1x128", gemm_type="contiguous")
    with pytest.raises(ValueError, match="b_scales must be one of"):
        KernelConfig(b_scales="128x1")


@pytest.mark.parametrize("m, n, k", [(7168, 2112, 4096), (1536, 24576, 4096), (512, 32768, 8192),
                                     (2048, 7168, 4096), (100, 200, 16)])
def test_heuristic_wgrad_configs_assemble_without_spills(m, n, k):
    from gemm.heuristics import choose_wgrad_config
    from gemm.kernel.generator import generate
    from ptx.compile import compile_ptx
    config = choose_wgrad_config(m, n, k)
    assert config.b_scales == "1x128" and config.accumulate and config.out_dtype == "f32"
    log = compile_ptx(generate(config, n, None)).info_log
    assert "0 bytes spill stores" in log, log


# -- on the GPU ------------------------------------------------------------------------------------------------

def _torch_wgrad_problem(m, n, k, rng, mn_major=True):
    """Token-major dy (K, M) and x (K, N) in float32, cast with the library's transposing cast; the float64
    reference of D = residual + dy^T x over the dequantized operands."""
    torch = pytest.importorskip("torch")
    from gemm import transpose_cast_to_fp8
    dy = torch.from_numpy(rng.standard_normal((k, m), dtype=np.float32)).cuda()
    x = torch.from_numpy(rng.standard_normal((k, n), dtype=np.float32)).cuda()
    (a, sa), (b, sb) = transpose_cast_to_fp8(dy, mn_major=mn_major), transpose_cast_to_fp8(x, mn_major=mn_major)
    residual = torch.from_numpy(rng.standard_normal((m, n), dtype=np.float32) * 10).cuda()
    host = [t.cpu() for t in (a, sa, b, sb)]
    a_values = dequantize_per_token(host[0].view(torch.uint8).numpy().view(E4M3), host[1].numpy())
    b_values = dequantize_per_token(host[2].view(torch.uint8).numpy().view(E4M3), host[3].numpy())
    want = residual.double().cpu().numpy() + a_values @ b_values.T
    return (a, sa), (b, sb), residual, (want, np.abs(a_values) @ np.abs(b_values).T)


def _check(out, expected, times: int = 1):
    """Every element within the tensor cores' FP8 accumulation error of float64: Hopper's FP8 wgmma adds its
    products with about 13 mantissa bits (why the K blocks are promoted to FP32 at all), so the bound is
    2^-10 of the sum of |products| (measured errors sit near 2^-14 of it), times the calls added."""
    want, magnitude = expected
    got = out.double().cpu().numpy()
    assert np.isfinite(got).all()
    assert calc_diff(got, want) < 1e-6, calc_diff(got, want)
    error = np.abs(got - want)
    assert (error <= times * 2.0 ** -10 * magnitude + 1e-5 * np.abs(want)).all(), error.max()


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(200, 232, 384), (7168, 2112, 4096), (1536, 4096, 4112), (4, 8, 16),
                                     (129, 36, 1040)])
def test_wgrad_matches_float64_on_the_gpu(m, n, k, rng):
    from gemm import fp8_wgrad_gemm_nt
    lhs, rhs, residual, want = _torch_wgrad_problem(m, n, k, rng)
    out = residual.clone()
    fp8_wgrad_gemm_nt(lhs, rhs, out)
    _check(out, want)
    fp8_wgrad_gemm_nt(lhs, rhs, out)  # again, through the prepared launch: D += A*B^T twice
    _check(out, (2 * want[0] - residual.double().cpu().numpy(), want[1]), times=2)


@pytest.mark.gpu
def test_wgrad_takes_deepgemm_scale_layouts_on_the_gpu(rng):
    """Row-major (M, Kb) scales, what a plain per-token cast of the transpose gives, are converted on the device
    (with a ScaleLayoutWarning); DeepGEMM's transposed (Kb, M) form is read as it is."""
    import gemm
    torch = pytest.importorskip("torch")
    lhs, rhs, residual, want = _torch_wgrad_problem(256, 128, 512, rng, mn_major=False)
    out = residual.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gemm.ScaleLayoutWarning)
        gemm.wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out)
    _check(out, want)
    out = residual.clone()
    transposed = [(x, s.t().contiguous()) for x, s in (lhs, rhs)]
    assert transposed[0][1].shape == (4, 256)
    gemm.wgrad_gemm_fp8_fp8_fp32_nt(*transposed, out)
    _check(out, want)


@pytest.mark.gpu
def test_k_grouped_wgrad_on_the_gpu(rng):
    """Uneven experts, one of them empty, one with K % 128 != 0: each D gains exactly its expert's dy^T x."""
    torch = pytest.importorskip("torch")
    import gemm
    m, n, sizes = 512, 384, [1024, 0, 272, 2048]
    dy = torch.from_numpy(rng.standard_normal((sum(sizes), m), dtype=np.float32)).cuda()
    x = torch.from_numpy(rng.standard_normal((sum(sizes), n), dtype=np.float32)).cuda()
    lhs, rhs = gemm.k_grouped_transpose_cast_to_fp8(dy, sizes), gemm.k_grouped_transpose_cast_to_fp8(x, sizes)
    out = torch.from_numpy(rng.standard_normal((len(sizes), m, n), dtype=np.float32)).cuda()
    before = out.double().cpu().numpy()
    gemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out, sizes)
    torch.cuda.synchronize()
    host = out.double().cpu().numpy()
    a, sa = lhs[0].cpu().view(torch.uint8).numpy().view(E4M3), lhs[1].cpu().numpy()
    b, sb = rhs[0].cpu().view(torch.uint8).numpy().view(E4M3), rhs[1].cpu().numpy()
    offset = scale_row = 0
    for group, k in enumerate(sizes):
        kb = ceil_div(k, GROUP)
        if not k:
            assert np.array_equal(host[group], before[group]), "an empty group's D changed"
            continue
        a_values = dequantize_per_token(a[offset * m:(offset + k) * m].reshape(m, k), sa[scale_row:scale_row + kb].T)
        b_values = dequantize_per_token(b[offset * n:(offset + k) * n].reshape(n, k), sb[scale_row:scale_row + kb].T)
        want = before[group] + a_values @ b_values.T
        error = np.abs(host[group] - want)
        assert (error <= 2.0 ** -10 * (np.abs(a_values) @ np.abs(b_values).T) + 1e-5 * np.abs(want)).all(), group
        offset, scale_row = offset + k, scale_row + kb
