"""``python -m lessons ladder``: every GEMM stage on one shape, checked, timed and tabled against cuBLAS.

On a GPU: one random problem (default M=4096, N=4096, K=7168), the same device arrays for every stage;
each stage's output is poisoned with NaN, computed once, checked (every element written; diff against a
float64 reference on a sample of rows, see :mod:`gemm.testing.problems`), then timed with the one kernel timer
(:func:`gemm.testing.timer.bench_kernel`). Writes ``ladder.json`` (device, clocks, versions, date, rows) and
``ladder.png`` into ``--out``. A stage that fails to import or run is reported and the others go on.

Without a GPU: the Numba stages run in Numba's CUDA simulator on a tiny shape (correctness only), every stage
is compiled for sm_90a (Numba's through NVVM, the PTX stages for the ladder shape) and its resources and key
SASS opcodes printed, then the committed GPU run (``results/ladder.json``; :mod:`lessons.results_store` finds it
in a checkout or an installed package) is tabled. Nothing is timed and no result file is written: timings need a
GPU.

Every timed row is set against the stage's **speed of light**: the one hardware unit that bounds it
(:data:`BOUNDS`, derived in each stage's docstring) at that unit's H100 SXM rate (:data:`UNITS`, the one
table of hardware numbers), and against the FP8 tensor-core peak that every stage is climbing toward.
"""
from __future__ import annotations

import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import lessons
from gemm.testing.peers import CublasBlockwise, time_peer
from gemm.testing.problems import reference_rows, torch_available
from gemm.testing.problems import flops, gemm_bytes, random_problem
from gemm.testing.problems import DeviceProblem, checked_run as _checked_run, device_problem
from gemm.testing.records import (Column, command_line, device_info, format_table, read_result, three_digits, write_result)
from gemm.testing.timer import bench_kernel
from lessons import results_store
from lessons.compile_report import numba_report, numba_stage_ptx, ptx_report

WIDTH = 120  # every table this command prints fits a terminal this wide
LADDER_SHAPE = (4096, 4096, 7168)  # the ladder's default (M, N, K)


# ------------------------------------------------------------------------------------------ speed of light

H100_SXM_SMS = 132


@dataclass(frozen=True)
class Unit:
    """One hardware unit's peak on an H100 SXM: ``per_sm_clock`` (flop or bytes per SM per clock) x 132 SMs x
    ``clock_ghz``, or a fixed ``rate`` where the SM clock does not enter (HBM)."""
    name: str
    what: str  # "flop" or "byte"
    per_sm_clock: float | None
    clock_ghz: float | None
    basis: str
    fixed_rate: float | None = None

    @property
    def rate(self) -> float:
        """Peak per second, whole GPU."""
        if self.fixed_rate is not None:
            return self.fixed_rate
        return H100_SXM_SMS * self.per_sm_clock * self.clock_ghz * 1e9

    def describe(self) -> str:
        return f"{self.rate / 1e12:,.4g} {'TFLOP/s' if self.what == 'flop' else 'TB/s'}"


