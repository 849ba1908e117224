"""Swap AB in the masked grouped GEMM (MoE decode: KernelConfig(gemm_type="masked", swap_ab=True)).

CPU: the generated PTX on the emulator, bit-exact against the float64 reference of each group's dequantized
small-integer inputs, on counts 0, 1, a count that is not a multiple of the token tile, M_max, and counts past what
the heuristics expected (more tiles), ragged N, several K-block counts, both weight-tile heights, round-robin and
random schedules; D starts as NaN, so rows at or past a group's count must still be NaN and every row below it
written. The cubins assemble clean (STSM .MT88, QGMMA, the row-masked st.global copy). The heuristics swap at
expected_m <= SWAP_AB_MAX_M with a TMA epilogue, and ``allow_swap_ab=False`` and ``config=`` still choose.
GPU (``gpu`` marker, skipped without a Hopper GPU): random counts, NaN-poisoned out, diff < 1e-3 against float64,
untouched rows; explicit configs; a CUDA graph replayed with new counts; bit-exact small integers.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

from gemm.fp8 import E4M3
from gemm.heuristics import H100, SWAP_AB_MAX_M, choose_grouped_config
from gemm.kernel import KERNEL, KernelConfig, generate

sys.path.insert(0, str(Path(__file__).parent))
from tc_checks import assert_clean_resources, assert_exact, small_integer_problem  # noqa: E402
from test_grouped import _cuda, _host, _nan_out, check_masked, masked_problem  # noqa: E402


def masked_swap_config(**fields) -> KernelConfig:
    fields.setdefault("raster_group", 0)
    return KernelConfig(gemm_type="masked", swap_ab=True, **fields)


def small_integer_masked_problem(groups: int, m_max: int, n: int, k: int, rng):
    """One small-integer problem per group (tc_checks.small_integer_problem): every partial and total is exact in
    FP32, so each computed row must equal the BF16-rounded float64 reference bit for bit."""
    a, b = np.empty((groups, m_max, k), E4M3), np.empty((groups, n, k), E4M3)
    sa = np.empty((groups, m_max, k // 128), np.float32)
    sb = np.empty((groups, -(-n // 128), k // 128), np.float32)
    for g in range(groups):
        a[g], sa[g], b[g], sb[g] = small_integer_problem(m_max, n, k, rng)
    return a, sa, b, sb


def assert_masked_exact(d, a, sa, b, sb, masked_m) -> None:
    """Rows at or past each group's (clamped) count untouched (NaN); the rows below it bit-exact."""
    m_max = a.shape[1]
    for g, count in enumerate(masked_m):
        count = min(max(int(count), 0), m_max)
        untouched = np.isnan(d[g, count:]).all(axis=1)
        assert untouched.all(), f"group {g}: rows {count + np.flatnonzero(~untouched)[:5]} at or past masked_m written"
        if count:
            assert_exact(d[g, :count], (a[g, :count], sa[g, :count], b[g], sb[g]))


# (groups, M_max, N, K, masked_m, config fields)
MASKED_SWAP_CASES = [
    # one group, one K block, a count below one 8-row tile
    (1, 8, 64, 128, [5], dict(block_m=8, block_n=64, stages=2)),
    # 0, 1, M_max, and 19 (three 8-row tiles, the last partial); ragged N (136 = 2 x 64 + 8)
    (4, 40, 136, 384, [0, 1, 40, 19], dict(block_m=8, block_n=64, stages=3)),
    # two math warpgroups (128 weight rows), N = 128 + 72, M_max = 33 (sa pitch 36), five K blocks
    (3, 33, 200, 640, [33, 17, 0], dict(block_m=16, block_n=128, stages=2)),
    # raster order inside a group (6 n-blocks in groups of 2 by 5 m-blocks); counts 40 and 9
    (2, 40, 328, 256, [40, 9], dict(block_m=8, block_n=64, stages=4, raster_group=2)),
    # 32-row tiles: a count exactly two tiles, one just past, one short
    (3, 70, 72, 384, [64, 65, 31], dict(block_m=32, block_n=64, stages=2)),
    # 64-row tiles (the largest swap tile), two weight-row warpgroups, counts M_max = 100 and 64
    (2, 100, 256, 256, [100, 64], dict(block_m=64, block_n=128, stages=2)),
]


