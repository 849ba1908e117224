"""The public dense GEMM, ``fp8_gemm_nt``: validated arguments -> a heuristic config -> the generated kernel.

The call goes ``check_gemm_args`` (:mod:`gemm.validate`) -> ``choose_config`` (:mod:`gemm.heuristics`) ->
``launch`` (:mod:`gemm.kernel.launch`, whose kernel is ``generate(config, n, k)`` of
:mod:`gemm.kernel.generator`). It accepts the array types users hold (torch, CuPy, Numba; zero-copy) and keeps
DeepGEMM's calling convention:

    fp8_gemm_nt((a, sa), (b, sb), out)

Alignment rules (checked, with a clear error when broken):
* K must be a multiple of 128 (one scale group); M and N are free (ragged edges are masked/zero-filled).
* a, b, out contiguous row-major; sb row-major; every base pointer 16-byte aligned.
* sa M-major with its M stride a multiple of 4 floats (the kernel's layout: ``per_token_cast_to_fp8(x,
  mn_major=True)`` casts into it, ``get_mn_major_tma_aligned_tensor`` converts to it). A row-major torch sa,
  what ``per_token_cast_to_fp8(x)`` returns, is accepted too and converted on the device at every call (an
  extra copy kernel; a :class:`ScaleLayoutWarning` says so once per process), as DeepGEMM does. Numba and
  CuPy arrays are not converted: they must come M-major.
* All arrays on one CUDA device.
Kernels are generated and assembled per (config, N, K) at the first call (a fraction of a second), then cached
in memory and on disk (``FP8LADDER_CACHE_DIR``). M is a kernel parameter: a new M launches the same kernel.
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from gemm.fp8 import _mn_major_torch, align, sa_to_mn_major
from gemm.heuristics import choose_config, device_facts
from gemm.kernel import launch as _launch
from gemm.validate import check_gemm_args
from ptx.arrays import as_device_view


class ScaleLayoutWarning(UserWarning):
    """sa came row-major and is converted to the kernel's M-major layout on every call (a performance note)."""


_warned_row_major_sa = False


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _warn_row_major_sa_once() -> None:
    global _warned_row_major_sa
    if _warned_row_major_sa:
        return
    _warned_row_major_sa = True
    warnings.warn(
        "fp8_gemm_nt: sa is row-major (M, K/128); it is converted to the kernel's M-major, TMA-aligned layout on "
        "the device at every call (an extra copy kernel). Cast with gemm.per_token_cast_to_fp8(x, mn_major=True) "
        "or convert once with gemm.get_mn_major_tma_aligned_tensor(sa) to avoid it. (Warned once per process.)",
        ScaleLayoutWarning, stacklevel=4)


def _torch_stream_of(handle, device):
    """The torch stream whose work is ordered with a launch on ``handle`` (None: the legacy default stream)."""
    import torch
    from ptx.runtime import stream_handle
    default = torch.cuda.default_stream(device)
    if handle is None:
        return default
    handle = stream_handle(handle)
    current = torch.cuda.current_stream(device)
    # torch's own stream objects where they match, so that its allocator sees the stream it already knows.
    for known in (current, default):
        if handle == known.cuda_stream:
            return known
    return torch.cuda.ExternalStream(handle, device=device)


def _sa_to_m_major_torch(sa, stream=None):
    """A row-major (M, Kb) torch sa -> a new M-major (M, Kb) view with strides (1, align(M, 4)), on the device.

    One allocation and one strided copy, both on the stream the GEMM is launched on (``stream``: a handle or
    stream object; None: the legacy default stream, where a launch with no stream runs). No host sync. Safe
    under CUDA-graph capture: the storage comes from torch's caching allocator (the graph's private pool while
    capturing) and the copy is captured with the GEMM, so each replay converts the sa then at its address.
    The storage is released when the caller drops the view; the allocator only hands that block to later work
    on the same stream, which runs after the GEMM has read it. The padding columns (M..align(M, 4)) are left
    unwritten: the kernel's sa tensor map is M wide, so TMA never reads them.
    """
    import torch
    m, kb = sa.shape
    with torch.cuda.stream(_torch_stream_of(stream, sa.device)):
        storage = torch.empty((kb, align(m, 4)), dtype=torch.float32, device=sa.device)
        view = storage[:, :m].t()
        view.copy_(sa)
    return view


def _run(a, sa, b, sb, d, stream, config) -> None:
    # Only torch can convert a row-major sa on the device (with its allocator, on its stream); other arrays
    # must come M-major, and check_gemm_args says which helper makes that.
    args = check_gemm_args(a, sa, b, sb, d, accept_row_major_sa=_is_torch(sa))
    if args.sa_layout == "row_major":
        _warn_row_major_sa_once()
        converted = _sa_to_m_major_torch(args.sa.obj, stream)
        args = dataclasses.replace(args, sa=as_device_view(converted), sa_layout="m_major")
    if callable(config):
        config = config(args.m, args.n, args.k)
    config = config or choose_config(args.m, args.n, args.k)
    # ``converted`` (when made) stays referenced by ``args`` until the launch is enqueued.
    _launch.launch(config, args, sm_count=device_facts().sm_count, stream=stream)


def gemm(a, sa, b, sb, d, stream=None, *, config=None) -> None:
    """The ladder's calling convention (``lessons``): D = (A*sA)(B*sB)^T. ``config``: a KernelConfig, or a
    function of (M, N, K) returning one (a lesson's), instead of the heuristics' choice. ``stream`` None: the
    legacy default stream."""
    _run(a, sa, b, sb, d, stream, config)


def fp8_gemm_nt(lhs, rhs, out, *, stream=None) -> None:
    """out = (a * sa) @ (b * sb).T in BF16, for lhs = (a, sa), rhs = (b, sb); see the module docstring.

    a: (M, K) e4m3; sa: (M, K/128) float32, M-major (a row-major torch tensor is converted, with a one-time
    ScaleLayoutWarning); b: (N, K) e4m3; sb: (N/128, K/128) float32; out: (M, N) bf16. ``stream``: a CUDA
    stream handle (int) or stream object; by default torch's current stream when ``out`` is a torch tensor,
    else the default stream. Asynchronous, like any kernel launch.
    """
    (a, sa), (b, sb) = lhs, rhs
    if stream is None and _is_torch(out) and out.is_cuda:
        # A host ``out`` is left to check_gemm_args, which names it, rather than to torch's stream lookup.
        import torch
        stream = torch.cuda.current_stream(out.device).cuda_stream
    _run(a, sa, b, sb, out, stream, None)


def get_mn_major_tma_aligned_tensor(sa):
    """(M, Kb) scales -> same values stored M-major with M padded to 4 floats (a copy; numpy or torch).

    torch: on sa's device and torch's current stream, padding zeroed, no host sync."""
    if _is_torch(sa):
        return _mn_major_torch(sa)
    return sa_to_mn_major(np.asarray(sa))


__all__ = ["fp8_gemm_nt", "gemm", "get_mn_major_tma_aligned_tensor", "ScaleLayoutWarning"]
