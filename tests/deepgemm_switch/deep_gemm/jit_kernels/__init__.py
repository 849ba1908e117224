"""DeepGEMM's ``deep_gemm.jit_kernels``: the GEMMs and their helpers, re-exported from ``gemm``."""
from gemm import (
    gemm_fp8_fp8_bf16_nt, k_grouped_wgrad_gemm_fp8_fp8_fp32_nt, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous,
    m_grouped_gemm_fp8_fp8_bf16_nt_masked, wgrad_gemm_fp8_fp8_fp32_nt,
)

from .utils import (
    ceil_div, get_col_major_tma_aligned_tensor, get_m_alignment_for_contiguous_layout, get_num_sms,
    get_tma_aligned_size, set_num_sms,
)

__all__ = [
    "ceil_div", "gemm_fp8_fp8_bf16_nt", "get_col_major_tma_aligned_tensor", "get_m_alignment_for_contiguous_layout",
    "get_num_sms", "get_tma_aligned_size", "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_masked", "set_num_sms",
    "wgrad_gemm_fp8_fp8_fp32_nt",
]
