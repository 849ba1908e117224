"""``python -m lessons ladder``: every GEMM stage on one shape, checked, timed and tabled against cuBLAS.

On a GPU: one random problem (default M=4096, N=4096, K=7168), the same device arrays for every stage;
each stage's output is poisoned with NaN, computed once, checked (every element written; diff against a
float64 reference on a sample of rows, see :mod:`gemm.bench`), then timed with the one kernel timer
(:func:`gemm.testing.bench_kernel`). Writes ``ladder.json`` (device, clocks, versions, date, rows) and
``ladder.png`` into ``--out``. A stage that fails to import or run is reported and the others go on.

Without a GPU: the Numba stages run in Numba's CUDA simulator on a tiny shape (correctness only), the PTX
stages are assembled for sm_90a for the ladder shape and their resources and key SASS opcodes printed.
Nothing is timed and no result file is written: timings need a GPU.
"""
from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np

import lessons
from gemm.bench import CublasBlockwise, reference_rows, time_peer, torch_available
from gemm.fp8 import flops, gemm_bytes, random_problem
from gemm.harness import DeviceProblem, checked_run as _checked_run, device_problem
from gemm.testing import (Column, bench_kernel, command_line, device_info, format_table, three_digits,
                          write_result)

COLUMNS = [
    Column("label", "stage", align="left"), Column("idea", "idea", align="left"),
    Column("time_us", "time (us)", "{:,.1f}"), Column("tflops", "TFLOP/s", three_digits),
    Column("gbps", "GB/s", three_digits), Column("speedup", "vs prev", "{:.2f}x"), Column("diff", "diff", "{:.1e}"),
    Column("status", "status", align="left"),
]
CPU_COLUMNS = [
    Column("label", "stage", align="left"), Column("kind", "kind", align="left"),
    Column("diff", "diff (sim)", "{:.1e}"), Column("registers", "regs"), Column("spills", "spills"),
    Column("shared_bytes", "smem bytes"), Column("opcodes", "key SASS opcodes", align="left"),
    Column("status", "status", align="left"),
]


def _label(number: int) -> str:
    return f"{number:02d} {lessons.STAGES[number].split('_', 1)[1]}"


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


def _load(number: int, row: dict):
    try:
        module = lessons.stage(number)
    except Exception as error:
        row.update(status="failed (import)", error=_error_text(error), traceback=traceback.format_exc())
        return None
    row.update(idea=getattr(module, "IDEA", ""), kind=getattr(module, "KIND", "?"))
    return module


# ------------------------------------------------------------------------------------------------ GPU

def measure_stage(number: int, problem: DeviceProblem, reference, shape) -> dict:
    row = {"stage": number, "label": _label(number)}
    module = _load(number, row)
    if module is None:
        return row
    m, n, k = shape
    try:
        check = _checked_run(module.gemm, problem, reference)
        row.update(diff=check["diff"], unwritten=check["unwritten"])
        timing = bench_kernel(lambda stream: module.gemm(problem.a, problem.sa, problem.b, problem.sb,
                                                         problem.d, stream=stream))
    except Exception as error:
        row.update(status="failed", error=_error_text(error), traceback=traceback.format_exc())
        return row
    row.update(time_us=timing.median_us, min_us=timing.min_us, pairs=timing.pairs,
               samples_us=timing.samples_us, tflops=timing.tflops(flops(m, n, k)),
               gbps=timing.gbps(gemm_bytes(m, n, k)), status="ok" if check["correct"] else "WRONG")
    return row


