"""``python -m gemm.bench``: the public ``fp8_gemm_nt`` against cuBLAS's blockwise FP8 on the DeepSeek shapes.

    python -m gemm.bench                              # the 18 DeepSeek-V3 shapes
    python -m gemm.bench --shapes "64,2112,7168;4096,7168,16384"
    python -m gemm.bench --grouped                    # the MoE grouped GEMMs on DeepGEMM's grouped shapes

Both kernels get the same quantized inputs and the same timer (:func:`gemm.testing.bench_kernel`); each
output is poisoned with NaN before its checked call and compared with the float64 reference. Writes
``results/gemm_bench.json``. This module is also the one home of the cuBLAS peer and of the output check
that the ladder (``python -m lessons ladder``) reuses. ``--grouped`` (:func:`grouped_bench`) times the m-grouped
contiguous and masked GEMMs (:mod:`gemm.grouped`) instead and writes ``results/grouped_bench.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gemm.fp8 import align, bf16_to_float, calc_diff, ceil_div, flops, gemm_bytes, reference_gemm
from gemm.testing import Column, bench_kernel, command_line, device_info, format_table, write_result

# DeepSeek-V3's dense GEMMs (N, K) at decode (M=64, 128) and prefill (M=4096) batch sizes.
DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
DEEPSEEK_SHAPES = [(m, n, k) for m in (64, 128, 4096) for n, k in DEEPSEEK_NK]
BENCH_SHAPES = DEEPSEEK_SHAPES + [(8192, 8192, 8192)]
REFERENCE_FILE = Path(__file__).resolve().parent.parent / "results" / "deepgemm_reference.json"
DIFF_LIMIT = 1e-3  # DeepGEMM's bar for BF16 output
REFERENCE_ROWS = 512  # rows checked against float64; every element is still checked for being written
BF16_NAN_BITS = 0x7FC0


# ------------------------------------------------------------------------------------------- checking

@dataclass
class Reference:
    """float64 D on a sample of rows: the full product at M=4096 costs minutes of CPU, a sample seconds."""
    rows: np.ndarray
    values: np.ndarray  # (len(rows), N)
    sampled: bool


def reference_rows(a, sa, b, sb, rng, max_rows: int = REFERENCE_ROWS) -> Reference:
    m = a.shape[0]
    if m <= max_rows:
        rows = np.arange(m)
    else:  # random rows plus the first and last, so ragged edges are always among them
        rows = np.union1d(1 + rng.choice(m - 2, max_rows - 2, replace=False), [0, m - 1])
    sa_rows = np.asarray(sa)[rows]
    return Reference(rows, reference_gemm(np.asarray(a)[rows], sa_rows, b, sb), m > max_rows)


def check_output(d_bits: np.ndarray, reference: Reference) -> dict:
    """Every element written (no NaN left from the poison) and diff vs the reference rows."""
    d = bf16_to_float(d_bits)
    unwritten = int(np.isnan(d).sum())
    diff = calc_diff(d[reference.rows], reference.values) if unwritten == 0 else float("nan")
    return {"unwritten": unwritten, "diff": diff, "correct": unwritten == 0 and diff < DIFF_LIMIT}


# ---------------------------------------------------------------------------------------- torch inputs

def torch_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _torch_fp8(host, device):
    import torch
    return torch.from_numpy(np.ascontiguousarray(host).view(np.uint8)).to(device).view(torch.float8_e4m3fn)


def _torch_m_major(sa, device, m_stride: int):
    """(M, Kb) values -> torch (M, Kb) view with strides (1, m_stride)."""
    import torch
    values = np.asarray(sa, dtype=np.float32)
    m, kb = values.shape
    storage = np.zeros((kb, m_stride), dtype=np.float32)
    storage[:, :m] = values.T
    return torch.from_numpy(storage).to(device)[:, :m].t()


@dataclass
class TorchProblem:
    """The inputs on the GPU as torch tensors, in our layout (sa M-major, M padded to 4)."""
    a: object
    sa: object
    b: object
    sb: object
    out: object

    @classmethod
    def from_host(cls, a, sa, b, sb, device="cuda"):
        import torch
        m, n = a.shape[0], b.shape[0]
        return cls(_torch_fp8(a, device), _torch_m_major(sa, device, align(m, 4)), _torch_fp8(b, device),
                   torch.from_numpy(np.ascontiguousarray(sb, dtype=np.float32)).to(device),
                   torch.empty((m, n), dtype=torch.bfloat16, device=device))


def torch_bits(tensor) -> np.ndarray:
    import torch
    return tensor.view(torch.int16).cpu().numpy().view(np.uint16)


def poison_torch(tensor) -> None:
    tensor.fill_(float("nan"))


class CublasBlockwise:
    """torch._scaled_mm with 1x128 activation and 128x128 weight scales: cuBLAS's DeepSeek-style FP8 GEMM.

    torch's layout rules (ScaledBlas.cpp): mat2 is B^T, (K, N) column-major; scale_a is (M, K/128) with
    strides (1, M) exactly (unpadded, unlike ours); scale_b is (K/128, N/128) column-major, i.e. sB^T, whose
    leading dimension some torch versions want padded to a multiple of 4. We try both and keep what works.
    All tensors, the output included, are allocated here, so a launch allocates nothing (graph-safe).
    """

    name = "cuBLAS blockwise (torch._scaled_mm)"

    def __init__(self, a, sa, b, sb, device="cuda"):
        import torch
        self.torch = torch
        m, n = a.shape[0], b.shape[0]
        self.a = _torch_fp8(a, device)
        self.mat2 = _torch_fp8(b, device).t()
        self.scale_a = _torch_m_major(sa, device, m)
        nb, kb = np.asarray(sb).shape
        padded_kb = _torch_m_major(np.asarray(sb).T, device, align(kb, 4))  # (Kb, Nb), strides (1, align(Kb, 4))
        plain_kb = _torch_m_major(np.asarray(sb).T, device, kb)
        self.out = torch.empty((m, n), dtype=torch.bfloat16, device=device)
        self._streams: dict[int, object] = {}
        errors = []
        for scale_b in (padded_kb, plain_kb):
            self.scale_b = scale_b
            try:
                self.launch(torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                return
            except RuntimeError as error:
                errors.append(str(error).splitlines()[0])
        raise RuntimeError("torch._scaled_mm refused both blockwise scale layouts: " + " | ".join(errors))

    def launch(self, stream: int) -> None:
        torch = self.torch
        if stream not in self._streams:
            self._streams[stream] = torch.cuda.ExternalStream(stream)
        with torch.cuda.stream(self._streams[stream]):
            torch._scaled_mm(self.a, self.mat2, self.scale_a, self.scale_b, out_dtype=torch.bfloat16,
                             out=self.out)

    def checked_run(self, reference: Reference) -> dict:
        poison_torch(self.out)
        self.launch(self.torch.cuda.current_stream().cuda_stream)
        self.torch.cuda.synchronize()
        return check_output(torch_bits(self.out), reference)


def time_peer(a, sa, b, sb, reference: Reference) -> dict:
    """Checked + timed cuBLAS row fields (peer_*); an error becomes peer_error, never an exception."""
    try:
        peer = CublasBlockwise(a, sa, b, sb)
        check = peer.checked_run(reference)
        timing = bench_kernel(peer.launch)
    except Exception as error:  # the peer is a comparison, not the thing under test
        return {"peer_error": f"{type(error).__name__}: {error}"}
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    return {"peer_us": timing.median_us, "peer_tflops": timing.tflops(flops(m, n, k)),
            "peer_gbps": timing.gbps(gemm_bytes(m, n, k)), "peer_diff": check["diff"],
            "peer_correct": check["correct"]}


# ------------------------------------------------------------------------------------------ the bench

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
    from gemm.fp8 import random_problem
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


def time_configs(m: int, n: int, k: int, configs: dict, rng=None) -> list[dict]:
    """Check (NaN-poisoned, float64 reference) then time each named KernelConfig on one problem: the
    ablation tables and heuristic checks (tools/sweep_configs.py, ``python -m lessons ablate``)."""
    from gemm.api import gemm
    from gemm.harness import checked_run, device_problem
    from gemm.fp8 import random_problem
    rng = rng or np.random.default_rng()
    host = random_problem(m, n, k, rng)
    reference = reference_rows(*host, rng)
    problem = device_problem(*host)
    rows = []
    for name, config in configs.items():
        def run(a, sa, b, sb, d, stream=None, config=config):
            gemm(a, sa, b, sb, d, stream, config=config)
        check = checked_run(run, problem, reference)
        timing = bench_kernel(lambda stream: run(problem.a, problem.sa, problem.b, problem.sb, problem.d, stream))
        rows.append({"name": name, "config": config.describe(), "time_us": timing.median_us,
                     "tflops": timing.tflops(flops(m, n, k)), "gbps": timing.gbps(gemm_bytes(m, n, k)),
                     "diff": check["diff"], "status": "ok" if check["correct"] else "WRONG"})
    return rows


CONFIG_COLUMNS = [Column("name", "config name", align="left"), Column("config", "config", align="left"),
                  Column("time_us", "time (us)", "{:.1f}"), Column("tflops", "TFLOP/s", "{:.0f}"),
                  Column("gbps", "GB/s", "{:.0f}"), Column("diff", "diff", "{:.1e}"),
                  Column("status", "status", align="left")]


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
    if text == "deepseek":
        return list(DEEPSEEK_SHAPES)
    if text == "bench":
        return list(BENCH_SHAPES)
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        values = [int(v) for v in part.replace("x", ",").split(",")]
        if len(values) != 3 or min(values) <= 0:
            raise argparse.ArgumentTypeError(f"shape {part!r}: expected M,N,K (positive integers)")
        shapes.append(tuple(values))
    return shapes


def describe_overhead(overhead: dict, unit: str = "µs") -> str:
    """One sentence for host_overhead()'s result (older results, timed by one loop, say so)."""
    shape = f"M={overhead['m']} N={overhead['n']} K={overhead['k']}, torch tensors"
    if "ours_host_us_per_call" not in overhead:
        return (f"Host time per call without a CUDA graph ({shape}, {overhead['calls']} calls back to back): ours "
                f"{overhead['ours_us_per_call']:.1f} {unit}, cuBLAS blockwise {overhead['cublas_us_per_call']:.1f} "
                f"{unit}.")
    return (f"Host time per call without a CUDA graph ({shape}; bursts of {overhead['burst']} calls onto an idle "
            f"GPU): ours {overhead['ours_host_us_per_call']:.1f} {unit}, cuBLAS blockwise (torch._scaled_mm) "
            f"{overhead['cublas_host_us_per_call']:.1f} {unit}. Back to back ({overhead['calls']} calls, where the "
            f"GPU sets the pace once the launch queue fills): {overhead['ours_us_per_call']:.1f} and "
            f"{overhead['cublas_us_per_call']:.1f} {unit} per call.")


