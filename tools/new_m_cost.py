"""What a serving loop pays for a new M: 50 distinct M at N=2112, K=7168, in three states (GPU).

    python tools/new_m_cost.py            # prints host time beyond kernel time for each state

1. cold: a fresh process and an empty kernel cache (every config M needs is generated and assembled);
2. warm disk: a fresh process, the cubins cached on disk by (1) (configs are loaded, not assembled);
3. warm process: the same M again in the process of (2) (every kernel loaded: only launches).
The kernels' own time (sum of 2MNK / 1000 TFLOP/s, generous) is subtracted.
"""
import os
import subprocess
import sys
import tempfile

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


def main() -> int:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FP8LADDER_CACHE_DIR=cache, PYTHONPATH=os.getcwd())
        for state in ("cold cache, new process", "warm disk cache, new process"):
            done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
            print(f"[{state}]\n{done.stdout.strip()}{done.stderr[-2000:] if done.returncode else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
