"""Argument checks shared by every stage and by the public API: bad input is a clear Python error.

A GPU kernel handed the wrong layout does not fail: it reads the wrong bytes, or faults with an illegal
address that kills the process. So everything a kernel assumes is checked here, before any launch, and
each error names the argument, says what was expected and which helper makes it.

The checks run in a fixed order, each stage over every argument before the next stage starts: array-ness,
then device (host memory, one device for all), then dtype, then rank and shape, then layout (strides), then
base-pointer alignment. So the first error names the most basic thing wrong: an argument left on the host is
reported as such, not as a layout problem of some other argument.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gemm.fp8 import BF16, E4M3, GROUP, align, ceil_div
from ptx.arrays import DeviceView, as_device_view
from ptx.device import DeviceMismatchError

FP8_DTYPES = (E4M3, np.dtype(np.uint8))  # raw e4m3 bytes are accepted as uint8
BF16_DTYPES = (BF16, np.dtype(np.uint16))  # raw bf16 bits are accepted as uint16
F32 = np.dtype(np.float32)
POINTER_ALIGNMENT = 16  # TMA and 16-byte vector loads need 16-byte aligned bases
NAMES = ("a", "sa", "b", "sb", "d")

SA_HELPERS = ("convert with gemm.get_mn_major_tma_aligned_tensor(sa), or cast with "
              "gemm.per_token_cast_to_fp8(x, mn_major=True), which writes this layout directly")
_MEANING = {  # what each argument is, and the helper that makes it
    "a": ("(M, K) activations, e4m3 FP8", "gemm.per_token_cast_to_fp8(x)"),
    "sa": ("(M, ceil(K/128)) float32 scales: one per token per 128-wide K group", "gemm.per_token_cast_to_fp8(x)"),
    "b": ("(N, K) weights, e4m3 FP8, stored row-major as (N, K): the NT layout", "gemm.per_block_cast_to_fp8(w)"),
    "sb": ("(ceil(N/128), ceil(K/128)) float32 scales: one per 128x128 block", "gemm.per_block_cast_to_fp8(w)"),
    "d": ("(M, N) BF16 or FP32 output", 'torch.empty((M, N), dtype=torch.bfloat16, device="cuda")'),
    "c": ("(M, N) FP32 addend: D = C + A*B", 'torch.zeros((M, N), dtype=torch.float32, device="cuda")'),
}
# the weight-gradient GEMM (1x128 scales on both operands, K = tokens): what its arguments are
_WGRAD_MEANING = {
    "a": ("(M, K) e4m3 FP8, K the token axis (e.g. the output gradient transposed)",
          "gemm.transpose_cast_to_fp8(grad_output)"),
    "sa": ("(M, ceil(K/128)) float32 scales: one per row per 128 tokens", "gemm.transpose_cast_to_fp8(grad_output)"),
    "b": ("(N, K) e4m3 FP8, K the token axis (e.g. the layer input transposed)", "gemm.transpose_cast_to_fp8(x)"),
    "sb": ("(N, ceil(K/128)) float32 scales: one per row per 128 tokens", "gemm.transpose_cast_to_fp8(x)"),
    "d": ("(M, N) FP32 weight gradient, accumulated in place: D += A*B^T",
          'torch.zeros((M, N), dtype=torch.float32, device="cuda")'),
}
WGRAD_K_MULTIPLE = 16  # K (tokens) only needs 16-byte rows for TMA: the last 128-token block is zero-filled


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
    c: DeviceView | None = None
    # "row_major" only when the caller asked the checks to accept it: the call path (gemm.dispatch) converts sa to
    # "m_major" (the only layout a kernel reads) before launching.
    sa_layout: str = "m_major"
    # The m-grouped GEMMs (gemm.grouped): the kernel type, G, and the device array that maps rows to groups
    # (contiguous: m_indices) or counts each group's rows (masked: masked_m). M is the rows of A (contiguous) or
    # of one group (masked: M_max).
    gemm_type: str = "normal"
    groups: int = 1
    layout: DeviceView | None = None
    sa_pitch: int | None = None  # masked: floats between one group's K groups of sa (None: from sa's strides)
    # "1x128": the weight-gradient GEMM: sb (N, Kb) per row of B, N-major like sa (sb_layout as sa_layout)
    b_scales: str = "128x128"
    sb_layout: str = "row_major"

    @property
    def sa_stride(self) -> int:
        """Elements between consecutive K groups of sa (the padded M)."""
        if self.sa_layout != "m_major":
            raise ValueError("sa is row-major: convert it to the M-major layout before launching")
        if self.sa_pitch is not None:
            return self.sa_pitch
        return self.sa.strides[1] if self.sa.shape[1] > 1 else align(self.m, 4)

    @property
    def sb_stride(self) -> int:
        """1x128: elements between consecutive K groups of sb (the padded N)."""
        if self.b_scales != "1x128" or self.sb_layout != "m_major":
            raise ValueError("sb_stride: only 1x128 B scales stored N-major have one")
        return self.sb.strides[1] if self.sb.shape[1] > 1 else align(self.n, 4)

    @property
    def device(self) -> int:
        """The CUDA device the call runs on: its arguments' (all on one, checked)."""
        return self.d.device_id


