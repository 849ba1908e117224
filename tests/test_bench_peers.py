"""The same-run peer benchmark without a GPU: the DeepGEMM child process protocol (driven through a CPU stand-in
tree with DeepGEMM's API), the interleaved timing order, the result rows and their summary."""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gemm.testing import bench_peers, deepgemm_peer
from gemm.testing.problems import random_problem, reference_gemm, reference_rows, Reference

FAKE_TREE = Path(__file__).parent / "data" / "fake_deepgemm"


def test_a_folder_without_deep_gemm_is_refused_by_name(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match=r"--deepgemm .*deep_gemm/__init__.py"):
        deepgemm_peer.parse_deepgemm(f"dg={tmp_path}")
    tree = deepgemm_peer.parse_deepgemm(f"fake-dg={FAKE_TREE}")
    assert tree.name == "fake-dg" and tree.path == FAKE_TREE.resolve()
    assert deepgemm_peer.parse_deepgemm(str(FAKE_TREE)).name == "fake_deepgemm"  # no NAME=: the folder's name


@pytest.fixture
def fake_process(tmp_path):
    pytest.importorskip("torch")
    process = deepgemm_peer.DeepGemmProcess(deepgemm_peer.parse_deepgemm(f"fake={FAKE_TREE}"), device="cpu",
                                            cache_root=tmp_path)
    yield process
    process.close()


def test_a_deepgemm_child_gets_the_same_bytes_and_is_checked(fake_process, rng):
    assert str(FAKE_TREE) in fake_process.version  # the child imported the tree it was given
    a, sa, b, sb = random_problem(130, 256, 384, rng)  # ragged M
    reference = reference_rows(a, sa, b, sb, rng)
    fake_process.load("k", deepgemm_peer.dense_payload(a, sa, b, sb))
    from gemm.testing.problems import check_rows
    check = check_rows(*fake_process.check("k", reference.rows), reference)
    assert check["correct"] and check["unwritten"] == 0 and check["diff"] < 1e-4, check
    with pytest.raises(RuntimeError, match=r"fake: .*(CUDA|cuda|Torch not compiled)"):
        fake_process.time("k")  # a CPU tree cannot be timed: the error names the tree and the process goes on
    fake_process.drop("k")
    with pytest.raises(RuntimeError, match="fake: KeyError"):
        fake_process.check("k", reference.rows)


