"""The production generator (gemm.kernel) and stages 07-08: assembly and SASS, heuristics, schedule and layout
maths, import direction (CPU); bit-identical to stage 06, ragged shapes, NaN-poisoned outputs, M at run time (GPU)."""
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import lessons
from gemm.fp8 import calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from gemm.heuristics import H100, DeviceFacts, choose_blocks, choose_config, raster_group
from gemm.kernel import KERNEL, KernelConfig, SharedPlan, generate
from gemm.kernel.epilogue import d_tile_offset
from gemm.kernel.config import k_share
from gemm.kernel.tile_scheduler import schedule, tile_coords
from lessons.generated import stage06_config

sys.path.insert(0, str(Path(__file__).parent))
from tc_checks import (RAGGED_SHAPES, assert_clean_resources, assert_exact, check_against_reference,  # noqa: E402
                       run_on_gpu, small_integer_problem)

ROOT = Path(__file__).resolve().parent.parent
STAGE07, STAGE08 = lessons.stage(7), lessons.stage(8)


def compile_ptx_of(config, n, k):
    from ptx.compile import compile_ptx
    return compile_ptx(generate(config, n, k))


def assemble(config, n, k):
    from ptx.sass import disassemble, opcode_counts
    cubin = compile_ptx_of(config, n, k)
    return cubin, opcode_counts(disassemble(cubin))


# ------------------------------------------------------------------------------ CPU: assembly and SASS
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 7168), (64, 2112, 7168), (100, 2111, 256), (4096, 7168, 16384)])
@pytest.mark.parametrize("number", [7, 8])
def test_stages_07_08_assemble_clean_with_their_instructions(number, m, n, k):
    config = lessons.stage(number).config(m, n, k)
    cubin, ops = assemble(config, n, k)
    assert_clean_resources(cubin, KERNEL)
    assert not [w for w in cubin.warnings if "setmaxnreg" in w or "C7508" in w or "C7504" in w], cubin.warnings
    assert "setmaxnreg" not in cubin.info_log  # no "setmaxnreg ignored" note either
    assert ops["USETMAXREG"] == 2  # one dealloc (producer), one alloc (math)
    assert ops["QGMMA"] >= 4 and ops["UTMALDG"] >= 3
    if config.epilogue == "tma":
        assert ops["UTMASTG"] >= 1 and ops["STSM"] >= 1
    assert (config.epilogue == "tma") == (number == 8 and n % 8 == 0)


@pytest.mark.parametrize("m, n, k", [(64, 2112, 7168), (128, 2112, 7168), (4096, 7168, 16384), (4096, 4096, 7168),
                                     (128, 32768, 512), (1, 24576, 1536)])
def test_production_configs_assemble_clean(m, n, k):
    config = choose_config(m, n, k, H100)
    cubin, ops = assemble(config, n, k)
    assert_clean_resources(cubin, KERNEL)
    assert ops["USETMAXREG"] == 2 and ops["UTMASTG"] >= 1


@pytest.mark.parametrize("m, n, k", [(4096, 4096, 7168), (4096, 24576, 1536), (8192, 8192, 8192)])
def test_b_multicast_assembles_clean_with_one_multicast_load(m, n, k):
    """Production's config with B multicast pairs: no spills, and the producer's multicast copy is B's (one
    multicast UTMALDG in the SASS: A and sa are the CTA's own)."""
    config = choose_config(m, n, k, H100).replace(multicast=2, multicast_operand="b")
    cubin, ops = assemble(config, n, k)
    assert_clean_resources(cubin, KERNEL)
    ptx = generate(config, n, k)
    multicasts = [line for line in ptx.splitlines() if ".multicast::cluster" in line]
    assert len(multicasts) == 1 and "tmap_b" in multicasts[0], multicasts
    assert ops["UTMALDG"] >= 3


def test_stage06_config_assembles_without_setmaxnreg_through_nvjitlink():
    from ptx.compile import choose_assembler
    ptx = generate(stage06_config(4096, 4096, 7168), 4096, 7168)
    assert "setmaxnreg" not in ptx and choose_assembler(ptx) == "nvjitlink"
    cubin, ops = assemble(stage06_config(4096, 4096, 7168), 4096, 7168)
    assert_clean_resources(cubin, KERNEL)
    assert ops["USETMAXREG"] == 0 and ops["UTMASTG"] == 0


def test_one_kernel_serves_every_m():
    """M is a parameter: the PTX depends on (config, N, K) only, and names M's parameter."""
    config = choose_config(4096, 2112, 7168, H100)
    ptx = generate(config, 2112, 7168)
    assert f"{KERNEL}_param_m" in ptx and "4096" not in ptx.split(".entry")[1].split("{")[0]
    assert STAGE08.config(2000, 2112, 7168) == STAGE08.config(2050, 2112, 7168)
    assert STAGE08.generate(2000, 2112, 7168) == STAGE08.generate(2050, 2112, 7168)


# ------------------------------------------------------------------------------ CPU: configs and heuristics
@pytest.mark.parametrize("bad, words", [
    (dict(block_m=96), "block_m"), (dict(block_n=12), "multiple of 8"), (dict(block_n=200), "at most two"),
    (dict(block_n=96, producer="inline", persistent=False, registers=None), "divide"),
    (dict(producer="inline"), "inline producer"), (dict(multicast=4), "1 or 2"),
    (dict(multicast=2, persistent=False), "persistent"),
    (dict(registers=(40, 256)), "65536"), (dict(epilogue="direct"), "epilogue"),
])
def test_bad_configs_are_named(bad, words):
    with pytest.raises(ValueError, match=words):
        KernelConfig(**bad)


@pytest.mark.parametrize("block_n, variants", [(128, (16,)), (64, (8,)), (192, (8, 16)), (96, (4, 8, 12)),
                                               (160, (4, 8, 12, 16)), (144, (2, 4, 6, 8, 10, 12, 14, 16))])
def test_the_b_scale_switch_point_takes_few_values(block_n, variants):
    config = KernelConfig(block_m=64, block_n=block_n, stages=3)
    assert config.former_groups_variants == variants
    # every tile's first-block share is one of them
    for n0 in range(0, 40 * block_n, block_n):
        assert min(block_n, 128 - n0 % 128) // 8 in variants


@pytest.mark.parametrize("block_m, block_n", [(128, 192), (64, 160), (128, 96), (64, 144)])
def test_wide_and_unaligned_block_n_assemble_clean(block_m, block_n):
    config = KernelConfig(block_m=block_m, block_n=block_n, stages=3)
    cubin, ops = assemble(config, 4096, 7168)
    assert_clean_resources(cubin, KERNEL)
    assert ops["QGMMA"] >= 4 * len(config.former_groups_variants)  # one K loop per switch point


def test_tma_epilogue_needs_16_byte_rows():
    with pytest.raises(ValueError, match="N % 8"):
        generate(KernelConfig(), 2111, 256)


def test_plans_fit_and_align():
    for shape in [(4096, 7168, 16384), (64, 2112, 7168), (128, 24576, 1536)]:
        config = choose_config(*shape, H100)
        plan = SharedPlan(config, shape[1], shape[2])
        plan.check()
        assert plan.b_region % 1024 == 0 and plan.d_region % 1024 == 0 and plan.full_region % 8 == 0
        assert plan.shared_bytes <= H100.shared_limit and config.stages >= 3


