"""``python -m gemm bench dense``: ours beside every peer in one run: the same inputs, the same timer, interleaved.

    python -m gemm bench dense                    # ours and cuBLAS blockwise on the bench shapes
    python -m gemm bench dense --grouped \\
        --deepgemm deepgemm-2504=/tmp/peers/deepgemm-2504 --deepgemm deepgemm-2507=/tmp/peers/deepgemm-2507

Per shape, every contender is checked first (NaN-poisoned output, sampled rows against float64), then timed by
:func:`gemm.testing.timer.bench_kernel` in the order A-B-C-D-D-C-B-A (``--rounds 2``) and the best of its
timings kept: this GPU's clock moves with heat, and the palindrome gives every contender the same share of it.
Beside the ratio of bests, each row has ours' speed against each peer round by round (``ours_paired``: median,
low, high of the peer's time over ours in the same round; ``ours_vs_best_deepgemm_paired``, the lowest median over
the DeepGEMMs): bests compare each contender's luckiest moment, and one kernel under two names measured up to 4%
apart that way (``results/sweep_aa_warmup0.json``).
DeepGEMM releases run in child processes (:mod:`gemm.testing.deepgemm_peer`), one tree each, fed the same bytes.
Writes ``results/gemm_bench.json``: one row per shape, ``{"M", "N", "K", "tflops": {name: ...}, "gbs": {...},
"us": {...}, "diff": {...}}`` (grouped rows add ``"layout"`` and ``"groups"``, M per group), the device, clocks
and versions, the summary, and the host time per call.
"""
from __future__ import annotations

import argparse
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from gemm.testing.bench_dense import BENCH_SHAPES, parse_shapes
from gemm.testing.bench_grouped import grouped_problem, grouped_shapes
from gemm.testing.deepgemm_peer import DeepGemmProcess, dense_payload, parse_deepgemm, start_peers
from gemm.testing.l2_flush import FLUSHES
from gemm.testing.peers import CublasBlockwise
from gemm.testing.problems import (TorchProblem, check_rows, flops, gemm_bytes, poison_torch, random_problem,
                                   reference_rows, torch_output_parts)
from gemm.testing.records import Column, command_line, device_info, format_table, write_result
from gemm.testing.timer import bench_kernel, paired_speeds, palindrome

OURS, CUBLAS = "ours", "cublas"
LABELS = {CUBLAS: "cuBLAS"}  # column and legend names; a DeepGEMM tree's is the name it was given
TIMING = ("CUDA-graph replay of (256 MiB L2 flush: {flush}; call) pairs minus flushes only, median of 5; contenders "
          "interleaved A-B-C-D-D-C-B-A per shape after {warmup} untimed pass(es), best of the rounds kept; paired: "
          "ratios round by round, median")
RESULT_FILES = {"memset": "gemm_bench", "clean": "gemm_bench_clean_l2"}  # per flush (gemm.testing.l2_flush)


@dataclass
class Contender:
    """One implementation on one problem: ``check()`` -> {unwritten, diff, correct}; ``time()`` -> the timer's
    fields (median_us, min_us, ...)."""
    name: str
    check: Callable[[], dict]
    time: Callable[[], dict]


