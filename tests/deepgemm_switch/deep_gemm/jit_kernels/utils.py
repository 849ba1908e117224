"""DeepGEMM's ``deep_gemm.jit_kernels.utils`` (2507's test_core.py imports the contiguous layout's alignment from
here), re-exported from ``gemm``."""
from gemm import (
    ceil_div, get_col_major_tma_aligned_tensor, get_m_alignment_for_contiguous_layout, get_num_sms,
    get_tma_aligned_size, set_num_sms,
)

__all__ = ["ceil_div", "get_col_major_tma_aligned_tensor", "get_m_alignment_for_contiguous_layout", "get_num_sms",
           "get_tma_aligned_size", "set_num_sms"]
