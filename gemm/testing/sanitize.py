"""``python -m gemm sanitize``: compute-sanitizer's memcheck, racecheck and synccheck on production kernels (GPU).

    python -m gemm sanitize                                   # the default jobs: ragged shapes, both epilogues
    python -m gemm sanitize 1000,2112,512 "520,2112,1024@block_m=256,block_n=128,stages=2,d_buffer=(128,64)"
    python -m gemm sanitize --tools memcheck "300,2112,512@out_dtype='f32',accumulate=True"
    python -m gemm sanitize "300,232,272@wgrad" "520,4096,1040@wgrad,block_m=64,block_n=128"

A job is ``M,N,K`` (the heuristics' config) or ``M,N,K@field=value,...`` (that config with overrides, as
``python -m gemm bench configs`` takes them: ``split_k=3`` alone gathers the partials, ``split_k=3,split_k_push=True``
pushes them as production's splits do); ``M,N,K@wgrad[,field=value,...]`` is the weight-gradient GEMM (1x128
scales on both operands, FP32 D += A*B^T; K any multiple of 16) with the wgrad heuristics' config. Each job runs
once under each tool in a child process (``python -m gemm.testing.sanitize --once ...``, also the target for ncu;
``--graph M N K`` is ncu's target inside the timer's graph), which checks its output (NaN-poisoned D, every element
written, calc_diff against float64). Exit 0 only when every run is clean and correct; a missing compute-sanitizer or
GPU is a message and exit 2, never a silent pass.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import numpy as np

from gemm.shapes import parse_shape_list

DEFAULT_JOBS = ("2048,2048,512", "1000,2112,512", "4096,4096,512", "1000,2112,512@epilogue='staged'",
                "300,2112,512@out_dtype='f32',accumulate=True", "300,232,272@wgrad", "1000,2112,1040@wgrad",
                "16,2112,7168", "5,576,1040@split_k=4", "5,576,1040@split_k=3")
TOOLS = ("memcheck", "racecheck", "synccheck")


def parse_job(text: str) -> tuple[tuple[int, int, int], str]:
    shape, _, overrides = text.partition("@")
    shapes = parse_shape_list(shape, 3, '"1000,2112,512" or "1000,2112,512@epilogue=\'staged\'"')
    if len(shapes) != 1:
        raise argparse.ArgumentTypeError(f"job {text!r}: expected one M,N,K (jobs are separated by spaces)")
    return shapes[0], overrides


def run_wgrad_once(m: int, n: int, k: int, overrides: str = "") -> int:
    """One weight-gradient call (D += A*B^T, 1x128 scales on both) on fresh inputs, checked against float64."""
    import ast
    from numba import cuda

    from gemm import dispatch
    from gemm.fp8 import E4M3, align, calc_diff, ceil_div, dequantize_per_token
    from gemm.heuristics import choose_wgrad_config
    from gemm.testing.problems import mn_major_view
    from gemm.validate import check_wgrad_args
    rng = np.random.default_rng()
    kb = ceil_div(k, 128)
    a = rng.standard_normal((m, k)).astype(np.float32).astype(E4M3)
    b = rng.standard_normal((n, k)).astype(np.float32).astype(E4M3)
    sa, sb = (rng.uniform(0.5, 2.0, (rows, kb)).astype(np.float32) for rows in (m, n))
    c = rng.standard_normal((m, n)).astype(np.float32)
    fields = dict((name, ast.literal_eval(value)) for name, _, value in
                  (part.partition("=") for part in overrides.split(",") if part))
    config = choose_wgrad_config(m, n, k).replace(**fields)
    print(f"wgrad {m}x{n}x{k}: {config.describe()}")

    def scales(values, rows):
        storage = np.zeros((kb, align(rows, 4)), np.float32)
        storage[:, :rows] = values.T
        return mn_major_view(cuda.to_device(storage), rows)
    d = cuda.to_device(c)
    args = check_wgrad_args(cuda.to_device(a.view(np.uint8)), scales(sa, m), cuda.to_device(b.view(np.uint8)),
                            scales(sb, n), d)
    dispatch.run(args, None, config)
    cuda.synchronize()
    got = d.copy_to_host()
    want = c + dequantize_per_token(a, sa) @ dequantize_per_token(b, sb).T
    finite = np.isfinite(got).all()
    diff = calc_diff(got, want)
    print(f"wgrad {m}x{n}x{k}: diff {diff:.2e}, all finite: {finite}")
    return 0 if finite and diff < 1e-6 else 1


def run_once(m: int, n: int, k: int, overrides: str = "") -> int:
    """One production call on fresh inputs, checked: what each sanitizer run (and ncu) executes."""
    if overrides.split(",")[0] == "wgrad":
        return run_wgrad_once(m, n, k, overrides[len("wgrad"):].lstrip(","))
    from numba import cuda

    from gemm.api import gemm
    from gemm.dispatch import run_dense
    from gemm.fp8 import bf16_to_float, calc_diff
    from gemm.testing.bench_configs import parse_config
    from gemm.testing.problems import BF16_NAN_BITS, device_problem, random_problem, reference_gemm
    a, sa, b, sb = random_problem(m, n, k)
    problem = device_problem(a, sa, b, sb)
    config = parse_config(f"production:{overrides}", m, n, k)
    print(f"{m}x{n}x{k}: {config.describe()}")
    rows = slice(0, min(m, 256))
    want = reference_gemm(a[rows], sa[rows], b, sb)
    if config.out_dtype == "f32":  # FP32 D (accumulate: D = 0 + A*B)
        d = cuda.to_device(np.full((m, n), 0.0 if config.accumulate else np.nan, np.float32))
        run_dense(problem.a, problem.sa, problem.b, problem.sb, d, d if config.accumulate else None, config=config)
        cuda.synchronize()
        got = d.copy_to_host()
    else:
        problem.d.copy_to_device(np.full((m, n), BF16_NAN_BITS, np.uint16))
        gemm(problem.a, problem.sa, problem.b, problem.sb, problem.d, config=config)
        cuda.synchronize()
        got = bf16_to_float(problem.d.copy_to_host())
    written = not np.isnan(got).any()
    diff = calc_diff(got[rows], want)
    print(f"{m}x{n}x{k}: diff {diff:.2e}, all written: {written}")
    return 0 if written and diff < 1e-3 else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("jobs", nargs="*", type=parse_job, help="M,N,K or M,N,K@field=value,... (default: %s)"
                        % " ".join(DEFAULT_JOBS))
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated (default %(default)s)")


def run(args) -> int:
    from ptx.device import is_hopper
    sanitizer = shutil.which("compute-sanitizer") or shutil.which("compute-sanitizer", path="/usr/local/cuda/bin")
    if sanitizer is None:
        print("gemm sanitize needs compute-sanitizer (CUDA toolkit): none on PATH or in /usr/local/cuda/bin",
              file=sys.stderr)
        return 2
    if not is_hopper():
        print("gemm sanitize runs the sm_90a kernels: it needs a Hopper GPU (none found)", file=sys.stderr)
        return 2
    jobs = args.jobs or [parse_job(job) for job in DEFAULT_JOBS]
    failures = 0
    for (m, n, k), overrides in jobs:
        for tool in args.tools.split(","):
            command = [sanitizer, "--tool", tool, "--error-exitcode", "1", sys.executable, "-m",
                       "gemm.testing.sanitize", "--once", str(m), str(n), str(k), overrides]
            done = subprocess.run(command, capture_output=True, text=True)
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-4:])
            print(f"--- {tool} {m}x{n}x{k} {overrides}\n{tail}\nrc={done.returncode}", flush=True)
            failures += done.returncode != 0
    print(f"{failures} of {len(jobs) * len(args.tools.split(','))} runs failed")
    return 1 if failures else 0


def time_in_graph(m: int, n: int, k: int, flush: str = "memset", overrides: str = "") -> int:
    """Production's call on fresh inputs, timed once by the bench's timer (4 pairs of flush and call; ``flush``:
    "memset" or "clean", as ``bench --flush``): ncu's target when the kernel is to be profiled where the timer runs
    it, right after a flush inside the graph (``ncu --graph-profiling node --cache-control none``; DeepGEMM's side:
    ``deepgemm_peer graph``). ``overrides``: production's config with these fields replaced, as ``--once``'s
    (``bench configs``' ``field=value,...``)."""
    from gemm.testing.timer import check_flush
    try:  # before the GPU check, so a wrong name is said on any machine
        check_flush(flush)
    except ValueError as error:
        print(f"sanitize --graph M N K [FLUSH]: {error}", file=sys.stderr)
        return 2
    from ptx.device import is_hopper
    if not is_hopper():
        print("sanitize --graph times the sm_90a kernels: it needs a Hopper GPU (none found)", file=sys.stderr)
        return 2
    import gemm
    from gemm.testing.bench_configs import parse_config
    from gemm.testing.problems import TorchProblem, device_problem, random_problem
    from gemm.testing.timer import bench_kernel
    host = random_problem(m, n, k)
    print(f"{m}x{n}x{k}: {parse_config(f'production:{overrides}', m, n, k).describe()}")
    if overrides:  # the config as bench configs times it (gemm.api.gemm on device arrays)
        config, arrays = parse_config(f"production:{overrides}", m, n, k), device_problem(*host)

        def launch(stream):
            gemm.api.gemm(arrays.a, arrays.sa, arrays.b, arrays.sb, arrays.d, stream, config=config)
    else:  # the public call, on torch tensors, as DeepGEMM's side is called
        problem = TorchProblem.from_host(*host)

        def launch(stream):
            gemm.fp8_gemm_nt((problem.a, problem.sa), (problem.b, problem.sb), problem.out, stream=stream)
    timing = bench_kernel(launch, pairs=4, reps=1, flush=flush)
    print(f"{m}x{n}x{k}: {timing}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--once"]:
        sys.exit(run_once(*(int(v) for v in sys.argv[2:5]), *sys.argv[5:6]))
    if sys.argv[1:2] == ["--graph"]:  # --graph M N K [FLUSH [FIELD=VALUE,...]]
        sys.exit(time_in_graph(*(int(v) for v in sys.argv[2:5]), *sys.argv[5:7]))
    parser = argparse.ArgumentParser(prog="python -m gemm.testing.sanitize")
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