def _local(name: str, launch, out, reference, timer, rows_in_use=None) -> Contender:
    """A contender in this process: ``launch(stream)`` enqueues one call; ``rows_in_use()``: the part of ``out`` the
    call defines (masked grouped: each group's rows in use), all of it by default."""
    import torch

    def check():
        poison_torch(out)
        launch(torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        return check_rows(*torch_output_parts(rows_in_use() if rows_in_use else out, reference.rows), reference)

    def timed():
        timing = timer(launch)
        return {"median_us": timing.median_us, "min_us": timing.min_us}
    return Contender(name, check, timed)


def _remote(process: DeepGemmProcess, key, payload: dict, reference, flush: str = "memset") -> Contender:
    process.load(key, payload)
    return Contender(process.tree.name, lambda: check_rows(*process.check(key, reference.rows), reference),
                     lambda: process.time(key, flush))


def run_contenders(row: dict, make: list[tuple[str, Callable[[], Contender]]], flop_count: int, byte_count: int,
                   rounds: int, warmup: int = 0) -> dict:
    """Build and check every contender, time them interleaved, and fill ``row``; a contender that fails is an
    entry in ``row["errors"]`` (ours failing or wrong makes the row's status), never an exception."""
    contenders, errors = [], {}
    for name, build in make:
        try:
            contender = build()
            check = contender.check()
            row.setdefault("diff", {})[name] = check["diff"]
            if not check["correct"]:
                raise ValueError(f"wrong output: {check['unwritten']} elements unwritten, diff {check['diff']:.2e}")
            contenders.append(contender)
        except Exception as error:  # a row field: the run goes on
            errors[name] = f"{type(error).__name__}: {error}"
    for _ in range(warmup):  # untimed: the checks left the GPU idle, and its first kernels run at a higher clock
        for contender in contenders:
            try:
                contender.time()
            except Exception as error:  # recorded; the rounds still time it, as they do after a failed round
                errors[contender.name] = f"{type(error).__name__}: {error}"
    best: dict[str, float] = {}
    times: dict[str, list] = {c.name: [] for c in contenders}
    for contender in palindrome(contenders, rounds):
        try:
            median = contender.time()["median_us"]
            best[contender.name] = min(best.get(contender.name, math.inf), median)
        except Exception as error:
            median = None
            errors[contender.name] = f"{type(error).__name__}: {error}"
        times[contender.name].append(median)
    row["us"] = best
    row["round_us"] = times
    if OURS in times:  # ours' speed against each peer, round by round (gemm.testing.timer.paired_speeds)
        paired = {peer: paired_speeds({peer: own, OURS: times[OURS]}, peer).get(OURS)
                  for peer, own in times.items() if peer != OURS}
        row["ours_paired"] = {peer: speed for peer, speed in paired.items() if speed}
    row["tflops"] = {name: flop_count / us / 1e6 for name, us in best.items()}
    row["gbs"] = {name: byte_count / us / 1e3 for name, us in best.items()}
    if errors:
        row["errors"] = errors
    row["status"] = ("ok" if OURS in best else "WRONG" if "wrong output" in errors.get(OURS, "") else "failed")
    deepgemm = [v for name, v in row["tflops"].items() if name not in (OURS, CUBLAS)]
    if OURS in row["tflops"] and deepgemm:
        row["ours_vs_best_deepgemm"] = row["tflops"][OURS] / max(deepgemm)
    paired_deepgemm = [s["median"] for name, s in row.get("ours_paired", {}).items() if name != CUBLAS]
    if paired_deepgemm:  # against the DeepGEMM ours is slowest against, each ratio taken round by round
        row["ours_vs_best_deepgemm_paired"] = min(paired_deepgemm)
    if OURS in row["tflops"] and CUBLAS in row["tflops"]:
        row["ours_vs_cublas"] = row["tflops"][OURS] / row["tflops"][CUBLAS]
    return row


def dense_row(m: int, n: int, k: int, rng, deepgemm: list[DeepGemmProcess], *, with_cublas: bool = True,
              rounds: int = 2, flush: str = "memset", warmup: int = 0) -> dict:
    from gemm.api import fp8_gemm_nt
    timer = functools.partial(bench_kernel, flush=flush)
    a, sa, b, sb = random_problem(m, n, k, rng)
    reference = reference_rows(a, sa, b, sb, rng)
    row = {"M": m, "N": n, "K": k}

    def ours():
        problem = TorchProblem.from_host(a, sa, b, sb)
        return _local(OURS, lambda stream: fp8_gemm_nt((problem.a, problem.sa), (problem.b, problem.sb), problem.out,
                                                       stream=stream), problem.out, reference, timer)

    def cublas():
        peer = CublasBlockwise(a, sa, b, sb)
        return _local(CUBLAS, peer.launch, peer.out, reference, timer)

    make = [(OURS, ours)] + ([(CUBLAS, cublas)] if with_cublas else [])
    payload = dense_payload(a, sa, b, sb) if deepgemm else None
    make += [(p.tree.name, lambda p=p: _remote(p, (m, n, k), payload, reference, flush)) for p in deepgemm]
    try:
        return run_contenders(row, make, flops(m, n, k), gemm_bytes(m, n, k), rounds, warmup)
    finally:
        for process in deepgemm:
            _drop(process, (m, n, k))


def grouped_row(layout: str, groups: int, m: int, n: int, k: int, rng, deepgemm: list[DeepGemmProcess], *,
                rounds: int = 2, flush: str = "memset", warmup: int = 0) -> dict:
    """A grouped shape: ours and each DeepGEMM (cuBLAS has no grouped FP8 GEMM with these scales)."""
    timer = functools.partial(bench_kernel, flush=flush)
    row = {"layout": layout, "groups": groups, "M": m, "N": n, "K": k}
    try:
        problem = grouped_problem(layout, groups, m, n, k, rng)
    except Exception as error:
        row.update(status="failed", errors={OURS: f"{type(error).__name__}: {error}"})
        return row
    key = (layout, groups, m, n, k)
    make = [(OURS, lambda: _local(OURS, problem.launch, problem.out, problem.reference, timer, problem.rows_in_use))]
    make += [(p.tree.name, lambda p=p: _remote(p, key, problem.payload, problem.reference, flush)) for p in deepgemm]
    try:
        return run_contenders(row, make, problem.flop_count, problem.byte_count, rounds, warmup)
    finally:
        for process in deepgemm:
            _drop(process, key)


def _drop(process: DeepGemmProcess, key) -> None:
    try:
        process.drop(key)
    except RuntimeError:
        pass  # the process is gone; its rows already say why


def summarize(rows: list[dict]) -> dict:
    """Geomean, count at or above 1.0 and lowest of ours/best DeepGEMM and ours/cuBLAS over the rows that have them."""
    summary = {}
    for key in ("ours_vs_best_deepgemm", "ours_vs_best_deepgemm_paired", "ours_vs_cublas"):
        ratios = [r[key] for r in rows if r.get(key)]
        if ratios:
            summary[key] = {"geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)), "shapes": len(ratios),
                            "at_or_above": sum(r >= 1.0 for r in ratios), "lowest": min(ratios)}
    return summary


# -------------------------------------------------------------------------------------------- output
def table_rows(rows: list[dict], names: list[str]) -> list[dict]:
    """Nested result rows -> flat rows for :func:`format_table`."""
    flat = []
    for row in rows:
        shape = (f"{row['layout']} {row['groups']}x" if "layout" in row else "") + f"{row['M']}x{row['N']}x{row['K']}"
        paired = row.get("ours_vs_best_deepgemm_paired")
        entry = {"shape": shape, "status": row.get("status"), "vs_dg": row.get("ours_vs_best_deepgemm"),
                 "vs_dg_paired": None if paired is None else f"{paired:.3f}",
                 "vs_cublas": row.get("ours_vs_cublas"), "ours_gbs": row.get("gbs", {}).get(OURS),
                 "diff": row.get("diff", {}).get(OURS)}
        entry.update({f"tflops {name}": row.get("tflops", {}).get(name) for name in names})
        flat.append(entry)
    return flat


def columns(names: list[str], rows: list[dict] = ()) -> list[Column]:
    """The table's columns; "paired" (ours / the DeepGEMM it is slowest against, the median of round-by-round
    ratios) when ``rows`` have it (results written before the paired ratio existed do not)."""
    paired = any("ours_vs_best_deepgemm_paired" in row for row in rows)
    return ([Column("shape", "shape", align="left")]
            + [Column(f"tflops {name}", f"{LABELS.get(name, name)} TFLOP/s", "{:.0f}") for name in names]
            + [Column("ours_gbs", "ours GB/s", "{:.0f}"), Column("vs_dg", "ours/best DeepGEMM", "{:.2f}x")]
            + ([Column("vs_dg_paired", "paired", align="right")] if paired else [])
            + [Column("vs_cublas", "ours/cuBLAS", "{:.2f}x"), Column("diff", "ours diff", "{:.1e}"),
               Column("status", "status", align="left")])


def contender_names(rows: list[dict]) -> list[str]:
    names = [OURS]
    for row in rows:
        for name in list(row.get("tflops", {})) + list(row.get("errors", {})):
            if name not in names:
                names.append(name)
    return names


def describe_summary(summary: dict) -> str:
    parts = []
    for key, label in (("ours_vs_best_deepgemm", "ours / best DeepGEMM"),
                       ("ours_vs_best_deepgemm_paired", "paired round by round"), ("ours_vs_cublas", "ours / cuBLAS")):
        if key in summary:
            s = summary[key]
            parts.append(f"{label}: geomean {s['geomean']:.3f} over {s['shapes']} shapes, {s['at_or_above']} at or "
                         f"above 1.00, lowest {s['lowest']:.3f}")
    return "; ".join(parts)


def plot(rows: list[dict], path: Path, *, title: str) -> None:
    """Grouped bars: every contender's TFLOP/s per shape (log scale: M=1 and M=4096 differ a thousandfold)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = contender_names(rows)
    labels = [r["shape"] for r in table_rows(rows, names)]
    x = np.arange(len(rows))
    width = 0.8 / len(names)
    colors = {OURS: "#3b75af", CUBLAS: "#888888"}
    fig, ax = plt.subplots(figsize=(0.7 * len(rows) + 3, 4.8))
    for index, name in enumerate(names):
        ax.bar(x - 0.4 + (index + 0.5) * width, [r.get("tflops", {}).get(name) or 0 for r in rows], width=width,
               label=LABELS.get(name, name), color=colors.get(name))
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("TFLOP/s (log scale)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -------------------------------------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", type=parse_shapes, default=BENCH_SHAPES,
                        help='"bench" (the 18 DeepSeek shapes, 8192^3, and decode / prefill spots; default), '
                             '"deepseek" (the 18) or "M,N,K;M,N,K;..."')
    parser.add_argument("--grouped", action="store_true",
                        help="add the MoE grouped shapes (contiguous, masked, masked decode) to the run and the "
                             "file")
    parser.add_argument("--deepgemm", type=parse_deepgemm, action="append", default=[], metavar="NAME=FOLDER",
                        help="a DeepGEMM release tree to time beside ours (repeat for several), e.g. "
                             "deepgemm-2504=/tmp/peers/deepgemm-2504")
    parser.add_argument("--no-cublas", action="store_true", help="leave cuBLAS out")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds per shape (default 2)")
    parser.add_argument("--warmup", type=int, default=1, metavar="PASSES",
                        help="untimed passes over the contenders before the rounds (default 1: without it the "
                             "contender timed first runs on a GPU cooled by the checks, and its best is that)")
    parser.add_argument("--warm-processes", type=int, default=None,
                        help="parallel DeepGEMM compile processes before timing (default: the CPU count)")
    parser.add_argument("--flush", choices=FLUSHES, default="memset",
                        help="how the L2 is emptied before each timed call: memset (leaves it dirty, as DeepGEMM's "
                             "bench does; default, writes gemm_bench.json) or clean (a read pass; writes "
                             "gemm_bench_clean_l2.json); see gemm/testing/l2_flush.py")
    parser.add_argument("--out", type=Path, default=Path("results"),
                        help="folder for gemm_bench.json (gemm_bench_clean_l2.json with --flush clean)")
    parser.add_argument("--no-overhead", action="store_true", help="skip the host-time measurement")


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from gemm.testing.bench_host import describe_overhead, host_overhead
    rng = np.random.default_rng()
    grouped = grouped_shapes() if args.grouped else []
    jobs = [("dense", 1, m, n, k) for m, n, k in args.shapes] + [tuple(g) for g in grouped]
    processes = start_peers(args.deepgemm, jobs, warm_processes=args.warm_processes)
    rows = []
    try:
        for m, n, k in tqdm(args.shapes, desc="gemm bench dense", unit="shape"):
            rows.append(dense_row(m, n, k, rng, processes, with_cublas=not args.no_cublas, rounds=args.rounds,
                                  flush=args.flush, warmup=args.warmup))
            tqdm.write(_progress_line(rows[-1]))
            torch.cuda.empty_cache()
        for layout, groups, m, n, k in tqdm(grouped, desc="grouped", unit="shape"):
            rows.append(grouped_row(layout, groups, m, n, k, rng, processes, rounds=args.rounds, flush=args.flush,
                                    warmup=args.warmup))
            tqdm.write(_progress_line(rows[-1]))
            torch.cuda.empty_cache()
    finally:
        for process in processes:
            process.close()
    names = contender_names(rows)
    print(format_table(columns(names, rows), table_rows(rows, names)))
    summary = summarize(rows)
    print(describe_summary(summary))
    for row in rows:
        for name, error in row.get("errors", {}).items():
            print(f"{row['M']}x{row['N']}x{row['K']} {name}: {error}")
    overhead = None if args.no_overhead or args.no_cublas else host_overhead()
    if overhead:
        print(describe_overhead(overhead, unit="us"))
    device = device_info()
    path, chart = (args.out / (RESULT_FILES[args.flush] + suffix) for suffix in (".json", ".png"))
    write_result(path, command=command_line("gemm"), rows=rows, device=device, summary=summary,
                 peers={p.tree.name: {"path": str(p.tree.path), "module": p.version} for p in processes},
                 host_overhead=overhead, timing=TIMING.format(flush=args.flush, warmup=args.warmup), flush=args.flush)
    try:
        plot(rows, chart, title=f"{device.get('name', 'GPU')}: TFLOP/s per shape, same run, L2 flush: {args.flush}")
    except Exception as error:  # the JSON is the result; the chart is a view of it
        print(f"no chart: {type(error).__name__}: {error}")
    print(f"wrote {path} and {chart}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def _progress_line(row: dict) -> str:
    shape = (f"{row['layout']} G={row['groups']} " if "layout" in row else "") + f"{row['M']}x{row['N']}x{row['K']}"
    timings = ", ".join(f"{name} {value:.0f}" for name, value in row.get("tflops", {}).items())
    return f"{shape}: {timings} TFLOP/s {row.get('status')}"


__all__ = ["Contender", "run_contenders", "dense_row", "grouped_row", "summarize", "table_rows", "columns", "plot",
           "add_arguments", "run"]