def host_overhead(m: int = 64, n: int = 2112, k: int = 7168, calls: int = 2000, burst: int = 100) -> dict:
    """Host time per call without a CUDA graph (what a serving loop pays), on torch tensors, for ours and for
    torch._scaled_mm (cuBLAS), timed by the wall clock after a warm-up:

    * ``*_host_us_per_call``: bursts of ``burst`` calls issued onto an idle GPU, the median burst's time per call.
      The launch queue never fills, so this is the CPU time a call costs its caller: the host overhead.
    * ``*_us_per_call``: ``calls`` back to back, then a sync. When the kernel is longer than the host time the
      queue fills and this is the GPU's time per call (kernel + launch gap) instead."""
    import statistics
    import time

    import torch

    from gemm.api import fp8_gemm_nt
    from gemm.fp8 import random_problem
    a, sa, b, sb = random_problem(m, n, k)
    ours = TorchProblem.from_host(a, sa, b, sb)
    peer = CublasBlockwise(a, sa, b, sb)
    stream = torch.cuda.current_stream().cuda_stream
    runs = {"ours": lambda: fp8_gemm_nt((ours.a, ours.sa), (ours.b, ours.sb), ours.out),
            "cublas": lambda: peer.launch(stream)}
    result = {"m": m, "n": n, "k": k, "calls": calls, "burst": burst}
    for name, call in runs.items():
        for _ in range(50):
            call()
        bursts = []
        for _ in range(21):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(burst):
                call()
            bursts.append((time.perf_counter() - start) / burst)
        result[f"{name}_host_us_per_call"] = 1e6 * statistics.median(bursts)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        result[f"{name}_us_per_call"] = 1e6 * (time.perf_counter() - start) / calls
    return result


