"""``python -m gemm COMMAND``: the library's command line.

    python -m gemm prebuild --model deepseek-v3 --jobs 8      # compile a model's kernels into the disk cache
    python -m gemm prebuild --shapes "2112,7168;24576,1536" --max-m 4096

Benchmarks: ``python -m gemm bench dense | grouped | wgrad | configs | flush | host | new-m``;
``python -m gemm sanitize``; ``python -m gemm profile-regions`` (an ncu listing by kernel phase).
"""
from __future__ import annotations

import argparse
import sys

from gemm.shapes import parse_shape_list


def parse_nk_shapes(text: str) -> list[tuple[int, int]]:
    """ "N,K;N,K" (or NxK) -> [(N, K), ...]."""
    return parse_shape_list(text, 2, '--shapes "2112,7168;24576,1536"')


def _add_prebuild(commands) -> None:
    from gemm.prebuild import DEFAULT_MAX_M, MODELS
    parser = commands.add_parser(
        "prebuild", help="compile a model's kernels ahead of time into the disk cache",
        description="Compile every kernel the heuristics pick for the given (N, K) shapes and M in 1..--max-m into "
                    "the disk cache ($FP8LADDER_CACHE_DIR, default ~/.cache/fp8-ladder). No GPU needed. The cache "
                    "is keyed by content: copy the directory to other machines and point FP8LADDER_CACHE_DIR at it.")
    parser.add_argument("--shapes", type=parse_nk_shapes, default=[], metavar="N,K;N,K",
                        help='(N, K) pairs, e.g. "2112,7168;24576,1536"')
    parser.add_argument("--model", choices=MODELS, help="a preset list of (N, K) (with --shapes: both)")
    parser.add_argument("--max-m", type=int, default=DEFAULT_MAX_M, help="largest M served (default %(default)s)")
    parser.add_argument("--sm-count", type=int, default=None,
                        help="SMs the server uses (set_num_sms); default: the current device's "
                             "(CUDA_VISIBLE_DEVICES picks it), 132 (H100) without a GPU")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="parallel compile processes (default 1)")
    parser.add_argument("--cache-dir", default=None, help="write here instead of $FP8LADDER_CACHE_DIR")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only the summary")
    parser.set_defaults(run=_run_prebuild)


def _run_prebuild(args) -> int:
    from gemm.prebuild import prebuild
    if not args.shapes and not args.model:
        print("prebuild: give --shapes \"N,K;N,K\" and/or --model (e.g. --model deepseek-v3)", file=sys.stderr)
        return 2

    def progress(kernel, compiled):
        if not args.quiet:
            print(f"  {'compiled' if compiled else 'cached  '}  {kernel.describe()}", flush=True)
    report = prebuild(args.shapes, model=args.model, max_m=args.max_m, num_sms=args.sm_count, jobs=args.jobs,
                      cache_dir=args.cache_dir, progress=progress)
    print(report.summary())
    return 0


BENCHES = {  # name: (module under gemm.testing, what it times, its add_arguments / run)
    "dense": ("bench_peers", "fp8_gemm_nt beside cuBLAS blockwise and any DeepGEMM trees given (--deepgemm), in one "
              "run, on the DeepSeek shapes, 8192^3 and decode / prefill spots; --grouped adds the MoE shapes "
              "(results/gemm_bench.json)", "add_arguments", "run"),
    "grouped": ("bench_grouped", "the m-grouped contiguous and masked GEMMs on DeepGEMM's grouped shapes "
                "(results/grouped_bench.json)", "add_arguments", "run"),
    "wgrad": ("bench_wgrad", "the weight-gradient GEMMs (wgrad, k-grouped wgrad) beside DeepGEMM 2507 (--deepgemm) on "
              "its test_core shapes (results/wgrad.json)", "add_arguments", "run"),
    "configs": ("bench_configs", "named kernel configs (production[:field=value,...]) on shapes", "add_arguments", "run"),
    "flush": ("bench_flush", "the production kernel after a dirty (memset) and a clean (read) L2 flush, beside the "
              "memory floor (reading the same bytes) after each (results/l2_flush.json)", "add_arguments", "run"),
    "host": ("bench_host", "host time per call without a graph: dense, grouped, cuBLAS; the hot path piece by piece",
             "add_host_arguments", "run_host"),
    "new-m": ("bench_host", "host cost of 50 new M: cold cache, warm disk cache, warm process", None, "run_new_m"),
}


def _gpu_ready(command: str, needs_torch: bool = True) -> str | None:
    """None when a Hopper GPU (and torch with CUDA) is here, else the message that says what is missing."""
    from ptx.device import is_hopper
    if not is_hopper():
        return (f"{command} times the sm_90a kernels: it needs a Hopper GPU (none found). Without one, "
                "`python -m lessons ladder` assembles the kernels and `python -m lessons inspect 8` shows their "
                "resources; tests/ run them on the PTX emulator.")
    if needs_torch:
        from gemm.testing.problems import torch_available
        if not torch_available():
            return f"{command} needs torch with CUDA (its inputs and the cuBLAS peer are torch tensors)."
    return None


def _add_bench(commands) -> None:
    import importlib
    parser = commands.add_parser("bench",
                                 help="benchmarks (GPU): dense | grouped | wgrad | configs | flush | host | new-m",
                                 description="Check, then time with the one kernel timer (CUDA-graph replay of "
                                             "(L2 flush; call) pairs minus the flushes).")
    kinds = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (module, text, add, run) in BENCHES.items():
        sub = kinds.add_parser(name, help=text, description=text)
        if add:
            getattr(importlib.import_module(f"gemm.testing.{module}"), add)(sub)
        sub.set_defaults(run=_run_bench, bench_module=module, bench_run=run)


def _run_bench(args) -> int:
    import importlib
    problem = _gpu_ready(f"python -m gemm bench {args.bench}", needs_torch=args.bench not in ("configs", "flush"))
    if problem:
        print(problem, file=sys.stderr)
        return 2
    return getattr(importlib.import_module(f"gemm.testing.{args.bench_module}"), args.bench_run)(args)


def _add_sanitize(commands) -> None:
    from gemm.testing import sanitize
    parser = commands.add_parser("sanitize", help="compute-sanitizer memcheck/racecheck/synccheck (GPU)",
                                 description=sanitize.__doc__.split("\n")[0])
    sanitize.add_arguments(parser)
    parser.set_defaults(run=sanitize.run)


def _add_profile_regions(commands) -> None:
    from gemm.testing import ncu_regions
    parser = commands.add_parser("profile-regions", help="ncu's per-instruction samples summed by kernel phase (CPU)",
                                 description=ncu_regions.__doc__.split("\n\n")[0])
    ncu_regions.add_arguments(parser)
    parser.set_defaults(run=ncu_regions.run)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gemm", description="fp8-ladder's GEMM library: commands.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_prebuild(commands)  # further commands: one _add_<name>(commands) each
    _add_bench(commands)
    _add_sanitize(commands)
    _add_profile_regions(commands)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ValueError as error:
        print(f"{args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