@pytest.mark.parametrize("seed", [None, 1, 2])
@pytest.mark.parametrize("groups, m_max, n, k, masked_m, fields", MASKED_SWAP_CASES)
def test_masked_swap_ab_on_the_emulator(groups, m_max, n, k, masked_m, fields, seed, rng):
    """A token scale read from the wrong group or row, a weight block from the wrong expert, a tile walked twice or
    skipped, or a transposed store landing in the wrong row (or past the count) is a wrong answer here."""
    from gemm.testing.emulated import run_grouped_gemm
    problem = small_integer_masked_problem(groups, m_max, n, k, rng)
    masked_m = np.array(masked_m, np.int32)
    d = run_grouped_gemm(masked_swap_config(**fields), *problem, masked_m, sm_count=3, seed=seed)
    assert_masked_exact(d, *problem, masked_m)


@pytest.mark.parametrize("expected_m", [1, 8, 16, 32])
def test_production_masked_swap_config_with_counts_past_expected_m(expected_m, rng):
    """The heuristics' config for expected_m (swapped, token tile = the fewest power of two >= expected_m), run on
    counts up to M_max = 2 tiles + 5 rows: a group with more tokens than expected takes more tiles, and is right."""
    from gemm.testing.emulated import run_grouped_gemm
    groups, n, k = 4, 136, 256
    config = choose_grouped_config("masked", expected_m, n, k, groups, H100)
    assert config.swap_ab
    m_max = 2 * config.block_m + 5
    masked_m = rng.permutation([0, m_max, expected_m, int(rng.integers(expected_m + 1, m_max + 1))]).astype(np.int32)
    print(f"{config.describe()}; masked_m {masked_m.tolist()} of {m_max}")
    problem = small_integer_masked_problem(groups, m_max, n, k, rng)
    d = run_grouped_gemm(config, *problem, masked_m, sm_count=3, seed=int(rng.integers(1000)))
    assert_masked_exact(d, *problem, masked_m)


def test_masked_swap_ab_counts_outside_0_to_m_max_are_clamped(rng):
    """Counts the host did not check: negative -> no rows, past M_max -> M_max rows (nothing outside the group)."""
    from gemm.testing.emulated import run_grouped_gemm
    masked_m = np.array([-3, 1000, 0], np.int32)
    problem = small_integer_masked_problem(3, 20, 64, 256, rng)
    d = run_grouped_gemm(masked_swap_config(block_m=8, block_n=64, stages=2), *problem, masked_m, sm_count=2)
    assert_masked_exact(d, *problem, masked_m)
    assert not np.isnan(d[1]).any()


def test_masked_swap_ab_on_gaussian_data(rng):
    """The test_grouped problems (Gaussian data, per-token and per-block casts): within 1e-3 of float64."""
    from gemm.testing.emulated import run_grouped_gemm
    masked_m = np.array([1, 0, 23, 48], np.int32)
    problem = masked_problem(4, 48, 200, 384, rng)
    d = run_grouped_gemm(masked_swap_config(block_m=16, block_n=64, stages=3), *problem, masked_m, sm_count=3,
                         seed=int(rng.integers(1000)))
    check_masked(d, *problem, masked_m)


@pytest.mark.parametrize("repeat", range(4))
def test_random_masked_swap_configs_and_counts(repeat, rng):
    from gemm.testing.emulated import run_grouped_gemm
    config = masked_swap_config(block_m=int(rng.choice([8, 16, 32, 64])), block_n=int(rng.choice([64, 128])),
                                stages=int(rng.integers(2, 5)), raster_group=int(rng.choice([0, 1, 2])))
    groups, m_max = int(rng.integers(1, 5)), int(rng.choice([1, 7, 8, 9, 33, 64, 70]))
    masked_m = rng.integers(0, m_max + 1, groups).astype(np.int32)
    masked_m[rng.random(groups) < 0.3] = 0
    n, k = int(rng.choice([64, 136, 200, 256])), int(rng.choice([128, 384]))
    sms, seed = int(rng.integers(1, 5)), int(rng.integers(1000))
    print(f"{config.describe()}; masked_m {masked_m.tolist()} of {m_max}, N={n}, K={k}, {sms} CTAs, seed {seed}")
    problem = small_integer_masked_problem(groups, m_max, n, k, rng)
    d = run_grouped_gemm(config, *problem, masked_m, sm_count=sms, seed=seed)
    assert_masked_exact(d, *problem, masked_m)


