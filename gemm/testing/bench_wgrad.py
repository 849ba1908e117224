"""``python -m gemm bench wgrad``: the weight-gradient GEMMs beside DeepGEMM 2507, same inputs, same timer, one run.

    python -m gemm bench wgrad --deepgemm deepgemm-2507=/tmp/peers/deepgemm-2507

The shapes are DeepGEMM 2507's own ``tests/test_core.py`` list: wgrad (M, N) in (7168, 2112), (1536, 24576),
(512, 32768), (16384, 7168), (7168, 4096), (2048, 7168) at K = 4096 and 8192 tokens, and k-grouped wgrad with
4 x 4096, 4 x 8192 and 8 x 4096 tokens (uneven: +-128 per expert) at (7168, 4096) and (2048, 7168). Operands are
cast 1x128 on the GPU from Gaussian data; both contenders get the same bytes and the scales in DeepGEMM's
transposed (Kb, M) layout, which neither converts. Every contender is checked first (D starts from a known
residual; sampled rows against float64 on the GPU, every element finite), then timed interleaved, best of the
rounds. Bytes counted: A and B once, D read and written in FP32. Writes ``results/wgrad.json``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from gemm.fp8 import GROUP, calc_diff, ceil_div
from gemm.testing.bench_peers import OURS, Contender, _drop, run_contenders
from gemm.testing.deepgemm_peer import (DeepGemmProcess, parse_deepgemm, start_peers, wgrad_payload,
                                        wgrad_residual)
from gemm.testing.problems import torch_output_values
from gemm.testing.records import Column, command_line, device_info, format_table, write_result
from gemm.testing.timer import bench_kernel

WGRAD_SHAPES = [(m, n, k) for k in (4096, 8192)
                for m, n in ((7168, 2112), (1536, 24576), (512, 32768), (16384, 7168), (7168, 4096), (2048, 7168))]
K_GROUPED_SHAPES = [(groups, base_k, m, n) for groups, base_k in ((4, 4096), (4, 8192), (8, 4096))
                    for m, n in ((7168, 4096), (2048, 7168))]
CHECK_ROWS = 48
DIFF_LIMIT = 1e-6  # FP32 D against float64: DeepGEMM's measure is ~1e-10 on correct output
TIMING = ("CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only, median of 5; contenders "
          "interleaved A-B-B-A per shape, best of the rounds kept")


def uneven_k_sizes(groups: int, base_k: int) -> list[int]:
    """DeepGEMM's test pattern, made deterministic: experts at base_k - 128, + 128, +- 0 ..., the last one taking
    the rest, so the total stays groups * base_k."""
    sizes = [base_k + 128 * ((-1, 1, 0)[i % 3]) for i in range(groups - 1)]
    return sizes + [base_k * groups - sum(sizes)]


def wgrad_bytes(m: int, n: int, total_k: int, groups: int = 1) -> int:
    return (m + n) * total_k + 8 * groups * m * n + 4 * (m + n) * ceil_div(total_k, GROUP)


class WgradProblem:
    """One wgrad (or k-grouped) problem on the GPU in DeepGEMM's layout, with float64 references of sampled rows."""

    def __init__(self, m: int, n: int, k_sizes: list[int] | None, total_k: int, rng):
        import torch
        from gemm import k_grouped_transpose_cast_to_fp8, per_token_cast_to_fp8
        self.m, self.n, self.k_sizes = m, n, k_sizes
        self.groups = len(k_sizes) if k_sizes else 1
        generator = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**31)))
        x = torch.randn((total_k, m) if k_sizes else (m, total_k), device="cuda", generator=generator)
        y = torch.randn((total_k, n) if k_sizes else (n, total_k), device="cuda", generator=generator)
        if k_sizes:  # token-stacked, as a MoE layer holds them: each expert's block transposed and cast
            (self.a, self.sa), (self.b, self.sb) = (k_grouped_transpose_cast_to_fp8(t, k_sizes) for t in (x, y))
        else:
            (self.a, sa), (self.b, sb) = per_token_cast_to_fp8(x), per_token_cast_to_fp8(y)
            self.sa, self.sb = sa.t().contiguous(), sb.t().contiguous()
        del x, y
        shape = (self.groups, m, n) if k_sizes else (m, n)
        self.residual = wgrad_residual(torch, shape, "cuda")
        self.out = self.residual.clone()
        self.rows = np.union1d(rng.choice(self.groups * m, CHECK_ROWS - 2, replace=False), [0, self.groups * m - 1])
        self.reference = self._reference(torch)

    def _reference(self, torch) -> np.ndarray:
        """float64 residual + A*B^T on the sampled rows (of the stacked (G*M, N) view), on the GPU."""
        sizes = self.k_sizes or [self.a.shape[1]]
        rows = torch.as_tensor(self.rows, device="cuda")
        want = self.residual.reshape(-1, self.n).index_select(0, rows).double()
        a_flat, b_flat = self.a.reshape(-1), self.b.reshape(-1)
        offset = scale_row = 0
        for group, k in enumerate(sizes):
            kb = ceil_div(k, GROUP)
            picked = [i for i, r in enumerate(self.rows) if r // self.m == group]
            if k and picked:
                a = a_flat[offset * self.m:(offset + k) * self.m].view(self.m, k)
                b = b_flat[offset * self.n:(offset + k) * self.n].view(self.n, k)
                local = torch.as_tensor([self.rows[i] % self.m for i in picked], device="cuda")
                a_rows = _dequantize(torch, a.index_select(0, local), self.sa[scale_row:scale_row + kb].t()
                                     .index_select(0, local))
                b_all = _dequantize(torch, b, self.sb[scale_row:scale_row + kb].t())
                want[torch.as_tensor(picked, device="cuda")] += a_rows @ b_all.t()
                del b_all
            offset, scale_row = offset + k, scale_row + kb
        return want.cpu().numpy()

    def payload(self) -> dict:
        host = [t.cpu() for t in (self.a, self.sa, self.b, self.sb)]
        import torch
        a, b = (t.view(torch.uint8).numpy() for t in (host[0], host[2]))
        return wgrad_payload(a, host[1].numpy(), b, host[3].numpy(), self.k_sizes, self.groups)

    def launch(self, stream) -> None:
        from gemm.wgrad import fp8_wgrad_gemm_nt, k_grouped_fp8_wgrad_gemm_nt
        if self.k_sizes:
            k_grouped_fp8_wgrad_gemm_nt((self.a, self.sa), (self.b, self.sb), self.out, self.k_sizes, stream=stream)
        else:
            fp8_wgrad_gemm_nt((self.a, self.sa), (self.b, self.sb), self.out, stream=stream)

    def check(self, unwritten: int, values: np.ndarray) -> dict:
        diff = calc_diff(values, self.reference) if unwritten == 0 else float("nan")
        return {"unwritten": unwritten, "diff": diff, "correct": unwritten == 0 and diff < DIFF_LIMIT}


def _dequantize(torch, q, scales):
    """(rows, K) e4m3 and (rows, Kb) scales -> float64 (rows, K)."""
    k = q.shape[1]
    return q.double() * scales.double().repeat_interleave(GROUP, dim=1)[:, :k]


def _local_wgrad(problem: WgradProblem, launch=None) -> Contender:
    import torch
    launch = launch or problem.launch

    def check():
        problem.out.copy_(problem.residual)
        launch(torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        return problem.check(*torch_output_values(problem.out, problem.rows))

    def timed():
        timing = bench_kernel(launch)
        return {"median_us": timing.median_us, "min_us": timing.min_us}
    return Contender(OURS, check, timed)


def parse_variant(text: str) -> dict:
    """ "block_n=152,d_buffer=(128,32)" -> {"block_n": 152, "d_buffer": (128, 32)}: fields of the heuristic
    config to change (stages, unless given, become the most that fit)."""
    import ast
    fields = {}
    for part in _split_top_level(text):
        name, _, value = part.partition("=")
        try:
            fields[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise argparse.ArgumentTypeError(f"--variant {text!r}: {part!r} is not FIELD=VALUE") from None
    return fields


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "([" and 1 or (-1 if char in ")]" else 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [p for p in parts + [text[start:]] if p.strip()]


def variant_config(fields: dict, m: int, n: int, k: int):
    from gemm.heuristics import MAX_STAGES, choose_wgrad_config
    from gemm.kernel.config import max_stages
    config = choose_wgrad_config(m, n, k).replace(**fields)
    if "stages" not in fields:
        config = config.replace(stages=max_stages(config, n, None, limit=MAX_STAGES))
    return config


def _variant_wgrad(problem: WgradProblem, name: str, fields: dict) -> Contender:
    """Ours with a changed config (dense wgrad only): the same check and timer as ours."""
    from gemm import dispatch
    from gemm.validate import check_wgrad_args
    config = variant_config(fields, problem.m, problem.n, problem.a.shape[1])
    args = check_wgrad_args(problem.a, problem.sa.t(), problem.b, problem.sb.t(), problem.out)
    contender = _local_wgrad(problem, lambda stream: dispatch.run(args, stream, config))
    contender.name = name
    return contender


def _remote_wgrad(process: DeepGemmProcess, key, problem: WgradProblem, payload: dict) -> Contender:
    process.load(key, payload)
    return Contender(process.tree.name, lambda: problem.check(*process.check(key, problem.rows)),
                     lambda: process.time(key))


def wgrad_row(m: int, n: int, k_sizes: list[int] | None, total_k: int, rng, deepgemm: list[DeepGemmProcess], *,
              rounds: int = 2, variants: list[dict] = ()) -> dict:
    row = {"M": m, "N": n, "K": total_k}
    if k_sizes:
        row.update(groups=len(k_sizes), k_sizes=k_sizes)
    problem = WgradProblem(m, n, k_sizes, total_k, rng)
    key = ("wgrad", m, n, tuple(k_sizes or [total_k]))
    payload = problem.payload() if deepgemm else None
    make = [(OURS, lambda: _local_wgrad(problem))]
    if not k_sizes:
        row["configs"] = {OURS: variant_config({}, m, n, total_k).describe()}
        for fields in variants:
            name = "ours[" + ",".join(f"{key}={value}" for key, value in fields.items()).replace(" ", "") + "]"
            row["configs"][name] = variant_config(fields, m, n, total_k).describe()
            make.append((name, lambda name=name, fields=fields: _variant_wgrad(problem, name, fields)))
    make += [(p.tree.name, lambda p=p: _remote_wgrad(p, key, problem, payload)) for p in deepgemm]
    try:
        row = run_contenders(row, make, 2 * m * n * total_k, wgrad_bytes(m, n, total_k, problem.groups), rounds)
        # the ratio is to DeepGEMM only (run_contenders counts every other contender, our variants included)
        row.pop("ours_vs_best_deepgemm", None)
        peers = [row["tflops"][p.tree.name] for p in deepgemm if p.tree.name in row.get("tflops", {})]
        if OURS in row.get("tflops", {}) and peers:
            row["ours_vs_best_deepgemm"] = row["tflops"][OURS] / max(peers)
        return row
    finally:
        for process in deepgemm:
            _drop(process, key)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--deepgemm", type=parse_deepgemm, action="append", default=[], metavar="NAME=FOLDER",
                        help="a DeepGEMM tree with wgrad (2507) to time beside ours, e.g. "
                             "deepgemm-2507=/tmp/peers/deepgemm-2507")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds per shape (default 2)")
    parser.add_argument("--no-grouped", action="store_true", help="leave the k-grouped shapes out")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[], metavar="FIELD=VALUE,...",
                        help='ours with changed config fields as a further contender on the dense shapes, e.g. '
                             '"block_n=128" or "block_n=128,d_buffer=(128,32)" (repeat for several)')
    parser.add_argument("--shapes", default=None, help='dense shapes "M,N,K;..." instead of the test_core list')
    parser.add_argument("--warm-processes", type=int, default=None,
                        help="parallel DeepGEMM compile processes before timing (default: the CPU count)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="folder for wgrad.json")


def run(args) -> int:
    import torch
    rng = np.random.default_rng()
    from gemm.shapes import parse_shape_list
    shapes = parse_shape_list(args.shapes, 3, "7168,2112,4096") if args.shapes else WGRAD_SHAPES
    cases = [(m, n, None, k) for m, n, k in shapes]
    if not args.no_grouped:
        cases += [(m, n, uneven_k_sizes(groups, base_k), groups * base_k)
                  for groups, base_k, m, n in K_GROUPED_SHAPES]
    jobs = sorted({("wgrad", 1, m, n, k) for m, n, sizes, total in cases for k in (sizes or [total])})
    processes = start_peers(args.deepgemm, jobs, warm_processes=args.warm_processes)
    rows = []
    try:
        for m, n, sizes, total_k in cases:
            rows.append(wgrad_row(m, n, sizes, total_k, rng, processes, rounds=args.rounds, variants=args.variant))
            torch.cuda.empty_cache()
            row = rows[-1]
            timings = ", ".join(f"{name} {value:.0f}" for name, value in row.get("tflops", {}).items())
            print(f"{'k-grouped G=%d ' % row['groups'] if sizes else ''}{m}x{n}x{total_k}: {timings} TFLOP/s "
                  f"{row['status']} {row.get('errors', '')}", flush=True)
    finally:
        for process in processes:
            process.close()
    names = [OURS] + [p.tree.name for p in processes]
    names += sorted({name for r in rows for name in r.get("tflops", {}) if name not in names})
    table = [{"shape": (f"G={r['groups']} " if "groups" in r else "") + f"{r['M']}x{r['N']}x{r['K']}",
              **{name: r.get("tflops", {}).get(name, float("nan")) for name in names},
              "ratio": r.get("ours_vs_best_deepgemm", float("nan"))} for r in rows]
    print(format_table([Column("shape", "M x N x K (tokens)", "{}")] +
                       [Column(name, f"{name} TFLOP/s", "{:.0f}") for name in names] +
                       [Column("ratio", "ours / DeepGEMM", "{:.3f}")], table))
    ratios = [r["ours_vs_best_deepgemm"] for r in rows if "ours_vs_best_deepgemm" in r]
    summary = {"shapes": len(rows), "compared": len(ratios)}
    if ratios:
        summary.update(geomean_ours_vs_deepgemm=float(np.exp(np.mean(np.log(ratios)))),
                       at_or_above=sum(r >= 1.0 for r in ratios), lowest=min(ratios), highest=max(ratios))
    print(summary)
    path = args.out / "wgrad.json"
    write_result(path, command=command_line("gemm"), rows=rows, device=device_info(), summary=summary,
                 peers={p.tree.name: {"path": str(p.tree.path), "module": p.version} for p in processes},
                 timing=TIMING)
    print(f"wrote {path}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


__all__ = ["WGRAD_SHAPES", "K_GROUPED_SHAPES", "uneven_k_sizes", "wgrad_bytes", "WgradProblem", "wgrad_row",
           "add_arguments", "run"]
