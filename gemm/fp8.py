"""FP8 (e4m3) basics on the host: encode/decode, DeepSeek-V3 fine-grained casts, the float64 reference.

The GEMM contract used by every stage and by :func:`gemm.fp8_gemm_nt`:

* ``a``  (M, K) e4m3, row-major; ``sa`` (M, ceil(K/128)) float32: one scale per token per 128-wide K group,
  which the kernels read M-major, strides (1, align(M, 4)) (``per_token_cast_to_fp8(x, mn_major=True)`` writes
  that layout, :func:`sa_to_mn_major` converts to it; ``fp8_gemm_nt`` also converts a row-major torch sa).
* ``b``  (N, K) e4m3, row-major ("NT"); ``sb`` (ceil(N/128), ceil(K/128)) float32: one scale per 128x128 block.
* ``d = (a * sa) @ (b * sb).T`` in BF16, shape (M, N).

Scales are amax-based: each group is divided by ``amax / 448`` so its largest magnitude lands on the e4m3
maximum (amax is floored at 1e-4, as DeepGEMM's casts do, so a group below the floor maps under 448, or onto
it only through rounding).
With ``ue8m0=True`` the scale is rounded up to a power of two (:func:`ceil_to_ue8m0`, DeepSeek's "UE8M0"
scales): the largest magnitude then lands in [224, 448]. Host arrays use ``ml_dtypes.float8_e4m3fn`` (1 byte,
bit-identical to torch.float8_e4m3fn).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ptx.arrays import is_torch_tensor

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3_MAX = 448.0
GROUP = 128  # DeepSeek-V3's quantization granularity along K (and along N for the weights)
AMAX_FLOOR = 1e-4  # keeps all-zero groups finite, as DeepGEMM's casts do: groups below it map under 448


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align(x: int, to: int) -> int:
    return ceil_div(x, to) * to


def e4m3_encode(x) -> np.ndarray:
    """float -> e4m3 (round to nearest even, saturating at +-448); returns float8_e4m3fn."""
    x = np.clip(np.asarray(x, dtype=np.float32), -E4M3_MAX, E4M3_MAX)
    return x.astype(E4M3)


def e4m3_decode(q) -> np.ndarray:
    """e4m3 (float8_e4m3fn array, or its raw uint8 bits) -> float32."""
    q = np.asarray(q)
    if q.dtype == np.uint8:
        q = q.view(E4M3)
    if q.dtype != E4M3:
        raise TypeError(f"e4m3_decode: expected float8_e4m3fn or uint8 bits, got {q.dtype}")
    return q.astype(np.float32)


def bf16_to_float(d) -> np.ndarray:
    """BF16 array (ml_dtypes.bfloat16, or raw uint16 bits) -> float32."""
    d = np.asarray(d)
    if d.dtype == np.uint16:
        d = d.view(BF16)
    return d.astype(np.float32)


def _pad_to(x: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    pad = align(x.shape[axis], multiple) - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return np.pad(x, widths)


def ceil_to_ue8m0(x):
    """The smallest power of two >= x, bit-exact, for positive finite float32 x (NumPy array or torch tensor).

    Done on the float32 bits, so exact by construction whatever a platform's log2/exp2 round to: a normal number
    whose mantissa bits are nonzero gets its exponent incremented and its mantissa cleared; an exact power of
    two is returned as is; a subnormal goes to the next power of two of its mantissa (the smallest normal,
    2**-126, when that carries out of the mantissa). Beyond positive finite inputs: the sign is dropped
    (UE8M0 is unsigned, like DeepGEMM's ``2 ** ceil(log2(|x|))``), so -x gives the result of x; +-0 -> +0;
    values above 2**127 and +-inf -> +inf; NaN -> NaN. Returns float32 of x's shape (torch: on x's device).
    """
    if is_torch_tensor(x):
        return _ceil_to_ue8m0_torch(x)
    shape = np.shape(x)
    # At least 1-D: NumPy warns about the (intended, masked-out) wrap of mantissa - 1 on 0-d scalars only.
    bits = np.array(x, dtype=np.float32, ndmin=1).view(np.uint32) & np.uint32(0x7FFFFFFF)
    exponent, mantissa = bits & np.uint32(0x7F800000), bits & np.uint32(0x007FFFFF)
    normal = exponent + np.where(mantissa != 0, np.uint32(0x00800000), np.uint32(0))
    # Subnormals (exponent field 0) are mantissa * 2**-149: the next power of two of the mantissa, by smearing
    # its top bit down and adding one, is the answer's bit pattern too (1 << 23 is 2**-126, the smallest normal).
    smeared = mantissa - np.uint32(1)
    for shift in (1, 2, 4, 8, 16):
        smeared |= smeared >> np.uint32(shift)
    subnormal = np.where(mantissa == 0, np.uint32(0), smeared + np.uint32(1))
    out = np.where(exponent == 0, subnormal, np.where(exponent == 0x7F800000, bits, normal))
    return out.astype(np.uint32).view(np.float32).reshape(shape)


def _ceil_to_ue8m0_torch(x):
    """ceil_to_ue8m0 in torch, on x's device. int32 stands in for uint32 (torch's uint32 lacks bitwise ops on
    some versions): with the sign bit cleared every value is non-negative, and the largest one formed,
    0x7F800000 (+inf), fits."""
    import torch
    bits = x.to(torch.float32).contiguous().view(torch.int32) & 0x7FFFFFFF
    exponent, mantissa = bits & 0x7F800000, bits & 0x007FFFFF
    normal = exponent + (mantissa != 0).to(torch.int32) * 0x00800000
    smeared = mantissa - 1
    for shift in (1, 2, 4, 8, 16):
        smeared = smeared | (smeared >> shift)
    subnormal = torch.where(mantissa == 0, torch.zeros_like(mantissa), smeared + 1)
    out = torch.where(exponent == 0, subnormal, torch.where(exponent == 0x7F800000, bits, normal))
    return out.view(torch.float32)


def _scale_of(amax, ue8m0: bool):
    """amax (already floored) -> the float32 scale that maps it to 448, or with ue8m0 into [224, 448]."""
    scale = amax / E4M3_MAX
    return ceil_to_ue8m0(scale) if ue8m0 else scale


def mn_major_torch(scale):
    """(M, Kb) torch scales -> the same values as a strided (M, Kb) view of (Kb, align(M, 4)) storage."""
    import torch
    m, kb = scale.shape
    storage = torch.zeros((kb, align(m, 4)), dtype=torch.float32, device=scale.device)
    storage[:, :m] = scale.t()
    return storage[:, :m].t()


def _torch_cast(x, group_rows: int, ue8m0: bool):
    """The same casts in torch, on x's device: groups of (group_rows x 128); returns (fp8 tensor, scales)."""
    import torch
    rows, k = x.shape
    padded = torch.zeros((align(rows, group_rows), align(k, GROUP)), dtype=torch.float32, device=x.device)
    padded[:rows, :k] = x.float()
    blocks = padded.view(padded.shape[0] // group_rows, group_rows, -1, GROUP)
    scale = _scale_of(blocks.abs().amax(dim=(1, 3)).clamp(min=AMAX_FLOOR), ue8m0)
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    q = q.view(padded.shape)[:rows, :k].contiguous()
    return q, (scale if group_rows > 1 else scale.view(rows, -1))


def per_token_cast_to_fp8(x, *, mn_major: bool = False, ue8m0: bool = False):
    """(M, K) float -> ((M, K) e4m3, (M, ceil(K/128)) float32 scales), one scale per 1x128 group.

    NumPy in, NumPy out; a torch tensor is cast with torch on its own device (as DeepGEMM's helper does).
    ``mn_major=True``: the scales come back already in the kernel's layout, a strided (M, Kb) view with strides
    (1, align(M, 4)) of (Kb, align(M, 4)) storage (as :func:`sa_to_mn_major` makes), so that
    :func:`gemm.fp8_gemm_nt` takes them without converting. ``ue8m0=True``: power-of-two scales
    (:func:`ceil_to_ue8m0` of amax / 448).
    """
    if is_torch_tensor(x):
        if x.dim() != 2:
            raise ValueError(f"per_token_cast_to_fp8: x must be 2-D (M, K), got shape {tuple(x.shape)}")
        q, scale = _torch_cast(x, 1, ue8m0)
        return q, (mn_major_torch(scale) if mn_major else scale)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"per_token_cast_to_fp8: x must be 2-D (M, K), got shape {x.shape}")
    m, k = x.shape
    groups = _pad_to(x, 1, GROUP).reshape(m, -1, GROUP)
    amax = np.maximum(np.abs(groups).max(axis=2), AMAX_FLOOR)
    scale = _scale_of(amax.astype(np.float32), ue8m0)
    q = e4m3_encode(groups / scale[:, :, None]).reshape(m, -1)[:, :k]
    return np.ascontiguousarray(q), (sa_to_mn_major(scale) if mn_major else scale)