# The hardware numbers, all of them: spec values for the H100 SXM5 (132 SMs, max boost 1.98 GHz). Each rate is
# per-SM-per-clock x 132 x the clock it assumes. FP32 (the datasheet's 67 TFLOP/s) and the L1/shared-memory port run
# at the 1.98 GHz max boost. The datasheet's dense tensor-core peaks, 989 (FP16) and 1979 (FP8) TFLOP/s, are 4096 and
# 8192 flop per SM per clock at 1.83 GHz, not at 1.98 (that would be 1071 and 2141): the clock below is the one each
# figure implies, so that per-clock rate x SMs x clock = the datasheet. HBM3's 3.35 TB/s runs on the memory clock.
UNITS = {
    "ffma": Unit("FP32 FFMA", "flop", 128 * 2, 1.98, "128 FP32 lanes x one FMA (2 flop) per clock"),
    "smem": Unit("L1/smem", "byte", 128, 1.98, "one 128-byte wavefront per clock (L1 and smem: one SRAM)"),
    "hmma": Unit("FP16 HMMA", "flop", 4096, 1.83, "dense FP16 tensor cores, FP32 accumulate"),
    "qgmma": Unit("FP8 QGMMA", "flop", 8192, 1.83, "dense FP8 tensor cores (wgmma e4m3), FP32 accumulate"),
    "hbm": Unit("HBM3", "byte", None, None, "datasheet; memory clock (the SM clock does not enter)",
                fixed_rate=3.35e12),
}
FP8_PEAK = UNITS["qgmma"]
# A run on another GH100 board: the same SMs at the same clocks (the units above), another memory. Keyed by a part
# of the device name the run records; a run on an H200 is bounded by its own HBM, not the H100's.
HBM_BY_DEVICE = {"H200": Unit("HBM3e", "byte", None, None, "datasheet (H200); memory clock", fixed_rate=4.8e12)}


def hbm_unit(device_name: str | None = None) -> Unit:
    """The HBM a run on ``device_name`` moves its bytes through (None: the H100 SXM's, the ladder's reference)."""
    return next((unit for key, unit in HBM_BY_DEVICE.items() if device_name and key in device_name), UNITS["hbm"])
CLOCK_NOTE = ("FP32 and L1/smem are per-clock rates at the 1.98 GHz max boost (the datasheet's 67 TFLOP/s FP32); the "
              "datasheet's dense tensor-core peaks, 989 (FP16) and 1979 (FP8) TFLOP/s, are 4096 and 8192 flop/clk/SM "
              "at 1.83 GHz (at 1.98 GHz they would be 1071 and 2141).")


@dataclass(frozen=True)
class StageBound:
    """What can bound a stage: ``terms`` (unit, work on it per useful flop: 1 for a math unit, bytes for a memory).
    The bound is the slowest term (or HBM, moving A, B and D once, if that is slower still); ``why`` says where the
    binding term's figure comes from (each stage's docstring derives it)."""
    terms: tuple[tuple[str, float], ...]
    why: str


BOUNDS = {
    1: StageBound((("smem", 33 * 128 / 64), ("ffma", 1.0)),
                  "per k a warp loads a[m, k] (one address: one L1 wavefront) and b[n, k] from 32 rows (32 lines: 32 "
                  "wavefronts) for 32 FFMAs: 33 x 128 B per 64 flop"),
    2: StageBound((("smem", 2 * 128 / 64), ("ffma", 1.0)),
                  "per k a warp reads a_tile (a broadcast: one wavefront) and b_tile (32 banks: one wavefront) for 32 "
                  "FFMAs: 2 x 128 B per 64 flop"),
    3: StageBound((("ffma", 1.0), ("smem", 6 * 128 / 4096)),
                  "one FFMA per product; the shared reads are 6 wavefronts per warp per 2048 FFMAs"),
    4: StageBound((("hmma", 1.0), ("smem", (96 + 32) * 1024 / (2 * 128 ** 3))),
                  "Hopper runs each e4m3 mma.sync as F2FP unpacks + two FP16 HMMA.16816; ldmatrix + cp.async move "
                  "128 KiB through shared memory per 128^3 block"),
    **{number: StageBound((("qgmma", 1.0),), "wgmma on e4m3 (QGMMA) at the dense FP8 rate")
       for number in lessons.GEMM_STAGES if number >= 5},  # 05 on: wgmma
}
PEER_BOUND = StageBound((("qgmma", 1.0),), "cuBLAS blockwise FP8 runs on wgmma")


