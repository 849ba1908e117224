"""MoE grouped GEMMs on the production generator: G experts' weights, one kernel launch (DeepGEMM's m-grouped).

Both compute, for each group (expert) g, ``out_g = (a_g * sa_g) @ (b[g] * sb[g]).T`` in BF16, with
``b`` (G, N, K) e4m3 and ``sb`` (G, ceil(N/128), K/128) float32 (:func:`gemm.per_block_cast_to_fp8` per expert):

* :func:`m_grouped_fp8_gemm_nt_contiguous` (prefill, training): the groups' tokens are stacked in one A
  (sum M, K), each group's rows starting at a multiple of :func:`get_m_alignment_for_contiguous_layout` (128) and
  padded to it with rows whose index is -1. ``m_indices`` (sum M,) int32 on the device gives every row's group.
  The kernel reads the group of each tile's first row: a tile whose first index is -1 is skipped (its rows of
  ``out`` are left as they were); otherwise the whole tile uses that group's B, so the -1 padding rows at the end
  of a group's last tile get meaningless (finite) values in ``out``. Rows of one 128-row block must therefore
  belong to one group: ``[g] * r + [-1] * (128 - r)``.
* :func:`m_grouped_fp8_gemm_nt_masked` (decode under CUDA graphs): A is (G, M_max, K) and ``masked_m`` (G,)
  int32 on the device says how many rows of each group are real. Only rows below ``masked_m[g]`` are computed
  and written; every other row of ``out`` is left untouched. Nothing is read back to the host, so a CUDA graph
  captures the call once and replays it with new counts in ``masked_m``. ``expected_m`` (a host int, e.g. the
  average count) picks the block shape and grid instead of the counts.

Layouts (checked; errors name the argument, what was expected and the helper that makes it):

* contiguous: ``a`` (sum M, K) e4m3 row-major; ``sa`` (sum M, K/128) float32 M-major with the M stride a multiple
  of 4 (as for :func:`gemm.fp8_gemm_nt`; a row-major torch ``sa`` is converted on the device with a one-time
  warning); ``out`` (sum M, N) BF16 row-major; sum M a multiple of 128.
* masked: ``a`` (G, M_max, K) e4m3 row-major; ``sa`` (G, M_max, K/128) float32 stored M-major per group, strides
  (K/128 * S, 1, S) with S >= M_max a multiple of 4 (:func:`masked_sa_to_mn_major` makes it; a row-major torch
  ``sa`` is converted on the device); ``out`` (G, M_max, N) BF16 row-major.

Host checks of the *values* of ``m_indices`` / ``masked_m`` (indices in -1..G-1 and groups aligned; counts in
0..M_max) need the array on the host: they run when that is free (a host array posing as a device one, as in the
CPU tests) or when asked (``check_indices=True`` / ``check_masked_m=True``: a device-to-host copy and a sync, not
allowed under CUDA-graph capture). Without them the kernel still stays in bounds: an index outside 0..G-1 skips its
tile like -1, and a count is clamped to 0..M_max.

TMA multicast is not used by grouped kernels (multicast=1): the two CTAs of a cluster would have to be in the same
group at every step, which the scheduler does not arrange.
"""
from __future__ import annotations


import numpy as np

from gemm.fp8 import GROUP, align, ceil_div
from gemm.kernel.config import CONTIGUOUS_ALIGNMENT
from gemm import dispatch
from gemm.validate import (BF16_DTYPES, F32, FP8_DTYPES, POINTER_ALIGNMENT, SA_HELPERS, GemmArgs, check_devices,
                           device_view, sa_layout)
from gemm.torch_interop import current_raw_stream
from ptx.arrays import DeviceView, is_torch_tensor

I32 = np.dtype(np.int32)
_BY_HELPER = {
    "a": "gemm.per_token_cast_to_fp8(x)",
    "b": "gemm.per_block_cast_to_fp8(w) per expert, stacked",
    "sb": "gemm.per_block_cast_to_fp8(w) per expert, stacked",
    "out": 'torch.empty(..., dtype=torch.bfloat16, device="cuda")',
    "m_indices": 'torch.tensor(indices, dtype=torch.int32, device="cuda")',
    "masked_m": 'torch.tensor(counts, dtype=torch.int32, device="cuda")',
}