def sa_layout(view: DeviceView, m: int, kb: int) -> str | None:
    """How an (M, Kb) float32 scale view is stored: "m_major" (the kernels' layout: M-major, the K-group stride
    a multiple of 4 floats and at least M; what ``get_mn_major_tma_aligned_tensor`` and
    ``per_token_cast_to_fp8(x, mn_major=True)`` make), "row_major" (contiguous (M, Kb), what
    ``per_token_cast_to_fp8(x)`` returns), or None (anything else). A layout that is both (Kb == 1 and M-major
    strides, say) is "m_major": the kernel reads it as is.
    """
    s_m, s_k = view.strides
    if (s_m == 1 or m == 1) and (kb == 1 or (s_k >= m and s_k % 4 == 0)):
        return "m_major"
    if view.is_row_major():
        return "row_major"
    return None


def device_view(name: str, obj) -> DeviceView:
    """``obj`` as a DeviceView; an array type we cannot read names the argument."""
    try:
        return as_device_view(obj)
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None


def _what(view: DeviceView) -> str:
    obj = view.obj
    kind = f"{type(obj).__module__.split('.')[0]}.{type(obj).__name__}"
    device = getattr(obj, "device", None)
    return f"{kind} on {device}" if device is not None else kind


def check_devices(views: dict[str, DeviceView]) -> None:
    """Every argument in device memory, all on one device; else an error naming them and the fix."""
    # Numba's simulator arrays report device 0 (ptx.arrays), so these checks hold there too: no mode skips them.
    for name, view in views.items():
        if not view.on_device:
            raise ValueError(
                f"{name} is in host memory ({_what(view)}); every argument must be on one CUDA device: move "
                f"it there first (torch: {name}.cuda(); Numba: numba.cuda.to_device({name}); CuPy: "
                f"cupy.asarray({name}))")
    devices = {name: view.device_id for name, view in views.items()}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{name} on cuda:{device}" for name, device in devices.items())
        target = devices.get("d", devices.get("out"))
        raise DeviceMismatchError(
            f"all arguments must be on one CUDA device (the call runs on its tensors' device), got {where}; move "
            f"them to one device first (torch: x.to(\"cuda:{target}\"); the weights of each rank belong on that "
            f"rank's GPU)")


def _check_dtype(name: str, view: DeviceView, allowed, meaning: str, meanings=_MEANING) -> None:
    if view.dtype not in allowed:
        names = " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name} must be {meaning} ({names}), got dtype {view.dtype}; "
                        f"{meanings[name][1]} makes it")


def _check_shape(name: str, view: DeviceView, expected: tuple[int, int], meanings=_MEANING) -> None:
    if tuple(view.shape) != expected:
        meaning, helper = meanings[name]
        raise ValueError(f"{name} must have shape {expected} ({meaning}), got {tuple(view.shape)}; "
                         f"{helper} makes it")


def _check_row_major(name: str, view: DeviceView) -> None:
    if not view.is_row_major():
        expected = (view.shape[1], 1)
        raise ValueError(f"{name} must be contiguous row-major (strides {expected} for shape {tuple(view.shape)}), "
                         f"got strides {tuple(view.strides)}; make it with {name}.contiguous() (torch) or "
                         f"ascontiguousarray (NumPy, CuPy)")


def _check_rows(name: str, view: DeviceView) -> None:
    """An operand TMA can read: unit stride along K, rows at least K apart and a multiple of 16 bytes apart (a
    view into K-padded storage, as DeepGEMM's casts return, is read in place)."""
    rows, k = view.shape
    s_row, s_k = view.strides
    if s_k != 1 or (rows > 1 and (s_row < k or s_row * view.itemsize % POINTER_ALIGNMENT)):
        raise ValueError(f"{name} must have unit stride along K and rows a multiple of {POINTER_ALIGNMENT} bytes "
                         f"apart (at least K), got strides {tuple(view.strides)} for shape {tuple(view.shape)}; make "
                         f"it with {name}.contiguous() (torch) or ascontiguousarray (NumPy, CuPy)")