# ------------------------------------------------------------------------------------------- assembly
@pytest.mark.parametrize("expected_m, n, k, groups", [(16, 4096, 7168, 8), (32, 7168, 2048, 16), (1, 4096, 7168, 8),
                                                      (64, 4096, 7168, 8)])
def test_masked_swap_ab_kernels_assemble_clean(expected_m, n, k, groups):
    """Production's swapped masked kernels at DeepSeek-V3 MoE shapes (and, for expected_m = 64, the largest tile,
    64 tokens by 128 weight rows): no spills, no ptxas warning; the wgmma's N is the token tile, every stmatrix the
    transposing one (SASS STSM .MT88), and the row-masked copy of a group's last tile (ld.shared + st.global v4) is
    there beside the TMA store."""
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble, opcode_counts
    if expected_m <= SWAP_AB_MAX_M:
        config = choose_grouped_config("masked", expected_m, n, k, groups, H100)
        assert config.swap_ab and config.persistent and config.block_n == 64
    else:
        config = masked_swap_config(block_m=64, block_n=128, stages=6, raster_group=8)
    ptx = generate(config, n, k)
    assert f"m64n{config.block_m}k32" in ptx and ".trans.shared.b16" in ptx and "st.global.v4.b32" in ptx
    cubin = compile_ptx(ptx)
    assert_clean_resources(cubin, KERNEL)
    assert not cubin.warnings, cubin.warnings
    sass = disassemble(cubin)
    stores = [i.text.split()[0] for i in sass if i.text.startswith("STSM")]
    assert stores and all(".MT88" in opcode for opcode in stores), stores
    ops = opcode_counts(sass)
    assert ops["QGMMA"] >= 4 and ops["UTMASTG"] >= 1 and ops["STG"] >= 1, ops


# ------------------------------------------------------------------------------------------- configs
def test_swap_ab_refuses_the_contiguous_layout_and_says_why():
    with pytest.raises(ValueError, match=r"gemm_type='normal' or 'masked', got 'contiguous'.*pads every group to 128"):
        KernelConfig(gemm_type="contiguous", swap_ab=True, block_m=16, block_n=64)
    with pytest.raises(ValueError, match="persistent=True"):  # the masked walk, swapped or not
        KernelConfig(gemm_type="masked", swap_ab=True, block_m=16, block_n=64, persistent=False)
    with pytest.raises(ValueError, match="multicast"):
        KernelConfig(gemm_type="masked", swap_ab=True, block_m=16, block_n=64, multicast=2)


@pytest.mark.parametrize("expected_m, block_m", [(1, 8), (7, 8), (8, 8), (9, 16), (16, 16), (17, 32), (32, 32)])
@pytest.mark.parametrize("n, k, groups", [(4096, 7168, 8), (7168, 2048, 16), (200, 384, 3)])
def test_masked_decode_swaps(expected_m, block_m, n, k, groups):
    from gemm.heuristics import MAX_STAGES
    from gemm.kernel import SharedPlan
    from gemm.kernel.config import max_stages
    config = choose_grouped_config("masked", expected_m, n, k, groups, H100)
    assert (config.swap_ab, config.block_m, config.block_n, config.persistent) == (True, block_m, 64, True)
    assert config.gemm_type == "masked" and config.split_k == 1 and config.epilogue == "tma"
    assert config.stages == max_stages(config, n, k, limit=MAX_STAGES) == MAX_STAGES  # small stages: all fit
    SharedPlan(config, n, k).check()


@pytest.mark.parametrize("expected_m, n", [(SWAP_AB_MAX_M + 1, 4096), (64, 7168), (16, 204)])
def test_masked_does_not_swap_past_decode_or_without_the_tma_epilogue(expected_m, n):
    config = choose_grouped_config("masked", expected_m, n, 7168, 8, H100)
    assert not config.swap_ab and config.block_m >= 64


