"""The public dense GEMM, ``fp8_gemm_nt``: a thin face over the ladder's final stage.

The kernel itself lives in ``lessons/`` (one home per idea); this module picks the stage, accepts the
array types users hold (torch, CuPy, Numba; zero-copy), and keeps DeepGEMM's calling convention:

    fp8_gemm_nt((a, sa), (b, sb), out)

Alignment rules (checked, with a clear error when broken):
* K must be a multiple of 128 (one scale group); M and N are free (ragged edges are masked/zero-filled).
* a, b, out contiguous row-major; sb row-major; sa M-major with its M stride a multiple of 4 floats
  (``get_mn_major_tma_aligned_tensor`` makes one); every base pointer 16-byte aligned.
* All arrays on one CUDA device.
Kernels are generated and assembled per (M, N, K) at the first call (about a second), then cached in
memory and on disk (``FP8LADDER_CACHE_DIR``): later calls with the same shape only launch.
"""
from __future__ import annotations

import numpy as np

from gemm.fp8 import align, sa_to_mn_major

FINAL_STAGE = 6  # the stage that backs the public API; later stages replace it behind the same call


def _final_stage():
    import lessons
    return lessons.stage(FINAL_STAGE)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def fp8_gemm_nt(lhs, rhs, out, *, stream=None) -> None:
    """out = (a * sa) @ (b * sb).T in BF16, for lhs = (a, sa), rhs = (b, sb); see the module docstring.

    a: (M, K) e4m3; sa: (M, K/128) float32, M-major; b: (N, K) e4m3; sb: (N/128, K/128) float32;
    out: (M, N) bf16. ``stream``: a CUDA stream handle (int); by default torch's current stream when the
    arguments are torch tensors, else the default stream. Asynchronous, like any kernel launch.
    """
    (a, sa), (b, sb) = lhs, rhs
    if stream is None and _is_torch(out):
        import torch
        stream = torch.cuda.current_stream(out.device).cuda_stream
    _final_stage().gemm(a, sa, b, sb, out, stream=stream)


def get_mn_major_tma_aligned_tensor(sa):
    """(M, Kb) scales -> same values stored M-major with M padded to 4 floats (a copy; numpy or torch)."""
    if _is_torch(sa):
        import torch
        m, kb = sa.shape
        storage = torch.zeros((kb, align(m, 4)), dtype=torch.float32, device=sa.device)
        storage[:, :m] = sa.t()
        return storage[:, :m].t()
    return sa_to_mn_major(np.asarray(sa))
