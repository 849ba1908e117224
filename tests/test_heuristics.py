"""The heuristics (gemm.heuristics), on the CPU: every DeepSeek shape gets a valid config that fits and is the
cheapest under the cost model; awkward wave counts; the SM count and shared memory are read, not assumed; the
choice is printable and is part of the kernel's cache key."""
import itertools

import pytest

from gemm.testing.bench_dense import BENCH_SHAPES
from gemm.fp8 import ceil_div
from gemm.heuristics import (BLOCK_M_CANDIDATES, BLOCK_N_CANDIDATES, DECODE_MAX_M, DECODE_MIN_BLOCK_N,
                             FULLER_WAVE_BLOCK_N, H100, PAIR_SPLIT_MAX_BLOCK_N, PAIR_SPLIT_MAX_M,
                             SPLIT_K_LEAD, SPLIT_K_MAX_M, SPLIT_K_MIN_K, SWAP_AB_MAX_M, TILE_OVERHEAD,
                             EVEN_WAVES_MIN_K, DeviceFacts, _choose_config, choose_blocks, choose_config, wave_cost)
from gemm.kernel import KernelConfig, SharedPlan


def modelled(m, n, k, block_m, block_n, sms):
    waves = ceil_div(ceil_div(m, block_m) * ceil_div(n, block_n), sms)
    return waves * (ceil_div(k, 128) * wave_cost(block_m, block_n) + TILE_OVERHEAD)


@pytest.mark.parametrize("m, n, k", BENCH_SHAPES + [(1, 24576, 1536), (4095, 7168, 2048), (300, 2111, 256)])
def test_every_shape_gets_the_cheapest_valid_config_that_fits(m, n, k):
    config = choose_config(m, n, k, H100)
    plan = SharedPlan(config, n, k)
    plan.check()
    assert plan.shared_bytes <= H100.shared_limit and config.stages >= 3
    assert (config.epilogue == "tma") == (n % 8 == 0)
    if config.swap_ab:  # decode: the measured rule, not the cost model (next tests)
        assert m <= SWAP_AB_MAX_M
        return
    narrowest = DECODE_MIN_BLOCK_N if m <= DECODE_MAX_M else 0  # decode: tiles at least 64 wide

    def cheapest(sms):
        return min(modelled(m, n, k, bm, bn, sms) for bm, bn in itertools.product(BLOCK_M_CANDIDATES,
                                                                                  BLOCK_N_CANDIDATES)
                   if not (bm > 64 and m <= 64 or bm > 128 and m <= 128 or bm == 256 and bn > 128
                           or n % 8 and bn & (bn - 1) or bn < narrowest))
    chosen = config.block_n if config.block_n != FULLER_WAVE_BLOCK_N else 128  # the model chose 128 (next test)
    tiles = ceil_div(m, config.block_m) * ceil_div(n, config.block_n)
    assert config.persistent == (tiles > 132)  # one wave: one CTA per tile, nothing to walk
    if (config.block_m, config.block_n) == (256, 128) and k >= EVEN_WAVES_MIN_K and config.persistent:
        # the model may have chosen 128 x 192 and the power-capped walk's rule taken 256 x 128 (its own test)
        model_m, model_n = (128, 192) if modelled(m, n, k, 128, 192, 132) < modelled(m, n, k, 256, 128, 132) \
            else (256, 128)
        assert modelled(m, n, k, model_m, model_n, 132) == cheapest(132)
        return
    if DECODE_MAX_M < m <= PAIR_SPLIT_MAX_M and config.split_k == 2:  # the cheapest tiles for half the SMs, paired
        assert modelled(m, n, k, config.block_m, chosen, 66) == cheapest(66) and 2 * tiles <= 132
        return
    assert modelled(m, n, k, config.block_m, chosen, 132) == cheapest(132)
    # decode with few tiles and long K: each tile's K blocks split over a 2-CTA cluster
    assert config.split_k == (2 if m <= SPLIT_K_MAX_M and k >= SPLIT_K_MIN_K and 2 * tiles <= 132 else 1)