def test_heuristics_weigh_waves_by_their_cost():
    assert choose_blocks(4096, 4096, 132) == (256, 128)  # DeepGEMM's pick
    assert choose_blocks(64, 2112, 132) == (64, 16)  # 132 tiles: every SM busy
    # same 128 CTAs, but two warpgroups with half-wide chains: 13% faster than DeepGEMM's 64 x 64 (sweep_m128.json)
    assert choose_blocks(128, 4096, 132) == (128, 32)
    assert choose_blocks(128, 2112, 132) == (64, 32)  # ... while 128 x 16 loses 3% (its extra A rows)
    assert choose_blocks(64, 7168, 132) == (64, 56)  # 128 tiles in one wave: 7168 = 128 x 56
    assert choose_blocks(4096, 4096, 78) == (256, 128)  # another SM count, same blocks
    assert choose_blocks(4096, 2112, 132) == (128, 192)  # 3 even waves; 256 x 128 would leave the third 6% full
    assert choose_blocks(4096, 32768, 132, k=512) == (256, 128)  # small K: fewer, larger tiles
    assert choose_blocks(8192, 8192, 132, k=8192) == (128, 192)
    small = DeviceFacts(sm_count=66, shared_limit=H100.shared_limit)
    assert choose_blocks(64, 2112, small.sm_count) == (64, 32)  # the SM count is read, not assumed


def test_raster_group_minimises_a_wave_footprint():
    assert raster_group(128, 128, 132) in (8, 16)
    assert raster_group(64, 16, 132) == 16  # narrow tiles: wide groups


# ------------------------------------------------------------------------------ CPU: schedule and D layout
@pytest.mark.parametrize("m_blocks, n_blocks, group", [(32, 17, 16), (3, 7, 2), (5, 33, 8), (1, 132, 16), (7, 5, 0)])
def test_every_tile_is_scheduled_once(m_blocks, n_blocks, group):
    grid = 13
    seen = [coord for cta in range(grid) for coord in schedule(cta, grid, m_blocks, n_blocks, group)]
    assert sorted(seen) == [(mb, nb) for mb in range(m_blocks) for nb in range(n_blocks)]


@pytest.mark.parametrize("m_blocks, n_blocks, group", [(32, 17, 16), (3, 7, 2), (33, 5, 8), (132, 1, 16), (7, 5, 0)])
def test_the_walk_along_m_schedules_every_tile_once_and_pairs_share_columns(m_blocks, n_blocks, group):
    """multicast_operand='b': the transposed walk covers every tile once, and tiles 2i, 2i + 1 share their n block
    wherever they share a raster group of an even width (the pairs that multicast B)."""
    grid = 14
    seen = [coord for cta in range(grid) for coord in schedule(cta, grid, m_blocks, n_blocks, group, along_m=True)]
    assert sorted(seen) == [(mb, nb) for mb in range(m_blocks) for nb in range(n_blocks)]
    width = group or m_blocks
    for pair in range(0, m_blocks * n_blocks - 1, 2):
        first, second = (tile_coords(t, m_blocks, n_blocks, group, along_m=True) for t in (pair, pair + 1))
        if width % 2 == 0 and (m_blocks % width == 0 or first[0] < m_blocks - m_blocks % width):
            assert first[1] == second[1] and second[0] == first[0] + 1, (pair, first, second)


