"""``python -m gemm bench grouped``: the MoE m-grouped GEMMs (contiguous and masked) on DeepGEMM's grouped shapes
and on MoE decode shapes (masked, a few tokens per expert).

Each is checked (NaN-poisoned out, sampled rows per group against float64) and timed with the one timer; the
contiguous ones also beside our dense ``fp8_gemm_nt`` at the same total M, and the masked ones whose production
kernel swaps A and B (decode) beside the unswapped kernel (``choose_grouped_config(..., allow_swap_ab=False)``), a
row of its own in the same run. Writes ``results/grouped_bench.json``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gemm.fp8 import ceil_div
from gemm.testing.bench_dense import measure_shape
from gemm.testing.problems import (Reference, check_rows, masked_capacity, flops, grouped_inputs, poison_torch, reference_gemm,
                                   torch_output_parts)
from gemm.testing.records import Column, command_line, device_info, format_table, write_result
from gemm.testing.timer import bench_kernel, paired_speeds, palindrome


# DeepGEMM's grouped test shapes: (groups, M per group, N, K); masked with every row in use (masked_m = M).
CONTIGUOUS_SHAPES = [(4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)]
MASKED_SHAPES = [(1, 1024, 4096, 7168), (1, 1024, 7168, 2048), (2, 512, 4096, 7168), (2, 512, 7168, 2048),
                 (4, 256, 4096, 7168), (4, 256, 7168, 2048)]
# MoE decode (DeepEP low-latency: each expert gets a few tokens), DeepSeek-V3 per GPU: 16 or 8 local experts (EP 16
# or 32 of 256), 32 or 16 tokens each, the up/gate (N = 4096, K = 7168) and down (N = 7168, K = 2048) projections;
# masked_m = expected_m = M in slabs of 128 rows (gemm.testing.problems.masked_capacity). Production swaps A and B here
# (gemm.heuristics.masked_swap_ab_config).
MASKED_DECODE_SHAPES = [(16, 32, 4096, 7168), (16, 32, 7168, 2048), (8, 16, 4096, 7168), (8, 16, 7168, 2048)]
GROUPED_COLUMNS = [
    Column("layout", "layout", align="left"), Column("groups", "G"), Column("m_per_group", "M/group"),
    Column("n", "N"), Column("k", "K"), Column("config", "config", align="left"),
    Column("ours_us", "ours us", "{:.1f}"), Column("ours_tflops", "ours TFLOP/s", "{:.0f}"),
    Column("ours_gbps", "ours GB/s", "{:.0f}"), Column("dense_tflops", "dense same M TFLOP/s", "{:.0f}"),
    Column("vs_dense", "vs dense", "{:.2f}x"), Column("diff", "diff", "{:.1e}"), Column("status", "status", align="left"),
]
GROUPED_NOTE = ("masked with masked_m = M per group, in slabs of M rounded up to 128 rows; DeepGEMM and cuBLAS beside ours on these shapes, in the same "
                "run: python -m gemm bench dense --grouped --deepgemm ... (results/gemm_bench.json)")
GROUPED_REFERENCE_ROWS = 64  # rows per group checked against float64 (every row is checked for being written)


def grouped_bytes(rows: int, n: int, k: int, groups: int) -> int:
    """Bytes of A and its scales (the rows in use), every group's B and scales, and D (BF16), each moved once."""
    kb = ceil_div(k, 128)
    return rows * (k + 4 * kb + 2 * n) + groups * (n * k + 4 * ceil_div(n, 128) * kb)


@dataclass
class GroupedProblem:
    """One grouped problem on the GPU in our layouts, its launch, the float64 reference on sampled rows of D (seen as
    (G*M, N)), and the same operands as host arrays for a peer (:func:`gemm.testing.deepgemm_peer.grouped_payload`)."""
    layout: str
    groups: int
    m: int
    n: int
    k: int
    out: object
    launch: object
    reference: Reference
    config: object
    payload: dict

    def rows_in_use(self):
        """D's rows the call defines, as one (rows, N) tensor (masked: each group's first ``m`` of its slab)."""
        if self.layout != "masked":
            return self.out
        from gemm.testing.problems import masked_rows_in_use
        return masked_rows_in_use(self.out, [self.m] * self.groups)

    @property
    def flop_count(self) -> int:
        return flops(self.groups * self.m, self.n, self.k)

    @property
    def byte_count(self) -> int:
        return grouped_bytes(self.groups * self.m, self.n, self.k, self.groups)


