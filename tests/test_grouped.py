"""MoE grouped GEMMs (gemm.grouped): the m-grouped contiguous and masked kernels of the production generator.

CPU: every scheduler type runs on the PTX emulator (gemm.testing.emulated.run_grouped_gemm) on small shapes with random
group sizes (empty groups, one-row groups, -1 padding blocks, masked_m = 0, counts past M_max), its output poisoned
with NaN: rows that must stay untouched are still NaN, every computed row is written and matches the float64
reference of its group. Then the argument checks (clear errors), the configs and heuristics, the Python walk.
GPU (``gpu`` marker, skipped without a Hopper GPU): both layouts on realistic shapes with torch tensors, and the
masked GEMM captured in a CUDA graph and replayed with new counts.
"""
import numpy as np
import pytest

from gemm.fp8 import E4M3, calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from gemm.kernel import KernelConfig
from tc_checks import on_fake_device

ALIGN = 128
DIFF_LIMIT = 1e-3


# ------------------------------------------------------------------------------------------- problems
def expert_weights(groups: int, n: int, k: int, rng):
    """b (G, N, K) e4m3 and sb (G, ceil(N/128), K/128): one random_problem weight per group."""
    b = np.empty((groups, n, k), E4M3)
    sb = np.empty((groups, -(-n // 128), k // 128), np.float32)
    for g in range(groups):
        _, _, b[g], sb[g] = random_problem(1, n, k, rng)
    return b, sb


def contiguous_indices(sizes, rng, padding_blocks: int = 0) -> np.ndarray:
    """m_indices for groups of ``sizes`` rows, each padded with -1 to the alignment (empty groups take no rows),
    with ``padding_blocks`` all -1 blocks put at random places between groups."""
    blocks = []
    for g, size in enumerate(sizes):
        if size:
            rows = -(-size // ALIGN) * ALIGN
            blocks.append([g] * size + [-1] * (rows - size))
    for _ in range(padding_blocks):
        blocks.insert(int(rng.integers(len(blocks) + 1)), [-1] * ALIGN)
    return np.array([i for block in blocks for i in block], np.int32)


def contiguous_problem(sizes, n, k, rng, padding_blocks: int = 0):
    m_indices = contiguous_indices(sizes, rng, padding_blocks)
    a, sa, _, _ = random_problem(len(m_indices), 8, k, rng)
    b, sb = expert_weights(len(sizes), n, k, rng)
    return a, np.ascontiguousarray(sa), b, sb, m_indices


def check_contiguous(d, a, sa, b, sb, m_indices, block_m: int) -> None:
    """Blocks of BLOCK_M rows whose first index is -1 untouched (NaN); every other row written; every group's
    rows match its float64 reference."""
    m = len(m_indices)
    first = np.repeat(m_indices[::block_m], block_m)[:m]
    skipped = first < 0
    assert np.isnan(d[skipped]).all(), \
        f"rows of skipped blocks written: {np.flatnonzero(skipped)[~np.isnan(d[skipped]).all(1)][:5].tolist()}"
    written = ~np.isnan(d[~skipped]).any(axis=1)
    assert written.all(), f"rows never written: {np.flatnonzero(~skipped)[~written][:5].tolist()}"
    for g in np.unique(m_indices[m_indices >= 0]):
        rows = np.flatnonzero(m_indices == g)
        diff = calc_diff(d[rows], reference_gemm(a[rows], sa[rows], b[g], sb[g]))
        assert diff < DIFF_LIMIT, f"group {g} ({len(rows)} rows): diff {diff:.3g}"


def masked_problem(groups, m_max, n, k, rng):
    a = np.empty((groups, m_max, k), E4M3)
    sa = np.empty((groups, m_max, k // 128), np.float32)
    for g in range(groups):
        a[g], sa[g], _, _ = random_problem(m_max, 8, k, rng)
    b, sb = expert_weights(groups, n, k, rng)
    return a, sa, b, sb


def check_masked(d, a, sa, b, sb, masked_m) -> None:
    """Rows below the (clamped) count of their group written and right; every other row untouched (NaN)."""
    m_max = a.shape[1]
    for g, count in enumerate(masked_m):
        count = min(max(int(count), 0), m_max)
        assert np.isnan(d[g, count:]).all(), f"group {g}: rows at or past masked_m = {count} were written"
        if count:
            assert not np.isnan(d[g, :count]).any(), f"group {g}: rows below masked_m = {count} never written"
            diff = calc_diff(d[g, :count], reference_gemm(a[g, :count], sa[g, :count], b[g], sb[g]))
            assert diff < DIFF_LIMIT, f"group {g} ({count} rows): diff {diff:.3g}"


# ------------------------------------------------------------------------------------------- emulator
CONTIGUOUS_CONFIGS = {
    "64x64 staged, persistent raster 2": dict(block_m=64, block_n=64, stages=3, raster_group=2, epilogue="staged"),
    "64x128 TMA store, persistent": dict(block_m=64, block_n=128, stages=3, raster_group=0),
    "128x192 TMA store, one CTA per tile": dict(block_m=128, block_n=192, stages=2, persistent=False,
                                                raster_group=0),
}


@pytest.mark.parametrize("name", list(CONTIGUOUS_CONFIGS))
def test_contiguous_on_the_emulator(name, rng):
    """Random group sizes, always with an empty group, a one-row group (padded to 128), a group longer than one
    block and an all-padding block: skipped blocks untouched, the rest right per group; 3 CTAs walk the tiles."""
    from gemm.testing.emulated import run_grouped_gemm
    config = KernelConfig(gemm_type="contiguous", **CONTIGUOUS_CONFIGS[name])
    sizes = [0, 1, int(rng.integers(129, 200)), int(rng.integers(2, 128))]
    sizes = [int(s) for s in rng.permutation(sizes)]
    n, k = 200, 384
    problem = contiguous_problem(sizes, n, k, rng, padding_blocks=1)
    seed = int(rng.integers(1000))
    print(f"sizes {sizes}, m_indices blocks {problem[-1][::ALIGN].tolist()}, schedule seed {seed}")
    d = run_grouped_gemm(config, *problem, sm_count=3, seed=seed)
    check_contiguous(d, *problem, config.block_m)


def test_contiguous_index_outside_the_groups_skips_its_block(rng):
    """An index past G at a block's start (m_indices not checked on the host) reads no B out of bounds: the block
    is skipped like padding."""
    from gemm.testing.emulated import run_grouped_gemm
    config = KernelConfig(gemm_type="contiguous", block_m=128, block_n=64, stages=2, raster_group=0)
    a, sa, b, sb, m_indices = contiguous_problem([5, 128], 64, 256, rng)
    m_indices[:ALIGN] = np.where(m_indices[:ALIGN] >= 0, 7, -1)  # group 0's rows claim group 7 of 2
    d = run_grouped_gemm(config, a, sa, b, sb, m_indices, sm_count=2)
    assert np.isnan(d[:ALIGN]).all()
    check_contiguous(d, a, sa, b, sb, np.where(m_indices == 7, -1, m_indices), config.block_m)


MASKED_CONFIGS = {
    "64x64 TMA store, raster 2": dict(block_m=64, block_n=64, stages=3, raster_group=2),
    "64x64 staged": dict(block_m=64, block_n=64, stages=3, raster_group=0, epilogue="staged"),
    "128x192 TMA store": dict(block_m=128, block_n=192, stages=2, raster_group=0),
}


@pytest.mark.parametrize("name", list(MASKED_CONFIGS))
def test_masked_on_the_emulator(name, rng):
    """M_max = 130 (not a multiple of BLOCK_M: a group's last block reads the next group's A rows, never stored)
    with counts 0, 1, M_max and random ones: rows past each count untouched, the rest right."""
    from gemm.testing.emulated import run_grouped_gemm
    config = KernelConfig(gemm_type="masked", **MASKED_CONFIGS[name])
    groups, m_max, n, k = 4, 130, 200, 256
    masked_m = rng.permutation([0, 1, m_max, int(rng.integers(2, m_max))]).astype(np.int32)
    seed = int(rng.integers(1000))
    print(f"masked_m {masked_m.tolist()}, schedule seed {seed}")
    problem = masked_problem(groups, m_max, n, k, rng)
    d = run_grouped_gemm(config, *problem, masked_m, sm_count=3, seed=seed)
    check_masked(d, *problem, masked_m)


def test_masked_256_row_tiles_through_a_partial_d_buffer(rng):
    """256-row tiles stored in passes through a 128 x 64 D buffer: each pass decides TMA store or masked copy."""
    from gemm.testing.emulated import run_grouped_gemm
    config = KernelConfig(gemm_type="masked", block_m=256, block_n=128, stages=2, raster_group=0, d_buffer=(128, 64))
    masked_m = np.array([200, 0, 100], np.int32)
    problem = masked_problem(3, 256, 128, 256, rng)
    check_masked(run_grouped_gemm(config, *problem, masked_m, sm_count=2), *problem, masked_m)


def test_masked_counts_outside_0_to_m_max_are_clamped(rng):
    """Counts the host did not check: negative -> no rows, past M_max -> M_max rows (nothing outside the group)."""
    from gemm.testing.emulated import run_grouped_gemm
    config = KernelConfig(gemm_type="masked", block_m=64, block_n=64, stages=2, raster_group=0)
    masked_m = np.array([-3, 1000, 0], np.int32)
    problem = masked_problem(3, 68, 64, 256, rng)
    d = run_grouped_gemm(config, *problem, masked_m, sm_count=2)
    check_masked(d, *problem, masked_m)
    assert not np.isnan(d[1]).any()


def random_config(kind: str, rng) -> KernelConfig:
    """A random grouped config: BLOCK_M 64/128 (256 too for masked), BLOCK_N across the swizzled, unswizzled (56,
    144: whole-row D boxes) and two-scale-block (144, 192) cases, either epilogue, 2-3 stages, row-major or raster
    order."""
    while True:
        block_n = int(rng.choice([56, 64, 128, 144, 192]))
        epilogue = "staged" if block_n in (64, 128) and rng.random() < 0.4 else "tma"
        persistent = kind == "masked" or rng.random() < 0.7
        # one CTA per tile stages its BF16 tile in the idle A ring: 3 stages hold it
        stages = 3 if epilogue == "staged" and not persistent else int(rng.integers(2, 4))
        try:
            block_m = int(rng.choice([64, 128, 256] if kind == "masked" and block_n <= 128 else [64, 128]))
            return KernelConfig(gemm_type=kind, block_m=block_m, block_n=block_n,
                                stages=stages, persistent=persistent, epilogue=epilogue,
                                raster_group=int(rng.choice([0, 1, 2])) if persistent else 0)
        except ValueError:  # e.g. a staged epilogue with a BLOCK_N that is not a power of two
            continue


@pytest.mark.parametrize("repeat", range(4))
def test_random_contiguous_layouts_and_configs(repeat, rng):
    from gemm.testing.emulated import run_grouped_gemm
    config = random_config("contiguous", rng)
    groups = int(rng.integers(1, 6))
    sizes = [int(s) for s in rng.choice([0, 1, 2, 63, 64, 65, 127, 128, 129, 200], groups)]
    if not any(sizes):
        sizes[0] = 1
    n, k = int(rng.choice([136, 200, 256])), int(rng.choice([128, 384]))
    sms, seed = int(rng.integers(1, 5)), int(rng.integers(1000))
    print(f"{config.describe()}; sizes {sizes}, N={n}, K={k}, {sms} CTAs, schedule seed {seed}")
    problem = contiguous_problem(sizes, n, k, rng, padding_blocks=int(rng.integers(0, 2)))
    d = run_grouped_gemm(config, *problem, sm_count=sms, seed=seed)
    check_contiguous(d, *problem, config.block_m)


@pytest.mark.parametrize("repeat", range(4))
def test_random_masked_counts_and_configs(repeat, rng):
    from gemm.testing.emulated import run_grouped_gemm
    config = random_config("masked", rng)
    groups, m_max = int(rng.integers(1, 5)), int(rng.choice([1, 63, 64, 130, 192]))
    masked_m = rng.integers(0, m_max + 1, groups).astype(np.int32)
    masked_m[rng.random(groups) < 0.3] = 0
    n, k = int(rng.choice([136, 200, 256])), int(rng.choice([128, 384]))
    sms, seed = int(rng.integers(1, 5)), int(rng.integers(1000))
    print(f"{config.describe()}; masked_m {masked_m.tolist()} of {m_max}, N={n}, K={k}, {sms} CTAs, seed {seed}")
    problem = masked_problem(groups, m_max, n, k, rng)
    d = run_grouped_gemm(config, *problem, masked_m, sm_count=sms, seed=seed)
    check_masked(d, *problem, masked_m)


# ------------------------------------------------------------------------------------------- the walk
@pytest.mark.parametrize("raster_group", [0, 2, 16])
def test_masked_schedule_covers_every_tile_once(raster_group, rng):
    from gemm.kernel.tile_scheduler import masked_schedule
    masked_m = rng.integers(-2, 300, 6)
    masked_m[int(rng.integers(6))] = 0
    m_max, block_m, n_blocks, grid = 256, 64, 5, 7
    tiles = [t for cta in range(grid)
             for t in masked_schedule(cta, grid, masked_m, m_max, block_m, n_blocks, raster_group)]
    want = {(g, mb, nb) for g, count in enumerate(masked_m)
            for mb in range(-(-min(max(int(count), 0), m_max) // block_m)) for nb in range(n_blocks)}
    assert len(tiles) == len(want) and set(tiles) == want, masked_m.tolist()


# ------------------------------------------------------------------------------------------- configs
def test_grouped_configs_refuse_what_they_cannot_run():
    with pytest.raises(ValueError, match="multicast"):
        KernelConfig(gemm_type="contiguous", multicast=2)
    with pytest.raises(ValueError, match="multicast"):
        KernelConfig(gemm_type="masked", multicast=2)
    with pytest.raises(ValueError, match="divide the groups' alignment"):
        KernelConfig(gemm_type="contiguous", block_m=256, block_n=128)
    with pytest.raises(ValueError, match="persistent=True"):
        KernelConfig(gemm_type="masked", persistent=False)
    with pytest.raises(ValueError, match="producer='warpgroup'"):
        KernelConfig(gemm_type="contiguous", producer="inline", persistent=False, registers=None, block_n=64)
    with pytest.raises(ValueError, match="BF16"):
        KernelConfig(gemm_type="masked", out_dtype="f32")
    with pytest.raises(ValueError, match="gemm_type must be one of"):
        KernelConfig(gemm_type="k_grouped")


def test_grouped_kernels_take_the_layout_and_g_and_dense_ones_do_not():
    from gemm.kernel import generate
    from gemm.kernel.generator import kernel_params
    dense = KernelConfig()
    assert ("u64", "grouped_layout") not in kernel_params(dense)
    assert "grouped_layout" not in generate(dense, 256, 256)
    for kind in ("contiguous", "masked"):
        config = KernelConfig(gemm_type=kind)
        assert kernel_params(config)[-2:] == [("u64", "grouped_layout"), ("u32", "groups")]
        assert config.describe().startswith(f"m-grouped {kind}")


@pytest.mark.parametrize("kind, m, n, k, groups", [
    ("contiguous", 32768, 4096, 7168, 4), ("contiguous", 4096, 7168, 2048, 8), ("contiguous", 256, 200, 384, 3),
    ("masked", 1024, 4096, 7168, 1), ("masked", 64, 7168, 2048, 8), ("masked", 1, 4096, 7168, 4),
    ("masked", 100, 200, 384, 3)])
def test_grouped_heuristics(kind, m, n, k, groups):
    from gemm.heuristics import GROUPED_BLOCK_M, SWAP_AB_MAX_M, choose_grouped_config
    from gemm.kernel.config import SWAP_AB_BLOCK_M, SharedPlan
    config = choose_grouped_config(kind, m, n, k, groups)
    print(config.describe())
    swapped = kind == "masked" and m <= SWAP_AB_MAX_M and n % 8 == 0  # decode: tests/test_masked_swap_ab.py
    assert config.swap_ab == swapped
    assert config.gemm_type == kind and config.multicast == 1
    assert config.block_m in (SWAP_AB_BLOCK_M if swapped else GROUPED_BLOCK_M[kind])
    assert config.persistent or kind == "contiguous"
    assert config.stages >= 3
    SharedPlan(config, n, k).check()
    assert (config.epilogue == "tma") == (n % 8 == 0)


# ------------------------------------------------------------------------------------------- argument checks
def contiguous_args(rng, sizes=(3, 130), n=64, k=256):
    a, sa, b, sb, m_indices = contiguous_problem(list(sizes), n, k, rng)
    from gemm.fp8 import sa_to_mn_major
    return dict(a=a, sa=sa_to_mn_major(sa), b=b, sb=sb, out=np.zeros((len(m_indices), n), np.uint16),
                m_indices=m_indices)


def masked_args(rng, groups=3, m_max=64, n=64, k=256):
    from gemm.grouped import masked_sa_to_mn_major
    a, sa, b, sb = masked_problem(groups, m_max, n, k, rng)
    return dict(a=a, sa=masked_sa_to_mn_major(sa), b=b, sb=sb, out=np.zeros((groups, m_max, n), np.uint16),
                masked_m=np.array([m_max, 0, 5][:groups], np.int32))


def check_contiguous_call(args, **kw):
    from gemm.grouped import check_contiguous_args
    fake = {name: on_fake_device(value) for name, value in args.items()}
    return check_contiguous_args(fake["a"], fake["sa"], fake["b"], fake["sb"], fake["out"], fake["m_indices"], **kw)


def check_masked_call(args, expected_m=32, **kw):
    from gemm.grouped import check_masked_args
    fake = {name: on_fake_device(value) for name, value in args.items()}
    return check_masked_args(fake["a"], fake["sa"], fake["b"], fake["sb"], fake["out"], fake["masked_m"], expected_m,
                             **kw)


def test_valid_arguments_pass(rng):
    args = check_contiguous_call(contiguous_args(rng))
    assert (args.m, args.n, args.k, args.groups, args.sa_stride) == (384, 64, 256, 2, 384)
    args = check_masked_call(masked_args(rng, m_max=66))
    assert (args.m, args.n, args.k, args.groups, args.sa_stride) == (66, 64, 256, 3, 68)


@pytest.mark.parametrize("name, bad, error, match", [
    ("m_indices", lambda x: x.astype(np.int64), TypeError, r"m_indices must be int32 row group indices .*int32"),
    ("m_indices", lambda x: x[:-1], ValueError, r"m_indices must have shape \(384,\)"),
    ("b", lambda x: x[0], ValueError, r"b must be 3-D \(G, N, K\)"),
    ("sb", lambda x: x[:, :, :1], ValueError, r"sb must have shape \(2, 1, 2\) \(\(G, ceil\(N/128\), K/128\)"),
    ("a", lambda x: x[:200], ValueError, r"a has 200 rows.*get_m_alignment_for_contiguous_layout\(\) = 128"),
    ("out", lambda x: x.view(np.int16), TypeError, r"out must be BF16 output"),
    ("out", lambda x: x[:, :32], ValueError, r"out must have shape \(384, 64\)"),
    ("sa", lambda x: np.ascontiguousarray(x), ValueError, r"sa must be stored M-major.*get_mn_major_tma_aligned"),
    ("a", lambda x: np.asfortranarray(x), ValueError, r"a must be contiguous row-major"),
])
def test_contiguous_argument_errors(name, bad, error, match, rng):
    args = contiguous_args(rng)
    args[name] = bad(args[name])
    with pytest.raises(error, match=match):
        check_contiguous_call(args)


def test_contiguous_m_indices_in_host_memory_is_named(rng):
    from gemm.grouped import check_contiguous_args
    args = contiguous_args(rng)
    fake = {name: on_fake_device(value) for name, value in args.items() if name != "m_indices"}
    with pytest.raises(ValueError, match=r"m_indices is in host memory.*m_indices.cuda\(\)"):
        check_contiguous_args(**fake, m_indices=args["m_indices"])


def test_contiguous_index_values_are_checked_when_readable(rng):
    from gemm.grouped import GroupedLayoutError, check_m_indices
    args = contiguous_args(rng)
    args["m_indices"][0] = 2  # G = 2
    with pytest.raises(GroupedLayoutError, match=r"m_indices\[0\] = 2: group indices must be in 0..1"):
        check_contiguous_call(args)
    check_contiguous_call(args, check_indices=False)  # asked not to look
    args["m_indices"][0] = -2
    with pytest.raises(GroupedLayoutError, match=r"m_indices\[0\] = -2"):
        check_contiguous_call(args)
    # group 1 starting in the middle of group 0's padding: not aligned
    indices = np.array([0] * 3 + [1] * 125 + [1] * 2 + [-1] * 126, np.int32)
    with pytest.raises(GroupedLayoutError, match=r"m_indices\[3\] = 1 .* multiple of get_m_alignment_for_contig"):
        check_m_indices(indices, 2)
    # a group row after padding inside one block
    indices = np.array([0] * 3 + [-1] * 5 + [0] + [-1] * 119, np.int32)
    with pytest.raises(GroupedLayoutError, match=r"m_indices\[8\] = 0"):
        check_m_indices(indices, 1)
    check_m_indices(contiguous_indices([0, 1, 128, 300], rng, padding_blocks=2), 4)


@pytest.mark.parametrize("name, bad, error, match", [
    ("masked_m", lambda x: x.astype(np.uint32), TypeError, r"masked_m must be int32 row counts per group"),
    ("masked_m", lambda x: x[:2], ValueError, r"masked_m must have shape \(3,\)"),
    ("a", lambda x: x[:2], ValueError, r"a must be \(G=3, M_max, K=256\)"),
    ("out", lambda x: x[:, :32], ValueError, r"out must have shape \(3, 64, 64\) \(\(G, M_max, N\) BF16\)"),
    ("sa", lambda x: np.ascontiguousarray(x), ValueError, r"sa must be stored M-major per group.*masked_sa_to_mn"),
    ("sa", lambda x: x[:, :, :1], ValueError, r"sa must have shape \(3, 64, 2\)"),
    ("sb", lambda x: x[:2], ValueError, r"sb must have shape \(3, 1, 2\)"),
    ("b", lambda x: x.view(np.int8), TypeError, r"b must be e4m3 FP8"),
])
def test_masked_argument_errors(name, bad, error, match, rng):
    args = masked_args(rng)
    args[name] = bad(args[name])
    with pytest.raises(error, match=match):
        check_masked_call(args)


def test_masked_counts_and_expected_m_are_checked(rng):
    from gemm.grouped import GroupedLayoutError
    args = masked_args(rng)
    args["masked_m"][2] = 65
    with pytest.raises(GroupedLayoutError, match=r"masked_m\[2\] = 65: each count must be in 0..M_max = 64"):
        check_masked_call(args)
    check_masked_call(args, check_masked_m=False)
    args["masked_m"][2] = 0
    for expected_m in (0, -1, 2.5, None):
        with pytest.raises(ValueError, match="expected_m must be a positive int"):
            check_masked_call(args, expected_m=expected_m)


def test_masked_sa_helper_and_deepgemm_names(rng):
    import gemm
    sa = rng.random((3, 6, 2), dtype=np.float32)
    got = gemm.masked_sa_to_mn_major(sa)
    np.testing.assert_array_equal(got, sa)
    assert tuple(s // 4 for s in got.strides) == (2 * 8, 1, 8)
    np.testing.assert_array_equal(gemm.get_col_major_tma_aligned_tensor(sa), sa)
    assert gemm.get_m_alignment_for_contiguous_layout() == 128
    assert gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous and gemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked
    from gemm import deepgemm_api
    for name in ("m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_masked",
                 "get_m_alignment_for_contiguous_layout"):
        assert name in deepgemm_api.__all__


# ------------------------------------------------------------------------------------------- GPU
def _torch():
    return pytest.importorskip("torch")


def _cuda(x, dtype=None):
    torch = _torch()
    x = np.ascontiguousarray(x)
    if x.dtype == E4M3:
        return torch.from_numpy(x.view(np.uint8)).cuda().view(torch.float8_e4m3fn)
    return torch.from_numpy(x).cuda()


def _nan_out(shape):
    torch = _torch()
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")


def _host(out):
    return out.float().cpu().numpy()


def _gpu_contiguous(sizes, n, k, rng, padding_blocks=1, alias=False):
    import gemm
    torch = _torch()
    a, sa, b, sb, m_indices = contiguous_problem(sizes, n, k, rng, padding_blocks)
    out = _nan_out((len(m_indices), n))
    sa_dev = gemm.get_mn_major_tma_aligned_tensor(_cuda(sa))
    call = gemm.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous if alias else gemm.m_grouped_fp8_gemm_nt_contiguous
    call((_cuda(a), sa_dev), (_cuda(b), _cuda(sb)), out, _cuda(m_indices))
    torch.cuda.synchronize()
    from gemm.heuristics import choose_grouped_config
    block_m = choose_grouped_config("contiguous", len(m_indices), n, k, len(sizes)).block_m
    check_contiguous(_host(out), a, sa, b, sb, m_indices, block_m)


@pytest.mark.gpu
@pytest.mark.parametrize("groups, n, k", [(8, 4096, 7168), (4, 7168, 2048), (3, 200, 384), (5, 2112, 512)])
def test_contiguous_on_the_gpu(groups, n, k, rng):
    """About 4096 rows in all at the large shapes, random sizes with an empty group and a one-row group."""
    sizes = [int(s) for s in rng.integers(2, 1024 if n >= 2048 else 300, groups)]
    sizes[0], sizes[-1] = 0, 1
    sizes = [int(s) for s in rng.permutation(sizes)]
    print(f"sizes {sizes}")
    _gpu_contiguous(sizes, n, k, rng, alias=groups == 4)


def _gpu_masked(groups, m_max, n, k, masked_m, expected_m, rng, alias=False):
    import gemm
    torch = _torch()
    a, sa, b, sb = masked_problem(groups, m_max, n, k, rng)
    out = _nan_out((groups, m_max, n))
    call = gemm.m_grouped_gemm_fp8_fp8_bf16_nt_masked if alias else gemm.m_grouped_fp8_gemm_nt_masked
    call((_cuda(a), gemm.masked_sa_to_mn_major(_cuda(sa))), (_cuda(b), _cuda(sb)), out,
         _cuda(np.asarray(masked_m, np.int32)), expected_m)
    torch.cuda.synchronize()
    check_masked(_host(out), a, sa, b, sb, masked_m)


@pytest.mark.gpu
@pytest.mark.parametrize("groups, m_max, n, k, expected_m", [
    (8, 256, 4096, 7168, 64), (8, 256, 7168, 2048, 128), (4, 256, 4096, 7168, 256), (6, 130, 200, 384, 50)])
def test_masked_on_the_gpu(groups, m_max, n, k, expected_m, rng):
    masked_m = rng.integers(1, m_max + 1, groups)
    masked_m[0], masked_m[-1] = 0, 1
    masked_m = rng.permutation(masked_m)
    print(f"masked_m {masked_m.tolist()}")
    _gpu_masked(groups, m_max, n, k, masked_m, expected_m, rng, alias=groups == 4)


@pytest.mark.gpu
def test_masked_row_major_torch_scales_are_converted(rng, monkeypatch):
    import gemm
    import gemm.grouped
    torch = _torch()
    monkeypatch.setattr(gemm.dispatch, "_warned_row_major_sa", set())
    groups, m_max, n, k = 3, 64, 256, 512
    a, sa, b, sb = masked_problem(groups, m_max, n, k, rng)
    masked_m = np.array([64, 0, 33], np.int32)
    out = _nan_out((groups, m_max, n))
    with pytest.warns(gemm.ScaleLayoutWarning):
        gemm.m_grouped_fp8_gemm_nt_masked((_cuda(a), _cuda(sa)), (_cuda(b), _cuda(sb)), out, _cuda(masked_m), 32)
    torch.cuda.synchronize()
    check_masked(_host(out), a, sa, b, sb, masked_m)


@pytest.mark.gpu
def test_masked_in_a_cuda_graph_replays_with_new_counts(rng):
    """Captured once; each replay reads masked_m then: new counts (zeros, one row, all rows) into a NaN-poisoned
    out give the rows of that replay's counts and leave the others untouched."""
    import gemm
    torch = _torch()
    groups, m_max, n, k = 8, 256, 4096, 7168
    a, sa, b, sb = masked_problem(groups, m_max, n, k, rng)
    ta, tsa, tb, tsb = _cuda(a), gemm.masked_sa_to_mn_major(_cuda(sa)), _cuda(b), _cuda(sb)
    counts = torch.zeros(groups, dtype=torch.int32, device="cuda")
    out = _nan_out((groups, m_max, n))

    def call():
        gemm.m_grouped_fp8_gemm_nt_masked((ta, tsa), (tb, tsb), out, counts, 128)
    call()  # compile and load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for replay in range(4):
        masked_m = rng.integers(0, m_max + 1, groups).astype(np.int32)
        masked_m[replay % groups] = [0, 1, m_max, 200][replay]
        print(f"replay {replay}: masked_m {masked_m.tolist()}")
        counts.copy_(torch.from_numpy(masked_m))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_masked(_host(out), a, sa, b, sb, masked_m)


@pytest.mark.gpu
def test_contiguous_in_a_cuda_graph(rng):
    import gemm
    torch = _torch()
    a, sa, b, sb, m_indices = contiguous_problem([200, 0, 1, 500], 1024, 1024, rng, padding_blocks=1)
    ta, tsa = _cuda(a), gemm.get_mn_major_tma_aligned_tensor(_cuda(sa))
    tb, tsb, ti = _cuda(b), _cuda(sb), _cuda(m_indices)
    out = _nan_out((len(m_indices), 1024))

    def call():
        gemm.m_grouped_fp8_gemm_nt_contiguous((ta, tsa), (tb, tsb), out, ti)
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    from gemm.heuristics import choose_grouped_config
    block_m = choose_grouped_config("contiguous", len(m_indices), 1024, 1024, 4).block_m
    check_contiguous(_host(out), a, sa, b, sb, m_indices, block_m)