# ------------------------------------------------------------------------------------ grouped GEMMs

# DeepGEMM's grouped test shapes: (groups, M per group, N, K); masked with every row in use (masked_m = M).
CONTIGUOUS_SHAPES = [(4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)]
MASKED_SHAPES = [(1, 1024, 4096, 7168), (1, 1024, 7168, 2048), (2, 512, 4096, 7168), (2, 512, 7168, 2048),
                 (4, 256, 4096, 7168), (4, 256, 7168, 2048)]
# DeepGEMM 4499c4c's grouped GEMMs measured on this H100 model with the same timer (CUDA-graph replay of
# (L2 flush; call) minus the flushes), TFLOP/s: ../shared/reference/peer-baselines-h100.md, 2026-11-22.
DEEPGEMM_GROUPED_TFLOPS = {
    ("contiguous", 4, 8192, 4096, 7168): 1038, ("contiguous", 4, 8192, 7168, 2048): 1066,
    ("contiguous", 8, 4096, 4096, 7168): 993, ("contiguous", 8, 4096, 7168, 2048): 1008,
    ("masked", 1, 1024, 4096, 7168): 1281, ("masked", 1, 1024, 7168, 2048): 917,
    ("masked", 2, 512, 4096, 7168): 1220, ("masked", 2, 512, 7168, 2048): 876,
    ("masked", 4, 256, 4096, 7168): 1037, ("masked", 4, 256, 7168, 2048): 820,
}
GROUPED_COLUMNS = [
    Column("layout", "layout", align="left"), Column("groups", "G"), Column("m_per_group", "M/group"),
    Column("n", "N"), Column("k", "K"), Column("config", "config", align="left"),
    Column("ours_us", "ours us", "{:.1f}"), Column("ours_tflops", "ours TFLOP/s", "{:.0f}"),
    Column("ours_gbps", "ours GB/s", "{:.0f}"), Column("deepgemm_tflops", "DeepGEMM TFLOP/s*", "{:.0f}"),
    Column("vs_deepgemm", "ours / DeepGEMM", "{:.2f}x"), Column("dense_tflops", "dense same M TFLOP/s", "{:.0f}"),
    Column("vs_dense", "vs dense", "{:.2f}x"), Column("diff", "diff", "{:.1e}"), Column("status", "status", align="left"),
]
GROUPED_NOTE = ("* DeepGEMM 4499c4c on this H100 model with the same timer "
                "(../shared/reference/peer-baselines-h100.md, 2026-11-22; masked with masked_m = M per group); "
                "ratios across runs carry the run-to-run spread (0.98-1.05 there)")
