"""The public dense GEMM, ``fp8_gemm_nt``: validated arguments -> a heuristic config -> the generated kernel.

The call goes ``check_gemm_args`` (:mod:`gemm.validate`) -> :func:`gemm.dispatch.run`, the one call path of every
GEMM type (config from :mod:`gemm.heuristics`, then :mod:`gemm.kernel.launch`, whose kernel is
``generate(config, n, k)`` of :mod:`gemm.kernel.generator`). It accepts the array types users hold (torch, CuPy, Numba; zero-copy) and keeps
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

import numpy as np

from gemm import dispatch
from gemm.dispatch import OUT_DEVICE, ScaleLayoutWarning, dense_signature
from gemm.fp8 import mn_major_torch, sa_to_mn_major
from ptx.arrays import is_torch_tensor

# Set by the first call with a torch ``out`` (torch is not imported before): (torch.Tensor, is_compiling, the
# current-stream getter), so that later calls skip the import, the type checks and the attribute lookups.
_HOT_PATH = None


def gemm(a, sa, b, sb, d, stream=None, *, config=None) -> None:
    """The ladder's calling convention (``lessons``): D = (A*sA)(B*sB)^T. ``config``: a KernelConfig, or a
    function of (M, N, K) returning one (a lesson's), instead of the heuristics' choice. ``stream`` None: the
    legacy default stream."""
    dispatch.run_dense(a, sa, b, sb, d, None, stream, config=config)


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
    hot = _HOT_PATH
    if hot is not None and type(out) is hot[0] and c is None and stream is None and not hot[1]():
        # The serving hot path (a plain torch tensor, a signature seen before): nothing but the lookup and the
        # launch. A CPU out's signature holds device -1, under which nothing is ever prepared.
        try:
            key = dense_signature(a, sa, b, sb, out)
        except AttributeError:  # an argument that is not a tensor: the checks below name it
            key = None
        else:
            prepared = dispatch.PREPARED.get(key)
            if prepared is not None:
                return prepared(hot[2](key[OUT_DEVICE]))
    return _checked_call(a, sa, b, sb, out, c, stream)


def _checked_call(a, sa, b, sb, out, c, stream) -> None:
    """fp8_gemm_nt past the hot path, every check on: under torch.compile, a signature not seen yet (its launch is
    prepared here, so a miss computes the signature twice, beside a launch's preparation), a c, a stream, arrays
    that are not CUDA torch tensors."""
    global _HOT_PATH
    key = None
    if is_torch_tensor(out):
        import torch
        if torch.compiler.is_compiling():
            return _torch_op(a, sa, b, sb, out, c)
        if out.is_cuda and stream is None and c is None:
            # (a CUDA out: this torch has CUDA, and the stream getter)
            _HOT_PATH = (torch.Tensor, torch.compiler.is_compiling, torch._C._cuda_getCurrentRawStream)
            try:
                key = dense_signature(a, sa, b, sb, out)
            except AttributeError:  # an argument that is not a tensor: the checks below name it
                key = None
            else:
                prepared = dispatch.PREPARED.get(key)
                if prepared is not None:
                    return prepared(torch._C._cuda_getCurrentRawStream(key[OUT_DEVICE]))
        if stream is None and out.is_cuda:
            # A host ``out`` is left to check_gemm_args, which names it, rather than to torch's stream lookup.
            stream = torch._C._cuda_getCurrentRawStream(out.get_device())
    dispatch.run_dense(a, sa, b, sb, out, c, stream, plan_key=key)


def get_mn_major_tma_aligned_tensor(sa):
    """(M, Kb) scales -> same values stored M-major with M padded to 4 floats (a copy; numpy or torch).

    torch: on sa's device and torch's current stream, padding zeroed, no host sync."""
    if is_torch_tensor(sa):
        return mn_major_torch(sa)
    return sa_to_mn_major(np.asarray(sa))


__all__ = ["fp8_gemm_nt", "gemm", "get_mn_major_tma_aligned_tensor", "ScaleLayoutWarning"]