def transpose_cast_to_fp8(x, *, mn_major: bool = False, ue8m0: bool = False):
    """(T, C) float, T the token axis -> ((C, T) e4m3, (C, ceil(T/128)) float32): x^T cast 1x128 along the tokens.

    The weight-gradient GEMM (:func:`gemm.fp8_wgrad_gemm_nt`) reduces over tokens, so both of its operands are
    the transposes of token-major tensors, scaled per 128 tokens: ``dW = dy^T x`` takes
    ``transpose_cast_to_fp8(dy)`` as lhs and ``transpose_cast_to_fp8(x)`` as rhs. The e4m3 result is contiguous
    (C, T); ``mn_major=True`` returns the scales in the kernel's C-major layout (no conversion at the call).
    NumPy in, NumPy out; torch on its own device."""
    if len(getattr(x, "shape", ())) != 2:
        raise ValueError(f"transpose_cast_to_fp8: x must be 2-D (T, C), tokens first; got shape "
                         f"{tuple(getattr(x, 'shape', ()))}")
    transposed = x.t() if is_torch_tensor(x) else np.asarray(x, dtype=np.float32).T
    return per_token_cast_to_fp8(transposed, mn_major=mn_major, ue8m0=ue8m0)


def k_grouped_transpose_cast_to_fp8(x, k_sizes, *, ue8m0: bool = False):
    """Token-stacked (sum T_g, C) float, the groups' tokens one after another (``k_sizes`` = T_g) -> DeepGEMM's
    k-grouped wgrad operand: (flat e4m3 of each group's (C, T_g) block in turn, (sum ceil(T_g/128), C) float32
    scales, each group's transposed, C-major). What :func:`gemm.k_grouped_fp8_wgrad_gemm_nt` takes as lhs or
    rhs; empty groups contribute nothing. NumPy in, NumPy out; torch on its own device."""
    sizes = [int(t) for t in k_sizes]
    if len(getattr(x, "shape", ())) != 2 or int(x.shape[0]) != sum(sizes) or min(sizes, default=0) < 0:
        raise ValueError(f"k_grouped_transpose_cast_to_fp8: x must be (sum(k_sizes), C) = ({sum(sizes)}, C) with "
                         f"k_sizes >= 0, got shape {tuple(getattr(x, 'shape', ()))} and k_sizes {sizes}")
    columns = int(x.shape[1])
    blocks, scales, start = [], [], 0
    for tokens in sizes:
        if tokens:
            q, scale = transpose_cast_to_fp8(x[start:start + tokens], ue8m0=ue8m0)
            blocks.append(q.reshape(-1))
            scales.append(scale.t() if is_torch_tensor(scale) else scale.T)
        start += tokens
    if is_torch_tensor(x):
        import torch
        if not blocks:
            return (torch.empty(0, dtype=torch.float8_e4m3fn, device=x.device),
                    torch.empty((0, columns), dtype=torch.float32, device=x.device))
        return torch.cat(blocks), torch.cat(scales).contiguous()
    if not blocks:
        return np.empty(0, E4M3), np.empty((0, columns), np.float32)
    return np.concatenate(blocks), np.ascontiguousarray(np.concatenate(scales), np.float32)