@pytest.mark.parametrize("operand, m, n", [("b", 192, 64), ("a", 64, 192), ("b", 320, 192), ("a", 192, 320)])
def test_a_lone_last_tile_after_a_group_that_fills_its_side_on_the_emulator(operand, m, n, rng):
    """An odd tile count whose groups (odd G) divide the walked side: the pair flags of the last, lone tile must not
    look at tile `num_tiles` (its group would be zero blocks wide: a division by zero); exact, every element."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(block_m=64, block_n=64, stages=2, multicast=2, multicast_operand=operand, raster_group=1)
    problem = small_integer_problem(m, n, 256, rng)
    assert_exact(run_gemm(config, *problem, sm_count=2, seed=int(rng.integers(1000))), problem)


def test_b_multicast_misuse_is_named():
    with pytest.raises(ValueError, match="multicast_operand must be 'a'"):
        KernelConfig(multicast=2, multicast_operand="c")
    with pytest.raises(ValueError, match="needs multicast=2 and raster_shifts=False"):
        KernelConfig(multicast_operand="b")
    with pytest.raises(ValueError, match="needs multicast=2 and raster_shifts=False"):
        KernelConfig(multicast=2, multicast_operand="b", raster_shifts=True)
    assert "B multicast to 2 CTAs" in KernelConfig(multicast=2, multicast_operand="b").describe()
    with pytest.raises(ValueError, match="raster_group must be in 0..65535"):
        KernelConfig(multicast=2, multicast_operand="b", raster_group=2**31)
    from gemm.kernel.seams import Seams
    seams = Seams(tile_coords=lambda t, m_blocks, n_blocks, group: divmod(t, n_blocks), rows=256)
    with pytest.raises(ValueError, match="tile_coords seam gives a walk of its own"):
        generate(KernelConfig(block_m=128, multicast=2, multicast_operand="b"), 256, 256, seams)


def test_grouped_order_keeps_a_wave_within_a_few_n_blocks():
    coords = [tile_coords(t, 32, 56, 16) for t in range(132)]
    assert len({nb for _, nb in coords}) == 16 and len({mb for mb, _ in coords}) == 9


@pytest.mark.parametrize("block_m, block_n", [(128, 128), (64, 64), (64, 16), (128, 32)])
def test_d_tile_layout_is_a_permutation_and_stmatrix_rows_hit_distinct_banks(block_m, block_n):
    offsets = {d_tile_offset(r, c, block_m, block_n) for r in range(block_m) for c in range(0, block_n, 8)}
    assert len(offsets) == block_m * block_n // 8 and max(offsets) < 2 * block_m * block_n
    if block_n % 64 == 0:  # the 8 rows one stmatrix matrix writes: 8 different 16-byte bank groups
        for col in range(0, block_n, 8):
            banks = {d_tile_offset(r, col, block_m, block_n) % 128 // 16 for r in range(8)}
            assert len(banks) == 8


# ------------------------------------------------------------------------------ CPU: the PTX, emulated
EMULATED_CONFIGS = {
    "06-generated": lambda m, n, k: stage06_config(m, n, k),
    "07": lambda m, n, k: STAGE07.config(m, n, k).replace(stages=3),  # 3 stages: the ring wraps many times
    "08": lambda m, n, k: STAGE08.config(m, n, k).replace(stages=3),
    "08-staged": lambda m, n, k: STAGE08.config(m, n, k).replace(stages=3, epilogue="staged"),
    "256x128": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=256, block_n=128, stages=2),
    "256x128, D in four passes": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=256, block_n=128, stages=2,
                                                                                d_buffer=(128, 64)),
    "256x128, D in two passes": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=256, block_n=128, stages=2,
                                                                               d_buffer=(128, 128)),
    "128x192 (two B scales)": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=128, block_n=192, stages=2),
    "64x160 (four switch points)": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=64, block_n=160,
                                                                                 stages=2),
    "64x16": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=64, block_n=16, stages=4),
    "09 (A multicast)": lambda m, n, k: lessons.stage(9).config(m, n, k).replace(stages=3),
    "09-128x192": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=128, block_n=192, stages=2, multicast=2),
    "B multicast": lambda m, n, k: lessons.stage(9).config(m, n, k).replace(stages=3, multicast_operand="b"),
    "B multicast 256x128, groups of 2 m-blocks": lambda m, n, k: STAGE08.config(m, n, k).replace(
        block_m=256, block_n=128, stages=2, multicast=2, multicast_operand="b", raster_group=2),
    "B multicast, column-major": lambda m, n, k: STAGE08.config(m, n, k).replace(
        block_m=64, block_n=64, stages=2, multicast=2, multicast_operand="b", raster_group=0),
}


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
@pytest.mark.parametrize("operand", ["a", "b"])
@pytest.mark.parametrize("m, n, k, sms", [(300, 416, 640, 4), (200, 200, 384, 2), (520, 136, 384, 4)])
def test_multicast_pairs_on_the_emulator_under_many_schedules(m, n, k, sms, seed, operand, rng):
    """2-CTA clusters sharing A or B: odd tile counts (a lone CTA), pairs split by a row or column edge, the ring
    wrapping; round-robin and random schedules (the random ones expose a missing drain or a one-sided release)."""
    from gemm.testing.emulated import run_gemm
    config = lessons.stage(9).config(m, n, k).replace(stages=2, multicast_operand=operand)
    assert config.multicast == 2
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=sms, seed=seed), problem)


def test_b_multicast_pairs_issue_one_b_load_per_shared_step_on_the_emulator(rng):
    """multicast_operand='b' on the emulator (4 CTAs, 2 clusters, 3 m-blocks by 2 n-blocks, groups of 2 m-blocks:
    cluster 0's first pair shares a column, its second is split by the last, one-wide group): rank 0 multicasts B, once
    per K block of each step where the pair's tiles share a column (by the Python walk), rank 1 never multicasts,
    and A is never multicast."""
    from gemm.kernel.launch import grid as launch_grid
    from gemm.testing.emulated import run_gemm
    from ptx.emulate.warpgroup import Warpgroup
    m, n, k = 300, 256, 384
    config = STAGE08.config(m, n, k).replace(block_m=128, block_n=128, stages=2, multicast=2, multicast_operand="b",
                                             raster_group=2)
    ctas, m_blocks, n_blocks, kb = launch_grid(config, m, n, 4), -(-m // 128), -(-n // 128), k // 128
    assert (ctas, m_blocks, n_blocks) == (4, 3, 2)
    loads = {}  # (cta, multicast, tensor map parameter) -> TMA loads issued
    original = Warpgroup.bulk

    def recording(self, parts, ops, mask, *args, **kwargs):
        if mask.any() and parts[3:5] == ["tensor", "2d"] and parts[5].startswith("shared"):
            key = (self.cta.ctaid[0], "multicast::cluster" in parts, str(ops[1]))
            loads[key] = loads.get(key, 0) + int(mask.sum())
        return original(self, parts, ops, mask, *args, **kwargs)

    Warpgroup.bulk = recording
    try:
        problem = small_integer_problem(m, n, k, rng)
        assert_exact(run_gemm(config, *problem, sm_count=4), problem)
    finally:
        Warpgroup.bulk = original
    tiles = m_blocks * n_blocks
    for cluster in range(ctas // 2):
        shared = sum(1 for t in range(2 * cluster, tiles - 1, ctas)
                     if tile_coords(t, m_blocks, n_blocks, 2, True)[1] == tile_coords(t + 1, m_blocks, n_blocks, 2, True)[1])
        multicast = {key[2]: count for key, count in loads.items() if key[0] == 2 * cluster and key[1]}
        assert shared and list(multicast) == [next(op for op in multicast if "b" in op.split(",")[0])]
        assert sum(multicast.values()) == kb * shared, (multicast, shared)
        assert not any(key[1] for key in loads if key[0] == 2 * cluster + 1)


def emulate_stage06(a, sa, b, sb):
    """lessons/06 on the emulator, exactly as tests/test_stage06.py runs it."""
    from test_stage06 import emulate
    return emulate(a, sa, b, sb)


@pytest.mark.parametrize("m, n, k", [(130, 256, 640), (70, 200, 384)])
def test_generator_as_stage06_is_bit_identical_to_stage06_on_the_emulator(m, n, k, rng):
    from gemm.testing.emulated import run_gemm
    problem = random_problem(m, n, k, rng)
    want = emulate_stage06(*problem)
    got = run_gemm(stage06_config(m, n, k), *problem)
    assert np.array_equal(got, want, equal_nan=False), np.argwhere(got != want)[:5].tolist()


@pytest.mark.parametrize("name", list(EMULATED_CONFIGS))
@pytest.mark.parametrize("m, n, k", [(300, 416, 640), (130, 136, 384)])
def test_configs_on_the_emulator_wrap_the_ring_and_walk_several_tiles(name, m, n, k, rng):
    """Ragged M and N, K blocks > stages (the ring wraps, parities flip), 3 CTAs for 6-30 tiles (persistent
    walks), the producer preempted after every arrive: exact against the BF16-rounded reference."""
    from gemm.testing.emulated import run_gemm
    config = EMULATED_CONFIGS[name](m, n, k)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=int(rng.integers(1000))), problem)


SPLIT_K_CASES = [  # (M, N, K, config fields): K blocks that split evenly and not, ragged M, N and K
    (20, 136, 640, dict(block_m=64, block_n=64, stages=2, split_k=2)),
    (70, 200, 1024, dict(block_m=128, block_n=64, stages=3, split_k=4)),
    (5, 72, 384, dict(block_m=64, block_n=16, stages=2, split_k=2, epilogue="staged")),
    (1, 200, 640, dict(block_m=64, block_n=56, stages=2, split_k=4)),  # tiles across a B-scale edge
    (33, 304, 1152, dict(block_m=64, block_n=128, stages=2, split_k=8)),
    (130, 136, 512, dict(block_m=256, block_n=64, stages=2, split_k=2)),  # two waves per warpgroup
    (64, 136, 272, dict(block_m=64, block_n=32, stages=5, split_k=2, pdl=True)),  # K = 272: 3 blocks, 2 CTAs
    (9, 200, 1024, dict(block_m=64, block_n=64, stages=2, split_k=3)),  # clusters of three: 8 K blocks as 2, 3, 3
    (17, 136, 896, dict(block_m=64, block_n=64, stages=2, split_k=6)),  # 7 K blocks over six CTAs
]


@pytest.mark.parametrize("seed", [None, 1, 2])
@pytest.mark.parametrize("m, n, k, fields", SPLIT_K_CASES)
def test_split_k_clusters_on_the_emulator(m, n, k, fields, seed, rng):
    """Split-K: each CTA of a cluster takes its share of the K blocks, ranks 1.. hand their totals to rank 0
    through distributed shared memory; exact against the reference, every element written, under round-robin and
    random schedules (a rank that read its peer after the peer exited, or a missing barrier phase, fails here)."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(persistent=False, raster_group=0, **fields)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=seed), problem)


@pytest.mark.parametrize("seed", [None, 1, 2])
@pytest.mark.parametrize("m, n, k, fields", [case for case in SPLIT_K_CASES if case[3]["split_k"] < 8]
                         + [(33, 304, 1152, dict(block_m=64, block_n=16, stages=2, split_k=8))])  # 7 peers' inboxes
def test_split_k_partials_pushed_on_the_emulator(m, n, k, fields, seed, rng):
    """split_k_push: ranks 1.. send their totals into rank 0's inbox with st.async and exit; rank 0 waits on its
    inbox barrier. Exact, every element written, under round-robin and random schedules (a peer that sends before
    rank 0 initialised its barrier, or a rank 0 that reads before the bytes landed, fails here)."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(**fields, persistent=False, raster_group=0, split_k_push=True)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=4, seed=seed), problem)


@pytest.mark.parametrize("shape, small", [((16, 2112, 7168), (16, 200, 1536)), ((64, 2112, 7168), (64, 120, 1024)),
                                          ((5, 2112, 7168), (5, 72, 896)), ((128, 2112, 7168), (100, 72, 1024))])
def test_production_decode_configs_push_their_partials_on_the_emulator(shape, small, rng):
    """Production's decode configs (swap AB split over three CTAs; pairs of 64- and 128-row tiles with two K blocks
    in flight) push their partials (split_k_push), on small ragged shapes: exact under a random schedule; and the SASS
    has the st.async messages (STAS) and one cluster barrier instead of the exchange's eight."""
    from gemm.testing.emulated import run_gemm
    config = choose_config(*shape)
    assert config.split_k > 1 and config.split_k_push, config.describe()
    problem = small_integer_problem(*small, rng)
    assert_exact(run_gemm(config, *problem, sm_count=6, seed=int(rng.integers(1000))), problem)
    cubin, ops = assemble(config, *shape[1:])
    assert_clean_resources(cubin, KERNEL)
    assert ops["STAS"] >= 1 and ops["UCGABAR_ARV"] == 1 and ops["UCGABAR_WAIT"] == 1, ops
    # st.async's complete_tx releases at cluster scope: rank 0's wait must acquire at cluster scope to pair with it
    # (try_wait's default is .acquire.cta); the emulator ignores scopes, so the text is checked
    waits = [line for line in generate(config, *shape[1:]).splitlines() if "wait_inbox" not in line and "[%inbox_bar" in line
             and "try_wait" in line]
    assert len(waits) == 1 and "try_wait.parity.acquire.cluster." in waits[0], waits