GROUPED_REFERENCE_ROWS = 64  # rows per group checked against float64 (every row is checked for being written)


def grouped_bytes(rows: int, n: int, k: int, groups: int) -> int:
    """Bytes of A and its scales (the rows in use), every group's B and scales, and D (BF16), each moved once."""
    kb = ceil_div(k, 128)
    return rows * (k + 4 * kb + 2 * n) + groups * (n * k + 4 * ceil_div(n, 128) * kb)


def _grouped_inputs(layout: str, groups: int, m: int, n: int, k: int, device="cuda"):
    """Quantized on the GPU (gemm's torch casts): a (G*m, K) or (G, m, K) with its scales in the kernel's layout,
    b (G, N, K), sb (G, ceil(N/128), K/128)."""
    import torch
    from gemm.fp8 import per_block_cast_to_fp8, per_token_cast_to_fp8
    from gemm.grouped import masked_sa_to_mn_major
    x = torch.randn((groups * m, k), device=device)
    a, sa = per_token_cast_to_fp8(x, mn_major=layout == "contiguous")
    del x
    if layout == "masked":
        a, sa = a.view(groups, m, k), masked_sa_to_mn_major(sa.view(groups, m, -1))
    bs, sbs = zip(*(per_block_cast_to_fp8(torch.randn((n, k), device=device)) for _ in range(groups)))
    b = torch.stack([x.view(torch.uint8) for x in bs]).view(torch.float8_e4m3fn)  # stacked as bytes
    return a, sa, b, torch.stack(sbs)


