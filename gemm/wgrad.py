"""The weight-gradient GEMMs of FP8 training (DeepSeek-V3's wgrad): D += A * B^T with 1x128 scales on both sides.

For a linear layer y = x W^T over T tokens, the backward pass needs dx = dy W (dgrad: the forward recipe again, the
weight scaled 128x128) and dW = dy^T x (wgrad). In wgrad both operands are activations or gradients and the
reduction runs over the tokens, so both are cast 1x128 *along the token axis* (:func:`transpose_cast_to_fp8`):
A = dy^T (out_features, T), B = x^T (in_features, T), K = T. The FP32 gradient is accumulated in place, over
micro-batches (and, k-grouped, per expert): D += A * B^T.

    from gemm import fp8_wgrad_gemm_nt, transpose_cast_to_fp8
    a, sa = transpose_cast_to_fp8(grad_output, mn_major=True)   # (O, T), (O, T/128)
    b, sb = transpose_cast_to_fp8(x, mn_major=True)             # (I, T), (I, T/128)
    fp8_wgrad_gemm_nt((a, sa), (b, sb), weight_grad)           # weight_grad (O, I) float32, += dy^T x

The kernel is the production generator with ``b_scales="1x128"`` (:mod:`gemm.kernel.config`): B's scales arrive
with each ring stage and every accumulator is promoted with sa[row] * sb[column]; it takes K at run time (one
kernel per N serves every token count) and K need only be a multiple of 16. DeepGEMM 2507's names,
``wgrad_gemm_fp8_fp8_fp32_nt`` and ``k_grouped_wgrad_gemm_fp8_fp8_fp32_nt``, are in :mod:`gemm.deepgemm_api`.
"""
from __future__ import annotations

import math

from gemm import dispatch
from gemm.fp8 import GROUP, ceil_div
from gemm.validate import check_wgrad_args
from ptx.arrays import is_torch_tensor


def _scales_as_rows_by_groups(scales, rows: int, k: int):
    """DeepGEMM accepts the scales as (rows, Kb), or already transposed as (Kb, rows) (its k-grouped layout);
    the latter is returned as the (rows, Kb) view it is, which is the kernel's MN-major layout when rows % 4 == 0."""
    kb = ceil_div(k, GROUP)
    shape = tuple(getattr(scales, "shape", ()))
    if shape != (rows, kb) and shape == (kb, rows):
        return scales.t() if is_torch_tensor(scales) else scales.T
    return scales


def fp8_wgrad_gemm_nt(lhs, rhs, out, *, stream=None) -> None:
    """out += (a * sa) @ (b * sb).T, for lhs = (a, sa), rhs = (b, sb): the weight-gradient GEMM.

    a: (M, K) e4m3 and b: (N, K) e4m3, K the token axis (any multiple of 16; 0 adds nothing); sa: (M, ceil(K/128))
    and sb: (N, ceil(K/128)) float32, one scale per row per 128 tokens, stored M-/N-major (what
    :func:`transpose_cast_to_fp8` with ``mn_major=True`` returns; torch scales in another layout, e.g. row-major or
    DeepGEMM's transposed (Kb, M), are converted on the device, with a one-time ScaleLayoutWarning unless they
    already are that layout); out: (M, N) float32, accumulated in place. Runs on the tensors' device, on
    ``stream`` (default: torch's current stream of ``out``'s device, else the default stream); asynchronous."""
    (a, sa), (b, sb) = lhs, rhs
    for name, value in (("a", a), ("b", b)):
        if len(getattr(value, "shape", ())) != 2:
            raise ValueError(f"{name} must be a 2-D (rows, K) e4m3 array, K the token axis; got shape "
                             f"{tuple(getattr(value, 'shape', ()))}; gemm.transpose_cast_to_fp8(x) makes it")
    k = a.shape[1]
    sa, sb = _scales_as_rows_by_groups(sa, a.shape[0], k), _scales_as_rows_by_groups(sb, b.shape[0], k)
    torch_out = is_torch_tensor(out) and out.is_cuda
    key = None
    if torch_out and stream is None:
        try:
            key = ("wgrad",) + dispatch.dense_signature(a, sa, b, sb, out)
        except AttributeError:  # an argument that is not a tensor: the checks below name it
            key = None
        else:
            prepared = dispatch.PREPARED.get(key)
            if prepared is not None:
                import torch
                return prepared(torch._C._cuda_getCurrentRawStream(key[1 + dispatch.OUT_DEVICE]))
    if stream is None and torch_out:
        from gemm.torch_interop import current_raw_stream
        stream = current_raw_stream(out)
    args = check_wgrad_args(a, sa, b, sb, out, convert_scales=is_torch_tensor(sa) and is_torch_tensor(sb))
    if args.k == 0:
        return  # no tokens: the gradient gains nothing
    dispatch.run(args, stream, plan_key=key)


