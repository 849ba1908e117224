"""The dense benchmark's shapes and its one-row measurement of ours beside cuBLAS (``python -m gemm bench dense``
is :mod:`gemm.testing.bench_peers`, which adds DeepGEMM and interleaves them all).

:data:`BENCH_SHAPES`: the 18 DeepSeek-V3 shapes (M = 64, 128, 4096), 8192^3, and the decode and prefill spots the
peer baselines measured (M = 1, 16, 32, 256, 1024, 2048, 16384). :func:`measure_shape`: ours checked and timed,
then cuBLAS on the same inputs (the grouped bench's "dense at the same M" and the tests use it).
"""
from __future__ import annotations


from gemm.prebuild import MODEL_SHAPES
from gemm.shapes import parse_shape_list
from gemm.testing.peers import time_peer
from gemm.testing.problems import (TorchProblem, check_output, flops, gemm_bytes, poison_torch, random_problem,
                                   reference_rows, torch_bits)
from gemm.testing.timer import bench_kernel

DEEPSEEK_SHAPES = [(m, n, k) for m in (64, 128, 4096) for n, k in MODEL_SHAPES["deepseek-v3"]]
EXTRA_SHAPES = [(1, 7168, 2048), (16, 2112, 7168), (32, 4096, 7168), (256, 7168, 2048), (1024, 4096, 7168),
                (2048, 24576, 1536), (16384, 7168, 2048)]
BENCH_SHAPES = DEEPSEEK_SHAPES + [(8192, 8192, 8192)] + EXTRA_SHAPES


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


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """ "bench" (:data:`BENCH_SHAPES`), "deepseek" (the 18) or "M,N,K;M,N,K" (or MxNxK)."""
    if text == "deepseek":
        return list(DEEPSEEK_SHAPES)
    if text == "bench":
        return list(BENCH_SHAPES)
    return parse_shape_list(text, 3, '--shapes "64,2112,7168;4096,7168,16384"')


__all__ = ["DEEPSEEK_SHAPES", "EXTRA_SHAPES", "BENCH_SHAPES", "measure_shape", "parse_shapes"]