def get_m_alignment_for_contiguous_layout() -> int:
    """Rows every group of an m-grouped contiguous A starts at a multiple of (and is padded to, with -1 rows)."""
    return CONTIGUOUS_ALIGNMENT


class GroupedLayoutError(ValueError):
    """m_indices or masked_m hold values the kernel cannot use as intended."""


# -- checks ------------------------------------------------------------------------------------------------
def _dtype(name: str, view: DeviceView, allowed, meaning: str) -> None:
    if view.dtype not in allowed:
        raise TypeError(f"{name} must be {meaning} ({' or '.join(str(d) for d in allowed)}), got dtype {view.dtype}; "
                        f"{_BY_HELPER.get(name, 'see gemm.grouped')} makes it")


def _shape(name: str, view: DeviceView, expected: tuple, meaning: str) -> None:
    if tuple(view.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)} ({meaning}), got {tuple(view.shape)}")


def _row_major(name: str, view: DeviceView) -> None:
    if not view.is_row_major():
        raise ValueError(f"{name} must be contiguous row-major, got strides {tuple(view.strides)} for shape "
                         f"{tuple(view.shape)}; make it with {name}.contiguous() (torch) or ascontiguousarray")


def _aligned(views: dict[str, DeviceView]) -> None:
    for name, view in views.items():
        if view.ptr % POINTER_ALIGNMENT:
            raise ValueError(f"{name} must start at a {POINTER_ALIGNMENT}-byte aligned address (got 0x{view.ptr:x}); "
                             "slice views that shift the start are not supported")


def _common(kind: str, a, sa, b, sb, out, layout, layout_name: str):
    named = {"a": a, "sa": sa, "b": b, "sb": sb, "out": out, layout_name: layout}
    views = {name: device_view(name, obj) for name, obj in named.items()}
    check_devices(views)
    _dtype("a", views["a"], FP8_DTYPES, "e4m3 FP8")
    _dtype("b", views["b"], FP8_DTYPES, "e4m3 FP8")
    _dtype("sa", views["sa"], (F32,), "float32 scales")
    _dtype("sb", views["sb"], (F32,), "float32 scales")
    _dtype("out", views["out"], BF16_DTYPES, "BF16 output")
    _dtype(layout_name, views[layout_name], (I32,), "int32 " + ("row group indices" if kind == "contiguous"
                                                                else "row counts per group"))
    vb = views["b"]
    if len(vb.shape) != 3:
        raise ValueError(f"b must be 3-D (G, N, K): one (N, K) e4m3 weight per group, stored row-major (NT), got "
                         f"shape {tuple(vb.shape)}; {_BY_HELPER['b']} makes it")
    groups, n, k = vb.shape
    if min(groups, n, k) <= 0:
        raise ValueError(f"b: empty problem, G={groups}, N={n}, K={k}")
    if k % GROUP:
        raise ValueError(f"K={k} (b's last dimension) must be a multiple of {GROUP} (one scale group is 128 wide)")
    kb = k // GROUP
    _shape("sb", views["sb"], (groups, ceil_div(n, GROUP), kb),
           "(G, ceil(N/128), K/128) float32: one scale per 128x128 block of each group's weight")
    return views, groups, n, k, kb


def _row_majors(views: dict[str, DeviceView]) -> None:
    for name in ("a", "b", "sb", "out", "m_indices", "masked_m"):
        if name in views:
            _row_major(name, views[name])


def _host_values(view: DeviceView, force: bool):
    """The array's values on the host when that costs nothing (host memory posing as the device's), or when
    ``force`` (a copy and a sync); else None."""
    obj = view.obj
    if isinstance(obj, np.ndarray):
        return obj
    if type(obj).__name__ == "FakeCUDAArray":  # Numba's simulator
        return obj._ary
    if not force:
        return None
    if is_torch_tensor(obj):
        return obj.detach().cpu().numpy()
    if hasattr(obj, "copy_to_host"):
        return obj.copy_to_host()
    if hasattr(obj, "get"):
        return obj.get()
    return np.asarray(obj)


