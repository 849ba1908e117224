"""DeepGEMM's names for this library's functions, so that a DeepGEMM user changes one import.

    import gemm as deep_gemm      # instead of: import deep_gemm
    deep_gemm.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)

docs/deepgemm.md maps every DeepGEMM name (functions and DG_* environment variables) to ours, and says which
are not here yet.
"""
from __future__ import annotations

from gemm.api import fp8_gemm_nt, get_mn_major_tma_aligned_tensor
from gemm.grouped import (get_m_alignment_for_contiguous_layout, m_grouped_fp8_gemm_nt_contiguous,
                          m_grouped_fp8_gemm_nt_masked, masked_sa_to_mn_major)
from gemm.heuristics import get_num_sms, set_num_sms
from gemm.wgrad import fp8_wgrad_gemm_nt, k_grouped_fp8_wgrad_gemm_nt

TMA_ALIGNMENT_BYTES = 16  # TMA wants every row stride a multiple of 16 bytes


def gemm_fp8_fp8_bf16_nt(lhs, rhs, out, *, stream=None) -> None:
    """DeepGEMM's original name of :func:`gemm.fp8_gemm_nt`: out = (a*sa)(b*sb)^T in BF16."""
    fp8_gemm_nt(lhs, rhs, out, stream=stream)


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` elements of ``element_size`` bytes, rounded up so that they span a multiple of 16 bytes."""
    if element_size <= 0 or TMA_ALIGNMENT_BYTES % element_size:
        raise ValueError(f"get_tma_aligned_size: element_size must divide {TMA_ALIGNMENT_BYTES}, got {element_size}")
    per = TMA_ALIGNMENT_BYTES // element_size
    return -(-int(x) // per) * per


def get_col_major_tma_aligned_tensor(sa):
    """DeepGEMM's name of :func:`gemm.get_mn_major_tma_aligned_tensor` (sa stored M-major, M padded to 4); a 3-D
    (G, M, K/128) sa, as the masked grouped GEMM takes, is stored M-major per group
    (:func:`gemm.grouped.masked_sa_to_mn_major`), as DeepGEMM's helper does for batched scales."""
    if len(sa.shape) == 3:
        return masked_sa_to_mn_major(sa)
    return get_mn_major_tma_aligned_tensor(sa)


def m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, out, m_indices, *, stream=None) -> None:
    """DeepGEMM's name of :func:`gemm.m_grouped_fp8_gemm_nt_contiguous` (MoE experts, tokens stacked by group)."""
    m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, m_indices, stream=stream)


def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out, masked_m, expected_m, *, stream=None) -> None:
    """DeepGEMM's name of :func:`gemm.m_grouped_fp8_gemm_nt_masked` (MoE decode: per-group row counts on the
    device, CUDA-graph capturable)."""
    m_grouped_fp8_gemm_nt_masked(lhs, rhs, out, masked_m, expected_m, stream=stream)


def wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out, *, stream=None) -> None:
    """DeepGEMM 2507's name of :func:`gemm.fp8_wgrad_gemm_nt`: out += (a*sa)(b*sb)^T, 1x128 scales on both, FP32
    out accumulated in place (the weight gradient)."""
    fp8_wgrad_gemm_nt(lhs, rhs, out, stream=stream)


def k_grouped_wgrad_gemm_fp8_fp8_fp32_nt(lhs, rhs, out, batch_sizes, *, stream=None) -> None:
    """DeepGEMM 2507's name of :func:`gemm.k_grouped_fp8_wgrad_gemm_nt`: one weight gradient per group (expert),
    groups along K (each expert's tokens, ``batch_sizes``), in DeepGEMM's flat layout."""
    k_grouped_fp8_wgrad_gemm_nt(lhs, rhs, out, batch_sizes, stream=stream)


__all__ = ["gemm_fp8_fp8_bf16_nt", "wgrad_gemm_fp8_fp8_fp32_nt", "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", "get_tma_aligned_size", "get_col_major_tma_aligned_tensor", "set_num_sms",
           "get_num_sms", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_masked",
           "get_m_alignment_for_contiguous_layout"]