def grouped_problem(layout: str, groups: int, m: int, n: int, k: int, rng, config=None) -> GroupedProblem:
    """``config``: a KernelConfig to run instead of the heuristics' (e.g. the unswapped masked kernel; None: the call
    chooses, as production's do)."""
    import torch
    from gemm.grouped import m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked
    from gemm.heuristics import choose_grouped_config
    from gemm.testing.deepgemm_peer import grouped_payload
    rows = masked_capacity(m) if layout == "masked" else m  # per group, in A and D
    a, sa, b, sb = grouped_inputs(layout, groups, rows, n, k)
    if layout == "contiguous":
        out = torch.empty((groups * m, n), dtype=torch.bfloat16, device="cuda")
        layout_array = torch.arange(groups, dtype=torch.int32, device="cuda").repeat_interleave(m)
        chosen = config or choose_grouped_config(layout, groups * m, n, k, groups)

        def launch(stream):
            m_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), out, layout_array, stream=stream, config=config)
    else:
        out = torch.empty((groups, rows, n), dtype=torch.bfloat16, device="cuda")
        layout_array = torch.full((groups,), m, dtype=torch.int32, device="cuda")
        chosen = config or choose_grouped_config(layout, m, n, k, groups)

        def launch(stream):
            m_grouped_fp8_gemm_nt_masked((a, sa), (b, sb), out, layout_array, m, stream=stream, config=config)
    host = lambda t: t.cpu().numpy()  # noqa: E731
    a_host = host(a.view(torch.uint8)).reshape(groups * rows, k)
    sa_host = np.ascontiguousarray(host(sa).reshape(groups * rows, -1))
    b_host, sb_host = host(b.view(torch.uint8)), host(sb)
    picked, values = [], []
    for g in range(groups):  # sampled rows of each group, against float64; indexed among the rows in use
        chosen_rows = np.sort(rng.choice(m, size=min(m, GROUPED_REFERENCE_ROWS), replace=False))
        picked.append(g * m + chosen_rows)
        values.append(reference_gemm(a_host[g * rows + chosen_rows], sa_host[g * rows + chosen_rows], b_host[g],
                                     sb_host[g]))
    reference = Reference(np.concatenate(picked), np.concatenate(values), sampled=True)
    payload = grouped_payload(layout, a_host.reshape(a.shape), sa_host.reshape(*a.shape[:-1], -1), b_host, sb_host,
                              host(layout_array), expected_m=m)
    return GroupedProblem(layout, groups, m, n, k, out, launch, reference, chosen, payload)


def measure_grouped(layout: str, groups: int, m: int, n: int, k: int, rng, timer=None, config=None) -> dict:
    """One row: the grouped GEMM checked (NaN-poisoned out, sampled rows per group vs float64) and timed;
    ``config``: a KernelConfig instead of the heuristics'."""
    import torch
    timer = timer or bench_kernel
    row = {"layout": layout, "groups": groups, "m_per_group": m, "n": n, "k": k}
    try:
        problem = grouped_problem(layout, groups, m, n, k, rng, config)
        config = problem.config
        row["config"] = f"{config.block_m}x{config.block_n}, {config.stages} stages" + \
            (", swap AB" if config.swap_ab else "")
        poison_torch(problem.out)
        problem.launch(None)
        torch.cuda.synchronize()
        check = check_rows(*torch_output_parts(problem.rows_in_use(), problem.reference.rows), problem.reference)
        timing = timer(problem.launch)
        row.update(ours_us=timing.median_us, ours_min_us=timing.min_us, pairs=timing.pairs,
                   ours_tflops=timing.tflops(problem.flop_count), ours_gbps=timing.gbps(problem.byte_count),
                   diff=check["diff"], unwritten=check["unwritten"], status="ok" if check["correct"] else "WRONG")
    except Exception as error:  # one shape's failure is a row, not the end of the run
        row.update(status="failed", error=f"{type(error).__name__}: {error}")
    return row