def speed_of_light(number: int | None, m: int, n: int, k: int, device_name: str | None = None) -> dict | None:
    """The stage's bound at (m, n, k): the unit that limits it and the TFLOP/s it allows; None for a stage without
    one (stage 00 is no GEMM). ``number=None`` is the cuBLAS peer. ``device_name``: the GPU a run was measured on
    (its HBM: :func:`hbm_unit`); None, the H100 SXM the stages' docstrings derive their bounds for."""
    bound = PEER_BOUND if number is None else BOUNDS.get(number)
    if bound is None:
        return None
    work, hbm = flops(m, n, k), hbm_unit(device_name)
    times = [(work * per_flop / UNITS[unit].rate, UNITS[unit]) for unit, per_flop in bound.terms]
    times.append((gemm_bytes(m, n, k) / hbm.rate, hbm))  # A, B, scales, D once: none does less
    seconds, limit = max(times, key=lambda pair: pair[0])
    why = bound.why if limit is UNITS[bound.terms[0][0]] else (
        "moving A, B, the scales and D once from HBM takes longer than the math" if limit is hbm
        else f"{limit.name} binds before {UNITS[bound.terms[0][0]].name} at this shape")
    others = [f"{unit.name} {three_digits(work / t / 1e12)}" for t, unit in times[:-1] if unit is not limit]
    if others:
        why += f" (next: {', '.join(others)} TFLOP/s)"
    return {"bound_unit": limit.name, "bound_tflops": work / seconds / 1e12, "bound_us": seconds * 1e6,
            "unit_rate": limit.describe(), "why": why}


def with_bounds(rows: list[dict], shape, device_name: str | None = None) -> list[dict]:
    """Copies of ladder rows with the speed-of-light columns: bound_unit, bound_tflops, pct_bound, pct_fp8.
    ``device_name``: the run's GPU (:func:`speed_of_light`)."""
    m, n, k = (shape[key] for key in ("m", "n", "k")) if isinstance(shape, dict) else shape
    out = []
    for row in rows:
        row = dict(row)
        bound = speed_of_light(row.get("stage") if row.get("kind") != "peer" else None, m, n, k, device_name)
        if bound is not None:
            row.update(bound_unit=bound["bound_unit"], bound_tflops=bound["bound_tflops"])
            if row.get("tflops"):
                row.update(pct_bound=100 * row["tflops"] / bound["bound_tflops"],
                           pct_fp8=100 * row["tflops"] * 1e12 / FP8_PEAK.rate)
        out.append(row)
    return out


def percent(value: float) -> str:
    """97%, 36%, 1.2%, 0.025%: two significant digits below 10."""
    return f"{value:.0f}%" if value >= 9.5 else f"{value:.2g}%"


UNIT_COLUMNS = [Column("name", "unit", align="left"), Column("rate", "H100 SXM peak"),
                Column("per_clock", "per SM per clock"), Column("clock", "at SM clock"),
                Column("basis", "basis", align="left")]


def unit_rows() -> list[dict]:
    """UNITS as table rows (UNIT_COLUMNS): unit, peak, the per-clock figure and the clock it assumes."""
    return [{"name": u.name, "rate": u.describe(), "basis": u.basis,
             "per_clock": "-" if u.per_sm_clock is None else
             f"{u.per_sm_clock:,.0f} {'B' if u.what == 'byte' else 'flop'}",
             "clock": "-" if u.clock_ghz is None else f"{u.clock_ghz:.2f} GHz"} for u in UNITS.values()]


def units_table() -> str:
    return format_table(UNIT_COLUMNS, unit_rows())


def bound_legend() -> str:
    """What the speed-of-light columns mean, and the hardware table they come from."""
    text = textwrap.fill(
        "limit: the unit that bounds the stage (derived in its docstring; HBM when moving A, B and D once would take "
        "longer). SOL (speed of light): the TFLOP/s that unit allows at this shape. % SOL: measured / SOL. % FP8: "
        f"measured / the dense FP8 peak ({three_digits(FP8_PEAK.rate / 1e12)} TFLOP/s). The peaks "
        "(lessons.ladder.UNITS, H100 SXM, 132 SMs):", WIDTH)
    hbm = "; ".join(f"on an {key}: {unit.name} {unit.describe()}" for key, unit in HBM_BY_DEVICE.items())
    note = f"{CLOCK_NOTE} HBM {hbm} (lessons.ladder.HBM_BY_DEVICE)."
    return f"{text}\n{units_table()}\n{textwrap.fill(note, WIDTH)}"


