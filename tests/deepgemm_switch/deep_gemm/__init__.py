"""DeepGEMM's ``deep_gemm`` package as re-exports of ``gemm``: with ``tests/deepgemm_switch`` on PYTHONPATH, DeepGEMM's
own tests/test_core.py (releases 2504 and 2507) runs unchanged against this library (tests/test_deepgemm_switch.py)."""
from gemm import calc_diff
from gemm.testing.timer import bench, bench_kineto

from .jit_kernels import (
    ceil_div, gemm_fp8_fp8_bf16_nt, get_col_major_tma_aligned_tensor, get_m_alignment_for_contiguous_layout,
    get_num_sms, k_grouped_wgrad_gemm_fp8_fp8_fp32_nt, m_grouped_gemm_fp8_fp8_bf16_nt_contiguous,
    m_grouped_gemm_fp8_fp8_bf16_nt_masked, set_num_sms, wgrad_gemm_fp8_fp8_fp32_nt,
)

__all__ = [
    "bench", "bench_kineto", "calc_diff", "ceil_div", "gemm_fp8_fp8_bf16_nt", "get_col_major_tma_aligned_tensor",
    "get_m_alignment_for_contiguous_layout", "get_num_sms", "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt",
    "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_masked", "set_num_sms",
    "wgrad_gemm_fp8_fp8_fp32_nt",
]
