"""The public dense GEMM, ``fp8_gemm_nt``: validated arguments -> a heuristic config -> the generated kernel.

The call goes ``check_gemm_args`` (:mod:`gemm.validate`) -> ``choose_config`` (:mod:`gemm.heuristics`) ->
``launch`` (:mod:`gemm.kernel.launch`, whose kernel is ``generate(config, n, k)`` of
:mod:`gemm.kernel.generator`). It accepts the array types users hold (torch, CuPy, Numba; zero-copy) and keeps
DeepGEMM's calling convention:

    fp8_gemm_nt((a, sa), (b, sb), out)

Alignment rules (checked, with a clear error when broken):
* K must be a multiple of 128 (one scale group); M and N are free (ragged edges are masked/zero-filled).
* a, b, out contiguous row-major; sb row-major; sa M-major with its M stride a multiple of 4 floats
  (``get_mn_major_tma_aligned_tensor`` makes one); every base pointer 16-byte aligned.
* All arrays on one CUDA device.
Kernels are generated and assembled per (config, N, K) at the first call (a fraction of a second), then cached
in memory and on disk (``FP8LADDER_CACHE_DIR``). M is a kernel parameter: a new M launches the same kernel.
"""
from __future__ import annotations

import numpy as np

from gemm.fp8 import align, sa_to_mn_major
from gemm.heuristics import choose_config, device_facts
from gemm.kernel import launch as _launch
from gemm.validate import check_gemm_args


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def gemm(a, sa, b, sb, d, stream=None, *, config=None) -> None:
    """The ladder's calling convention (``lessons``): D = (A*sA)(B*sB)^T. ``config``: a KernelConfig, or a
    function of (M, N, K) returning one (a lesson's), instead of the heuristics' choice."""
    args = check_gemm_args(a, sa, b, sb, d)
    if callable(config):
        config = config(args.m, args.n, args.k)
    config = config or choose_config(args.m, args.n, args.k)
    _launch.launch(config, args, sm_count=device_facts().sm_count, stream=stream)


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
    gemm(a, sa, b, sb, out, stream=stream)


def get_mn_major_tma_aligned_tensor(sa):
    """(M, Kb) scales -> same values stored M-major with M padded to 4 floats (a copy; numpy or torch)."""
    if _is_torch(sa):
        import torch
        m, kb = sa.shape
        storage = torch.zeros((kb, align(m, 4)), dtype=torch.float32, device=sa.device)
        storage[:, :m] = sa.t()
        return storage[:, :m].t()
    return sa_to_mn_major(np.asarray(sa))