@pytest.mark.parametrize("m, n, k, unsplit, split", [
    (64, 2112, 7168, (64, 16), (64, 32)), (48, 2112, 7168, (64, 16), (64, 32)), (128, 2112, 7168, (64, 32), (128, 32)),
    (64, 4096, 7168, (64, 32), (64, 64)), (128, 4096, 7168, (128, 32), (128, 64)),
    (64, 7168, 16384, (64, 56), None), (128, 7168, 16384, (128, 56), None),  # 56 wide: A's re-reads do not dominate
    (64, 2112, 2048, (64, 16), None),  # K below SPLIT_K_MIN_K
])
def test_narrow_tiles_at_m_33_to_128_split_k_over_pairs(m, n, k, unsplit, split):
    """PAIR_SPLIT_MAX_M: where the one-wave tiles are at most 32 wide (A re-read from L2 by every CTA outweighs B), the
    tiles for half the SMs with their K blocks split over a pair, as measured; elsewhere the unsplit tiles."""
    config = choose_config(m, n, k, H100)
    if split is None:
        assert (config.block_m, config.block_n, config.split_k) == (*unsplit, 1)
    else:
        assert (config.block_m, config.block_n, config.split_k) == (*split, 2)
        assert unsplit[1] <= PAIR_SPLIT_MAX_BLOCK_N


def test_narrow_pair_tiles_are_productions_own_pair_tiles():
    """narrow_pair_tiles (what stage 20 takes) is the pair split production chooses, at every M from 1 to 256 over
    N and K either side of the rule's bounds; None wherever production keeps one CTA per tile or swaps."""
    from gemm.heuristics import narrow_pair_tiles
    split_somewhere = 0
    for m in range(1, 257, 3):
        for n in (128, 576, 1000, 2112, 4096, 7168, 24576):
            for k in (2048, 4096, 7168, 16384):
                config = choose_config(m, n, k, H100)
                production = ((config.block_m, config.block_n) if config.split_k == 2 and not config.swap_ab
                              and m > DECODE_MAX_M else None)
                assert narrow_pair_tiles(m, n, k, H100) == production, (m, n, k, config.describe())
                split_somewhere += production is not None
    assert split_somewhere > 100


def test_the_pair_rule_asks_the_model_for_every_sm_then_half():
    """pair_split_blocks: the model's one-wave tiles decide (at most 32 wide), its tiles for half the SMs are the
    answer, and only if two CTAs per tile fit; never outside M = 33-128 or on one SM."""
    from gemm.heuristics import pair_split_blocks
    asked = []

    def model(ctas):
        asked.append(ctas)
        return {132: (64, 16), 66: (64, 32)}[ctas]
    assert pair_split_blocks(64, 2112, 132, model) == (64, 32) and asked == [132, 66]
    assert pair_split_blocks(64, 2112 + 32, 132, model) is None  # 67 tiles: 134 CTAs on 132 SMs
    assert pair_split_blocks(32, 2112, 132, model) is None and pair_split_blocks(129, 2112, 132, model) is None
    assert pair_split_blocks(64, 2112, 132, lambda ctas: (64, 40)) is None  # one-wave tiles too wide
    assert pair_split_blocks(64, 16, 1, lambda ctas: (64, 16)) is None


@pytest.mark.parametrize("m, n, k, block_n", [
    (256, 7168, 2048, 112), (192, 7168, 7168, 112), (129, 7168, 4096, 112),  # 128 tiles of 112 instead of 112 of 128
    (256, 7168, 16384, 128),  # HBM sets the pace at long K: measured no gain
    (256, 4096, 7168, 64),  # 112 does not divide N (a ragged last n-block measured 15% slower): not offered
    (512, 7168, 2048, 128),  # 256 x 128 tiles (the model's): 4 x 64 = 256 tiles of 112 would not fit one wave
])
def test_a_partial_wave_of_128_wide_tiles_gives_way_to_112_wide_ones_where_measured(m, n, k, block_n):
    config = choose_config(m, n, k, H100)
    assert config.block_n == block_n
    if block_n == FULLER_WAVE_BLOCK_N:
        assert config.block_m == 128 and not config.persistent and config.stages >= 6
        SharedPlan(config, n, k).check()


@pytest.mark.parametrize("m, n, k, out_dtype, paired", [
    (64, 7168, 2048, "bf16", True), (33, 4096, 7168, "bf16", True), (64, 7168, 16384, "bf16", True),
    (1, 7168, 2048, "bf16", False),  # M <= 32 swaps A and B (test_decode_swaps_ab_where_it_measured_faster)
    (256, 7168, 2048, "bf16", True),  # 128 x 112: two warpgroups, one wave each
    (64, 24576, 1536, "bf16", False),  # 64 x 192: wider than measured (and a third set of 96 would not fit)
    (4096, 4096, 7168, "bf16", False),  # 256 x 128, persistent: not measured with it
    (128, 32768, 512, "bf16", False),  # persistent
    (64, 7168, 2048, "f32", False),  # measured with a BF16 D only
])
def test_one_wave_decode_tiles_keep_two_k_blocks_in_flight(m, n, k, out_dtype, paired):
    config = choose_config(m, n, k, H100, out_dtype=out_dtype, accumulate=out_dtype == "f32")
    assert (config.accumulators == 2) == paired, config.describe()
    if paired:
        assert not config.persistent and config.block_m <= 128 and config.block_n <= 112
        SharedPlan(config, n, k).check()