def grouped_shapes() -> list[tuple]:
    """(layout, G, M per group, N, K) of every grouped bench shape: DeepGEMM's, then the MoE decode ones."""
    return ([("contiguous", *s) for s in CONTIGUOUS_SHAPES]
            + [("masked", *s) for s in MASKED_SHAPES + MASKED_DECODE_SHAPES])


def unswapped_masked_config(groups: int, m: int, n: int, k: int):
    """The masked kernel production ran before swap AB, where production now swaps (decode); else None."""
    from gemm.heuristics import choose_grouped_config
    if not choose_grouped_config("masked", m, n, k, groups).swap_ab:
        return None
    return choose_grouped_config("masked", m, n, k, groups, allow_swap_ab=False)


def grouped_bench(out: Path | None = Path("results"), rng=None) -> list[dict]:
    """Check and time both grouped layouts on DeepGEMM's grouped shapes and the MoE decode ones
    (:func:`grouped_shapes`), the swapped masked kernels beside the unswapped; print the table and write
    grouped_bench.json into ``out`` (None: write nothing)."""
    import torch
    from tqdm import tqdm
    rng = rng or np.random.default_rng()
    rows = []
    for layout, groups, m, n, k in tqdm(grouped_shapes(), desc="grouped bench", unit="shape"):
        rows.append(measure_grouped(layout, groups, m, n, k, rng))
        unswapped = unswapped_masked_config(groups, m, n, k) if layout == "masked" else None
        if unswapped is not None:  # swap AB's gain, same run: the unswapped kernel as a row of its own
            swapped = rows[-1]
            rows.append(measure_grouped(layout, groups, m, n, k, rng, config=unswapped))
            if swapped.get("ours_us") and rows[-1].get("ours_us"):
                swapped["vs_unswapped"] = rows[-1]["ours_us"] / swapped["ours_us"]
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
        if "vs_unswapped" in row:
            print(f"swap AB, masked G={row['groups']} M={row['m_per_group']} N={row['n']} K={row['k']}: "
                  f"{row['vs_unswapped']:.3f}x the unswapped kernel's speed (same run)")
    for row in rows:
        if "error" in row:
            print(f"{row['layout']} G={row['groups']} M={row['m_per_group']} N={row['n']} K={row['k']}: {row['error']}")
    if out is not None:
        path = Path(out) / "grouped_bench.json"
        write_result(path, command=command_line("gemm"), rows=rows, device=device_info(),
                     reference_note=GROUPED_NOTE,
                     timing="CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5; "
                            "FLOPs and bytes count every row (masked_m = M per group)")
        print(f"wrote {path}")
    return rows


