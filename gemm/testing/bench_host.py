"""``python -m gemm bench host`` and ``python -m gemm bench new-m``: what a call costs the host, without a CUDA graph.

    python -m gemm bench host [--shape 64,512,128]   # host time per call: dense, contiguous, masked, cuBLAS; and
                                                     # where a dense call's time goes, piece by piece
    python -m gemm bench new-m                       # 50 new M at N=2112 K=7168: cold, warm disk, warm process

A serving loop calls the GEMM with the same tensors (or same-shaped ones at recycled addresses) over and over; the
first call with a signature prepares its launch (gemm.dispatch), later ones only look it up and launch it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

from gemm.testing.peers import CublasBlockwise
from gemm.testing.problems import TorchProblem, grouped_inputs, random_problem


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


def _burst_time(call, burst: int = 100, bursts: int = 21) -> float:
    """Median seconds per call over bursts of calls issued onto an idle GPU (the queue never fills)."""
    import torch
    for _ in range(50):
        call()
    times = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(burst):
            call()
        times.append((time.perf_counter() - start) / burst)
    torch.cuda.synchronize()
    return statistics.median(times)


def grouped_host_overhead(groups: int = 4, m: int = 64, n: int = 512, k: int = 128) -> dict:
    """Host time per grouped call (contiguous: groups x 128 rows; masked: groups x m rows), as for the dense one."""
    import torch
    import gemm
    result = {"groups": groups, "m_per_group": m, "n": n, "k": k}
    for layout, rows in (("contiguous", 128), ("masked", m)):
        a, sa, b, sb = grouped_inputs(layout, groups, rows, n, k)
        if layout == "contiguous":
            out = torch.empty((groups * rows, n), dtype=torch.bfloat16, device="cuda")
            index = torch.arange(groups, dtype=torch.int32, device="cuda").repeat_interleave(rows)
            call = lambda: gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), out, index)  # noqa: E731
        else:
            out = torch.empty((groups, rows, n), dtype=torch.bfloat16, device="cuda")
            counts = torch.full((groups,), rows, dtype=torch.int32, device="cuda")
            call = lambda: gemm.m_grouped_fp8_gemm_nt_masked((a, sa), (b, sb), out, counts, rows)  # noqa: E731
        result[f"{layout}_host_us_per_call"] = 1e6 * _burst_time(call)
    return result


def profile_pieces(m: int = 64, n: int = 512, k: int = 128) -> dict[str, float]:
    """Microseconds per call of a dense call's hot path and of each piece alone (timeit, best of 3), so a change
    to the hot path can be predicted and checked piece by piece; indented pieces are parts of the piece above, or
    the same call another way. The default shape is a ~3 us kernel: host-bound. A torch elementwise launch is timed
    beside them: the host's own pace, which moves several µs between machines."""
    import torch
    from cuda.bindings import driver
    import gemm
    from gemm import api, dispatch
    problem = TorchProblem.from_host(*random_problem(m, n, k))
    a, sa, b, sb, out = problem.a, problem.sa, problem.b, problem.sb, problem.out
    lhs, rhs = (a, sa), (b, sb)
    gemm.fp8_gemm_nt(lhs, rhs, out)
    key = dispatch.dense_signature(a, sa, b, sb, out)
    prepared = dispatch.PREPARED[key]
    device = out.get_device()
    stream = torch._C._cuda_getCurrentRawStream(device)
    config, function, address = prepared.launch_arguments(stream)
    launch_by_ctypes = _ctypes_launch(config, function, address)
    reference = torch.zeros(16, device=out.device)
    pieces = {
        "fp8_gemm_nt (whole call)": lambda: gemm.fp8_gemm_nt(lhs, rhs, out),
        "  without the hot path": lambda: api._checked_call(a, sa, b, sb, out, None, None),
        "signature": lambda: dispatch.dense_signature(a, sa, b, sb, out),
        "dict lookup": lambda: dispatch.PREPARED.get(key),
        "current raw stream": lambda: torch._C._cuda_getCurrentRawStream(device),
        "is_compiling": torch.compiler.is_compiling,
        "prepared launch": lambda: prepared(stream),
        "  cuCtxGetCurrent": driver.cuCtxGetCurrent,
        "  cuLaunchKernelEx": lambda: driver.cuLaunchKernelEx(config, function, address, 0),
        "  cuLaunchKernelEx via ctypes": launch_by_ctypes,
        "torch: x.add_(1), for scale": lambda: reference.add_(1),
    }
    result = {}
    for name, call in pieces.items():
        for _ in range(200):
            call()
        torch.cuda.synchronize()
        number = 5000
        result[name] = 1e6 * min(timeit.repeat(call, number=number, repeat=3)) / number
        torch.cuda.synchronize()
    return result


def _ctypes_launch(config, function, address):
    """cuLaunchKernelEx called through ctypes with every argument a prebuilt pointer: the cheapest way to reach the
    driver from Python without compiling anything, to compare with cuda-bindings' wrapper."""
    import ctypes
    launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    launch.argtypes, launch.restype = [ctypes.c_void_p] * 4, ctypes.c_int
    arguments = (config.getPtr(), int(function), address, None)
    return lambda: launch(*arguments)


CHILD = r"""
import time, numpy as np, torch, gemm
from gemm.heuristics import choose_config
n, k = 2112, 7168
ms = sorted({int(x) for x in np.random.default_rng(0).integers(1, 4097, 60)})[:50]
b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
sb = torch.rand(-(-n // 128), k // 128, device="cuda") + 0.5
inputs = [(torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn),
           gemm.get_mn_major_tma_aligned_tensor(torch.rand(m, k // 128, device="cuda") + 0.5),
           torch.empty(m, n, dtype=torch.bfloat16, device="cuda")) for m in ms]
torch.cuda.synchronize()
kernel_s = sum(2 * m * n * k for m in ms) / 1e15
for label in ("first pass", "second pass"):
    start = time.perf_counter()
    for a, sa, out in inputs:
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    torch.cuda.synchronize()
    print(f"{label}: {len(ms)} M, {len({choose_config(m, n, k) for m in ms})} configs, "
          f"{(time.perf_counter() - start - kernel_s) * 1e3:.1f} ms beyond kernel time")
"""




def new_m_cost() -> list[str]:
    """Host time beyond kernel time for 50 new M, in a fresh process with a cold kernel cache, then a warm one."""
    lines = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FP8LADDER_CACHE_DIR=cache)
        for state in ("cold cache, new process", "warm disk cache, new process"):
            done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
            lines.append(f"[{state}]\n{done.stdout.strip()}{done.stderr[-2000:] if done.returncode else ''}")
    return lines


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shape", default="64,512,128", help="M,N,K of the piece-by-piece profile")


def run_host(args) -> int:
    m, n, k = (int(v) for v in args.shape.replace("x", ",").split(","))
    print(describe_overhead(host_overhead(), unit="us"))
    grouped = grouped_host_overhead()
    print(f"Grouped, host time per call (G={grouped['groups']}, N={grouped['n']} K={grouped['k']}): contiguous "
          f"{grouped['contiguous_host_us_per_call']:.1f} us, masked {grouped['masked_host_us_per_call']:.1f} us")
    print(f"\nwhere a dense call's host time goes (M={m} N={n} K={k}):")
    for name, micros in profile_pieces(m, n, k).items():
        print(f"  {name:32s} {micros:8.2f} us")
    return 0


def run_new_m(args) -> int:
    print("\n".join(new_m_cost()))
    return 0


__all__ = ["host_overhead", "describe_overhead", "grouped_host_overhead", "profile_pieces", "new_m_cost"]