def check_gemm_args(a, sa, b, sb, d, c=None, *, k_multiple: int = GROUP, accept_row_major_sa: bool = False,
                    out_dtypes=BF16_DTYPES, strided_operands: bool = False) -> GemmArgs:
    """Validate D = C + (a*sa)(b*sb)^T arguments; returns their views and M, N, K. See gemm.fp8 for the contract.

    ``accept_row_major_sa``: let a contiguous row-major sa through (``GemmArgs.sa_layout == "row_major"``) for a
    caller that converts it to the M-major layout before launching, as ``fp8_gemm_nt`` does for torch tensors.
    ``out_dtypes``: what d may be (the lessons write BF16; ``fp8_gemm_nt`` also FP32). ``c``: the optional FP32
    addend; it needs an FP32 d. ``k_multiple``: 128 for the lessons' kernels; the production kernels take any
    multiple of 16 (TMA zero-fills the last K block). ``strided_operands``: a and b may be row views of wider
    storage (rows 16-byte multiples apart), which the production kernels' tensor maps read in place.
    """
    named = dict(zip(NAMES, (a, sa, b, sb, d)), **({"c": c} if c is not None else {}))
    views = {name: device_view(name, obj) for name, obj in named.items()}
    check_devices(views)
    va, vsa, vb, vsb, vd = (views[name] for name in NAMES)
    vc = views.get("c")

    _check_dtype("a", va, FP8_DTYPES, "e4m3 FP8")
    _check_dtype("b", vb, FP8_DTYPES, "e4m3 FP8")
    _check_dtype("sa", vsa, (F32,), "float32 scales")
    _check_dtype("sb", vsb, (F32,), "float32 scales")
    _check_dtype("d", vd, out_dtypes, "BF16 or FP32 output" if F32 in out_dtypes else "BF16 output")
    if vc is not None:
        _check_dtype("c", vc, (F32,), "the FP32 addend of D = C + A*B")
        if vd.dtype != F32:
            raise TypeError(f"d must be float32 when c is given (D = C + A*B is accumulated in FP32), got dtype "
                            f"{vd.dtype}; allocate d as float32 (or pass c=d to add into d in place)")

    for name, view in views.items():
        if len(view.shape) != 2:
            raise ValueError(f"{name} must be 2-D, {_MEANING[name][0]}, got shape {tuple(view.shape)}")
    m, k = va.shape
    n, kb_ = vb.shape
    if kb_ != k:
        raise ValueError(f"b must have shape (N, K) with the K of a ({k}), got {tuple(vb.shape)} (this is the NT "
                         "layout: b is stored row-major as (N, K), i.e. transposed)")
    if min(m, n, k) <= 0:
        raise ValueError(f"empty problem: M={m}, N={n}, K={k}")
    if k % k_multiple:
        why = ("one scale group is 128 wide along K" if k_multiple == GROUP else
               "TMA reads rows of 16-byte multiples; pad K with zeros")
        raise ValueError(f"K={k} must be a multiple of {k_multiple} ({why})")
    kb = ceil_div(k, GROUP)
    _check_shape("sa", vsa, (m, kb))
    _check_shape("sb", vsb, (ceil_div(n, GROUP), kb))
    _check_shape("d", vd, (m, n))
    if vc is not None:
        _check_shape("c", vc, (m, n))
    if vd.dtype == F32 and n % 4:
        raise ValueError(f"an FP32 d needs N % 4 == 0 (its rows are stored by TMA in 16-byte units), got N={n}; "
                         "pad N or use a BF16 d")

    for name in ("a", "b", "d", "sb") + (("c",) if vc is not None else ()):
        if strided_operands and name in ("a", "b"):
            _check_rows(name, views[name])
        else:
            _check_row_major(name, views[name])
    layout = sa_layout(vsa, m, kb)
    if layout is None or (layout == "row_major" and not accept_row_major_sa):
        note = ("; fp8_gemm_nt converts a row-major torch tensor itself, but not a Numba or CuPy array"
                if layout == "row_major" else "")
        raise ValueError(
            f"sa must be stored M-major with the M stride padded to a multiple of 4 floats (DeepGEMM's "
            f"column-major TMA-aligned layout: strides (1, {align(m, 4)}) for shape {(m, kb)}), got strides "
            f"{tuple(vsa.strides)}; {SA_HELPERS}{note}")

    for name, view in views.items():
        # sb is read with plain loads; a row-major sa is copied into fresh (aligned) storage before any launch.
        if name == "sb" or (name == "sa" and layout == "row_major"):
            continue
        if view.ptr % POINTER_ALIGNMENT:
            raise ValueError(f"{name} must start at a {POINTER_ALIGNMENT}-byte aligned address "
                             f"(got 0x{view.ptr:x}); slice views that shift the start are not supported")
    return GemmArgs(m, n, k, va, vsa, vb, vsb, vd, vc, layout)