def beside_bench(fields: str, shapes: list[tuple], rounds: int, flush: str, out: Path | None, rng=None,
                 warmup: int = 0) -> list[dict]:
    """Each shape's production kernel and the same config with ``fields`` (``python -m gemm bench configs``'s
    ``field=value,...``) replaced, checked and timed ``rounds`` times in alternating order after ``warmup`` untimed
    passes over both (as bench configs' rounds), the best of each kept; a shape whose config does not take the
    fields (even_waves on a masked walk) is a row saying why. Writes grouped_beside_<flush>.json into ``out``
    (None: nothing)."""
    import functools
    from gemm.heuristics import choose_grouped_config
    from gemm.testing.bench_configs import parse_fields
    changes = parse_fields(fields)
    timer = functools.partial(bench_kernel, flush=flush)
    rng = rng or np.random.default_rng()
    rows = []
    for layout, groups, m, n, k in shapes:
        production = choose_grouped_config(layout, groups * m if layout == "contiguous" else m, n, k, groups)
        try:
            configs = {"production": production, f"production:{fields}": production.replace(**changes)}
        except ValueError as error:
            rows.append({"layout": layout, "groups": groups, "m": m, "n": n, "k": k, "name": f"production:{fields}",
                         "config": production.describe(), "status": f"n/a: {error}"})
            print(f"{layout} G={groups} M={m} N={n} K={k}: n/a ({error})", flush=True)
            continue
        for _ in range(warmup):  # the first kernels after the checks run on a cool GPU
            for config in configs.values():
                measure_grouped(layout, groups, m, n, k, rng, timer=timer, config=config)
        best: dict[str, dict] = {}
        rounds_us: dict[str, list] = {name: [] for name in configs}  # None: a round that was not ok
        for name in palindrome(configs, rounds):
            row = measure_grouped(layout, groups, m, n, k, rng, timer=timer, config=configs[name])
            rounds_us[name].append(row.get("ours_us") if row.get("status") == "ok" else None)
            rank = (row.get("status") != "ok", row.get("ours_us", float("inf")))  # a wrong round never wins
            if name not in best or rank < (best[name].get("status") != "ok",
                                           best[name].get("ours_us", float("inf"))):
                best[name] = {**row, "name": name, "config": configs[name].describe()}
        variant = best[f"production:{fields}"]
        if best["production"].get("ours_us") and variant.get("ours_us"):
            variant["vs_production"] = best["production"]["ours_us"] / variant["ours_us"]
        paired = paired_speeds(rounds_us, "production").get(f"production:{fields}")
        if paired:  # round by round (gemm.testing.timer.paired_speeds)
            variant["vs_production_paired"] = paired
        for name, times in rounds_us.items():
            best[name]["round_us"] = times
        rows += best.values()
        ratio = variant.get("vs_production", float("nan"))
        times = [best[name].get("ours_us", float("nan")) for name in configs]
        print(f"{layout} G={groups} M={m} N={n} K={k}: production {times[0]:.2f} us, with {fields} {times[1]:.2f} us "
              f"({ratio:.3f}x production's speed by bests"
              + (f", {paired['median']:.3f}x round by round" if paired else "") + ")", flush=True)
    if out is not None:
        path = Path(out) / f"grouped_beside_{flush}.json"
        write_result(path, command=command_line("gemm"), rows=rows, device=device_info(), flush=flush,
                     timing=f"best of {rounds} rounds in alternating order after {warmup} untimed "
                            f"pass{'es' * (warmup != 1)}, each the median of 5 graph replays of "
                            f"(L2 flush ({flush}); call) pairs minus flushes only; vs_production_paired: "
                            "production's time over the other's, round by round (median, low, high)")
        print(f"wrote {path}")
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("results"), help="folder for grouped_bench.json")
    parser.add_argument("--beside", metavar="FIELD=VALUE,...",
                        help="instead of the full bench: each shape's production kernel beside the same config with "
                             "these KernelConfig fields replaced (e.g. b_eviction=normal), rounds in alternating "
                             "order; writes grouped_beside_<flush>.json")
    parser.add_argument("--masked-decode", action="store_true", help="with --beside: the MoE decode shapes only")
    parser.add_argument("--rounds", type=int, help="with --beside: rounds (default 3)")
    parser.add_argument("--warmup", type=int, metavar="PASSES",
                        help="with --beside: untimed passes over both configs before the rounds (default 1)")
    parser.add_argument("--flush", choices=("memset", "clean"),
                        help="with --beside: the L2 flush before each timed call (default memset; gemm.testing.l2_flush)")


def run(args) -> int:
    warmup = args.warmup
    if not args.beside and (args.masked_decode or args.rounds is not None or args.flush is not None
                            or warmup is not None):
        raise SystemExit("python -m gemm bench grouped: --masked-decode, --rounds, --warmup and --flush go with "
                         "--beside (the full bench times every grouped shape once, after the memset flush)")
    if args.beside:
        args.rounds, args.flush = args.rounds or 3, args.flush or "memset"
        shapes = [("masked", *s) for s in MASKED_DECODE_SHAPES] if args.masked_decode else grouped_shapes()
        rows = beside_bench(args.beside, shapes, args.rounds, args.flush, args.out,
                            warmup=1 if warmup is None else warmup)
    else:
        rows = grouped_bench(args.out)
    timed = [r for r in rows if not r["status"].startswith("n/a")]  # n/a: a shape the fields do not apply to
    return 0 if timed and all(r["status"] == "ok" for r in timed) else 1


__all__ = ["CONTIGUOUS_SHAPES", "MASKED_SHAPES", "MASKED_DECODE_SHAPES", "GroupedProblem", "grouped_problem",
           "grouped_shapes", "unswapped_masked_config", "measure_grouped", "grouped_bench", "beside_bench", "grouped_bytes",
           "run"]