def measure_grouped(layout: str, groups: int, m: int, n: int, k: int, rng, timer=None) -> dict:
    """One row: the grouped GEMM checked (NaN-poisoned out, sampled rows per group vs float64) and timed."""
    import torch
    from gemm.fp8 import reference_gemm
    from gemm.grouped import m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked
    from gemm.heuristics import choose_grouped_config
    timer = timer or bench_kernel
    row = {"layout": layout, "groups": groups, "m_per_group": m, "n": n, "k": k}
    try:
        a, sa, b, sb = _grouped_inputs(layout, groups, m, n, k)
        if layout == "contiguous":
            out = torch.empty((groups * m, n), dtype=torch.bfloat16, device="cuda")
            layout_array = torch.arange(groups, dtype=torch.int32, device="cuda").repeat_interleave(m)
            config = choose_grouped_config(layout, groups * m, n, k, groups)

            def launch(stream):
                m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), out, layout_array, stream=stream)
        else:
            out = torch.empty((groups, m, n), dtype=torch.bfloat16, device="cuda")
            layout_array = torch.full((groups,), m, dtype=torch.int32, device="cuda")
            config = choose_grouped_config(layout, m, n, k, groups)

            def launch(stream):
                m_grouped_fp8_gemm_nt_masked((a, sa), (b, sb), out, layout_array, m, stream=stream)
        row["config"] = f"{config.block_m}x{config.block_n}, {config.stages} stages"
        poison_torch(out)
        launch(None)
        torch.cuda.synchronize()
        got = out.view(groups, m, n)
        unwritten = int(torch.isnan(got).sum().item())
        a3, sa3 = a.view(groups, m, k), sa.reshape(groups, m, -1)
        host = lambda t: t.cpu().numpy()  # noqa: E731
        diffs = []
        for g in range(groups):
            index = torch.from_numpy(np.sort(rng.choice(m, size=min(m, GROUPED_REFERENCE_ROWS), replace=False)))
            index = index.cuda()
            want = reference_gemm(host(a3[g].index_select(0, index).view(torch.uint8)),
                                  host(sa3[g].index_select(0, index)), host(b[g].view(torch.uint8)), host(sb[g]))
            diffs.append(calc_diff(host(got[g].index_select(0, index).float()), want))
        diff = max(diffs)
        timing = timer(launch)
        flop_count = flops(groups * m, n, k)
        row.update(ours_us=timing.median_us, ours_min_us=timing.min_us, pairs=timing.pairs,
                   ours_tflops=timing.tflops(flop_count),
                   ours_gbps=timing.gbps(grouped_bytes(groups * m, n, k, groups)),
                   diff=diff, unwritten=unwritten,
                   status="ok" if unwritten == 0 and diff < DIFF_LIMIT else "WRONG")
    except Exception as error:  # one shape's failure is a row, not the end of the run
        row.update(status="failed", error=f"{type(error).__name__}: {error}")
    known = DEEPGEMM_GROUPED_TFLOPS.get((layout, groups, m, n, k))
    if known:
        row["deepgemm_tflops"] = known
        if row.get("ours_tflops"):
            row["vs_deepgemm"] = row["ours_tflops"] / known
    return row