def check_wgrad_args(a, sa, b, sb, d, *, convert_scales: bool = False) -> GemmArgs:
    """Validate the weight-gradient GEMM D += (a*sa)(b*sb)^T: a (M, K) and b (N, K) e4m3 with K the token axis,
    sa (M, ceil(K/128)) and sb (N, ceil(K/128)) float32 (1x128 both), d (M, N) float32 accumulated in place.

    K may be any multiple of 16 (TMA's 16-byte rows); 0 is the caller's (nothing to add). The scales must be stored
    M-major / N-major with the stride padded to 4 floats (what ``transpose_cast_to_fp8(x, mn_major=True)``
    writes); ``convert_scales``: let any other layout through (``sa_layout``/``sb_layout`` then say "row_major"
    or "strided") for a caller that converts them on the device before launching, as torch callers get."""
    named = dict(zip(NAMES, (a, sa, b, sb, d)))
    views = {name: device_view(name, obj) for name, obj in named.items()}
    check_devices(views)
    va, vsa, vb, vsb, vd = (views[name] for name in NAMES)
    for name, view in (("a", va), ("b", vb)):
        _check_dtype(name, view, FP8_DTYPES, "e4m3 FP8", _WGRAD_MEANING)
    for name, view in (("sa", vsa), ("sb", vsb)):
        _check_dtype(name, view, (F32,), "float32 scales", _WGRAD_MEANING)
    _check_dtype("d", vd, (F32,), "the FP32 weight gradient (D += A*B^T)", _WGRAD_MEANING)
    for name, view in views.items():
        if len(view.shape) != 2:
            raise ValueError(f"{name} must be 2-D, {_WGRAD_MEANING[name][0]}, got shape {tuple(view.shape)}")
    m, k = va.shape
    n, k_b = vb.shape
    if k_b != k:
        raise ValueError(f"b must have shape (N, K) with the K (tokens) of a ({k}), got {tuple(vb.shape)}")
    if min(m, n) <= 0 or k < 0:
        raise ValueError(f"empty problem: M={m}, N={n}, K={k}")
    if k % WGRAD_K_MULTIPLE:
        raise ValueError(f"K={k} (tokens) must be a multiple of {WGRAD_K_MULTIPLE}: TMA reads a and b in rows of "
                         "16-byte multiples; pad the token axis with zero rows (zeros add nothing to D)")
    kb = ceil_div(k, GROUP)
    _check_shape("sa", vsa, (m, kb), _WGRAD_MEANING)
    _check_shape("sb", vsb, (n, kb), _WGRAD_MEANING)
    _check_shape("d", vd, (m, n), _WGRAD_MEANING)
    if n % 4:
        raise ValueError(f"the FP32 d needs N % 4 == 0 (its rows are added by TMA in 16-byte units), got N={n}")
    for name in ("a", "b", "d"):
        _check_row_major(name, views[name])
    layouts = {}
    for name, view, rows in (("sa", vsa, m), ("sb", vsb, n)):
        layout = sa_layout(view, rows, kb) or "strided"
        if layout != "m_major" and not convert_scales:
            axis = "M" if name == "sa" else "N"
            raise ValueError(
                f"{name} must be stored {axis}-major with the {axis} stride padded to a multiple of 4 floats "
                f"(strides (1, {align(rows, 4)}) for shape {(rows, kb)}), got strides {tuple(view.strides)}; "
                "cast with gemm.transpose_cast_to_fp8(x, mn_major=True) or convert with "
                "gemm.get_mn_major_tma_aligned_tensor(scales) (torch tensors are converted on the device)")
        layouts[name] = layout
    for name, view in views.items():
        if name in layouts and layouts[name] != "m_major":
            continue  # converted into fresh (aligned) storage before any launch
        if view.ptr % POINTER_ALIGNMENT:
            raise ValueError(f"{name} must start at a {POINTER_ALIGNMENT}-byte aligned address (got 0x{view.ptr:x}); "
                             "a k-grouped slice must start at a 16-byte boundary (M*K and N*K multiples of 16)")
    # c is d: D += A*B^T in place (the TMA reduce-add), the FP32 accumulate path of every GEMM
    return GemmArgs(m, n, k, va, vsa, vb, vsb, vd, vd, layouts["sa"], b_scales="1x128", sb_layout=layouts["sb"])


__all__ = ["GemmArgs", "check_gemm_args", "check_wgrad_args", "WGRAD_K_MULTIPLE", "check_devices", "device_view", "sa_layout", "SA_HELPERS", "FP8_DTYPES", "BF16_DTYPES", "F32",
           "POINTER_ALIGNMENT"]
