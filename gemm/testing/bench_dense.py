"""``python -m gemm bench dense``: the public ``fp8_gemm_nt`` against cuBLAS's blockwise FP8 on the DeepSeek shapes.

    python -m gemm bench dense                              # the 18 DeepSeek-V3 shapes + 8192^3
    python -m gemm bench dense --shapes "64,2112,7168;4096,7168,16384"

Both kernels get the same quantized inputs and the same timer (:func:`gemm.testing.timer.bench_kernel`); each
output is poisoned with NaN before its checked call and compared with the float64 reference. Writes
``results/gemm_bench.json`` (and its chart), with the host time per call (:mod:`gemm.testing.bench_host`).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from gemm.prebuild import MODEL_SHAPES
from gemm.shapes import parse_shape_list
from gemm.testing.peers import time_peer
from gemm.testing.problems import (TorchProblem, check_output, flops, gemm_bytes, poison_torch, random_problem,
                                   reference_rows, torch_bits)
from gemm.testing.records import Column, command_line, device_info, format_table, write_result
from gemm.testing.timer import bench_kernel

DEEPSEEK_SHAPES = [(m, n, k) for m in (64, 128, 4096) for n, k in MODEL_SHAPES["deepseek-v3"]]
BENCH_SHAPES = DEEPSEEK_SHAPES + [(8192, 8192, 8192)]
COMMAND = "gemm bench dense"
# DeepGEMM's cuBLAS ratios measured once (a proxy, checkout only; an installed package has none and shows no column)
REFERENCE_FILE = Path(__file__).resolve().parents[2] / "results" / "deepgemm_reference.json"


COLUMNS = [
    Column("m", "M"), Column("n", "N"), Column("k", "K"),
    Column("ours_us", "ours us", "{:.1f}"), Column("ours_tflops", "ours TFLOP/s", "{:.0f}"),
    Column("ours_gbps", "ours GB/s", "{:.0f}"), Column("peer_tflops", "cuBLAS TFLOP/s", "{:.0f}"),
    Column("ratio", "ours/cuBLAS", "{:.2f}x"), Column("dg_ratio", "DeepGEMM/cuBLAS*", "{:.2f}x"),
    Column("vs_deepgemm", "ours vs DeepGEMM", "{:.2f}x"), Column("vs_stage06", "vs stage 06*", "{:.2f}x"),
    Column("diff", "diff", "{:.1e}"), Column("status", "status", align="left"),
]
REFERENCE_NOTE = ("* from results/deepgemm_reference.json (DeepGEMM 4499c4c and stage 06 measured on this H100 model "
                  "with the same timer): a kernel matches DeepGEMM on a shape when its cuBLAS ratio reaches DeepGEMM's")


def reference_rows_by_shape(path: Path = REFERENCE_FILE) -> dict:
    try:
        rows = json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return {}
    return {(r["m"], r["n"], r["k"]): r for r in rows}


def compare_with_reference(row: dict, reference: dict) -> None:
    """Add DeepGEMM's cuBLAS ratio and ours relative to it (ratios of ratios: cuBLAS is in both runs)."""
    known = reference.get((row["m"], row["n"], row["k"]))
    if not known:
        return
    row["dg_ratio"] = known["deepgemm_over_cublas"]
    if row.get("ratio"):
        row["vs_deepgemm"] = row["ratio"] / known["deepgemm_over_cublas"]
        row["vs_stage06"] = row["ratio"] / known["stage06_over_cublas"]