@pytest.mark.parametrize("layout", ["contiguous", "masked"])
def test_grouped_payloads_reach_deepgemm_in_its_layouts(fake_process, rng, layout):
    groups, m, n, k = 2, 64, 128, 256
    problems = [random_problem(m, n, k, rng) for _ in range(groups)]
    a = np.stack([p[0] for p in problems])
    sa = np.stack([np.asarray(p[1]) for p in problems])
    b = np.stack([p[2] for p in problems])
    sb = np.stack([p[3] for p in problems])
    if layout == "contiguous":
        a, sa, layout_array = a.reshape(groups * m, k), sa.reshape(groups * m, -1), np.repeat(np.arange(groups), m)
    else:
        layout_array = np.full(groups, m)
    payload = deepgemm_peer.grouped_payload(layout, a, sa, b, sb, layout_array, expected_m=m)
    fake_process.load(layout, payload)
    rows = np.array([0, 5, m - 1, m, m + 7, 2 * m - 1])
    values = np.concatenate([reference_gemm(*problems[g][:2], *problems[g][2:])[rows[rows // m == g] % m]
                             for g in range(groups)])
    from gemm.testing.problems import check_rows
    check = check_rows(*fake_process.check(layout, rows), Reference(rows, values, sampled=True))
    assert check["correct"], check


def test_a_wrong_peer_is_caught_and_a_broken_tree_is_named(tmp_path, rng, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("FAKE_DEEPGEMM_WRONG", "1")
    with deepgemm_peer.DeepGemmProcess(deepgemm_peer.parse_deepgemm(f"wrong={FAKE_TREE}"), device="cpu",
                                       cache_root=tmp_path) as process:
        a, sa, b, sb = random_problem(64, 128, 256, rng)
        reference = reference_rows(a, sa, b, sb, rng)
        row = {"M": 64, "N": 128, "K": 256}
        bench_peers.run_contenders(row, [("wrong", lambda: bench_peers._remote(process, 1, deepgemm_peer.dense_payload(
            a, sa, b, sb), reference))], 1, 1, rounds=2)
        assert "wrong output" in row["errors"]["wrong"] and "wrong" not in row["us"]
    broken = tmp_path / "broken"
    (broken / "deep_gemm").mkdir(parents=True)
    (broken / "deep_gemm" / "__init__.py").write_text("raise ImportError('no CUDA here')\n")
    with pytest.raises(RuntimeError, match=r"broken: importing deep_gemm failed: ImportError: no CUDA here"):
        deepgemm_peer.DeepGemmProcess(deepgemm_peer.parse_deepgemm(f"broken={broken}"), device="cpu",
                                      cache_root=tmp_path)


def _contender(name, times, log, correct=True):
    values = iter(times)

    def timed():
        log.append(name)
        return {"median_us": next(values)}
    return name, lambda: bench_peers.Contender(name, lambda: {"correct": correct, "diff": 1e-6, "unwritten": 0},
                                               timed)


def test_contenders_are_timed_in_a_palindrome_and_the_best_kept():
    log = []
    row = bench_peers.run_contenders(
        {"M": 4096, "N": 4096, "K": 7168},
        [_contender("ours", [100.0, 90.0], log), _contender("cublas", [120.0, 130.0], log),
         _contender("dg-a", [95.0, 99.0], log), _contender("dg-b", [110.0, 80.0], log)],
        flop_count=2 * 4096 * 4096 * 7168, byte_count=10 ** 9, rounds=2)
    assert log == ["ours", "cublas", "dg-a", "dg-b", "dg-b", "dg-a", "cublas", "ours"]
    assert row["us"] == {"ours": 90.0, "cublas": 120.0, "dg-a": 95.0, "dg-b": 80.0}
    assert row["tflops"]["ours"] == pytest.approx(2 * 4096 * 4096 * 7168 / 90e-6 / 1e12)
    assert row["gbs"]["ours"] == pytest.approx(1e9 / 90e-6 / 1e9)
    assert row["ours_vs_best_deepgemm"] == pytest.approx(80 / 90) and row["ours_vs_cublas"] == pytest.approx(120 / 90)
    assert row["status"] == "ok" and "errors" not in row
    # round by round: dg-b's 80 us came in the round where ours took 90; in the round before, 110 against 100
    assert row["round_us"]["dg-b"] == [110.0, 80.0]
    assert row["ours_paired"]["dg-b"] == {"median": pytest.approx((1.1 + 80 / 90) / 2), "low": pytest.approx(80 / 90),
                                          "high": pytest.approx(1.1), "rounds": 2}
    assert row["ours_vs_best_deepgemm_paired"] == pytest.approx(min((1.1 + 80 / 90) / 2, (0.95 + 99 / 90) / 2))
    assert "ours_vs_best_deepgemm_paired" in bench_peers.summarize([row])


def test_the_untimed_warmup_pass_never_counts():
    """The contender timed first after the checks runs on a GPU they left idle: at 4096 x 4096 x 7168 on an H200
    ours took 163.8 us in the first round and 171-174 in the next three (results/gemm_bench_h200_no_warmup.json).
    A warm-up pass times every contender once and throws the times away."""
    log = []
    row = bench_peers.run_contenders({"M": 1, "N": 2, "K": 3},
                                     [_contender("ours", [50.0, 100.0, 90.0], log),
                                      _contender("dg", [60.0, 95.0, 97.0], log)], 1, 1, rounds=2, warmup=1)
    assert log == ["ours", "dg", "ours", "dg", "dg", "ours"]
    assert row["us"] == {"ours": 90.0, "dg": 95.0} and row["round_us"] == {"ours": [100.0, 90.0], "dg": [95.0, 97.0]}


def test_a_failed_warmup_is_recorded_and_the_rounds_still_time_the_contender():
    log, calls = [], iter([RuntimeError("cold"), 5.0, 6.0])

    def timed():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return {"median_us": value}
    flaky = ("dg", lambda: bench_peers.Contender("dg", lambda: {"correct": True, "diff": 1e-6, "unwritten": 0}, timed))
    row = bench_peers.run_contenders({"M": 1, "N": 2, "K": 3}, [_contender("ours", [1.0, 4.0, 4.0], log), flaky],
                                     1, 1, rounds=2, warmup=1)
    assert "cold" in row["errors"]["dg"] and row["round_us"]["dg"] == [5.0, 6.0] and row["us"]["dg"] == 5.0


def test_paired_speeds_compare_within_each_round_and_skip_failed_rounds():
    """One kernel timed under two names drifts with the clock the same way in each round: the paired ratio is 1.0
    however far the rounds drift, where the two bests may differ (the luckier round wins)."""
    from gemm.testing.timer import paired_speeds
    times = {"a": [100.0, 110.0, 96.0, 120.0], "b": [100.0, 110.0, None, 120.0], "c": [50.0, 55.0, 48.0, 60.0]}
    speeds = paired_speeds(times, "a")
    assert speeds["b"] == {"median": 1.0, "low": 1.0, "high": 1.0, "rounds": 3}
    assert speeds["c"]["median"] == pytest.approx(2.0) and speeds["c"]["rounds"] == 4
    assert paired_speeds({"a": [1.0], "b": [None]}, "a") == {}


def test_a_failing_contender_is_a_row_field_and_ours_failing_is_the_status():
    log = []

    def broken():
        raise RuntimeError("no such kernel")
    row = bench_peers.run_contenders({"M": 1, "N": 7168, "K": 2048},
                                     [_contender("ours", [5.0, 5.0], log, correct=False), ("dg", broken),
                                      _contender("cublas", [6.0, 6.0], log)], 1, 1, rounds=2)
    assert row["status"] == "WRONG" and "wrong output" in row["errors"]["ours"]
    assert "no such kernel" in row["errors"]["dg"] and list(row["us"]) == ["cublas"]


def test_summary_table_and_chart(tmp_path):
    rows = [{"M": 64, "N": 2112, "K": 7168, "tflops": {"ours": 183, "cublas": 90, "dg": 171}, "gbs": {"ours": 1498},
             "diff": {"ours": 1e-6}, "ours_vs_best_deepgemm": 183 / 171, "ours_vs_cublas": 183 / 90, "status": "ok"},
            {"layout": "masked", "groups": 2, "M": 512, "N": 4096, "K": 7168, "tflops": {"ours": 1213, "dg": 1224},
             "gbs": {"ours": 500}, "ours_vs_best_deepgemm": 1213 / 1224, "status": "ok"},
            {"M": 128, "N": 2112, "K": 7168, "status": "failed", "errors": {"ours": "boom"}}]
    summary = bench_peers.summarize(rows)
    ratios = [183 / 171, 1213 / 1224]
    assert summary["ours_vs_best_deepgemm"]["geomean"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]))
    assert summary["ours_vs_best_deepgemm"]["at_or_above"] == 1 and summary["ours_vs_cublas"]["shapes"] == 1
    assert "geomean" in bench_peers.describe_summary(summary)
    names = bench_peers.contender_names(rows)
    assert names == ["ours", "cublas", "dg"]
    from gemm.testing.records import format_table
    text = format_table(bench_peers.columns(names, rows), bench_peers.table_rows(rows, names))
    assert "masked 2x512x4096x7168" in text and "1.07x" in text and "failed" in text and "paired" not in text
    rows[0]["ours_vs_best_deepgemm_paired"] = 1.0123
    text = format_table(bench_peers.columns(names, rows), bench_peers.table_rows(rows, names))
    assert "paired" in text and "1.012" in text
    pytest.importorskip("matplotlib")
    bench_peers.plot(rows, tmp_path / "bench.png", title="test")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("target", [["gemm.testing.sanitize", "--graph"], ["gemm.testing.deepgemm_peer", "graph"]])
def test_the_ncu_graph_targets_say_what_is_missing_without_a_gpu(target):
    """``--graph`` / ``graph`` (ncu's targets inside the timer's graph, docs/benchmarks.md): no traceback, exit 2."""
    from ptx.device import is_hopper
    if is_hopper():
        pytest.skip("a Hopper GPU is here")
    done = subprocess.run([sys.executable, "-m", *target, "1", "256", "128"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "Hopper GPU" in done.stderr, done.stderr


def test_the_ncu_graph_target_names_a_wrong_flush():
    done = subprocess.run([sys.executable, "-m", "gemm.testing.sanitize", "--graph", "1", "256", "128", "dirty"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "memset, clean" in done.stderr, done.stderr


def test_configs_are_timed_in_a_palindrome_after_untimed_warmup_passes():
    """bench configs' rounds (gemm.testing.bench_configs.timed_rounds): the warm-up passes run every config once,
    untimed, and their (cool-GPU) times never count; then the palindrome, every round's time kept."""
    from types import SimpleNamespace

    from gemm.testing.bench_configs import timed_rounds
    log, times = [], {"a": iter([50.0, 100.0, 90.0]), "b": iter([60.0, 95.0, 97.0])}

    def timer(launch):
        log.append(launch)
        return SimpleNamespace(median_us=next(times[launch]))
    rounds = timed_rounds({"a": "a", "b": "b"}, timer, rounds=2, warmup=1)
    assert log == ["a", "b", "a", "b", "b", "a"]
    assert rounds == {"a": [100.0, 90.0], "b": [95.0, 97.0]}


def test_every_bench_times_in_one_palindrome_order():
    from gemm.testing.timer import palindrome
    assert list(palindrome("abc", 3)) == list("abccbaabc")
    assert list(palindrome(iter("ab"), 2)) == list("abba") and list(palindrome("ab", 0)) == []


def test_a_sweeps_paired_ratio_is_printed_and_drawn_with_its_range():
    from gemm.testing.bench_configs import paired_text
    from lessons.render_docs import sweep_block
    speed = {"median": 1.0123, "low": 0.9981, "high": 1.0302, "rounds": 4}
    assert paired_text(speed) == "1.012 (0.998-1.030)" and paired_text(None) is None
    rows = [{"m": 1, "n": 2, "k": 3, "name": "a", "tflops": 10.0, "vs_first": 1.0},
            {"m": 1, "n": 2, "k": 3, "name": "b", "tflops": 11.0, "vs_first": 1.1, "vs_first_paired": speed}]
    result = {"configs": ["a", "b"], "rows": rows, "device": {}, "date": "today", "command": "python -m gemm ..."}
    assert "1.012x (0.998-1.030)" in sweep_block(result)
    del rows[1]["vs_first_paired"]
    rows.append({"m": 1, "n": 2, "k": 3, "name": "c", "config": "-", "status": "n/a: not this shape"})
    result["configs"].append("c")
    block = sweep_block(result)
    assert "1.10x" in block and block.splitlines()[-1].endswith("| - |")
