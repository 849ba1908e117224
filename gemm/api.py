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
* All arrays on one CUDA device: the call runs there, whatever device is current (the launch makes that device's
  context current and restores the caller's); a ``stream`` must belong to it.
Kernels are generated and assembled per (config, N, K) at the first call (a fraction of a second), then cached
in memory and on disk (``FP8LADDER_CACHE_DIR``). M is a kernel parameter: a new M launches the same kernel.
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from gemm.fp8 import _mn_major_torch, align, sa_to_mn_major
from gemm import heuristics as _heuristics
from gemm.heuristics import choose_config, device_facts
from gemm.kernel import launch as _launch
from gemm.validate import BF16_DTYPES, F32, check_gemm_args
from ptx.arrays import as_device_view
from ptx.device import check_stream_of


OUT_DTYPES = BF16_DTYPES + (F32,)


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


def _copy_c_into_d(args, stream) -> None:
    """D = C + A*B adds into d: d must hold C first (nothing to do when c is d, the in-place case)."""
    if args.c.ptr == args.d.ptr:
        return
    if _is_torch(args.d.obj) and _is_torch(args.c.obj):
        import torch
        with torch.cuda.stream(_torch_stream_of(stream, args.d.obj.device)):
            args.d.obj.copy_(args.c.obj)
    else:
        from ptx.runtime import copy_device_async
        copy_device_async(args.d.ptr, args.c.ptr, args.m * args.n * 4, stream, device=args.device)


def _run(a, sa, b, sb, d, stream, config, c=None, *, plan_key=None) -> None:
    # Only torch can convert a row-major sa on the device (with its allocator, on its stream); other arrays
    # must come M-major, and check_gemm_args says which helper makes that.
    args = check_gemm_args(a, sa, b, sb, d, c, accept_row_major_sa=_is_torch(sa), out_dtypes=OUT_DTYPES)
    check_stream_of(stream, args.device)  # before any torch conversion or copy runs on it
    if args.sa_layout == "row_major":
        _warn_row_major_sa_once()
        converted = _sa_to_m_major_torch(args.sa.obj, stream)
        args = dataclasses.replace(args, sa=as_device_view(converted), sa_layout="m_major")
        plan_key = None  # the converted copy lives at a new address each call: nothing to reuse
    out_dtype = "f32" if args.d.dtype == F32 else "bf16"
    facts = device_facts(args.device)
    if callable(config):
        config = config(args.m, args.n, args.k)
    config = config or choose_config(args.m, args.n, args.k, facts, out_dtype=out_dtype,
                                     accumulate=args.c is not None)
    if config.out_dtype != out_dtype or config.accumulate != (args.c is not None):
        raise ValueError(f"config {config.describe()} writes a {config.out_dtype} D"
                         f"{' += A*B' if config.accumulate else ''}, but d is {args.d.dtype} and c is "
                         f"{'given' if args.c is not None else 'None'}")
    if args.c is not None:
        _copy_c_into_d(args, stream)
    # ``converted`` (when made) stays referenced by ``args`` until the launch is enqueued.
    if plan_key is None:
        _launch.launch(config, args, sm_count=facts.sm_count, stream=stream)
        return
    prepared = _launch.prepare(config, args, sm_count=facts.sm_count)
    if len(_PREPARED) >= MAX_PREPARED:
        _PREPARED.clear()
    _PREPARED[plan_key] = prepared
    prepared(stream or 0)


def gemm(a, sa, b, sb, d, stream=None, *, config=None) -> None:
    """The ladder's calling convention (``lessons``): D = (A*sA)(B*sB)^T. ``config``: a KernelConfig, or a
    function of (M, N, K) returning one (a lesson's), instead of the heuristics' choice. ``stream`` None: the
    legacy default stream."""
    _run(a, sa, b, sb, d, stream, config)


# -- the host hot path -------------------------------------------------------------------------------------
# A serving loop calls fp8_gemm_nt with the same tensors (or same-shaped ones at recycled addresses) over and
# over. Everything a call derives from its arguments (checks, config, tensor maps, packed kernel parameters) is a
# function of the tensors' device, pointers, shapes, strides and dtypes, plus the SM limit; so the first call with a
# given signature builds a ptx.runtime.PreparedLaunch (bound to that device) and later ones only look it up and
# launch it on the device's current stream (about 9 us in all on the H100: tools/host_profile.py). $FP8LADDER_FFMA_INTERLEAVE is read when a
# signature is first seen (reading the environment costs a microsecond a call); clear_prepared() forgets them.
MAX_PREPARED = 4096
_PREPARED: dict = {}


def _torch_signature(a, sa, b, sb, out) -> tuple:
    # Every argument's device is in the key (out's, at index 24, also picks the stream), so a freed address reused
    # on another GPU never hits a launch prepared for the first one.
    return (a.data_ptr(), a.shape, a.stride(), a.dtype, a.get_device(), sa.data_ptr(), sa.shape, sa.stride(),
            sa.dtype, sa.get_device(), b.data_ptr(), b.shape, b.stride(), b.dtype, b.get_device(), sb.data_ptr(),
            sb.shape, sb.stride(), sb.dtype, sb.get_device(), out.data_ptr(), out.shape, out.stride(), out.dtype,
            out.get_device(), _heuristics._SM_LIMIT)


def clear_prepared() -> None:
    """Forget every prepared launch (e.g. after changing $FP8LADDER_FFMA_INTERLEAVE in a running process)."""
    _PREPARED.clear()


def _torch_op(a, sa, b, sb, out, c) -> None:
    """Under torch.compile: the registered custom op (gemm.torch_ops), which a graph can hold."""
    from gemm import torch_ops  # noqa: F401  (registers the op)
    import torch
    in_place = c is not None and c is out
    torch.ops.fp8_ladder.fp8_gemm_nt(a, sa, b, sb, out, None if in_place else c, in_place)


def fp8_gemm_nt(lhs, rhs, out, c=None, *, stream=None) -> None:
    """out = c + (a * sa) @ (b * sb).T, for lhs = (a, sa), rhs = (b, sb); see the module docstring.

    a: (M, K) e4m3; sa: (M, K/128) float32, M-major (a row-major torch tensor is converted, with a one-time
    ScaleLayoutWarning); b: (N, K) e4m3; sb: (N/128, K/128) float32; out: (M, N) bf16 or float32. ``c``: an
    optional (M, N) float32 addend; out must then be float32 (``c=out`` adds into out in place, the fastest;
    another c is first copied into out on the device). The call runs on the device of its tensors (all on one),
    whichever device is current. ``stream``: a CUDA stream handle (int) or stream object of that device; by default
    torch's current stream on ``out``'s device when ``out`` is a torch tensor, else the default stream. Asynchronous, like
    any kernel launch. Under ``torch.compile`` the call becomes the custom op ``torch.ops.fp8_ladder.fp8_gemm_nt``.
    """
    (a, sa), (b, sb) = lhs, rhs
    key = None
    if type(out).__module__.startswith("torch"):
        import torch
        if torch.compiler.is_compiling():
            return _torch_op(a, sa, b, sb, out, c)
        if out.is_cuda and stream is None and c is None:
            try:
                key = _torch_signature(a, sa, b, sb, out)
            except AttributeError:  # an argument that is not a tensor: the checks below name it
                key = None
            else:
                prepared = _PREPARED.get(key)
                if prepared is not None:
                    return prepared(torch._C._cuda_getCurrentRawStream(key[24]))
        if stream is None and out.is_cuda:
            # A host ``out`` is left to check_gemm_args, which names it, rather than to torch's stream lookup.
            stream = torch._C._cuda_getCurrentRawStream(out.get_device())
    _run(a, sa, b, sb, out, stream, None, c, plan_key=key)


def get_mn_major_tma_aligned_tensor(sa):
    """(M, Kb) scales -> same values stored M-major with M padded to 4 floats (a copy; numpy or torch).

    torch: on sa's device and torch's current stream, padding zeroed, no host sync."""
    if _is_torch(sa):
        return _mn_major_torch(sa)
    return sa_to_mn_major(np.asarray(sa))


__all__ = ["fp8_gemm_nt", "gemm", "get_mn_major_tma_aligned_tensor", "ScaleLayoutWarning", "clear_prepared"]