def check_m_indices(indices: np.ndarray, groups: int) -> None:
    """The contiguous layout's rules on m_indices values (host array): every value in -1..G-1, and every 128-row
    block ``[g] * r + [-1] * (128 - r)`` (one group, padding only at its end)."""
    indices = np.asarray(indices)
    alignment = CONTIGUOUS_ALIGNMENT
    bad = np.flatnonzero((indices < -1) | (indices >= groups))
    if bad.size:
        raise GroupedLayoutError(f"m_indices[{bad[0]}] = {indices[bad[0]]}: group indices must be in 0..{groups - 1} "
                                 f"(G = b.shape[0]) or -1 for padding rows")
    blocks = indices.reshape(-1, alignment)
    first = blocks[:, :1]
    padding = blocks < 0
    # in each block: the rows before the first -1 all hold the block's first index, the rest are -1
    valid = np.where(np.cumsum(padding, axis=1) > 0, padding, blocks == first)
    wrong = np.argwhere(~valid)
    if wrong.size:
        block, row = (int(x) for x in wrong[0])
        start = block * alignment
        raise GroupedLayoutError(
            f"m_indices[{start + row}] = {blocks[block, row]} in the block of rows {start}..{start + alignment - 1}, "
            f"which starts with {blocks[block, 0]}: every group's rows must start at a multiple of "
            f"get_m_alignment_for_contiguous_layout() = {alignment} and be padded to it with -1 rows (a block holds "
            f"one group's rows, then -1 padding)")


def check_contiguous_args(a, sa, b, sb, out, m_indices, *, check_indices: bool | None = None,
                          accept_row_major_sa: bool = False) -> GemmArgs:
    """Validate the contiguous layout's arguments (see the module docstring); returns their views."""
    views, groups, n, k, kb = _common("contiguous", a, sa, b, sb, out, m_indices, "m_indices")
    va, vsa = views["a"], views["sa"]
    if len(va.shape) != 2 or va.shape[1] != k:
        raise ValueError(f"a must be (sum M, K={k}) e4m3: every group's tokens one after another, got shape "
                         f"{tuple(va.shape)}; {_BY_HELPER['a']} makes it")
    m = va.shape[0]
    alignment = CONTIGUOUS_ALIGNMENT
    if m == 0 or m % alignment:
        raise ValueError(f"a has {m} rows: the contiguous layout needs sum M to be a positive multiple of "
                         f"get_m_alignment_for_contiguous_layout() = {alignment} (pad every group's rows to a "
                         "multiple of it, with m_indices -1 on the padding rows)")
    _shape("m_indices", views["m_indices"], (m,), "int32 group of each row of a, -1 for padding rows")
    _shape("out", views["out"], (m, n), "(sum M, N) BF16")
    if len(vsa.shape) != 2 or tuple(vsa.shape) != (m, kb):
        raise ValueError(f"sa must have shape {(m, kb)} ((sum M, K/128) float32 scales, one per token per 128-wide "
                         f"K group), got {tuple(vsa.shape)}; gemm.per_token_cast_to_fp8(x, mn_major=True) makes it")
    _row_majors(views)
    layout = sa_layout(vsa, m, kb)
    if layout is None or (layout == "row_major" and not accept_row_major_sa):
        raise ValueError(f"sa must be stored M-major with the M stride a multiple of 4 floats (strides "
                         f"(1, {align(m, 4)}) for shape {(m, kb)}), got strides {tuple(vsa.strides)}; {SA_HELPERS}")
    aligned = {name: views[name] for name in ("a", "b", "out")}
    if layout == "m_major":
        aligned["sa"] = vsa
    _aligned(aligned)
    values = _host_values(views["m_indices"], bool(check_indices))
    if values is not None and check_indices is not False:
        check_m_indices(values, groups)
    return GemmArgs(m, n, k, va, vsa, views["b"], views["sb"], views["out"], sa_layout=layout,
                    gemm_type="contiguous", groups=groups, layout=views["m_indices"])


def masked_sa_stride(view: DeviceView) -> int | None:
    """S of a (G, M_max, Kb) sa stored M-major per group, strides (Kb*S, 1, S) with S >= M_max and S % 4 == 0
    (dimensions of size 1 may carry any stride); None when sa is stored otherwise."""
    groups, m, kb = view.shape
    s_g, s_m, s_k = view.strides
    if m > 1 and s_m != 1:
        return None
    if kb > 1:
        stride = s_k
        if groups > 1 and s_g != kb * stride:
            return None
    elif groups > 1:
        stride = s_g
    else:
        stride = align(m, 4)
    return stride if stride >= m and stride % 4 == 0 else None