# ------------------------------------------------------------------------------------------ tables

COLUMNS = [  # the terminal table (GPU run, and the committed run on a CPU): at most WIDTH columns
    Column("label", "stage", align="left"), Column("time_us", "time (us)", "{:,.1f}"),
    Column("tflops", "TFLOP/s", three_digits), Column("speedup", "vs prev", "{:.2f}x"),
    Column("bound_unit", "limit", align="left"), Column("bound_tflops", "SOL TFLOP/s", three_digits),
    Column("pct_bound", "% SOL", percent), Column("pct_fp8", "% FP8", percent), Column("diff", "diff", "{:.1e}"),
    Column("status", "status", align="left"),
]
DOC_COLUMNS = [  # docs/ladder.md (Markdown, no width limit): the idea and GB/s too
    Column("label", "stage", align="left"), Column("idea", "idea", align="left"),
    Column("time_us", "time (us)", "{:,.1f}"), Column("tflops", "TFLOP/s", three_digits),
    Column("gbps", "GB/s", three_digits), Column("speedup", "vs prev", "{:.2f}x"),
    Column("bound_unit", "limit", align="left"), Column("bound_tflops", "SOL TFLOP/s", three_digits),
    Column("pct_bound", "% SOL", percent), Column("pct_fp8", "% FP8", percent), Column("diff", "diff", "{:.1e}"),
    Column("status", "status", align="left"),
]
CPU_COLUMNS = [
    Column("label", "stage", align="left"), Column("kind", "kind", align="left"),
    Column("diff", "diff (sim)", "{:.1e}"), Column("registers", "regs"), Column("spills", "spills"),
    Column("shared_bytes", "smem bytes"), Column("status", "status", align="left"),
]
# The SASS families that carry the ladder's ideas, one column each (0 prints as "-")
OPCODE_FAMILIES = ["FFMA", "LDS", "LDG", "LDGSTS", "LDSM", "HMMA", "F2FP", "QGMMA", "UTMALDG", "SYNCS", "USETMAXREG",
                   "STSM", "UTMASTG"]
OPCODE_COLUMNS = [Column("label", "stage", align="left")] + [Column(op, op) for op in OPCODE_FAMILIES]


def ladder_table(rows: list[dict], shape, device_name: str | None = None) -> str:
    """The timed ladder with each stage's speed of light (terminal width) on ``device_name``'s HBM."""
    return format_table(COLUMNS, with_bounds(rows, shape, device_name))


def cpu_tables(rows: list[dict]) -> str:
    """The no-GPU ladder: resources per stage, then the key SASS opcode counts per stage."""
    opcode_rows = [{"label": r["label"], **{op: (r.get("opcodes") or {}).get(op) or None for op in OPCODE_FAMILIES}}
                   for r in rows if r.get("opcodes")]
    text = format_table(CPU_COLUMNS, rows)
    if opcode_rows:
        text += "\n\nKey SASS opcodes (static counts in the cubin; - = none):\n" + format_table(OPCODE_COLUMNS,
                                                                                            opcode_rows)
    return text


LADDER_FILE = "ladder.json"
NO_LADDER = f"no {LADDER_FILE} yet: on a Hopper GPU, python -m lessons ladder writes it"


def ladder_file(shape=LADDER_SHAPE) -> str:
    """The result file of a ladder run at ``shape``: ladder.json at the ladder's shape, ladder_MxNxK.json elsewhere
    (a stage whose idea shows at another shape, its ``SHAPE``, is measured there: stage 12 at a decode shape)."""
    m, n, k = shape
    return LADDER_FILE if tuple(shape) == LADDER_SHAPE else f"ladder_{m}x{n}x{k}.json"