def test_the_pair_rule_refuses_what_was_not_measured_or_does_not_fit():
    from gemm.heuristics import paired_k_blocks
    one_wave = KernelConfig(block_m=64, block_n=64, stages=4, persistent=False, raster_group=0)
    assert paired_k_blocks(one_wave)
    for fields in (dict(block_n=128), dict(persistent=True, raster_group=8), dict(epilogue="staged"),
                   dict(out_dtype="f32"), dict(block_m=256), dict(b_scales="1x128")):
        assert not paired_k_blocks(one_wave.replace(**fields)), fields


def test_a_config_override_keeps_production_rule_for_the_accumulator_sets():
    """``python -m gemm bench configs`` / ``gemm sanitize`` overrides: the sets follow the overridden tile and D (an
    FP32 override is production's FP32 config, one set), unless ``accumulators`` is itself overridden."""
    from gemm.testing.bench_configs import parse_config
    assert parse_config("production", 64, 7168, 2048).accumulators == 2
    assert parse_config("production:out_dtype='f32',accumulate=True", 300, 2112, 512).accumulators == 1
    assert parse_config("production:block_n=192", 64, 7168, 2048).accumulators == 1
    assert parse_config("production:accumulators=1", 64, 7168, 2048).accumulators == 1
    assert parse_config("production:block_n=32", 64, 7168, 2048).accumulators == 2
    # the unswapped decode kernel, as production ran it before swap AB (results/sweep_swap_ab_memset.json)
    unswapped = parse_config("production:swap_ab=False,block_m=64,block_n=64", 1, 7168, 2048)
    assert (unswapped.block_m, unswapped.block_n, unswapped.accumulators, unswapped.pdl) == (64, 64, 2, True)
    assert parse_config("production:swap_ab=False", 1, 7168, 2048) == unswapped
    # fields the swapped kernel does not take start from the unswapped one, so earlier sweeps' commands still run
    assert parse_config("production:accumulators=2", 1, 7168, 2048) == unswapped
    assert parse_config("production:block_n=32", 1, 7168, 2048).block_m == 64
    assert parse_config("production:pdl=False", 1, 7168, 2048).swap_ab  # one swap AB takes: still swapped


def test_decode_takes_wide_tiles_and_splits_k_where_it_measured_faster():
    assert (choose_config(16, 2112, 7168, H100).block_n, choose_config(16, 2112, 7168, H100).split_k) == (64, 3)
    assert choose_config(16, 4096, 7168, H100).split_k == 2  # 64 tiles: three CTAs each would not fit 132 SMs
    assert choose_config(32, 4096, 7168, H100).split_k == 2  # swapped: M = 32 splits too (64 tiles: pairs)
    assert choose_config(1, 7168, 2048, H100).split_k == 1  # K = 2048: the exchange does not pay
    # M = 64: the model's narrow tiles for half the SMs, split over pairs (PAIR_SPLIT_MAX_M)
    assert (choose_config(64, 2112, 7168, H100).block_n, choose_config(64, 2112, 7168, H100).split_k) == (32, 2)


@pytest.mark.parametrize("m, n, k, block_m, split_k, persistent", [
    (1, 7168, 2048, 8, 1, False), (1, 2112, 7168, 8, 3, False), (8, 7168, 2048, 8, 1, False),
    (9, 7168, 2048, 16, 1, False), (16, 2112, 7168, 16, 3, False), (17, 2112, 7168, 32, 3, False),
    (1, 4096, 7168, 8, 2, False),  # 64 tiles: pairs
    (16, 2496, 7168, 16, 3, False), (16, 2560, 7168, 16, 2, False),  # 39 tiles: threes; 40: past the resident 39
    (20, 2112, 7168, 32, 3, False), (32, 4096, 7168, 32, 2, False), (32, 7168, 2048, 32, 1, False),
    (1, 24576, 1536, 8, 1, True),  # 384 tiles of 64 weight rows: a persistent walk, measured +5%
])
def test_decode_swaps_ab_where_it_measured_faster(m, n, k, block_m, split_k, persistent):
    """M <= 32 (BF16 D, N % 8 == 0): B's rows as wgmma's 64-row side, the fewest power-of-two token rows >= M; K
    split at K >= 4096 up to M = 32 (results/sweep_swap_ab_*.json, results/sweep_split_m32_*.json), over three
    CTAs where three per tile still fit the SMs (results/sweep_split3_*.json)."""
    config = choose_config(m, n, k, H100)
    assert config.swap_ab and (config.block_m, config.block_n) == (block_m, 64), config.describe()
    assert (config.split_k, config.persistent, config.pdl) == (split_k, persistent, not persistent)
    SharedPlan(config, n, k).check()


