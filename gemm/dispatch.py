"""One call path for every GEMM type: validated arguments -> plan -> (prepared) launch.

    arguments (gemm.validate.GemmArgs: views, M, N, K, gemm_type, groups, the rows-to-groups layout)
      -> plan: the scales in the kernel's layout, D seeded with C, the config (heuristics or the caller's)
      -> launch: gemm.kernel.launch (tensor maps, grid, the kernel's arguments by name), or a prepared launch

:func:`run` is the path; :mod:`gemm.api` (dense) and :mod:`gemm.grouped` (m-grouped contiguous and masked) only
check their arguments and call it.

The host hot path: a serving loop calls with the same tensors (or same-shaped ones at recycled addresses) over and
over. Everything a call derives from its arguments (checks, config, tensor maps, packed kernel parameters) is a
function of the tensors' device, pointers, shapes, strides and dtypes, plus the SM limit (and, grouped, the layout
array and expected_m); so the first call with a given signature builds a ptx.runtime.PreparedLaunch (bound to that
device) under that signature and later ones only look it up and launch it on the device's current stream
(``python -m gemm bench host`` times each piece). $FP8LADDER_FFMA_INTERLEAVE is read when a signature is first seen;
:func:`clear_prepared` forgets them.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import warnings

from gemm import heuristics
from gemm.fp8 import align
from gemm.heuristics import choose_config, choose_grouped_config, choose_wgrad_config, device_facts
from gemm.kernel import launch as kernel_launch
from gemm.kernel.config import KernelConfig
from gemm.validate import BF16_DTYPES, F32, check_gemm_args
from ptx.arrays import as_device_view, is_torch_tensor
from ptx.device import check_stream_of

OUT_DTYPES = BF16_DTYPES + (F32,)
RAGGED_K_MULTIPLE = 16  # the generated kernels take K in 16-byte steps: TMA zero-fills the last 128-wide K block
MAX_PREPARED = 4096
PREPARED: dict = {}


class ScaleLayoutWarning(UserWarning):
    """sa came row-major and is converted to the kernel's M-major layout on every call (a performance note)."""


_warned_row_major_sa: set[str] = set()