def test_allow_swap_ab_false_gives_the_unswapped_masked_config():
    swapped = choose_grouped_config("masked", 16, 4096, 7168, 8, H100)
    unswapped = choose_grouped_config("masked", 16, 4096, 7168, 8, H100, allow_swap_ab=False)
    assert swapped.swap_ab and not unswapped.swap_ab and unswapped.block_m == 64
    contiguous = choose_grouped_config("contiguous", 4096, 4096, 7168, 8, H100)
    assert not contiguous.swap_ab


def test_masked_calls_choose_swap_from_expected_m_and_keep_overrides(rng):
    """dispatch.choose: expected_m (the heuristics' M) <= 32 picks the swapped kernel whatever M_max is; a caller's
    config, swapped or not, is taken as given."""
    from gemm import dispatch
    from test_grouped import check_masked_call, masked_args
    args = check_masked_call(masked_args(rng, m_max=256), expected_m=16)
    assert dispatch.choose(args, heuristic_m=16).swap_ab
    assert not dispatch.choose(args, heuristic_m=128).swap_ab
    unswapped = KernelConfig(gemm_type="masked", block_m=64, block_n=64, stages=4)
    assert dispatch.choose(args, unswapped, heuristic_m=16) is unswapped
    swapped = masked_swap_config(block_m=32, block_n=128, stages=4)
    assert dispatch.choose(args, lambda m, n, k: swapped, heuristic_m=200) is swapped


# ------------------------------------------------------------------------------------------- GPU
def _gpu_masked_swap(groups, m_max, n, k, masked_m, expected_m, rng, config=None):
    """As test_grouped's GPU masked check, with an optional config: random Gaussian inputs, NaN-poisoned out, rows
    below each count within 1e-3 of float64, the others untouched."""
    import gemm
    torch = pytest.importorskip("torch")
    a, sa, b, sb = masked_problem(groups, m_max, n, k, rng)
    out = _nan_out((groups, m_max, n))
    gemm.m_grouped_fp8_gemm_nt_masked((_cuda(a), gemm.masked_sa_to_mn_major(_cuda(sa))), (_cuda(b), _cuda(sb)), out,
                                      _cuda(np.asarray(masked_m, np.int32)), expected_m, config=config)
    torch.cuda.synchronize()
    check_masked(_host(out), a, sa, b, sb, masked_m)