@pytest.mark.parametrize("m, n, k, fields", [
    (33, 4096, 7168, {}), (64, 2112, 7168, {}),  # M = 64: 64 x 64 swapped lost to 64 x 16 by 26% (H200)
    (16, 2111, 7168, {}),  # N % 8 != 0: the staged epilogue, which swap AB does not have
    (16, 2112, 7168, dict(out_dtype="f32", accumulate=True)),  # measured with a BF16 D only
])
def test_swap_ab_stays_where_it_was_not_measured(m, n, k, fields):
    assert not choose_config(m, n, k, H100, **fields).swap_ab


@pytest.mark.parametrize("m, n, k", [(4096, 2112, 7168), (2048, 8448, 4096), (1536, 1536, 8192)])
def test_awkward_waves_are_not_left_nearly_empty(m, n, k):
    """Shapes where the biggest tile leaves a last wave a few percent full: the choice beats that by the model."""
    bm, bn = choose_blocks(m, n, 132, k=k)
    tiles = ceil_div(m, bm) * ceil_div(n, bn)
    last = tiles % 132 or 132
    assert tiles <= 132 or last >= 132 // 4, (bm, bn, tiles)


def test_the_device_is_read_not_assumed():
    small = DeviceFacts(sm_count=78, shared_limit=101376, name="a smaller GPU")
    config = choose_config(4096, 4096, 7168, small)
    assert SharedPlan(config, 4096, 7168).shared_bytes <= 101376  # fewer stages fit
    assert config.stages < choose_config(4096, 4096, 7168, H100).stages or config.block_m < 256
    assert choose_blocks(64, 2112, 66) == (64, 32)  # 66 SMs: 66 tiles of 32 columns fill them


def test_the_choice_is_printable_and_keys_the_kernel_cache(monkeypatch, capsys):
    import gemm.kernel.launch as launch
    monkeypatch.setenv("FP8LADDER_PRINT_CONFIGS", "1")
    _choose_config.cache_clear()
    config = choose_config(4096, 4096, 4096, H100)
    assert config.describe() in capsys.readouterr().out
    _choose_config.cache_clear()
    # the kernel cache is keyed by (config, N, K): a config that differs in any field is another kernel
    assert launch.kernel.cache_info is not None and hash(config) != hash(config.replace(stages=config.stages - 1))


def test_ffma_pass_is_off_unless_asked(monkeypatch):
    _choose_config.cache_clear()
    monkeypatch.delenv("FP8LADDER_FFMA_INTERLEAVE", raising=False)
    assert choose_config(4096, 4096, 7168, H100).post_passes == ()
    _choose_config.cache_clear()
    monkeypatch.setenv("FP8LADDER_FFMA_INTERLEAVE", "deepgemm")
    assert choose_config(4096, 4096, 7168, H100).post_passes == ("ffma_deepgemm",)
    _choose_config.cache_clear()


def test_set_num_sms_limits_the_heuristics_and_is_checked():
    from gemm.heuristics import get_num_sms, set_num_sms
    full = get_num_sms()
    try:
        set_num_sms(66)
        assert get_num_sms() == 66
        assert choose_blocks(64, 2112, get_num_sms()) == (64, 32)
        assert choose_config(64, 2112, 7168).block_n == 64  # the cached choice follows the new SM count (33 pairs)
        with pytest.raises(ValueError, match="set_num_sms"):
            set_num_sms(full + 1)
    finally:
        set_num_sms(0)
    assert get_num_sms() == full and choose_config(64, 2112, 7168).block_n == 32


def test_bench_configs_names_what_cannot_apply_at_a_shape():
    """python -m gemm bench configs: a config the overrides or the generator refuse at a shape is a row saying why
    (its error), and the others are still timed."""
    from gemm.testing.bench_configs import configs_for_shape
    names = ["production", "production:stages=5,constant_stages=True", "production:stages=4,constant_stages=True"]
    configs, skipped = configs_for_shape(names, 128, 32768, 512)
    assert list(configs) == [names[0], names[2]]
    assert [row["name"] for row in skipped] == [names[1]]
    assert skipped[0]["status"].startswith("n/a: ") and "constant_stages needs the 5 stages" in skipped[0]["status"]


