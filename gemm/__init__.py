"""FP8 GEMM with DeepSeek-V3 fine-grained scaling on Hopper: the production face of the lessons.

Host-side FP8 basics live in :mod:`gemm.fp8`; timing and the accuracy measure in :mod:`gemm.testing`.
"""
from .fp8 import (  # noqa: F401
    E4M3, BF16, E4M3_MAX, GROUP, calc_diff, ceil_div, e4m3_decode, e4m3_encode, per_block_cast_to_fp8,
    per_token_cast_to_fp8, random_problem, reference_gemm, sa_to_mn_major,
)