def grouped_bench(out: Path | None = Path("results"), rng=None) -> list[dict]:
    """Check and time both grouped layouts on DeepGEMM's grouped shapes (:data:`CONTIGUOUS_SHAPES`,
    :data:`MASKED_SHAPES`); print the table and write grouped_bench.json into ``out`` (None: write nothing)."""
    import torch
    from tqdm import tqdm
    rng = rng or np.random.default_rng()
    shapes = [("contiguous", *s) for s in CONTIGUOUS_SHAPES] + [("masked", *s) for s in MASKED_SHAPES]
    rows = []
    for layout, groups, m, n, k in tqdm(shapes, desc="grouped bench", unit="shape"):
        rows.append(measure_grouped(layout, groups, m, n, k, rng))
        if layout == "contiguous":  # the bar: our own dense fp8_gemm_nt at the same total M
            dense = measure_shape(groups * m, n, k, rng, with_peer=False)
            rows[-1].update(dense_tflops=dense.get("ours_tflops"))
            if rows[-1].get("ours_tflops") and dense.get("ours_tflops"):
                rows[-1]["vs_dense"] = rows[-1]["ours_tflops"] / dense["ours_tflops"]
        tqdm.write(f"{layout} G={groups} M={m} N={n} K={k}: {rows[-1].get('ours_tflops', float('nan')):.0f} TFLOP/s "
                   f"{rows[-1]['status']}")
        torch.cuda.empty_cache()
    print(format_table(GROUPED_COLUMNS, rows))
    print(GROUPED_NOTE)
    for row in rows:
        if "error" in row:
            print(f"{row['layout']} G={row['groups']} M={row['m_per_group']} N={row['n']} K={row['k']}: {row['error']}")
    if out is not None:
        path = Path(out) / "grouped_bench.json"
        write_result(path, command=command_line("gemm.bench"), rows=rows, device=device_info(),
                     reference_note=GROUPED_NOTE,
                     timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5; "
                            "FLOPs and bytes count every row (masked_m = M per group)")
        print(f"wrote {path}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gemm.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", type=parse_shapes, default="bench",
                        help='"bench" (the 18 DeepSeek shapes + 8192^3), "deepseek" (the 18) or "M,N,K;M,N,K;..."')
    parser.add_argument("--no-peer", action="store_true", help="skip cuBLAS")
    parser.add_argument("--out", type=Path, default=Path("results"),
                        help="folder for gemm_bench.json (grouped_bench.json with --grouped)")
    parser.add_argument("--no-overhead", action="store_true", help="skip the host-overhead measurement")
    parser.add_argument("--grouped", action="store_true",
                        help="time the MoE grouped GEMMs (contiguous and masked) on DeepGEMM's grouped shapes instead; "
                             "writes grouped_bench.json")
    args = parser.parse_args(argv)
    shapes = parse_shapes(args.shapes) if isinstance(args.shapes, str) else args.shapes

    from ptx.device import is_hopper
    if args.grouped:
        if not is_hopper() or not torch_available():
            print("gemm.bench --grouped times the m-grouped sm_90a kernels on torch tensors: it needs a Hopper GPU and "
                  "torch with CUDA. On a CPU, tests/test_grouped.py runs them on the PTX emulator.")
            return 0 if not is_hopper() else 1
        rows = grouped_bench(args.out)
        return 0 if all(r["status"] == "ok" for r in rows) else 1
    if not is_hopper():
        print("gemm.bench times the sm_90a kernel behind fp8_gemm_nt: it needs a Hopper GPU (none found). "
              "On a CPU, `python -m lessons ladder` assembles the kernels and `python -m lessons inspect 6` "
              "shows their resources.")
        return 0
    if not torch_available():
        print("gemm.bench needs torch with CUDA (the inputs and the cuBLAS peer are torch tensors).")
        return 1
    from tqdm import tqdm
    rng = np.random.default_rng()
    rows, reference = [], reference_rows_by_shape()
    for m, n, k in tqdm(shapes, desc="gemm.bench", unit="shape"):
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
    write_result(path, command=command_line("gemm.bench"), rows=rows, device=device, reference_note=REFERENCE_NOTE,
                 host_overhead=overhead,
                 timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5")
    try:
        plot_bench(rows, args.out / "gemm_bench.png", title=f"{device.get('name', 'GPU')}: fp8_gemm_nt vs cuBLAS")
    except Exception as error:  # the JSON is the result; the chart is a view of it
        print(f"no chart: {type(error).__name__}: {error}")
    print(f"wrote {path} and {args.out / 'gemm_bench.png'}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
