"""Run one stage (or the production kernel) once on one shape and check it: the target for compute-sanitizer
and ncu.

    compute-sanitizer --tool racecheck python3 tools/run_once.py 6 128 2112 512
    compute-sanitizer --tool memcheck python3 tools/run_once.py production 1000 2112 512
    compute-sanitizer --tool racecheck python3 tools/run_once.py production 520 2112 1024 \
        "block_m=256,block_n=128,stages=2,d_buffer=(128,64)"     # the heuristics' config with overrides
    compute-sanitizer --tool memcheck python3 tools/run_once.py production 300 2112 512 "out_dtype='f32',accumulate=True"
    ncu --set full -k regex:gemm python3 tools/run_once.py 8 4096 7168 16384
"""
import sys

import numpy as np

import lessons
from gemm.fp8 import bf16_to_float, calc_diff, random_problem, reference_gemm
from gemm.harness import device_problem


def main(stage: str, m: int, n: int, k: int, overrides: str = "") -> int:
    from numba import cuda
    a, sa, b, sb = random_problem(m, n, k)
    problem = device_problem(a, sa, b, sb)
    problem.d.copy_to_device(np.full((m, n), 0x7FC0, np.uint16))
    if stage == "production" and overrides:
        import os
        sys.path.insert(0, os.path.dirname(__file__))
        from sweep_configs import parse_config
        from gemm.api import _run
        config = parse_config(f"production:{overrides}", m, n, k)
        print(f"production config with {overrides}: {config.describe()}")
        if config.out_dtype == "f32":  # FP32 D (accumulate: D = 0 + A*B), checked and returned here
            d = cuda.to_device(np.full((m, n), np.nan if not config.accumulate else 0.0, np.float32))
            _run(problem.a, problem.sa, problem.b, problem.sb, d, None, config, d if config.accumulate else None)
            cuda.synchronize()
            got = d.copy_to_host()
            diff = calc_diff(got[:256], reference_gemm(a[:256], sa[:256], b, sb))
            print(f"{m}x{n}x{k} FP32 D: diff {diff:.2e}, all written: {not np.isnan(got).any()}")
            return 0 if not np.isnan(got).any() and diff < 1e-3 else 1

        def gemm(*args):
            _run(*args, None, config)
    elif stage == "production":
        from gemm.api import gemm
        from gemm.heuristics import choose_config
        print(f"production config: {choose_config(m, n, k).describe()}")
    else:
        gemm = lessons.stage(int(stage)).gemm
        if hasattr(lessons.stage(int(stage)), "config"):
            print(f"stage {stage} config: {lessons.stage(int(stage)).config(m, n, k).describe()}")
    gemm(problem.a, problem.sa, problem.b, problem.sb, problem.d)
    cuda.synchronize()
    got = bf16_to_float(problem.d.copy_to_host())
    rows = slice(0, min(m, 256))
    diff = calc_diff(got[rows], reference_gemm(a[rows], sa[rows], b, sb))
    written = not np.isnan(got).any()
    print(f"stage {stage} {m}x{n}x{k}: diff {diff:.2e}, all written: {written}")
    return 0 if written and diff < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *(int(x) for x in sys.argv[2:5]), *sys.argv[5:6]))