def test_a_push_without_the_start_phase_is_caught_on_the_emulator():
    """Take out the peer's barrier.cluster.wait before its st.async messages: under some schedules a peer sends
    before rank 0 has initialised its inbox barrier, and the emulator names it (the wait is what orders them)."""
    from gemm.testing.emulated import run_gemm
    from ptx.emulate.common import EmulationError
    config = KernelConfig(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0, split_k=2,
                          split_k_push=True)
    lines = generate(config, 136, 256).splitlines()
    assert sum("barrier.cluster.wait" in line for line in lines) == 1
    broken = "\n".join(line for line in lines if "barrier.cluster.wait" not in line)
    problem = small_integer_problem(20, 136, 256, np.random.default_rng(0))
    caught = []
    for seed in range(20):
        try:
            run_gemm(config, *problem, sm_count=4, seed=seed, ptx=broken)
        except EmulationError as error:
            caught.append(str(error))
    assert caught and all("uninitialised barrier" in text for text in caught), caught[:2]


def test_a_cta_scoped_wait_for_pushed_partials_is_caught_on_the_emulator(rng):
    """Rank 0's inbox wait with try_wait's default (.acquire.cta) instead of .acquire.cluster: the phase it sees
    completed with another CTA's st.async bytes (a release at cluster scope), and the emulator names the scope."""
    from gemm.testing.emulated import run_gemm
    from ptx.emulate.common import EmulationError
    config = KernelConfig(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0, split_k=2,
                          split_k_push=True)
    text = generate(config, 136, 256)
    assert text.count("try_wait.parity.acquire.cluster.") == 1
    with pytest.raises(EmulationError, match="use .acquire.cluster"):
        run_gemm(config, *small_integer_problem(20, 136, 256, rng), sm_count=4,
                 ptx=text.replace("try_wait.parity.acquire.cluster.", "try_wait.parity."))


@pytest.mark.parametrize("split_k, k_blocks, lead", [(2, 56, 1), (3, 56, 2), (3, 19, 1), (4, 7, 9), (3, 4, 1),
                                                      (8, 9, 3), (2, 2, 5)])