def check_masked_args(a, sa, b, sb, out, masked_m, expected_m: int, *, check_masked_m: bool | None = None,
                      accept_row_major_sa: bool = False) -> GemmArgs:
    """Validate the masked layout's arguments (see the module docstring); returns their views."""
    views, groups, n, k, kb = _common("masked", a, sa, b, sb, out, masked_m, "masked_m")
    va, vsa = views["a"], views["sa"]
    if len(va.shape) != 3 or va.shape[0] != groups or va.shape[2] != k:
        raise ValueError(f"a must be (G={groups}, M_max, K={k}) e4m3: each group's rows padded to M_max, got shape "
                         f"{tuple(va.shape)}; {_BY_HELPER['a']} per group makes it")
    m = va.shape[1]
    if m <= 0:
        raise ValueError("a: M_max (a.shape[1]) must be positive")
    _shape("masked_m", views["masked_m"], (groups,), "int32 count of real rows in each group")
    _shape("out", views["out"], (groups, m, n), "(G, M_max, N) BF16")
    if tuple(vsa.shape) != (groups, m, kb):
        raise ValueError(f"sa must have shape {(groups, m, kb)} ((G, M_max, K/128) float32 scales), got "
                         f"{tuple(vsa.shape)}; gemm.grouped.masked_sa_to_mn_major(sa) stores them as the kernel reads")
    _row_majors(views)
    stride = masked_sa_stride(vsa)
    row_major = stride is None and vsa.is_row_major() and accept_row_major_sa
    if stride is None and not row_major:
        s = align(m, 4)
        raise ValueError(f"sa must be stored M-major per group: strides (K/128 * S, 1, S) with S >= M_max and S a "
                         f"multiple of 4, e.g. {(kb * s, 1, s)} for shape {(groups, m, kb)}, got strides "
                         f"{tuple(vsa.strides)}; convert with gemm.grouped.masked_sa_to_mn_major(sa) (DeepGEMM: "
                         "get_col_major_tma_aligned_tensor)")
    if not isinstance(expected_m, (int, np.integer)) or isinstance(expected_m, bool) or expected_m <= 0:
        raise ValueError(f"expected_m must be a positive int (the rows a group is expected to use, for the "
                         f"heuristics), got {expected_m!r}")
    aligned = {name: views[name] for name in ("a", "b", "out")}
    if not row_major:
        aligned["sa"] = vsa
    _aligned(aligned)
    values = _host_values(views["masked_m"], bool(check_masked_m))
    if values is not None and check_masked_m is not False:
        values = np.asarray(values)
        bad = np.flatnonzero((values < 0) | (values > m))
        if bad.size:
            raise GroupedLayoutError(f"masked_m[{bad[0]}] = {values[bad[0]]}: each count must be in 0..M_max = {m} "
                                     "(a.shape[1])")
    return GemmArgs(m, n, k, va, vsa, views["b"], views["sb"], views["out"],
                    sa_layout="row_major" if row_major else "m_major", gemm_type="masked", groups=groups,
                    layout=views["masked_m"], sa_pitch=None if row_major else stride)


# -- scales in the kernel's layout ---------------------------------------------------------------------------
def masked_sa_to_mn_major(sa):
    """(G, M_max, Kb) scales -> the same values stored M-major per group, strides (Kb*S, 1, S), S = align(M_max, 4)
    (a copy; NumPy or torch, on sa's device, padding zeroed): what :func:`m_grouped_fp8_gemm_nt_masked` reads."""
    if is_torch_tensor(sa):
        import torch
        groups, m, kb = sa.shape
        storage = torch.zeros((groups, kb, align(m, 4)), dtype=torch.float32, device=sa.device)
        storage[:, :, :m] = sa.transpose(1, 2)
        return storage[:, :, :m].transpose(1, 2)
    sa = np.asarray(sa, np.float32)
    groups, m, kb = sa.shape
    storage = np.zeros((groups, kb, align(m, 4)), np.float32)
    storage[:, :, :m] = sa.transpose(0, 2, 1)
    return storage[:, :, :m].transpose(0, 2, 1)


# -- the calls -------------------------------------------------------------------------------------------------
def _stream_for(out, stream):
    if stream is None and is_torch_tensor(out) and out.is_cuda:
        return current_raw_stream(out)
    return stream


