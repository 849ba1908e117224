"""L2 eviction priorities of the producer's TMA loads (KernelConfig.a_eviction / b_eviction; createpolicy +
.L2::cache_hint): the PTX and SASS they emit, the emulator running every loading path with them exactly (one CTA's
loads, a multicast pair's, split K, swap AB, the masked groups, wgrad's 1x128 B scales), the emulator refusing a
hinted load without a policy, the production rule (one row of tiles reads B once), and the GPU against float64."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from gemm.kernel import KernelConfig, generate
from ptx.vocab import bulk_copies

sys.path.insert(0, str(Path(__file__).parent))
from tc_checks import assert_exact, small_integer_problem  # noqa: E402
from test_grouped import check_masked, masked_problem  # noqa: E402
from test_wgrad import integer_wgrad_problem, reference_wgrad  # noqa: E402

HINTED_LOAD = re.compile(r"cp\.async\.bulk\.tensor\.2d\.\S*\.L2::cache_hint \[[^\]]*\], \[(%tmap_\w+?)_\d+, .*\], "
                         r"(%\w+);")


def hinted_loads(ptx: str) -> dict[str, set[str]]:
    """{tensor map: the policy registers its hinted loads name}, and every policy register created, with its
    priority, under the key "created"."""
    found: dict[str, set[str]] = {}
    for tmap, policy in HINTED_LOAD.findall(ptx):
        found.setdefault(tmap.lstrip("%"), set()).add(policy)
    found["created"] = set(re.findall(r"createpolicy\.fractional\.L2::evict_(\w+)\.b64 (%\w+), 1\.0;", ptx))
    return found


def test_the_vocabulary_names_the_priority_and_the_policy_operand():
    assert bulk_copies.create_l2_policy("%p", "first") == "createpolicy.fractional.L2::evict_first.b64 %p, 1.0;"
    with pytest.raises(ValueError, match=r"one of \('normal', 'first', 'last'\), got 'early'"):
        bulk_copies.create_l2_policy("%p", "early")
    plain = bulk_copies.tma_load_2d("%s", "%t", 0, "%y", "%m")
    hinted = bulk_copies.tma_load_2d("%s", "%t", 0, "%y", "%m", "%p")
    assert "cache_hint" not in plain and hinted == plain.replace("bytes ", "bytes.L2::cache_hint ")[:-1] + ", %p;"
    assert bulk_copies.tma_load_2d_multicast("%s", "%t", 0, "%y", "%m", "%mask", "%p").endswith(
        "multicast::cluster.L2::cache_hint [%s], [%t, {0, %y}], [%m], %mask, %p;")


@pytest.mark.parametrize("fields, words", [
    (dict(b_eviction="first_please"), "b_eviction must be one of"),
    (dict(a_eviction="none"), "a_eviction must be one of"),
    (dict(b_eviction="first", producer="inline", persistent=False, registers=None, raster_group=0),
     "producer='warpgroup'"),
])
def test_misuse_is_named(fields, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        KernelConfig(**fields)


def test_each_operand_takes_its_own_policy_and_normal_emits_none():
    """B's and sb's loads name the evict_first policy, A's and sa's the evict_last one; "normal" emits the PTX of
    a config without the fields (so production kernels that read B more than once are unchanged)."""
    base = KernelConfig(stages=3)
    assert generate(base, 4096, 512) == generate(base.replace(a_eviction="normal", b_eviction="normal"), 4096, 512)
    assert "cache_hint" not in generate(base, 4096, 512)
    found = hinted_loads(generate(base.replace(a_eviction="last", b_eviction="first"), 4096, 512))
    created = dict(found.pop("created"))
    assert set(created) == {"first", "last"}
    assert found == {"tmap_a": {created["last"]}, "tmap_sa": {created["last"]}, "tmap_b": {created["first"]}}
    only_b = hinted_loads(generate(base.replace(b_eviction="first"), 4096, 512))
    assert set(only_b) == {"tmap_b", "created"}


def test_production_hints_b_where_one_row_of_tiles_reads_it_once():
    from gemm.heuristics import choose_config, reads_b_once
    for m, n, k in [(1, 7168, 2048), (16, 2112, 7168), (64, 7168, 16384), (64, 32768, 512), (128, 32768, 512)]:
        config = choose_config(m, n, k)
        assert reads_b_once(m, config) and config.b_eviction == "first" and config.a_eviction == "normal", (m, n, k)
        assert "tmap_b" in hinted_loads(generate(config, n, k))
    for m, n, k in [(129, 7168, 2048), (4096, 7168, 16384), (4096, 4096, 7168)]:
        config = choose_config(m, n, k)
        assert config.b_eviction == "normal" and "cache_hint" not in generate(config, n, k), (m, n, k)


def test_production_hints_the_swapped_masked_kernels_only():
    """MoE decode (expected_m <= 32, swapped): each expert's weight is read once; the unswapped masked kernels and
    the contiguous layout (measured neither way) keep their loads unhinted."""
    from gemm.heuristics import choose_grouped_config
    assert choose_grouped_config("masked", 32, 4096, 7168, 16).b_eviction == "first"
    assert choose_grouped_config("masked", 16, 7168, 2048, 8).b_eviction == "first"
    assert choose_grouped_config("masked", 64, 7168, 2048, 8).b_eviction == "normal"
    assert choose_grouped_config("contiguous", 4 * 8192, 4096, 7168, 4).b_eviction == "normal"


def test_the_sass_loads_carry_the_policy():
    """ptxas keeps the hint: each UTMALDG of a hinted config takes a cache-policy descriptor operand."""
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble
    for config, hinted in [(KernelConfig(stages=3), 0), (KernelConfig(stages=3, b_eviction="first"), 1),
                           (KernelConfig(stages=3, a_eviction="last", b_eviction="first"), 3)]:
        loads = [i.text for i in disassemble(compile_ptx(generate(config, 4096, 512))) if i.opcode == "UTMALDG"]
        assert len(loads) == 3 and sum("desc[" in text for text in loads) == hinted, loads


CASES = {  # (M, N, K, fields): each path that issues TMA loads, several tiles per CTA
    "one CTA's loads, the ring wrapping": (300, 416, 640, dict(stages=3)),
    "a multicast pair": (300, 416, 256, dict(stages=4, multicast=2)),
    "split over three CTAs, swap AB": (9, 200, 1024, dict(stages=4, swap_ab=True, block_m=16, block_n=64, split_k=3,
                                                          persistent=False, raster_group=0)),
    "compile-time slots": (130, 200, 512, dict(stages=4, constant_stages=True, block_n=64)),
}


@pytest.mark.parametrize("a_eviction", ["normal", "last"])
@pytest.mark.parametrize("name", list(CASES))
def test_hinted_loads_on_the_emulator(name, a_eviction, rng):
    from gemm.testing.emulated import run_gemm
    m, n, k, fields = CASES[name]
    config = KernelConfig(b_eviction="first", a_eviction=a_eviction, **fields)
    problem = small_integer_problem(m, n, k, rng)
    assert_exact(run_gemm(config, *problem, sm_count=3, seed=int(rng.integers(1000))), problem)


def test_hinted_masked_groups_on_the_emulator(rng):
    from gemm.testing.emulated import run_grouped_gemm
    config = KernelConfig(gemm_type="masked", block_m=64, block_n=64, stages=3, raster_group=0, b_eviction="first")
    groups, m_max, n, k = 3, 130, 200, 384
    masked_m = rng.permutation([0, m_max, int(rng.integers(1, m_max))]).astype(np.int32)
    problem = masked_problem(groups, m_max, n, k, rng)
    check_masked(run_grouped_gemm(config, *problem, masked_m, sm_count=3, seed=int(rng.integers(1000))), *problem,
                 masked_m)


def test_hinted_1x128_scales_on_the_emulator(rng):
    """wgrad's fourth copy (the stage's B scales) takes B's policy."""
    from gemm.testing.emulated import run_gemm
    m, n, k = 200, 232, 400
    config = KernelConfig(block_m=128, block_n=128, stages=2, out_dtype="f32", b_scales="1x128", raster_group=2,
                          b_eviction="first", a_eviction="last")
    assert "tmap_sb" in hinted_loads(generate(config, n, None))
    problem = integer_wgrad_problem(m, n, k, rng)
    got = run_gemm(config, *problem, sm_count=3, seed=int(rng.integers(1000)))
    assert np.array_equal(got, reference_wgrad(*problem).astype(np.float32))