def test_lead_shares_tile_the_k_blocks_with_more_for_rank_zero(split_k, k_blocks, lead):
    """split_k_lead: the shares still tile [0, Kb) in rank order, none empty; rank 0 takes Kb // S + lead blocks
    (fewer only where a peer would be left none) and the peers' shares differ by at most one."""
    shares = [k_share(rank, split_k, k_blocks, lead) for rank in range(split_k)]
    assert shares[0][0] == 0 and shares[-1][1] == k_blocks
    assert all(first < end for first, end in shares) and all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
    assert shares[0][1] == min(k_blocks // split_k + lead, k_blocks - split_k + 1)
    peers = [end - first for first, end in shares[1:]]
    assert max(peers) - min(peers) <= 1
    assert [k_share(rank, split_k, k_blocks) for rank in range(split_k)] == [
        (rank * k_blocks // split_k, (rank + 1) * k_blocks // split_k) for rank in range(split_k)]


@pytest.mark.parametrize("seed", [None, 3])
@pytest.mark.parametrize("m, n, k, fields", [
    (16, 200, 1536, dict(block_m=16, block_n=64, stages=2, split_k=3, swap_ab=True, split_k_push=True,
                         split_k_lead=2)),  # production's decode kernel: 12 K blocks as 6, 3, 3
    (20, 136, 640, dict(block_m=64, block_n=64, stages=2, split_k=2, split_k_lead=1)),  # gathered: 5 as 3, 2
    (17, 136, 896, dict(block_m=64, block_n=64, stages=2, split_k=6, split_k_push=True,
                        split_k_lead=4)),  # 7 blocks over six CTAs: rank 0 can take only 2
    (100, 72, 1024, dict(block_m=128, block_n=32, stages=3, split_k=2, split_k_push=True, accumulators=2,
                         split_k_lead=3)),  # 8 blocks as 7, 1
])
def test_split_k_lead_shares_on_the_emulator(m, n, k, fields, seed, rng):
    """Rank 0 ahead by split_k_lead K blocks, pushed or gathered, swapped or not: exact, every element written
    (a share the PTX computes differently from config.k_share leaves blocks out or counts them twice)."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(**fields, persistent=False, raster_group=0)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=6, seed=seed), problem)


def _run_share_arithmetic(lines: list[str], rank: int) -> dict:
    """The u32 integer lines that compute a split CTA's share, run for one cluster rank (wrapping as PTX does)."""
    import re
    mask, registers = 0xFFFFFFFF, {}

    def value(text):
        text = text.strip()
        return int(text) & mask if re.fullmatch(r"-?\d+", text) else registers[text]
    for line in lines:
        opcode, rest = line.strip().rstrip(";").split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        if "%cluster_ctarank" in rest:
            registers[args[0]] = rank
            continue
        registers[args[0]] = {
            "mul.lo.u32": lambda: value(args[1]) * value(args[2]) & mask,
            "add.u32": lambda: value(args[1]) + value(args[2]) & mask,
            "sub.u32": lambda: value(args[1]) - value(args[2]) & mask,
            "shr.u32": lambda: value(args[1]) >> value(args[2]), "div.u32": lambda: value(args[1]) // value(args[2]),
            "setp.eq.u32": lambda: value(args[1]) == value(args[2]),
            "selp.u32": lambda: value(args[1]) if registers[args[3]] else value(args[2])}[opcode]()
    return registers


@pytest.mark.parametrize("split_k", range(2, 9))
def test_the_emitted_shares_are_k_share_for_every_rank_count_and_lead(split_k):
    """The share lines the generator emits, run with u32 arithmetic for every rank: k_share's shares, even and with
    leads up to 10 (rank 0's bounded where a peer would be left none), for K-block counts from S to 4096."""
    import re
    ops = ("mov.u32", "mul.lo.u32", "add.u32", "sub.u32", "shr.u32", "div.u32", "setp.eq.u32", "selp.u32")
    for blocks in [*range(split_k, 40), 56, 57, 129, 4096]:
        for lead in (0, 1, 2, 3, 10):
            config = KernelConfig(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0,
                                  split_k=split_k, split_k_push=True, split_k_lead=lead)
            lines = generate(config, 256, blocks * 128).splitlines()
            start = next(i for i, line in enumerate(lines) if "%cluster_ctarank" in line)
            block = []  # from the rank's read, the lines that write the rank, the shares and their predicate
            for line in lines[start:]:
                words = line.split(None, 2)
                if words[0] not in ops or not re.match(r"%(rank|k_first|k_end|peer_index|p)_\d+,", words[1]):
                    break
                block.append(line)
            for rank in range(split_k):
                registers = _run_share_arithmetic(block, rank)
                first = next(v for name, v in registers.items() if "k_first" in name)
                end = next(v for name, v in registers.items() if "k_end" in name)
                assert (first, end) == k_share(rank, split_k, blocks, lead), (split_k, blocks, lead, rank)


def test_a_k_share_seam_and_a_lead_are_refused_together():
    from gemm.kernel.seams import Seams
    config = KernelConfig(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0, split_k=2,
                          split_k_lead=1)
    with pytest.raises(ValueError, match="a k_share seam gives every rank's share itself"):
        generate(config, 256, 1024, seams=Seams(k_share=k_share))


def test_split_k_lead_misuse_is_named():
    with pytest.raises(ValueError, match="split_k_lead is the K blocks split-K's rank 0 takes beyond an even share"):
        KernelConfig(split_k_lead=1)
    with pytest.raises(ValueError, match="split_k_lead"):
        KernelConfig(split_k=2, persistent=False, raster_group=0, split_k_lead=-1)


def test_split_k_push_misuse_is_named():
    with pytest.raises(ValueError, match="split_k_push sends split-K partial totals to rank 0: it needs split_k > 1"):
        KernelConfig(split_k_push=True)
    too_big = KernelConfig(block_m=64, block_n=128, stages=2, persistent=False, raster_group=0, split_k=8,
                           split_k_push=True)
    with pytest.raises(ValueError, match="bytes of shared memory"):
        generate(too_big, 304, 1152)


@pytest.mark.parametrize("pushed", [False, True])
def test_split_k_fp32_accumulate_on_the_emulator(pushed, rng):
    """FP32 D += A*B with the K blocks split over 4 CTAs, the partials gathered or pushed: rank 0 adds the four
    shares before the one TMA reduce-add."""
    from gemm.testing.emulated import run_gemm
    m, n, k = 40, 72, 640
    a, sa, b, sb = small_integer_problem(m, n, k, rng)
    c = rng.integers(-8, 9, (m, n)).astype(np.float32)
    config = KernelConfig(block_m=64, block_n=72, stages=2, persistent=False, raster_group=0, out_dtype="f32",
                          accumulate=True, split_k=4, split_k_push=pushed)
    got = run_gemm(config, a, sa, b, sb, c=c, seed=int(rng.integers(1000)))
    assert np.array_equal(got, c + reference_gemm(a, sa, b, sb).astype(np.float32))


def test_production_fp32_decode_split_pushes_on_the_emulator(rng):
    """Production's FP32 D += A*B at decode (unswapped 64 x 64 tiles, K split over a pair) pushes its partials too:
    exact on a small ragged shape under a random schedule."""
    from gemm.testing.emulated import run_gemm
    config = choose_config(16, 2112, 7168, out_dtype="f32", accumulate=True)
    assert config.split_k == 2 and config.split_k_push, config.describe()
    m, n, k = 13, 200, 1280
    a, sa, b, sb = small_integer_problem(m, n, k, rng)
    c = rng.integers(-8, 9, (m, n)).astype(np.float32)
    got = run_gemm(config, a, sa, b, sb, c=c, sm_count=4, seed=int(rng.integers(1000)))
    assert np.array_equal(got, c + reference_gemm(a, sa, b, sb).astype(np.float32))


@pytest.mark.parametrize("m, n, k, fields", [
    (300, 1024, 384, dict(block_m=64, block_n=64, raster_group=8)),  # 16 N blocks: two full groups of 8
    (130, 512, 256, dict(block_m=128, block_n=128, raster_group=16)),  # 4 N blocks < 16: the division path
    (70, 512, 256, dict(block_m=64, block_n=128, raster_group=0)),  # no raster: 4 N blocks by a shift
    (200, 768, 256, dict(block_m=128, block_n=96, raster_group=8, multicast=2)),  # 8 N blocks, pairs
])
def test_raster_shifts_walk_the_same_tiles_on_the_emulator(m, n, k, fields, rng):
    """raster_shifts: a tile's coordinates by shifts where the raster group divides the N blocks (else the two
    divisions, unchanged): exact on ragged M, 3 CTAs walking several tiles each."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(stages=2, raster_shifts=True, **fields)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=int(rng.integers(1000))), problem)


@pytest.mark.parametrize("m, n, k, fields", [
    (300, 416, 640, dict(block_m=128, block_n=128)),  # ragged M and N, 12 tiles over 3 CTAs
    (200, 600, 384, dict(block_m=128, block_n=192)),  # tiles across two B-scale blocks (two scales a K block)
    (130, 136, 512, dict(block_m=256, block_n=64)),  # two waves per warpgroup
    (70, 1104, 1152, dict(block_m=64, block_n=160, raster_group=8)),  # tiles across scale blocks, raster groups
    (300, 416, 640, dict(block_m=128, block_n=128, multicast=2)),  # pairs, a lone CTA at the end
    (70, 320, 8960, dict(block_m=64, block_n=160)),  # 140 scales for 128 math threads: two chunks
])
@pytest.mark.parametrize("seed", [None, 7])
def test_b_scales_fetched_a_tile_ahead_on_the_emulator(m, n, k, fields, seed, rng):
    """prefetch_b_scales: each tile's B scales were read into registers during the previous tile (the first tile
    reads its own); exact on ragged shapes with several tiles per CTA, under round-robin and random schedules."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(stages=2, prefetch_b_scales=True, **fields)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=seed), problem)


def test_prefetch_b_scales_needs_a_persistent_dense_walk():
    for fields in (dict(persistent=False, raster_group=0), dict(gemm_type="masked"), dict(b_scales="1x128")):
        with pytest.raises(ValueError, match="prefetch_b_scales"):
            KernelConfig(prefetch_b_scales=True, **fields)


def test_raster_shifts_leave_no_division_where_they_apply():
    from gemm.kernel.generator import generate
    config = KernelConfig(block_m=128, block_n=128, stages=4, raster_group=16)
    before, after = generate(config, 32768, 512), generate(config.replace(raster_shifts=True), 32768, 512)
    assert before.count("div.u32") == 2 * after.count("div.u32") and after.count("rem.u32") == 0


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_even_waves_walks_every_tile_with_the_fewer_ctas_on_the_emulator(seed, rng):
    """Production's long-K persistent walks launch the fewest CTAs that take as many waves
    (gemm.heuristics.EVEN_WAVES_MIN_K): 9 tiles on 4 SMs are 3 waves, so 3 CTAs of 3 tiles, ragged edges included."""
    from gemm.kernel.launch import grid
    from gemm.testing.emulated import run_gemm
    m, n, k = 300, 360, 640
    config = KernelConfig(block_m=128, block_n=128, stages=3, raster_group=2, even_waves=True)
    assert grid(config, m, n, 4) == 3 and grid(config.replace(even_waves=False), m, n, 4) == 4
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=4, seed=seed), problem)


def test_production_walks_long_k_with_even_waves():
    from gemm.heuristics import EVEN_WAVES_MIN_K, H100, choose_config
    from gemm.kernel.launch import grid
    assert choose_config(4096, 4096, EVEN_WAVES_MIN_K, device=H100).even_waves
    assert grid(choose_config(4096, 4096, 7168, device=H100), 4096, 4096, 132) == 128
    assert not choose_config(4096, 4096, 2048, device=H100).even_waves  # short K: no gain at 2048, a loss at 512
    assert not choose_config(64, 4096, 7168, device=H100).even_waves  # one wave: no walk
    assert not choose_config(4096, 4096, 7168, device=H100, out_dtype="f32").even_waves  # measured with BF16 D
    assert not choose_config(4096, 4092, 7168, device=H100).even_waves  # and the TMA epilogue (N % 8 == 0)


def test_even_waves_sizes_only_a_persistent_grid():
    """even_waves: the fewest CTAs that take as many waves as one CTA per SM, the kernel unchanged."""
    from gemm.kernel.launch import grid
    with pytest.raises(ValueError, match="persistent=True"):
        KernelConfig(persistent=False, raster_group=0, even_waves=True)
    config = KernelConfig(block_m=128, block_n=128)
    assert grid(config, 128, 32768, 132) == 132 and grid(config.replace(even_waves=True), 128, 32768, 132) == 128
    assert grid(config.replace(even_waves=True), 128, 128 * 100, 132) == 100  # one wave: one CTA per tile
    assert grid(config.replace(even_waves=True), 4096, 4096, 132) == 128  # 1024 tiles: 8 waves of 128
    pairs = config.replace(even_waves=True, multicast=2)  # 266 tiles: 3 waves of 89, rounded up to whole pairs
    assert grid(pairs, 128 * 2, 128 * 133, 132) == 90
    from gemm.kernel.generator import generate
    assert generate(config, 4096, 512) == generate(config.replace(even_waves=True), 4096, 512)