def measure_shape(m: int, n: int, k: int, rng, *, with_peer: bool, gemm=None, device="cuda",
                  timer=None) -> dict:
    """One row: ``gemm`` (default: the public fp8_gemm_nt) checked and timed, then the peer on the same inputs.

    ``gemm``, ``device`` and ``timer`` are there so the row logic can be tested without a GPU.
    """
    import torch
    if gemm is None:
        from gemm.api import fp8_gemm_nt as gemm
    timer = timer or bench_kernel
    a, sa, b, sb = random_problem(m, n, k, rng)
    reference = reference_rows(a, sa, b, sb, rng)
    row = {"m": m, "n": n, "k": k, "reference_rows": len(reference.rows)}
    try:
        problem = TorchProblem.from_host(a, sa, b, sb, device)
        poison_torch(problem.out)

        def launch(stream):
            gemm((problem.a, problem.sa), (problem.b, problem.sb), problem.out, stream=stream)

        launch(None)
        if problem.out.is_cuda:
            torch.cuda.synchronize()
        check = check_output(torch_bits(problem.out), reference)
        timing = timer(launch)
        row.update(ours_us=timing.median_us, ours_min_us=timing.min_us, pairs=timing.pairs,
                   ours_tflops=timing.tflops(flops(m, n, k)), ours_gbps=timing.gbps(gemm_bytes(m, n, k)),
                   diff=check["diff"], unwritten=check["unwritten"],
                   status="ok" if check["correct"] else "WRONG")
    except Exception as error:
        row.update(status="failed", error=f"{type(error).__name__}: {error}")
    if with_peer:
        row.update(time_peer(a, sa, b, sb, reference))
        if row.get("ours_us") and row.get("peer_us"):
            row["ratio"] = row["peer_us"] / row["ours_us"]
    return row


def plot_bench(rows: list[dict], path: Path, *, title: str) -> None:
    """Grouped bars: ours and cuBLAS TFLOP/s per shape (log scale: M=64 and M=4096 differ tenfold)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['m']}x{r['n']}x{r['k']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(0.6 * len(rows) + 3, 4.5))
    for offset, key, name, color in ((-0.2, "ours_tflops", "fp8_gemm_nt", "#3b75af"),
                                     (0.2, "peer_tflops", "cuBLAS blockwise", "#888888")):
        ax.bar(x + offset, [r.get(key) or 0 for r in rows], width=0.4, label=name, color=color)
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("TFLOP/s (log scale)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """ "bench" (the 18 DeepSeek shapes + 8192^3), "deepseek" (the 18) or "M,N,K;M,N,K" (or MxNxK)."""
    if text == "deepseek":
        return list(DEEPSEEK_SHAPES)
    if text == "bench":
        return list(BENCH_SHAPES)
    return parse_shape_list(text, 3, '--shapes "64,2112,7168;4096,7168,16384"')


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", type=parse_shapes, default=BENCH_SHAPES,
                        help='"bench" (the 18 DeepSeek shapes + 8192^3; default), "deepseek" (the 18) or '
                             '"M,N,K;M,N,K;..."')
    parser.add_argument("--no-peer", action="store_true", help="skip cuBLAS")
    parser.add_argument("--out", type=Path, default=Path("results"), help="folder for gemm_bench.json")
    parser.add_argument("--no-overhead", action="store_true", help="skip the host-time measurement")


def run(args) -> int:
    from gemm.testing.bench_host import describe_overhead, host_overhead
    from tqdm import tqdm
    rng = np.random.default_rng()
    rows, reference = [], reference_rows_by_shape()
    for m, n, k in tqdm(args.shapes, desc="gemm bench dense", unit="shape"):
        rows.append(measure_shape(m, n, k, rng, with_peer=not args.no_peer))
        compare_with_reference(rows[-1], reference)
        tqdm.write(f"{m}x{n}x{k}: {rows[-1].get('ours_tflops', float('nan')):.0f} TFLOP/s "
                   f"(cuBLAS {rows[-1].get('peer_tflops', float('nan')):.0f}) {rows[-1]['status']}")
    print(format_table(COLUMNS, rows))
    print(REFERENCE_NOTE)
    for row in rows:
        for key in ("error", "peer_error"):
            if key in row:
                print(f"{row['m']}x{row['n']}x{row['k']} {key}: {row[key]}")
    path = args.out / "gemm_bench.json"
    device = device_info()
    overhead = None if args.no_overhead or args.no_peer else host_overhead()
    if overhead:
        print(describe_overhead(overhead, unit="us"))
    write_result(path, command=command_line(COMMAND), rows=rows, device=device, reference_note=REFERENCE_NOTE,
                 host_overhead=overhead,
                 timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5")
    try:
        plot_bench(rows, args.out / "gemm_bench.png", title=f"{device.get('name', 'GPU')}: fp8_gemm_nt vs cuBLAS")
    except Exception as error:  # the JSON is the result; the chart is a view of it
        print(f"no chart: {type(error).__name__}: {error}")
    print(f"wrote {path} and {args.out / 'gemm_bench.png'}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


__all__ = ["DEEPSEEK_SHAPES", "BENCH_SHAPES", "measure_shape", "parse_shapes", "plot_bench", "run", "add_arguments"]
