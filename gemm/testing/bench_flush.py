"""``python -m gemm bench flush``: the production kernel after each L2 flush, beside the memory floor after each.

    python -m gemm bench flush                                  # the default decode / bandwidth shapes
    python -m gemm bench flush --shapes "64,7168,16384" --rounds 4

Per shape, four timings with the one timer, in palindrome order over ``--rounds``, best kept: ours (production
config) after the memset flush and after the clean one, and the *floor*: the timer's own read pass
(:mod:`gemm.testing.l2_flush`) over as many bytes as the GEMM moves (A, B, scales and D: ``gemm_bytes``), after
each flush. The floor is what reading those bytes costs on this GPU under this timer, so ours / floor is the
share of the memory speed of light a bandwidth-bound GEMM reaches. Writes ``results/l2_flush.json``.

``--calls-only``: no timing, one production call after each flush (memset, clean, memset, clean), for a profiler
to look at the GEMM alone, e.g. the DRAM bytes each flush leaves it to move (results/ncu_flush_dram_bytes.txt):

    ncu --cache-control none -k regex:fp8_gemm --metrics dram__bytes_read.sum,dram__bytes_write.sum \
        python -m gemm bench flush --shapes "64,7168,16384" --calls-only
"""
from __future__ import annotations

import argparse
import functools
from pathlib import Path

import numpy as np

from gemm.testing.l2_flush import FLUSHES, VECTOR_BYTES, enqueue_read_pass
from gemm.testing.problems import gemm_bytes
from gemm.testing.records import Column, command_line, device_info, format_table, write_result
from gemm.testing.timer import bench_kernel, palindrome

FLUSH_SHAPES = [(1, 7168, 2048), (16, 2112, 7168), (32, 4096, 7168), (64, 2112, 7168), (64, 7168, 16384),
                (128, 7168, 16384), (4096, 4096, 7168)]


def floor_launch(nbytes: int):
    """``launch(stream)`` reading ``nbytes`` (rounded up to 16) from a buffer of its own: the memory floor."""
    from gemm.testing.timer import _check, _current_device, _driver
    nbytes = -(-nbytes // VECTOR_BYTES) * VECTOR_BYTES
    device = _current_device()
    buffer = int(_check(_driver().cuMemAlloc(nbytes)))
    _check(_driver().cuMemsetD32(buffer, 0, nbytes // 4))
    return (lambda stream: enqueue_read_pass(buffer, nbytes, stream, device)), buffer


def flush_row(m: int, n: int, k: int, rng, rounds: int) -> dict:
    from gemm.testing.bench_configs import parse_config, time_configs
    from gemm.testing.timer import _check, _driver
    config = {"production": parse_config("production", m, n, k)}
    floor, buffer = floor_launch(gemm_bytes(m, n, k))
    contenders = []
    for flush in FLUSHES:
        timer = functools.partial(bench_kernel, flush=flush)
        contenders.append((f"ours/{flush}", lambda timer=timer: time_configs(m, n, k, config, rng, timer=timer)[0]))
        contenders.append((f"floor/{flush}", lambda timer=timer: {"time_us": timer(floor).median_us, "status": "ok"}))
    best, config_text = {}, None
    try:
        for name, timed in palindrome(contenders, rounds):
            result = timed()
            if result["status"] != "ok":
                raise RuntimeError(f"{m}x{n}x{k} {name}: {result['status']} (diff {result.get('diff')})")
            config_text = result.get("config", config_text)
            best[name] = min(best.get(name, float("inf")), result["time_us"])
    finally:
        _check(_driver().cuMemFree(buffer))
    byte_count = gemm_bytes(m, n, k)
    row = {"M": m, "N": n, "K": k, "config": config_text, "bytes": byte_count, "us": best,
           "gbs": {name: byte_count / us / 1e3 for name, us in best.items()}}
    for flush in FLUSHES:
        row[f"ours_vs_floor/{flush}"] = best[f"floor/{flush}"] / best[f"ours/{flush}"]
    return row


COLUMNS = ([Column("shape", "shape", align="left")]
           + [Column(f"gbs {name}", f"{name} GB/s", "{:.0f}") for name in
              ("ours/memset", "ours/clean", "floor/memset", "floor/clean")]
           + [Column(f"us {name}", f"{name} us", "{:.1f}") for name in ("ours/memset", "ours/clean")]
           + [Column(f"ours_vs_floor/{flush}", f"ours/floor ({flush})", "{:.2f}") for flush in FLUSHES])


def flat_row(row: dict) -> dict:
    flat = {"shape": f"{row['M']}x{row['N']}x{row['K']}"}
    flat.update({f"gbs {name}": value for name, value in row["gbs"].items()})
    flat.update({f"us {name}": value for name, value in row["us"].items()})
    flat.update({key: value for key, value in row.items() if key.startswith("ours_vs_floor")})
    return flat


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gemm.testing.bench_dense import parse_shapes
    parser.add_argument("--shapes", type=parse_shapes, default=FLUSH_SHAPES,
                        help='"M,N,K;M,N,K;..." (default: decode and bandwidth-bound shapes, and 4096x4096x7168)')
    parser.add_argument("--rounds", type=int, default=2, help="palindrome rounds per shape, best kept (default 2)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="folder for l2_flush.json")
    parser.add_argument("--calls-only", action="store_true",
                        help="time nothing: one call after each flush, twice, for a profiler (ncu)")


def calls_after_each_flush(m: int, n: int, k: int) -> None:
    """One production call after each flush, twice over, nothing timed (``--calls-only``)."""
    from gemm.api import gemm
    from gemm.testing.bench_configs import parse_config
    from gemm.testing.problems import device_problem, random_problem
    from gemm.testing.timer import FLUSH_BYTES, _current_device, _enqueue_flush, _flush_buffer, timing_stream
    from ptx.runtime import synchronize
    problem = device_problem(*random_problem(m, n, k))
    config = parse_config("production", m, n, k)
    stream = timing_stream()
    device = _current_device()
    buffer = _flush_buffer(FLUSH_BYTES, device)
    gemm(problem.a, problem.sa, problem.b, problem.sb, problem.d, stream, config=config)  # compiled, loaded
    synchronize(stream)
    for flush in FLUSHES * 2:
        _enqueue_flush(buffer, FLUSH_BYTES, stream, flush, device)
        gemm(problem.a, problem.sa, problem.b, problem.sb, problem.d, stream, config=config)
        synchronize(stream)
        print(f"{m}x{n}x{k}: one call after the {flush} flush", flush=True)


def run(args) -> int:
    if args.calls_only:
        for m, n, k in args.shapes:
            calls_after_each_flush(m, n, k)
        return 0
    rng = np.random.default_rng()
    rows = []
    for m, n, k in args.shapes:
        rows.append(flush_row(m, n, k, rng, args.rounds))
        print(format_table(COLUMNS, [flat_row(rows[-1])]).splitlines()[-1], flush=True)
    print(format_table(COLUMNS, [flat_row(r) for r in rows]))
    path = args.out / "l2_flush.json"
    write_result(path, command=command_line("gemm"), rows=rows, device=device_info(),
                 timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only, median of 5; "
                        f"{args.rounds} palindrome rounds over (ours, floor) x (memset, clean), best kept")
    print(f"wrote {path}")
    return 0


__all__ = ["FLUSH_SHAPES", "COLUMNS", "floor_launch", "flush_row", "flat_row", "run", "add_arguments"]