def home_shape(number: int) -> tuple[int, int, int]:
    """Where stage ``number`` is measured for its docstring: its module's ``SHAPE``, else the ladder's shape."""
    return tuple(getattr(lessons.stage(number), "SHAPE", LADDER_SHAPE))


def read_committed(path: Path | None = None) -> dict | None:
    """The GPU run at ``path``, by default the ladder's (results/ladder.json: a measured one in an installed
    package's user directory, else the committed one; :mod:`lessons.results_store`); None when there is none."""
    path = results_store.find(LADDER_FILE) if path is None else path
    if path is None or not path.exists():
        return None
    return read_result(path)


def committed_table(path: Path | None = None) -> str:
    """The committed GPU run as the ladder table, with its device, date and shape; a line saying how to make one
    when there is none."""
    result = read_committed(path)
    if result is None:
        return NO_LADDER
    shape, name = result["shape"], result["device"].get("name")
    return (f"{name or '?'}, {result['date'][:10]}, M={shape['m']} N={shape['n']} K={shape['k']} "
            f"(`{result['command']}`):\n{ladder_table(result['rows'], shape, name)}\n{bound_legend()}")


def committed_summary(number: int, path: Path | None = None) -> str:
    """One stage's line from the committed GPU run at its home shape (:func:`home_shape`): time, TFLOP/s, speedup,
    and its speed of light."""
    name = ladder_file(home_shape(number))
    path = results_store.find(name) if path is None else path
    result = read_committed(path) if path is not None else None  # None: read_committed would read ladder.json
    if result is None:
        m, n, k = home_shape(number)
        return (NO_LADDER if name == LADDER_FILE else f"no {name} yet: on a Hopper GPU, python -m lessons ladder "
                f"--m {m} --n {n} --k {k} --stages {number - 2}-{number} writes it")
    row = next((r for r in result["rows"] if r.get("stage") == number), None)
    if row is None:
        return f"stage {number:02d} is not in {path.name} ({result['date'][:10]})"
    shape = result["shape"]
    where = (f"{results_store.shown(path)} ({result['device'].get('name', '?')}, {result['date'][:10]}), "
             f"M={shape['m']} N={shape['n']} K={shape['k']}")
    if not row.get("tflops"):
        return f"{where}: stage {number:02d} {row.get('status', 'has no time')}"
    earlier = [r for r in result["rows"] if isinstance(r.get("stage"), int) and r["stage"] < number]
    if row.get("speedup"):
        versus = f"{row['speedup']:.2f}x stage {earlier[-1]['stage']:02d}"
    elif not earlier:
        versus = "the first stage timed: no stage before it to compare with"
    else:
        versus = f"no speedup: stage {earlier[-1]['stage']:02d} has no time in this run"
    bounded = with_bounds([row], shape, result["device"].get("name"))[0]
    line = f"{where}:\n{row['time_us']:,.1f} us, {three_digits(row['tflops'])} TFLOP/s, {versus}."
    if "bound_unit" in bounded:
        line += (f"\n{percent(bounded['pct_bound'])} of its speed of light ({bounded['bound_unit']}, "
                 f"{three_digits(bounded['bound_tflops'])} TFLOP/s at this shape), {percent(bounded['pct_fp8'])} of "
                 f"the FP8 peak ({three_digits(FP8_PEAK.rate / 1e12)} TFLOP/s).")
    return "\n".join(textwrap.fill(part, WIDTH - 4, subsequent_indent="  ") for part in line.splitlines())


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
    device = device_info()
    print(ladder_table(rows, shape, device.get("name")))
    print(bound_legend())
    for row in rows:
        if "error" in row:
            print(f"{row['label']}: {row['error']}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for row in rows:
        row.pop("traceback", None)
    result_path = out_dir / ladder_file(shape)
    write_result(result_path, command=command_line("lessons"), rows=rows, device=device,
                 shape={"m": m, "n": n, "k": k}, reference_rows=len(reference.rows),
                 timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5")
    try:
        plot_ladder(rows, result_path.with_suffix(".png"), title=f"{device.get('name', 'GPU')}: FP8 GEMM {m}x{n}x{k}")
    except Exception as error:  # the JSON is the result; the chart is a view of it
        print(f"no chart: {_error_text(error)}")
    print(f"wrote {result_path} and {result_path.with_suffix('.png')}")
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

def _resources(report: dict) -> dict:
    kernels = list(report["kernels"].values())
    return {"registers": max(r["registers"] or 0 for r in kernels),
            "spills": sum((r["spill_stores"] or 0) + (r["spill_loads"] or 0) for r in kernels),
            "shared_bytes": max(r["shared_bytes"] or 0 for r in kernels) + report["dynamic_shared_bytes"],
            "opcodes": report["opcodes"]}


def describe_without_gpu(number: int, sim_shape, ptx_shape, numba_ptx: dict | None = None) -> dict:
    """One stage without a GPU: a PTX stage assembled for ``ptx_shape``; a Numba stage run in the simulator on
    ``sim_shape`` and, when ``numba_ptx`` has its PTX (:func:`lessons.compile_report.numba_stage_ptx`), assembled."""
    row = {"stage": number, "label": _label(number)}
    module = _load(number, row)
    if module is None:
        return row
    try:
        if hasattr(module, "generate"):
            row.update(_resources(ptx_report(module, *ptx_shape)), status="assembled")
        else:
            if number in (numba_ptx or {}):
                row.update(_resources(numba_report(module, numba_ptx[number])))
            rng = np.random.default_rng()
            host = random_problem(*sim_shape, rng)
            check = _checked_run(module.gemm, device_problem(*host), reference_rows(*host, rng))
            row.update(diff=check["diff"], status=f"{'ok' if check['correct'] else 'WRONG'} (simulator)")
    except Exception as error:
        row.update(status="failed", error=_error_text(error))
    return row


def run_without_gpu(stages, *, sim_shape, ptx_shape) -> int:
    from tqdm import tqdm
    sim, ptx = ("x".join(map(str, shape)) for shape in (sim_shape, ptx_shape))
    print(textwrap.fill(
        f"No GPU found. Timings need a GPU, so no result file is written. Numba stages run in the CUDA simulator at "
        f"{sim} (correctness only, 'diff (sim)'); every stage is compiled for sm_90a (Numba's kernels through NVVM, "
        f"PTX stages at {ptx}) for its resources and SASS.", WIDTH) + "\n")
    numba = []
    for number in stages:
        try:
            module = lessons.stage(number)
        except Exception:
            continue
        if getattr(module, "KIND", None) == "numba" and hasattr(module, "KERNEL"):
            numba.append(number)
    try:
        numba_ptx = numba_stage_ptx(numba)
    except Exception as error:  # no NVVM: the Numba rows still get their simulator check
        print(f"Numba stages not compiled ({_error_text(error)})")
        numba_ptx = {}
    rows = []
    for number in tqdm(stages, desc="ladder (no GPU)", unit="stage"):
        rows.append(describe_without_gpu(number, sim_shape, ptx_shape, numba_ptx))
    print(cpu_tables(rows))
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
        status = run_without_gpu(stages, sim_shape=args.sim_shape, ptx_shape=shape)
        name = ladder_file(shape)
        committed = args.out / name if args.out else results_store.find(name)
        print(f"\nThe committed GPU run, {results_store.shown(committed) if committed else name}:\n"
              + committed_table(committed))
        return status
    with_peer = not args.no_peer and torch_available()
    if not args.no_peer and not with_peer:
        print("torch with CUDA not importable: no cuBLAS peer")
    return run_on_gpu(shape, stages, with_peer=with_peer, out_dir=args.out or results_store.write_dir())