def _prepared_key(gemm_type: str, a, sa, b, sb, out, layout, expected_m, *, eligible: bool):
    """The signature a torch call's prepared launch is kept under (gemm.dispatch), or None when the call may not
    reuse one: an explicit stream or config, a requested value check (a host sync), or not torch tensors on a GPU."""
    if not (eligible and is_torch_tensor(out) and out.is_cuda):
        return None
    try:
        return dispatch.grouped_signature(gemm_type, a, sa, b, sb, out, layout, expected_m)
    except AttributeError:  # an argument that is not a tensor: the checks name it
        return None


def _launch_prepared(key, out) -> bool:
    prepared = dispatch.PREPARED.get(key)
    if prepared is None:
        return False
    prepared(current_raw_stream(out))
    return True


def m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, m_indices, *, check_indices: bool | None = None,
                                     stream=None, config=None) -> None:
    """out[i] = (a[i] * sa[i]) @ (b[g] * sb[g]).T for every row i of a whose group g = m_indices[i] (module
    docstring): lhs = (a (sum M, K), sa (sum M, K/128)), rhs = (b (G, N, K), sb (G, ceil(N/128), K/128)), out
    (sum M, N) BF16, m_indices (sum M,) int32 on the device, each group aligned to
    :func:`get_m_alignment_for_contiguous_layout` and padded with -1. Blocks of 128 rows starting with -1 are left
    untouched in ``out``; -1 rows after a group's last row get meaningless values.

    ``check_indices``: None (default) checks m_indices' values only when they are readable without a device sync;
    True copies them to the host and checks (a sync: not under CUDA-graph capture); False never. ``stream``: a CUDA
    stream handle or object (default: torch's current stream for a torch ``out``). ``config``: a KernelConfig with
    gemm_type="contiguous" (or a function of (M, N, K) returning one) instead of the heuristics'."""
    (a, sa), (b, sb) = lhs, rhs
    key = _prepared_key("contiguous", a, sa, b, sb, out, m_indices, None,
                        eligible=stream is None and config is None and not check_indices)
    if key is not None and _launch_prepared(key, out):
        return
    args = check_contiguous_args(a, sa, b, sb, out, m_indices, check_indices=check_indices,
                                 accept_row_major_sa=is_torch_tensor(sa))
    dispatch.run(args, _stream_for(out, stream), config, plan_key=key)


def m_grouped_fp8_gemm_nt_masked(lhs, rhs, out, masked_m, expected_m: int, *, check_masked_m: bool | None = None,
                                 stream=None, config=None) -> None:
    """out[g, :masked_m[g]] = (a[g] * sa[g])[:masked_m[g]] @ (b[g] * sb[g]).T for every group g (module docstring):
    lhs = (a (G, M_max, K), sa (G, M_max, K/128) M-major per group), rhs = (b (G, N, K), sb (G, ceil(N/128),
    K/128)), out (G, M_max, N) BF16, masked_m (G,) int32 on the device; rows at or past masked_m[g] of ``out`` are
    left untouched. ``expected_m``: the rows a group typically uses, which picks the kernel (block shape); any
    counts in 0..M_max are computed correctly. No host sync: CUDA-graph capturable, replays read the counts then.

    ``check_masked_m``: as ``check_indices`` of :func:`m_grouped_fp8_gemm_nt_contiguous` (counts in 0..M_max).
    ``stream``, ``config``: as there (gemm_type="masked"; the function gets (expected_m, N, K))."""
    (a, sa), (b, sb) = lhs, rhs
    key = _prepared_key("masked", a, sa, b, sb, out, masked_m, expected_m,
                        eligible=stream is None and config is None and not check_masked_m)
    if key is not None and _launch_prepared(key, out):
        return
    args = check_masked_args(a, sa, b, sb, out, masked_m, expected_m, check_masked_m=check_masked_m,
                             accept_row_major_sa=is_torch_tensor(sa))
    dispatch.run(args, _stream_for(out, stream), config, heuristic_m=min(int(expected_m), args.m), plan_key=key)


__all__ = ["m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked", "get_m_alignment_for_contiguous_layout",
           "masked_sa_to_mn_major", "check_contiguous_args", "check_masked_args", "check_m_indices",
           "GroupedLayoutError"]