def k_grouped_fp8_wgrad_gemm_nt(lhs, rhs, out, k_sizes, *, stream=None) -> None:
    """out[g] += A_g * B_g^T for every group g (MoE experts, each with its own tokens K_g = ``k_sizes[g]``).

    DeepGEMM 2507's layout: lhs = (a, sa) with a the flat concatenation of the groups' (M, K_g) e4m3 blocks
    (``sum(M * K_g)`` elements) and sa (sum(ceil(K_g/128)), M) float32, each group's ceil(K_g/128) rows in turn
    (its scales transposed, M-major); rhs = (b, sb) the same with N; out (G, M, N) float32, accumulated in place.
    :func:`gemm.k_grouped_transpose_cast_to_fp8` makes lhs and rhs from token-stacked activations. Empty groups
    (K_g = 0) are skipped; each K_g must be a multiple of 16 and M, N multiples of 4 (16-byte aligned blocks).
    One launch per non-empty group, on ``stream``, all reusing one kernel (K is a run-time parameter)."""
    for lhs_g, rhs_g, out_g in k_grouped_operands(lhs, rhs, out, k_sizes):
        fp8_wgrad_gemm_nt(lhs_g, rhs_g, out_g, stream=stream)


def k_grouped_operands(lhs, rhs, out, k_sizes):
    """The non-empty groups of a k-grouped wgrad call, checked: ((a_g, sa_g), (b_g, sb_g), out_g) views, a_g (M, K_g),
    sa_g (ceil(K_g/128), M) (DeepGEMM's transposed form, which :func:`fp8_wgrad_gemm_nt` reads as M-major)."""
    (a, sa), (b, sb) = lhs, rhs
    if len(getattr(out, "shape", ())) != 3:
        raise ValueError(f"out must be (G, M, N) float32, one weight gradient per group; got shape "
                         f"{tuple(getattr(out, 'shape', ()))}")
    groups, m, n = (int(x) for x in out.shape)
    sizes = [int(x) for x in k_sizes]
    if len(sizes) != groups or any(x < 0 for x in sizes):
        raise ValueError(f"k_sizes must give one token count >= 0 per group of out ({groups}), got {list(k_sizes)}")
    total_k, total_kb = sum(sizes), sum(ceil_div(x, GROUP) for x in sizes)
    expected = {"a": (m * total_k,), "b": (n * total_k,), "sa": (total_kb, m), "sb": (total_kb, n)}
    for name, value in (("a", a), ("b", b), ("sa", sa), ("sb", sb)):
        shape = tuple(getattr(value, "shape", ()))
        flat = name in ("a", "b") and len(shape) >= 1 and math.prod(int(x) for x in shape) == expected[name][0]
        if shape != expected[name] and not flat:
            raise ValueError(f"{name} must have shape {expected[name]} for out {tuple(out.shape)} and k_sizes "
                             f"{sizes} (DeepGEMM's k-grouped layout), got {shape}; "
                             "gemm.k_grouped_transpose_cast_to_fp8 makes it")
    a, b = _flat(a), _flat(b)
    offset_a = offset_b = offset_s = 0
    for group, k in enumerate(sizes):
        kb = ceil_div(k, GROUP)
        if k:
            yield ((_reshape(a[offset_a:offset_a + m * k], (m, k)), sa[offset_s:offset_s + kb]),
                   (_reshape(b[offset_b:offset_b + n * k], (n, k)), sb[offset_s:offset_s + kb]), out[group])
        offset_a, offset_b, offset_s = offset_a + m * k, offset_b + n * k, offset_s + kb


def _flat(x):
    return x.reshape(-1) if len(x.shape) != 1 else x


def _reshape(x, shape):
    return x.view(shape) if is_torch_tensor(x) else x.reshape(shape)


__all__ = ["fp8_wgrad_gemm_nt", "k_grouped_fp8_wgrad_gemm_nt", "k_grouped_operands"]