@pytest.mark.parametrize("m, n, k, stages, fields", [
    (64, 32768, 512, 4, {}), (128, 32768, 512, 4, {}), (128, 32768, 640, 5, {}),
    (4096, 32768, 512, None, {}),  # 256 x 128 tiles: 3 stages fit
    (4097, 2112, 512, None, {}),  # 128 x 192 tiles: not measured
    (128, 32768, 512, None, dict(out_dtype="f32")), (128, 32768, 512, None, dict(out_dtype="f32", accumulate=True)),
    (128, 7168, 2048, None, {}),  # one wave of one-CTA tiles
    (256, 32768, 384, None, {}),  # 3 K blocks: not measured
])
def test_short_k_persistent_walks_take_one_round_of_the_ring_a_tile(m, n, k, stages, fields):
    """SHORT_K_MIN_BLOCKS: a persistent walk of the measured tiles (at most 128 x 128, a BF16 D through the TMA
    epilogue) whose tiles have 4 or more K blocks but no more than the stages that fit takes as many stages as K
    blocks, at compile-time offsets; nowhere else."""
    config = choose_config(m, n, k, H100, **fields)
    if stages is None:
        assert not config.constant_stages
    else:
        assert config.constant_stages and config.stages == stages and config.persistent


def test_one_sm_takes_no_pair_split():
    """A device (or set_num_sms) of one SM has no half to choose tiles for: the rule stands aside (no division by
    zero) at the shapes where it applies on 132 SMs."""
    one = DeviceFacts(1, H100.shared_limit, "one SM", H100.l2_bytes)
    for n in (8, 16, 32, 2112):
        config = choose_config(64, n, 4096, one)
        assert config.split_k == 1


@pytest.mark.parametrize("m, n, k, out_dtype, lead", [
    (16, 2112, 7168, "bf16", 2), (1, 2112, 7168, "bf16", 2),  # swapped tiles split over three
    (32, 4096, 7168, "bf16", 0), (16, 4096, 7168, "bf16", 0),  # swapped pairs: even (a lead measured no gain)
    (64, 2112, 7168, "bf16", 2), (128, 4096, 7168, "bf16", 2),  # unswapped pairs
    (16, 2112, 7168, "f32", 0), (16, 2100, 7168, "bf16", 0),  # FP32 D, staged epilogue: even shares (unmeasured)
    (4096, 4096, 7168, "bf16", 0), (64, 7168, 16384, "bf16", 0),  # no split
])
def test_production_splits_lead_with_rank_zero_where_measured(m, n, k, out_dtype, lead):
    """SPLIT_K_LEAD: production's BF16 TMA-epilogue splits give rank 0 two more K blocks, but for swapped tiles
    split over a pair; the others keep even shares (and a config that does not split has no lead to give)."""
    config = choose_config(m, n, k, H100, out_dtype=out_dtype)
    assert config.split_k_lead == (SPLIT_K_LEAD if lead else 0), config.describe()
    assert (config.split_k > 1) or not config.split_k_lead


@pytest.mark.parametrize("m, n, k, tall", [
    (8192, 8192, 8192, True), (8192, 8192, 4096, True), (16384, 7168, 7168, True), (4096, 16384, 7168, True),
    (6144, 7168, 7168, False),  # 256 x 128 would take 4.8% more modelled work: measured a tie, the model keeps 128 x 192
    (4096, 2112, 7168, False),  # three waves either way, a third more work as 256 x 128
    (8192, 8192, 2048, False),  # short K: not measured
    (8192, 8192, 16384, False),  # from D_BUFFER_MIN_K the 256 x 128 tile stores D in passes: not measured
])
def test_power_capped_walks_take_256x128_tiles_where_measured(m, n, k, tall):
    """power_capped_block: a long-K walk of several waves that the model gives 128 x 192 takes 256 x 128 where that
    is within TALL_TILE_MAX_EXTRA_WORK of the modelled work; the FP32 D (whose 256 x 128 tile does not fit) keeps
    the model's choice."""
    config = choose_config(m, n, k, H100)
    assert (config.block_m, config.block_n) == ((256, 128) if tall else (128, 192)), config.describe()
    assert config.even_waves == (k >= EVEN_WAVES_MIN_K)
    f32 = choose_config(m, n, k, H100, out_dtype="f32")
    assert (f32.block_m, f32.block_n) != (256, 128), f32.describe()