def test_the_emulator_refuses_a_hint_without_a_policy(rng):
    """A hinted load whose last operand did not come from createpolicy is named, not run."""
    from gemm.testing.emulated import run_gemm
    from ptx.emulate import EmulationError
    config = KernelConfig(stages=2, block_n=64, b_eviction="first")
    original = generate(config, 200, 256)
    policy = re.search(r"createpolicy\.\S+ (%\w+), 1\.0;", original)
    broken = original.replace(policy.group(0), f"mov.b64 {policy.group(1)}, 0;")
    problem = small_integer_problem(130, 200, 256, rng)
    with pytest.raises(EmulationError, match="cache policy made by createpolicy"):
        run_gemm(config, *problem, sm_count=1, ptx=broken)


GPU_CASES = [  # (M, N, K, config fields): ragged, at real sizes, the production paths that take the hint
    (1, 7168, 2048, None),  # production: swap AB, 8-row tiles
    (13, 2112, 7168, None),  # production: swap AB, K split over three
    (65, 32768, 512, dict(block_m=128, block_n=128, stages=4, constant_stages=True)),
    (100, 7168, 16384, None),  # production: 128x56, two K blocks in flight
    (300, 7168, 2048, dict(block_m=128, block_n=128, stages=4, multicast=2, a_eviction="last")),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, fields", GPU_CASES)
def test_hinted_loads_on_the_gpu(m, n, k, fields, rng):
    """Against the float64 reference from the dequantized inputs (DeepGEMM's diff < 1e-3), every element written
    (NaN-poisoned D), fresh random inputs."""
    from gemm.heuristics import choose_config
    from gemm.testing.problems import random_problem
    from tc_checks import check_against_reference, run_on_gpu
    from test_generator import _configured
    config = choose_config(m, n, k) if fields is None else KernelConfig(b_eviction="first", **fields)
    assert config.b_eviction == "first"
    a, sa, b, sb = random_problem(m, n, k, rng)
    check_against_reference(run_on_gpu(_configured(config), a, sa, b, sb), a, sa, b, sb, rng)


def test_bench_grouped_beside_keeps_each_configs_best_ok_round(monkeypatch, tmp_path):
    """`python -m gemm bench grouped --beside` (the masked rows above) on the CPU, its GPU measurement replaced: the
    rounds alternate their order, each config keeps its fastest correct round (a faster WRONG one never wins), the
    ratio is production's time over the other's, and the rows land in grouped_beside_<flush>.json."""
    import json
    from gemm.testing import bench_grouped
    order, times = [], iter([10.0, 12.0, 11.0, 9.0, 8.0, 13.0])

    def measured(layout, groups, m, n, k, rng, timer=None, config=None):
        order.append(config.b_eviction)
        status = "WRONG" if (config.b_eviction, len(order)) == ("first", 5) else "ok"
        return {"layout": layout, "groups": groups, "ours_us": next(times), "status": status}
    monkeypatch.setattr(bench_grouped, "measure_grouped", measured)
    rows = bench_grouped.beside_bench("b_eviction=normal", [("masked", 8, 16, 7168, 2048)], 3, "clean", tmp_path)
    assert order == ["first", "normal", "normal", "first", "first", "normal"]
    production, other = rows
    assert (production["ours_us"], other["ours_us"]) == (9.0, 11.0)  # 8.0 was a WRONG round of production's
    assert other["vs_production"] == 9.0 / 11.0 and other["name"] == "production:b_eviction=normal"
    # round by round: (10 / 12, 9 / 11); the third round's production was WRONG and has no ratio
    assert production["round_us"] == [10.0, 9.0, None] and other["round_us"] == [12.0, 11.0, 13.0]
    assert other["vs_production_paired"]["rounds"] == 2
    assert other["vs_production_paired"]["median"] == pytest.approx((10 / 12 + 9 / 11) / 2)
    written = json.loads((tmp_path / "grouped_beside_clean.json").read_text())
    assert written["flush"] == "clean" and len(written["rows"]) == 2


def test_bench_grouped_beside_warms_up_and_says_where_the_fields_do_not_apply(monkeypatch, tmp_path):
    """A warm-up pass runs both configs untimed before the rounds; a masked walk cannot take even_waves (its grid
    is sized by counts the device holds): that shape is an n/a row saying why, and the contiguous one is timed."""
    from gemm.testing import bench_grouped
    calls = []

    def measured(layout, groups, m, n, k, rng, timer=None, config=None):
        calls.append((layout, config.even_waves))
        return {"layout": layout, "groups": groups, "ours_us": 10.0, "status": "ok"}
    monkeypatch.setattr(bench_grouped, "measure_grouped", measured)
    rows = bench_grouped.beside_bench("even_waves=True", [("masked", 8, 16, 7168, 2048),
                                                          ("contiguous", 8, 4096, 4096, 7168)], 2, "memset", None,
                                      warmup=1)
    skipped = rows[0]
    assert skipped["layout"] == "masked" and skipped["status"].startswith("n/a: even_waves=True")
    assert calls == [("contiguous", False), ("contiguous", True),  # the warm-up pass
                     ("contiguous", False), ("contiguous", True), ("contiguous", True), ("contiguous", False)]
    assert [r["status"] for r in rows[1:]] == ["ok", "ok"] and len(rows[1]["round_us"]) == 2


def test_bench_grouped_options_of_beside_alone_are_refused():
    from argparse import Namespace
    from gemm.testing.bench_grouped import run
    with pytest.raises(SystemExit, match="go with --beside"):
        run(Namespace(beside=None, masked_decode=True, rounds=None, flush=None, warmup=None, out=None))
    with pytest.raises(SystemExit, match="go with --beside"):
        run(Namespace(beside=None, masked_decode=False, rounds=None, flush=None, warmup=2, out=None))