def _warn_row_major_sa_once(gemm_type: str) -> None:
    if gemm_type in _warned_row_major_sa:
        return
    _warned_row_major_sa.add(gemm_type)
    if gemm_type == "wgrad":
        text = ("wgrad GEMM: sa or sb is not stored M-/N-major; it is converted to the kernel's layout on the device "
                "at every call (an extra copy kernel). Cast with gemm.transpose_cast_to_fp8(x, mn_major=True) or "
                "convert once with gemm.get_mn_major_tma_aligned_tensor(scales) to avoid it.")
    elif gemm_type == "normal":
        text = ("fp8_gemm_nt: sa is row-major (M, K/128); it is converted to the kernel's M-major, TMA-aligned layout "
                "on the device at every call (an extra copy kernel). Cast with gemm.per_token_cast_to_fp8(x, "
                "mn_major=True) or convert once with gemm.get_mn_major_tma_aligned_tensor(sa) to avoid it.")
    else:
        text = (f"m-grouped {gemm_type} GEMM: sa is row-major; it is converted to the kernel's M-major layout on the "
                "device at every call (an extra copy kernel). Store it M-major once (gemm.per_token_cast_to_fp8(x, "
                "mn_major=True) / gemm.grouped.masked_sa_to_mn_major(sa)) to avoid it.")
    warnings.warn(text + " (Warned once per process.)", ScaleLayoutWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stacklevel of the first frame outside this package: a warning names the caller's line."""
    package = os.path.dirname(__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == package:
        frame, level = frame.f_back, level + 1
    return level


def _scales_in_kernel_layout(args, stream):
    """A row-major torch sa (what a plain cast gives), and a 1x128 sb in any layout, -> converted copies on the
    launch's stream."""
    from gemm.torch_interop import sa_to_m_major
    if args.sa_layout != "m_major":
        _warn_row_major_sa_once("wgrad" if args.b_scales == "1x128" else args.gemm_type)
        view = as_device_view(sa_to_m_major(args.sa.obj, stream))
        pitch = align(args.m, 4) if args.gemm_type == "masked" else None
        args = dataclasses.replace(args, sa=view, sa_layout="m_major", sa_pitch=pitch)
    if args.b_scales == "1x128" and args.sb_layout != "m_major":
        _warn_row_major_sa_once("wgrad")
        args = dataclasses.replace(args, sb=as_device_view(sa_to_m_major(args.sb.obj, stream)), sb_layout="m_major")
    return args


def _seed_d_with_c(args, stream) -> None:
    """D = C + A*B adds into d: d must hold C first (nothing to do when c is d, the in-place case)."""
    if args.c.ptr == args.d.ptr:
        return
    if is_torch_tensor(args.d.obj) and is_torch_tensor(args.c.obj):
        from gemm.torch_interop import copy_into
        copy_into(args.d.obj, args.c.obj, stream)
    else:
        from ptx.runtime import copy_device_async
        copy_device_async(args.d.ptr, args.c.ptr, args.m * args.n * 4, stream, device=args.device)


def choose(args, config=None, heuristic_m: int | None = None) -> KernelConfig:
    """The call's config: the caller's (a KernelConfig, or a function of (M, N, K) returning one) or the
    heuristics' for the call's device; checked against what the arguments need. ``heuristic_m``: the M the
    heuristics see (masked: expected_m), default the call's M."""
    m = args.m if heuristic_m is None else heuristic_m
    if callable(config):
        config = config(m, args.n, args.k)
    out_dtype = "f32" if args.d.dtype == F32 else "bf16"
    facts = device_facts(args.device)
    if config is None and args.b_scales == "1x128":
        config = choose_wgrad_config(m, args.n, args.k, facts)
    elif config is None and args.gemm_type == "normal":
        config = choose_config(m, args.n, args.k, facts, out_dtype=out_dtype, accumulate=args.c is not None)
    elif config is None:
        config = choose_grouped_config(args.gemm_type, m, args.n, args.k, args.groups, facts)
    if config.b_scales != args.b_scales:
        raise ValueError(f"config {config.describe()} reads {config.b_scales} B scales, this call's sb is "
                         f"{args.b_scales}")
    if config.gemm_type != args.gemm_type:
        raise ValueError(f"config {config.describe()} is for gemm_type={config.gemm_type!r}, this call is "
                         f"{args.gemm_type!r}")
    if config.out_dtype != out_dtype or config.accumulate != (args.c is not None):
        raise ValueError(f"config {config.describe()} writes a {config.out_dtype} D"
                         f"{' += A*B' if config.accumulate else ''}, but d is {args.d.dtype} and c is "
                         f"{'given' if args.c is not None else 'None'}")
    return config


def run(args, stream=None, config=None, *, heuristic_m: int | None = None, plan_key=None) -> None:
    """Run validated arguments (any gemm_type) on their device. ``plan_key``: the call's signature, under which its
    prepared launch is kept for the next call (None: launch without keeping anything)."""
    check_stream_of(stream, args.device)  # before any conversion or copy runs on it
    if args.sa_layout != "m_major" or (args.b_scales == "1x128" and args.sb_layout != "m_major"):
        args = _scales_in_kernel_layout(args, stream)
        plan_key = None  # the converted copy lives at a new address each call: nothing to reuse
    config = choose(args, config, heuristic_m)
    if args.c is not None:
        _seed_d_with_c(args, stream)
    sm_count = device_facts(args.device).sm_count
    # a converted sa stays referenced by ``args`` until the launch is enqueued
    if plan_key is None:
        kernel_launch.launch(config, args, sm_count=sm_count, stream=stream)
        return
    prepared = kernel_launch.prepare(config, args, sm_count=sm_count)
    if len(PREPARED) >= MAX_PREPARED:
        PREPARED.clear()
    PREPARED[plan_key] = prepared
    prepared(stream or 0)


def run_dense(a, sa, b, sb, d, c=None, stream=None, *, config=None, plan_key=None) -> None:
    """Check dense arguments and run them: D = C + (a*sa)(b*sb)^T. Only torch can convert a row-major sa on the
    device (with its allocator, on its stream); other arrays must come M-major, and the check says which helper
    makes that."""
    args = check_gemm_args(a, sa, b, sb, d, c, accept_row_major_sa=is_torch_tensor(sa), out_dtypes=OUT_DTYPES,
                           k_multiple=RAGGED_K_MULTIPLE, strided_operands=True)
    run(args, stream, config, plan_key=plan_key)


# Signatures are flat tuples built without loops: they are on every call's path (a generator over the tensors
# measured slower). Every argument's device is in the key, so a freed address reused on another GPU never hits a
# launch prepared for the first one; out's device (index OUT_DEVICE) also picks the stream.
OUT_DEVICE = 24


def dense_signature(a, sa, b, sb, out) -> tuple:
    return (a.data_ptr(), a.shape, a.stride(), a.dtype, a.get_device(), sa.data_ptr(), sa.shape, sa.stride(),
            sa.dtype, sa.get_device(), b.data_ptr(), b.shape, b.stride(), b.dtype, b.get_device(), sb.data_ptr(),
            sb.shape, sb.stride(), sb.dtype, sb.get_device(), out.data_ptr(), out.shape, out.stride(), out.dtype,
            out.get_device(), heuristics._SM_LIMIT)


def grouped_signature(gemm_type: str, a, sa, b, sb, out, layout, expected_m) -> tuple:
    return dense_signature(a, sa, b, sb, out) + (gemm_type, expected_m, layout.data_ptr(), layout.shape,
                                                 layout.stride(), layout.dtype, layout.get_device())


def clear_prepared() -> None:
    """Forget every prepared launch (e.g. after changing $FP8LADDER_FFMA_INTERLEAVE in a running process)."""
    PREPARED.clear()


__all__ = ["run", "run_dense", "choose", "ScaleLayoutWarning", "dense_signature", "grouped_signature", "clear_prepared",
           "PREPARED", "MAX_PREPARED", "OUT_DEVICE"]