def run_on_gpu(shape, stages, *, with_peer: bool, out_dir: Path) -> int:
    from tqdm import tqdm
    m, n, k = shape
    rng = np.random.default_rng()
    progress = tqdm(total=len(stages) + 2 * with_peer + 1, desc="ladder", unit="step")
    progress.set_postfix_str("inputs + float64 reference")
    host = random_problem(m, n, k, rng)
    reference = reference_rows(*host, rng)
    problem = device_problem(*host)
    progress.update()
    rows, previous = [], None
    for number in stages:
        progress.set_postfix_str(_label(number))
        row = measure_stage(number, problem, reference, shape)
        if row.get("time_us") and previous is not None:
            row["speedup"] = previous / row["time_us"]
        previous = row.get("time_us", previous)
        rows.append(row)
        tqdm.write(f"{row['label']}: {row['status']}" + (f" {row['tflops']:.2f} TFLOP/s" if "tflops" in row else "")
                   + (f" ({row['error']})" if "error" in row else ""))
        progress.update()
    if with_peer:
        progress.set_postfix_str("cuBLAS")
        peer = time_peer(*host, reference)
        progress.update(2)
        rows.append({"stage": None, "label": "cuBLAS", "kind": "peer", "idea": CublasBlockwise.name,
                     "time_us": peer.get("peer_us"), "tflops": peer.get("peer_tflops"),
                     "gbps": peer.get("peer_gbps"), "diff": peer.get("peer_diff"),
                     "status": "ok" if peer.get("peer_correct") else "failed" if "peer_error" in peer else "WRONG",
                     **({"error": peer["peer_error"]} if "peer_error" in peer else {})})
    progress.close()

    print(f"\nM={m} N={n} K={k}; diff on {len(reference.rows)} rows vs float64"
          f"{' (sampled)' if reference.sampled else ''}; every element checked for being written")
    print(format_table(COLUMNS, rows))
    for row in rows:
        if "error" in row:
            print(f"{row['label']}: {row['error']}")
    device = device_info()
    out_dir.mkdir(parents=True, exist_ok=True)
    for row in rows:
        row.pop("traceback", None)
    write_result(out_dir / "ladder.json", command=command_line("lessons"), rows=rows, device=device,
                 shape={"m": m, "n": n, "k": k}, reference_rows=len(reference.rows),
                 timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5")
    try:
        plot_ladder(rows, out_dir / "ladder.png", title=f"{device.get('name', 'GPU')}: FP8 GEMM {m}x{n}x{k}")
    except Exception as error:  # the JSON is the result; the chart is a view of it
        print(f"no chart: {_error_text(error)}")
    print(f"wrote {out_dir / 'ladder.json'} and {out_dir / 'ladder.png'}")
    return 0 if all(r["status"] == "ok" for r in rows if r.get("kind") != "peer") else 1


def plot_ladder(rows: list[dict], path: Path, *, title: str) -> None:
    """Bar chart of TFLOP/s per stage (log scale: the ladder spans three orders of magnitude)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    timed = [r for r in rows if r.get("tflops")]
    fig, ax = plt.subplots(figsize=(1.1 * len(timed) + 3, 4.5))
    colors = ["#888888" if r.get("kind") == "peer" else "#3b75af" for r in timed]
    bars = ax.bar([r["label"] for r in timed], [r["tflops"] for r in timed], color=colors)
    ax.bar_label(bars, labels=[three_digits(r["tflops"]) for r in timed], padding=2, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("TFLOP/s (log scale)")
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ CPU

def describe_without_gpu(number: int, sim_shape, ptx_shape) -> dict:
    from lessons.inspect_stage import ptx_report
    row = {"stage": number, "label": _label(number)}
    module = _load(number, row)
    if module is None:
        return row
    try:
        if hasattr(module, "generate"):
            report = ptx_report(module, *ptx_shape)
            kernels = list(report["kernels"].values())
            row.update(registers=max(r["registers"] or 0 for r in kernels),
                       spills=sum((r["spill_stores"] or 0) + (r["spill_loads"] or 0) for r in kernels),
                       shared_bytes=max(r["shared_bytes"] or 0 for r in kernels) + report["dynamic_shared_bytes"],
                       opcodes=" ".join(f"{op}:{c}" for op, c in report["opcodes"].items() if c),
                       status=f"assembled ({'x'.join(map(str, ptx_shape))})")
        else:
            rng = np.random.default_rng()
            host = random_problem(*sim_shape, rng)
            check = _checked_run(module.gemm, device_problem(*host), reference_rows(*host, rng))
            row.update(diff=check["diff"], status=f"{'ok' if check['correct'] else 'WRONG'} (simulator, "
                                                  f"{'x'.join(map(str, sim_shape))})")
    except Exception as error:
        row.update(status="failed", error=_error_text(error))
    return row


def run_without_gpu(stages, *, sim_shape, ptx_shape) -> int:
    from tqdm import tqdm
    print("No GPU found: Numba stages run in the CUDA simulator on a tiny shape (correctness only); PTX stages "
          "are assembled for sm_90a (resources and SASS opcodes). Timings need a GPU; no result file written.")
    rows = []
    for number in tqdm(stages, desc="ladder (no GPU)", unit="stage"):
        rows.append(describe_without_gpu(number, sim_shape, ptx_shape))
    print(format_table(CPU_COLUMNS, rows))
    for row in rows:
        if "error" in row:
            print(f"{row['label']}: {row['error']}")
    if not rows:
        print("no GEMM stages in this checkout yet")
    return 0


def main(args) -> int:
    from ptx.device import has_gpu
    known = set(lessons.available_stages())
    stages = [s for s in (args.stages or lessons.GEMM_STAGES) if s in known]
    missing = [s for s in (args.stages or []) if s not in known]
    if missing:
        print(f"not in this checkout: stages {missing}")
    shape = (args.m, args.n, args.k)
    if not has_gpu():
        return run_without_gpu(stages, sim_shape=args.sim_shape, ptx_shape=shape)
    with_peer = not args.no_peer and torch_available()
    if not args.no_peer and not with_peer:
        print("torch with CUDA not importable: no cuBLAS peer")
    return run_on_gpu(shape, stages, with_peer=with_peer, out_dir=args.out)
