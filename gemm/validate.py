"""Argument checks shared by every stage and by the public API: bad input is a clear Python error.

A GPU kernel handed the wrong layout does not fail: it reads the wrong bytes, or faults with an illegal
address that kills the process. So everything a kernel assumes is checked here, before any launch, and
each error names the argument and says what was expected.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemm.fp8 import BF16, E4M3, GROUP, align, ceil_div
from ptx.arrays import DeviceView, as_device_view

FP8_DTYPES = (E4M3, np.dtype(np.uint8))  # raw e4m3 bytes are accepted as uint8
BF16_DTYPES = (BF16, np.dtype(np.uint16))  # raw bf16 bits are accepted as uint16
F32 = np.dtype(np.float32)
POINTER_ALIGNMENT = 16  # TMA and 16-byte vector loads need 16-byte aligned bases


@dataclass(frozen=True)
class GemmArgs:
    m: int
    n: int
    k: int
    a: DeviceView
    sa: DeviceView
    b: DeviceView
    sb: DeviceView
    d: DeviceView

    @property
    def sa_stride(self) -> int:
        """Elements between consecutive K groups of sa (the padded M)."""
        return self.sa.strides[1] if self.sa.shape[1] > 1 else align(self.m, 4)


def _view(name: str, obj) -> DeviceView:
    try:
        return as_device_view(obj)
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None


def _check_dtype(name: str, view: DeviceView, allowed, meaning: str) -> None:
    if view.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name} must be {meaning} ({names}), got dtype {view.dtype}")


def _check_shape(name: str, view: DeviceView, expected: tuple[int, int], meaning: str) -> None:
    if tuple(view.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} ({meaning}), got {tuple(view.shape)}")


def _check_row_major(name: str, view: DeviceView) -> None:
    if not view.is_row_major():
        raise ValueError(f"{name} must be contiguous row-major, got strides {view.strides} for shape {view.shape}")


def check_gemm_args(a, sa, b, sb, d, *, k_multiple: int = GROUP) -> GemmArgs:
    """Validate D = (a*sa)(b*sb)^T arguments; returns their views and M, N, K. See gemm.fp8 for the contract."""
    views = {name: _view(name, obj) for name, obj in (("a", a), ("sa", sa), ("b", b), ("sb", sb), ("d", d))}
    for name, view in views.items():
        if len(view.shape) != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(view.shape)}")
    va, vsa, vb, vsb, vd = (views[n] for n in ("a", "sa", "b", "sb", "d"))
    _check_dtype("a", va, FP8_DTYPES, "e4m3 FP8")
    _check_dtype("b", vb, FP8_DTYPES, "e4m3 FP8")
    _check_dtype("sa", vsa, (F32,), "float32 scales")
    _check_dtype("sb", vsb, (F32,), "float32 scales")
    _check_dtype("d", vd, BF16_DTYPES, "BF16 output")

    m, k = va.shape
    n, kb_ = vb.shape
    if kb_ != k:
        raise ValueError(f"b must have shape (N, K) with the K of a ({k}), got {tuple(vb.shape)} (this is the NT "
                         "layout: b is stored row-major as (N, K), i.e. transposed)")
    if min(m, n, k) <= 0:
        raise ValueError(f"empty problem: M={m}, N={n}, K={k}")
    if k % k_multiple:
        raise ValueError(f"K={k} must be a multiple of {k_multiple} (one scale group is 128 wide along K)")
    kb = ceil_div(k, GROUP)
    _check_shape("sa", vsa, (m, kb), "M, ceil(K/128): one scale per token per 128-wide K group")
    _check_shape("sb", vsb, (ceil_div(n, GROUP), kb), "ceil(N/128), ceil(K/128): one scale per 128x128 block")
    _check_shape("d", vd, (m, n), "M, N")
    for name in ("a", "b", "d", "sb"):
        _check_row_major(name, views[name])
    if not (vsa.strides[0] == 1 or m == 1) or (kb > 1 and (vsa.strides[1] < m or vsa.strides[1] % 4)):
        raise ValueError(
            f"sa must be stored M-major with the M stride padded to a multiple of 4 floats (DeepGEMM's "
            f"column-major TMA-aligned layout), got strides {vsa.strides} for shape {tuple(vsa.shape)}; "
            "convert with gemm.get_mn_major_tma_aligned_tensor(sa)")

    # Numba's simulator arrays report device 0 (ptx.arrays), so these checks hold there too: no mode skips them.
    devices = {name: view.device_id for name, view in views.items()}
    for name, device in devices.items():
        if device < 0:
            raise ValueError(f"{name} is in host memory; every argument must be on the CUDA device")
    if len(set(devices.values())) > 1:
        raise ValueError(f"all arguments must be on one CUDA device, got {devices}")
    for name, view in views.items():
        if view.ptr % POINTER_ALIGNMENT and name != "sb":
            raise ValueError(f"{name} must start at a {POINTER_ALIGNMENT}-byte aligned address "
                             f"(got 0x{view.ptr:x}); slice views that shift the start are not supported")
    return GemmArgs(m, n, k, va, vsa, vb, vsb, vd)