@pytest.mark.parametrize("fields, words", [
    (dict(split_k=9), "split_k must be one of"), (dict(split_k=2), "persistent=False"),
    (dict(split_k=2, persistent=False, multicast=2), "persistent"),
    (dict(split_k=2, persistent=False, gemm_type="masked"), "gemm_type='normal'"),
    (dict(split_k=2, persistent=False, b_scales="1x128"), "b_scales='128x128'"),
])
def test_split_k_misuse_is_named(fields, words):
    with pytest.raises(ValueError, match=words):
        KernelConfig(**fields)


def test_split_k_needs_a_k_block_per_cta_and_room_for_the_partials():
    config = KernelConfig(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0, split_k=4)
    with pytest.raises(ValueError, match="fewer than the 4 CTAs"):
        generate(config, 256, 384)
    wide = KernelConfig(block_m=128, block_n=128, stages=2, persistent=False, raster_group=0, split_k=2)
    with pytest.raises(ValueError, match="partial totals"):  # 64 KiB of totals, 64 KiB of ring
        SharedPlan(wide.replace(block_n=192, stages=2), 384, 1024).check()


def test_split_k_kernels_assemble_clean_with_cluster_barriers():
    config = KernelConfig(block_m=64, block_n=64, stages=10, persistent=False, raster_group=0, split_k=2, pdl=True)
    cubin, ops = assemble(config, 2112, 7168)
    assert_clean_resources(cubin, KERNEL)
    assert ops["UCGABAR_ARV"] >= 2 and ops["UCGABAR_WAIT"] >= 2


def test_a_wrong_producer_parity_deadlocks_on_the_emulator(rng, monkeypatch):
    """The first round of empty waits must pass at once (parity 1 on a fresh barrier): start it at 0 and the
    producer waits for a release that never comes. The emulator names the wait instead of hanging."""
    import re
    import gemm.testing.emulated
    from ptx.emulate import EmulationError
    m, n, k = 64, 64, 384
    config = STAGE08.config(m, n, k).replace(stages=2)
    broken = re.sub(r"(mov\.u32 %prod_parity_\d+), 1;", r"\1, 0;", generate(config, n, k), count=1)
    assert broken != generate(config, n, k)
    monkeypatch.setattr(gemm.testing.emulated, "generate", lambda *args: broken)
    with pytest.raises(EmulationError, match="deadlock"):
        gemm.testing.emulated.run_gemm(config, *small_integer_problem(m, n, k, rng))


# ------------------------------------------------------------------------------ GPU
def _configured(config):
    from gemm.api import gemm
    return SimpleNamespace(gemm=lambda a, sa, b, sb, d, stream=None: gemm(a, sa, b, sb, d, stream, config=config))


GPU_CONFIGS = {
    "06-generated": lambda m, n, k: stage06_config(m, n, k),
    "07": STAGE07.config, "08": STAGE08.config,
    "production": lambda m, n, k: choose_config(m, n, k),
    "08-staged-persistent": lambda m, n, k: STAGE08.config(m, n, k).replace(epilogue="staged"),
    "08-64x16": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=64, block_n=16, stages=6),
    "08-256x128": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=256, block_n=128, stages=3),
    "07-256x64": lambda m, n, k: STAGE07.config(m, n, k).replace(block_m=256, block_n=64, stages=4),
    "08-128x192": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=128, block_n=192, stages=3),
    "08-128x96": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=128, block_n=96, stages=4),
    "08-64x160": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=64, block_n=160, stages=4),
    "09": lambda m, n, k: lessons.stage(9).config(m, n, k),
    "09-256x128": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=256, block_n=128, stages=3, multicast=2),
    "09-128x192": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=128, block_n=192, stages=3, multicast=2),
    "09-64x16": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=64, block_n=16, stages=6, multicast=2),
    "B multicast 256x128": lambda m, n, k: STAGE08.config(m, n, k).replace(
        block_m=256, block_n=128, stages=3, multicast=2, multicast_operand="b"),
    "B multicast 128x192": lambda m, n, k: STAGE08.config(m, n, k).replace(
        block_m=128, block_n=192, stages=3, multicast=2, multicast_operand="b", raster_group=4),
    "08-64x56 (seven switch points)": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=64, block_n=56,
                                                                                    stages=6),
    "split-K 2, 64x64": lambda m, n, k: KernelConfig(block_m=64, block_n=64, stages=4, persistent=False,
                                                     raster_group=0, split_k=2),
    "split-K 4, 128x56": lambda m, n, k: KernelConfig(block_m=128, block_n=56, stages=4, persistent=False,
                                                      raster_group=0, split_k=4 if k >= 512 else 2),
    "08-128x56": lambda m, n, k: STAGE08.config(m, n, k).replace(block_m=128, block_n=56, stages=5),
    "split-K 3 pushed, 64x64": lambda m, n, k: KernelConfig(block_m=64, block_n=64, stages=4, persistent=False,
                                                           raster_group=0, split_k=3 if k >= 384 else 2,
                                                           split_k_push=True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(128, 128, 1152), (300, 256, 384), (100, 136, 256), (520, 1024, 640)])
def test_every_config_is_bit_identical_to_stage06(m, n, k, rng):
    """Same promotion order, same rounding: every generator config reproduces stage 06 bit for bit."""
    problem = small_integer_problem(m, n, k, rng) if m < 200 else random_problem(m, n, k, rng)
    want = run_on_gpu(lessons.stage(6), *problem)
    for name, config in GPU_CONFIGS.items():
        if config(m, n, k).epilogue == "tma" and n % 8:
            continue
        if config(m, n, k).split_k > 1 and m >= 200:  # K shares summed apart: equal only where sums are exact
            continue
        got = run_on_gpu(_configured(config(m, n, k)), *problem)
        assert np.array_equal(got, want), f"{name}: {np.argwhere(got != want)[:5].tolist()}"
    if m < 200:
        assert_exact(want, problem)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", RAGGED_SHAPES + [(1, 24576, 1536), (4097, 2112, 512)])
@pytest.mark.parametrize("name", list(GPU_CONFIGS))
def test_configs_on_ragged_shapes(name, m, n, k, rng):
    try:
        config = GPU_CONFIGS[name](m, n, k)
    except ValueError as error:  # e.g. N % 8 != 0 takes the staged epilogue, which needs a power-of-two BLOCK_N
        pytest.skip(str(error))
    if config.epilogue == "tma" and n % 8:
        if config.block_n & (config.block_n - 1):
            pytest.skip("N % 8 != 0 needs the staged epilogue, which needs a power-of-two BLOCK_N")
        config = config.replace(epilogue="staged")
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(_configured(config), a, sa, b, sb), a, sa, b, sb, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", [(64, 2112, 7168), (33, 2112, 7168), (100, 2112, 7168), (96, 4096, 7168),
                                     (128, 4096, 7168), (64, 1024, 7168)])
def test_production_pairs_split_narrow_tiles_on_the_gpu(m, n, k, rng):
    """PAIR_SPLIT_MAX_M's configs (M = 33-128, K >= 4096, tiles for half the SMs split over a pair), ragged M: against
    the float64 reference, every element written."""
    config = choose_config(m, n, k)
    assert config.split_k == 2, config.describe()
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(_configured(config), a, sa, b, sb), a, sa, b, sb, rng)