def per_block_cast_to_fp8(x, *, ue8m0: bool = False):
    """(N, K) float -> ((N, K) e4m3, (ceil(N/128), ceil(K/128)) float32 scales), one per 128x128 block.

    ``ue8m0=True``: power-of-two scales (:func:`ceil_to_ue8m0` of amax / 448)."""
    if is_torch_tensor(x):
        if x.dim() != 2:
            raise ValueError(f"per_block_cast_to_fp8: x must be 2-D (N, K), got shape {tuple(x.shape)}")
        return _torch_cast(x, GROUP, ue8m0)
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"per_block_cast_to_fp8: x must be 2-D (N, K), got shape {x.shape}")
    n, k = x.shape
    padded = _pad_to(_pad_to(x, 0, GROUP), 1, GROUP)
    nb, kb = padded.shape[0] // GROUP, padded.shape[1] // GROUP
    blocks = padded.reshape(nb, GROUP, kb, GROUP)
    amax = np.maximum(np.abs(blocks).max(axis=(1, 3)), AMAX_FLOOR)
    scale = _scale_of(amax.astype(np.float32), ue8m0)
    q = e4m3_encode(blocks / scale[:, None, :, None]).reshape(nb * GROUP, kb * GROUP)[:n, :k]
    return np.ascontiguousarray(q), scale


