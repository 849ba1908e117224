"""A CPU stand-in for DeepGEMM's Python API (tests of gemm.testing.deepgemm_peer): the same names and argument
layouts, computed with torch on the host. FAKE_DEEPGEMM_WRONG=1 makes it return a wrong answer."""
import os

import torch


def get_col_major_tma_aligned_tensor(x):
    return x


def _dequantized(x, scales, block_rows):
    values = x.float()
    scales = scales.repeat_interleave(128, dim=-1)[..., :values.shape[-1]]
    if block_rows:
        scales = scales.repeat_interleave(128, dim=-2)[..., :values.shape[-2], :]
    return values * scales


def _product(a, sa, b, sb):
    out = _dequantized(a, sa, False) @ _dequantized(b, sb, True).transpose(-1, -2)
    return out * 2 if os.environ.get("FAKE_DEEPGEMM_WRONG") else out


def gemm_fp8_fp8_bf16_nt(lhs, rhs, out):
    out.copy_(_product(*lhs, *rhs))


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, out, m_indices):
    (a, sa), (b, sb) = lhs, rhs
    for group in range(b.shape[0]):
        rows = (m_indices == group).nonzero().flatten()
        out[rows] = _product(a[rows], sa[rows], b[group], sb[group]).to(out.dtype)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out, masked_m, expected_m):
    (a, sa), (b, sb) = lhs, rhs
    for group in range(b.shape[0]):
        rows = int(masked_m[group])
        out[group, :rows] = _product(a[group, :rows], sa[group, :rows], b[group], sb[group]).to(out.dtype)