@pytest.mark.gpu
def test_a_new_m_compiles_nothing_and_costs_little(rng):
    """50 distinct M at N=2112, K=7168 after one call per config: no compile, and little host time per call."""
    torch = pytest.importorskip("torch")
    import gemm
    from ptx import compile as compiler
    n, k = 2112, 7168
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sb = torch.rand(-(-n // 128), k // 128, device="cuda") + 0.5
    ms = sorted({int(x) for x in np.random.default_rng(int(rng.integers(2**31))).integers(1, 4097, 50)})
    inputs = {}
    for m in ms:
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        sa = gemm.get_mn_major_tma_aligned_tensor(torch.rand(m, k // 128, device="cuda") + 0.5)
        inputs[m] = (a, sa, torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    configs = {choose_config(m, n, k) for m in ms}
    for config in configs:  # warm each config once (what a serving process does at start-up)
        m = next(m for m in ms if choose_config(m, n, k) == config)
        a, sa, out = inputs[m]
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    torch.cuda.synchronize()
    compiled = compiler.compile_count
    start = time.perf_counter()
    for m in ms:
        a, sa, out = inputs[m]
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    kernel_seconds = sum(2 * m * n * k for m in ms) / 1.0e15  # generous: 1000 TFLOP/s would be faster
    print(f"{len(ms)} distinct M over {len(configs)} configs: {elapsed * 1e3:.1f} ms in all")
    assert compiler.compile_count == compiled
    assert elapsed < 0.05 + kernel_seconds, f"{elapsed * 1e3:.1f} ms for {len(ms)} calls"


FP32_CONFIGS = {  # FP32 D: 32-column swizzled atoms, the unswizzled whole row (BLOCK_N % 32 != 0), two waves
    "128x128 f32": dict(block_m=128, block_n=128, stages=2),
    "64x48 f32 (unswizzled rows)": dict(block_m=64, block_n=48, stages=3),
    "256x64 f32 (two waves)": dict(block_m=256, block_n=64, stages=2),
    "256x64 f32, D in four passes": dict(block_m=256, block_n=64, stages=2, d_buffer=(128, 32)),
    "128x64 f32, D in two column passes": dict(block_m=128, block_n=64, stages=2, d_buffer=(128, 32)),
    "128x160 f32 (two B scales)": dict(block_m=128, block_n=160, stages=2),
}


@pytest.mark.parametrize("accumulate", [False, True], ids=["d=ab", "d=c+ab"])
@pytest.mark.parametrize("name", list(FP32_CONFIGS))
def test_fp32_output_and_accumulation_on_the_emulator(name, accumulate, rng):
    """out_dtype="f32" stores the FP32 totals unrounded (exact here: every total is exact in FP32), and
    accumulate adds them into D with the TMA reduce-add: D = C + A*B, every element written, ragged M and N."""
    from gemm.testing.emulated import run_gemm
    from gemm.kernel import KernelConfig
    m, n, k = 200, 232, 384
    config = KernelConfig(**FP32_CONFIGS[name], out_dtype="f32", accumulate=accumulate, raster_group=2)
    problem = small_integer_problem(m, n, k, rng)
    c = rng.integers(-64, 65, (m, n)).astype(np.float32) / 4 if accumulate else None  # exact sums in FP32
    got = run_gemm(config, *problem, c=c, sm_count=3, seed=int(rng.integers(1000)))
    want = reference_gemm(*problem) + (c if accumulate else 0)
    assert not np.isnan(got).any(), f"{np.isnan(got).sum()} elements of D never written"
    assert np.array_equal(got, want.astype(np.float32)), np.argwhere(got != want)[:5].tolist()


def test_fp32_tile_layout_matches_the_swizzle_rule():
    """d_tile_offset for FP32: 32-column atoms of 128-byte rows, chunks XOR row % 8; a bijection onto the tile."""
    from gemm.kernel.epilogue import d_tile_offset
    for block_n in (64, 48):
        offsets = {d_tile_offset(r, c, 128, block_n, 4) for r in range(128) for c in range(block_n)}
        assert offsets == set(range(0, 128 * block_n * 4, 4))
    assert d_tile_offset(1, 0, 128, 64, 4) == 128 + 16  # row 1: chunk 0 lands at chunk 1
    assert d_tile_offset(0, 32, 128, 64, 4) == 128 * 128  # the second atom follows the first's 128 rows


def test_config_rejects_fp32_and_accumulate_misuse():
    from gemm.kernel import KernelConfig
    with pytest.raises(ValueError, match="accumulate .* needs out_dtype='f32'"):
        KernelConfig(accumulate=True)
    with pytest.raises(ValueError, match="use epilogue='tma'"):
        KernelConfig(out_dtype="f32", epilogue="staged")
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        KernelConfig(out_dtype="fp16")


def test_long_k_256_row_tiles_trade_the_whole_d_buffer_for_a_fourth_stage():
    """K >= D_BUFFER_MIN_K: 256 x 128 tiles store D through a 128 x 64 buffer in four passes, which is what makes a
    fourth ring stage fit (results/sweep_d_buffer.json); shorter K keeps the whole-tile buffer and three stages."""
    from gemm.heuristics import D_BUFFER_MIN_K
    long_k = choose_config(4096, 7168, 16384, H100)
    assert (long_k.block_m, long_k.d_buffer, long_k.stages) == (256, (128, 64), 4)
    assert SharedPlan(long_k, 7168, 16384).shared_bytes <= H100.shared_limit
    assert SharedPlan(long_k.replace(d_buffer=None), 7168, 16384).shared_bytes > H100.shared_limit
    short_k = choose_config(4096, 7168, D_BUFFER_MIN_K - 128, H100)
    assert (short_k.d_buffer, short_k.stages) == (None, 3)


@pytest.mark.parametrize("k", [576, 272, 16])
def test_production_kernels_take_k_in_16_byte_steps_on_the_emulator(k, rng):
    """K need not be a multiple of 128 (DeepGEMM 2507's test_gemm starts at K = 576): TMA zero-fills the last K
    block of A and B, whose scales exist (ceil(K/128) of them); exact on integer inputs, every element written."""
    from gemm.fp8 import ceil_div
    from gemm.kernel import KernelConfig
    from gemm.testing.emulated import run_gemm
    from gemm.fp8 import E4M3
    m, n, kb = 136, 200, ceil_div(k, 128)
    a = rng.integers(-4, 5, (m, k)).astype(np.float32).astype(E4M3)
    b = rng.integers(-4, 5, (n, k)).astype(np.float32).astype(E4M3)
    sa = np.exp2(rng.integers(-1, 2, (m, kb))).astype(np.float32)
    sb = np.exp2(rng.integers(-1, 2, (ceil_div(n, 128), kb))).astype(np.float32)
    config = KernelConfig(block_m=128, block_n=64, stages=3, out_dtype="f32", raster_group=2)
    got = run_gemm(config, a, sa, b, sb, sm_count=3, seed=int(rng.integers(1000)))
    assert not np.isnan(got).any()
    assert np.array_equal(got, reference_gemm(a, sa, b, sb).astype(np.float32))


@pytest.mark.gpu
def test_split_k_cluster_residency():
    """The heuristics split K over clusters of two (three for swap AB's tiles, up to the 39 resident) only while the
    split tiles still give every CTA an SM: every cluster of production's decode configs must then be resident at
    once (the driver's cuOccupancyMaxActiveClusters), or the last ones would run in a second wave; the shapes span
    33 to 64 tiles, 39 and 40 among them. Clusters of four are not all
    resident on an H100 (30 of 33 there: 120 CTAs), which is why 4-CTA splits measured slower at 132 CTAs
    (docs/benchmarks.md)."""
    from cuda.bindings import driver
    from gemm.heuristics import choose_config, device_facts
    from gemm.kernel.config import tiles
    from gemm.kernel.launch import kernel
    from ptx.device import activated
    from ptx.runtime import launch_config
    facts = device_facts(0)

    def resident_clusters(config, n, k):
        shared = SharedPlan(config, n, k).shared_bytes
        with activated(0):
            function = kernel(config, n, k).function(0, shared)
            launch = launch_config((config.split_k, 1, 1), (config.threads, 1, 1), shared_bytes=shared,
                                   cluster=(config.split_k, 1, 1), stream=0)
            error, clusters = driver.cuOccupancyMaxActiveClusters(function, launch)
        assert error == driver.CUresult.CUDA_SUCCESS, error
        return clusters

    resident = {}
    for m, n, k in ((16, 2112, 7168), (1, 2112, 7168), (1, 4096, 7168), (16, 4096, 7168), (16, 2496, 7168),
                    (16, 2560, 7168), (16, 2816, 7168), (32, 2112, 7168), (64, 2112, 7168), (128, 2112, 7168),
                    (64, 4096, 7168), (128, 4096, 7168)):
        config = choose_config(m, n, k, facts)
        assert config.split_k > 1, config.describe()
        resident[(m, n, k)] = clusters = resident_clusters(config, n, k)
        assert clusters >= tiles(config, m, n), (m, n, k, config.describe(), clusters)
    fours = resident_clusters(choose_config(16, 2112, 7168, facts).replace(split_k=4), 2112, 7168)
    print(f"resident clusters on {facts.sm_count} SMs: {resident}; of four at 16x2112x7168: {fours}")


def test_the_early_poll_takes_both_paths_on_the_emulator(rng, monkeypatch):
    """early_poll: the next stage's full barrier is tested (mbarrier.test_wait, which does not block) before the
    promotion; a ring of 2 stages over 8 K blocks and 2 SMs makes the test find the stage both full (the blocking
    wait skipped) and not yet full (waited for), and D is right either way."""
    from ptx.emulate import warpgroup as emulated_warpgroup
    from gemm.testing.emulated import run_gemm
    answers = []
    original = emulated_warpgroup.Warpgroup.mbarrier

    def recording(self, opcode, kind, ops, mask):
        result = original(self, opcode, kind, ops, mask)
        if kind == "test_wait":
            answers.append(bool(self.value(ops[0])[mask].any()))
        return result
    monkeypatch.setattr(emulated_warpgroup.Warpgroup, "mbarrier", recording)
    m, n, k = 300, 256, 1024
    config = choose_config(4096, 4096, 7168, H100).replace(stages=2)
    assert config.early_poll
    problem = random_problem(m, n, k, rng)
    d = run_gemm(config, *problem, sm_count=2)
    assert calc_diff(d, reference_gemm(*problem)) < 1e-3 and not np.isnan(d).any()
    assert True in answers and False in answers, answers


PAIRED_CASES = [  # (M, N, K, config fields): two K blocks in flight (accumulators=2), odd and even K-block counts
    (20, 136, 640, dict(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0)),  # 5 K blocks
    (1, 72, 128, dict(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0)),  # one K block
    (70, 200, 1024, dict(block_m=128, block_n=56, stages=3)),  # two warpgroups, a B-scale edge, persistent
    (130, 136, 400, dict(block_m=64, block_n=32, stages=2, epilogue="staged")),  # K = 400: 4 blocks, last partial
    (200, 256, 768, dict(block_m=128, block_n=64, stages=3, multicast=2)),  # A multicast to a CTA pair
    (16, 200, 1152, dict(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0, split_k=2)),
    (5, 136, 896, dict(block_m=64, block_n=56, stages=3, persistent=False, raster_group=0, split_k=4)),
    (100, 72, 1152, dict(block_m=128, block_n=32, stages=3, persistent=False, raster_group=0, split_k=2)),  # two
]  # warpgroups split over a pair (PAIR_SPLIT_MAX_M's 128 x 32 tiles)


@pytest.mark.parametrize("seed", [None, 1, 2])
@pytest.mark.parametrize("m, n, k, fields", PAIRED_CASES)
def test_two_k_blocks_in_flight_on_the_emulator(m, n, k, fields, seed, rng):
    """accumulators=2: K block k+1's wgmmas are issued before K block k is waited for and promoted. The emulator
    reads a wgmma's operands at its wait_group, so a stage released (and refilled) before its own group completed,
    or a promotion of the wrong set, is a wrong answer here; exact against the reference, every element written,
    under round-robin and random schedules, with 2-3 ring stages so the producer refills as early as it may."""
    from gemm.testing.emulated import run_gemm
    config = KernelConfig(accumulators=2, **fields)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=seed), problem)


def test_two_k_blocks_in_flight_assemble_without_serialized_wgmma():
    """ptxas keeps the second group in flight: one wait for all but the newest group per unrolled half (of each
    compiled K loop: one per place the tile's B-scale edge may fall), one full wait per drain, no warning that it
    serialized the wgmmas, no spills; the register cost is one more accumulator set."""
    from ptx.sass import disassemble
    config = choose_config(64, 7168, 16384, H100).replace(accumulators=2)
    assert config.math_registers_needed == 3 * config.block_n // 2
    cubin = compile_ptx_of(config, 7168, 16384)
    assert_clean_resources(cubin, KERNEL)
    assert not cubin.warnings, cubin.warnings
    waits = [i.text for i in disassemble(cubin) if i.text.startswith("WARPGROUP.DEPBAR")]
    loops = len(config.former_groups_variants)
    assert waits.count("WARPGROUP.DEPBAR.LE gsb0, 0x1") == 2 * loops
    assert waits.count("WARPGROUP.DEPBAR.LE gsb0, 0x0") == 2 * loops


@pytest.mark.parametrize("fields, words", [
    (dict(accumulators=3), "accumulators must be 1 or 2"),
    (dict(accumulators=2, block_m=256, block_n=64), "block_m <= 128"),
    (dict(accumulators=2, producer="inline", persistent=False, registers=None), "producer='warpgroup'"),
    (dict(accumulators=2, block_n=64, b_scales="1x128"), "b_scales=.128x128."),
    (dict(accumulators=2, block_m=128, block_n=256), "registers per thread"),
])
def test_two_k_blocks_in_flight_misuse_is_named(fields, words):
    with pytest.raises(ValueError, match=words):
        KernelConfig(**fields)


@pytest.mark.parametrize("m, n, k, fields", [
    (20, 136, 640, dict(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0, l2_prefetch=3)),
    (70, 200, 1024, dict(block_m=128, block_n=56, stages=3, l2_prefetch=2, accumulators=2)),  # persistent walk
    (16, 200, 1152, dict(block_m=64, block_n=64, stages=2, persistent=False, raster_group=0, split_k=2,
                         l2_prefetch=20)),  # more blocks asked for than the CTA's share holds: clipped at its end
])
def test_l2_prefetch_changes_no_answer_on_the_emulator(m, n, k, fields, rng, monkeypatch):
    """l2_prefetch (a measured loss, kept so the measurement can be repeated: docs/benchmarks.md): the producer asks
    L2 for B ahead of its loads; the answer is the same, the emulator checks each prefetch names a tensor map, and
    every K block a CTA asks for lies in its own share of the tile's K blocks (split K: rank r's [r Kb/S, ...))."""
    from gemm.kernel.config import k_share
    from gemm.testing.emulated import run_gemm
    from ptx.emulate.warpgroup import Warpgroup
    asked = []  # (cluster rank, K block) of every prefetch issued
    original = Warpgroup.bulk

    def recording(self, parts, ops, mask, reduce=None):
        if parts[3:4] == ["prefetch"]:
            for t in np.flatnonzero(mask):
                asked.append((self.cta.rank, self._box(ops[0], int(t))[1] // 128))
        return original(self, parts, ops, mask, reduce)
    monkeypatch.setattr(Warpgroup, "bulk", recording)
    config = KernelConfig(**fields)
    assert "cp.async.bulk.prefetch.tensor.2d.L2.global.tile" in generate(config, n, k)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=int(rng.integers(1000))), problem)
    shares = {rank: k_share(rank, config.split_k, -(-k // 128)) for rank in range(config.split_k)}
    assert asked and all(shares[rank][0] <= block < shares[rank][1] for rank, block in asked), sorted(set(asked))


def test_l2_prefetch_misuse_is_named():
    for fields in (dict(l2_prefetch=65), dict(l2_prefetch=-1),
                   dict(l2_prefetch=4, producer="inline", persistent=False, registers=None, block_n=64),
                   dict(l2_prefetch=4, gemm_type="masked")):
        with pytest.raises(ValueError, match="l2_prefetch"):
            KernelConfig(**fields)