def dequantize_per_token(q, scale) -> np.ndarray:
    """Inverse of per_token_cast_to_fp8, in float64."""
    q = e4m3_decode(q).astype(np.float64)
    s = np.repeat(np.asarray(scale, dtype=np.float64), GROUP, axis=1)[:, : q.shape[1]]
    return q * s


def dequantize_per_block(q, scale) -> np.ndarray:
    """Inverse of per_block_cast_to_fp8, in float64."""
    q = e4m3_decode(q).astype(np.float64)
    s = np.asarray(scale, dtype=np.float64)
    s = np.repeat(np.repeat(s, GROUP, axis=0), GROUP, axis=1)[: q.shape[0], : q.shape[1]]
    return q * s


def calc_diff(x, y) -> float:
    """DeepGEMM's similarity measure: 1 - 2*sum(x*y) / sum(x*x + y*y); 0 for identical, NaN-poisoned -> nan.

    Computed in float64: with NumPy for arrays; with torch when either argument is a torch tensor, on that tensor's
    device (a CUDA tensor is not copied to the host, the other argument is brought to its device)."""
    if is_torch_tensor(x) or is_torch_tensor(y):
        return _calc_diff_torch(x, y)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0 if np.array_equal(x, y) else 1.0
    return float(1.0 - 2.0 * (x * y).sum() / denominator)


def _calc_diff_torch(x, y) -> float:
    """calc_diff in torch, float64, on the device of the first torch tensor among (x, y); one host sync."""
    import torch
    device = (x if is_torch_tensor(x) else y).device

    def float64_on_device(v):
        if is_torch_tensor(v):
            return v.to(device=device, dtype=torch.float64)
        return torch.from_numpy(np.asarray(v, dtype=np.float64)).to(device)

    x, y = float64_on_device(x), float64_on_device(y)
    denominator, cross = torch.stack([(x * x + y * y).sum(), (x * y).sum()]).tolist()
    if denominator == 0:
        return 0.0 if torch.equal(x, y) else 1.0
    return 1.0 - 2.0 * cross / denominator


def sa_to_mn_major(sa: np.ndarray) -> np.ndarray:
    """(M, Kb) scales -> the same logical (M, Kb) array stored M-major with M padded to 4 floats (16 bytes).

    This is DeepGEMM's "column-major, TMA-aligned" layout for the activation scales: the scales a block of
    BLOCK_M rows needs for one K group are contiguous, so TMA can fetch them as one box.
    """
    sa = np.asarray(sa, dtype=np.float32)
    m, kb = sa.shape
    storage = np.zeros((kb, align(m, 4)), dtype=np.float32)
    storage[:, :m] = sa.T
    return storage[:, :m].T


__all__ = [
    "E4M3", "BF16", "E4M3_MAX", "GROUP", "AMAX_FLOOR", "ceil_div", "align", "e4m3_encode", "e4m3_decode",
    "bf16_to_float", "ceil_to_ue8m0", "per_token_cast_to_fp8", "per_block_cast_to_fp8", "transpose_cast_to_fp8",
    "k_grouped_transpose_cast_to_fp8", "dequantize_per_token",
    "dequantize_per_block", "calc_diff", "sa_to_mn_major",
]