def _random_counts(groups, m_max, expected_m, rng):
    """Around expected_m (0.7x to 1.3x, DeepGEMM's test), with 0, 1, M_max and one past 1.3x expected_m."""
    masked_m = np.clip((expected_m * rng.uniform(0.7, 1.3, groups)).astype(np.int32), 0, m_max)
    masked_m[:4] = [0, 1, m_max, min(m_max, 2 * expected_m + 3)][:groups]
    return rng.permutation(masked_m).astype(np.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("groups, m_max, n, k, expected_m", [
    (8, 128, 4096, 7168, 16), (16, 64, 7168, 2048, 32), (8, 256, 7168, 2048, 8), (4, 37, 200, 384, 5),
    (16, 32, 4096, 7168, 32)])
def test_masked_swap_ab_on_the_gpu(groups, m_max, n, k, expected_m, rng):
    """Production's config (swapped at these expected_m) on DeepSeek-V3 MoE decode shapes and a ragged one."""
    assert choose_grouped_config("masked", min(expected_m, m_max), n, k, groups).swap_ab
    masked_m = _random_counts(groups, m_max, expected_m, rng)
    print(f"masked_m {masked_m.tolist()}")
    _gpu_masked_swap(groups, m_max, n, k, masked_m, expected_m, rng)


GPU_MASKED_SWAP_CONFIGS = {
    "8x64": dict(block_m=8, block_n=64, stages=10),
    "16x128": dict(block_m=16, block_n=128, stages=8),
    "32x64 raster 8": dict(block_m=32, block_n=64, stages=6, raster_group=8),
    "64x64": dict(block_m=64, block_n=64, stages=6),
}


@pytest.mark.gpu
@pytest.mark.parametrize("groups, m_max, n, k", [(6, 130, 200, 384), (4, 37, 136, 640), (8, 96, 4096, 7168)])
@pytest.mark.parametrize("name", list(GPU_MASKED_SWAP_CONFIGS))
def test_masked_swap_ab_configs_on_the_gpu(name, groups, m_max, n, k, rng):
    config = masked_swap_config(**GPU_MASKED_SWAP_CONFIGS[name])
    masked_m = rng.integers(0, m_max + 1, groups).astype(np.int32)
    masked_m[:3] = [0, 1, m_max]
    masked_m = rng.permutation(masked_m)
    print(f"masked_m {masked_m.tolist()}")
    _gpu_masked_swap(groups, m_max, n, k, masked_m, 16, rng, config=config)


@pytest.mark.gpu
def test_masked_swap_ab_in_a_cuda_graph_replays_with_new_counts(rng):
    """Captured once at expected_m = 16 (swapped); replays with counts from 0 to M_max = 128 (eight times the
    expected rows: more tiles than expected) into a NaN-poisoned out."""
    import gemm
    torch = pytest.importorskip("torch")
    groups, m_max, n, k, expected_m = 8, 128, 4096, 7168, 16
    assert choose_grouped_config("masked", expected_m, n, k, groups).swap_ab
    a, sa, b, sb = masked_problem(groups, m_max, n, k, rng)
    ta, tsa, tb, tsb = _cuda(a), gemm.masked_sa_to_mn_major(_cuda(sa)), _cuda(b), _cuda(sb)
    counts = torch.zeros(groups, dtype=torch.int32, device="cuda")
    out = _nan_out((groups, m_max, n))

    def call():
        gemm.m_grouped_fp8_gemm_nt_masked((ta, tsa), (tb, tsb), out, counts, expected_m)
    call()  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for replay in range(4):
        masked_m = _random_counts(groups, m_max, expected_m, rng)
        masked_m[replay % groups] = [0, 1, m_max, 17][replay]
        print(f"replay {replay}: masked_m {masked_m.tolist()}")
        counts.copy_(torch.from_numpy(masked_m))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_masked(_host(out), a, sa, b, sb, masked_m)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_MASKED_SWAP_CONFIGS))
def test_masked_swap_ab_is_exact_on_small_integers_on_the_gpu(name, rng):
    """Bit-exact on the GPU too (every partial exact in FP32), as on the emulator; rows past the counts untouched."""
    import gemm
    torch = pytest.importorskip("torch")
    groups, m_max, n, k = 4, 70, 200, 640
    problem = small_integer_masked_problem(groups, m_max, n, k, rng)
    a, sa, b, sb = problem
    masked_m = np.array([0, 1, m_max, 33], np.int32)
    out = _nan_out((groups, m_max, n))
    gemm.m_grouped_fp8_gemm_nt_masked((_cuda(a), gemm.masked_sa_to_mn_major(_cuda(sa))), (_cuda(b), _cuda(sb)), out,
                                      _cuda(masked_m), 16, config=masked_swap_config(**GPU_MASKED_SWAP_CONFIGS[name]))
    torch.cuda.synchronize()
    assert_masked_exact(_host(out), *problem, masked_m)


# ------------------------------------------------------------------------------------------- bench shapes
def test_the_grouped_bench_times_masked_decode_beside_the_unswapped_kernel():
    """The MoE decode shapes (at most 4: the full bench stays short) are in the grouped bench and in
    ``bench dense --grouped``; production swaps on each, and the grouped bench also times the unswapped kernel
    there (and only there)."""
    from gemm.testing.bench_grouped import MASKED_DECODE_SHAPES, MASKED_SHAPES, grouped_shapes, unswapped_masked_config
    assert 1 <= len(MASKED_DECODE_SHAPES) <= 4
    for groups, m, n, k in MASKED_DECODE_SHAPES:
        assert ("masked", groups, m, n, k) in grouped_shapes()
        assert choose_grouped_config("masked", m, n, k, groups).swap_ab
        unswapped = unswapped_masked_config(groups, m, n, k)
        assert unswapped.gemm_type == "masked" and not unswapped.swap_ab
    assert all(unswapped_masked_config(*shape) is None for shape in MASKED_SHAPES)
