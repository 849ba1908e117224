"""FP8 GEMM with DeepSeek-V3 fine-grained scaling on Hopper: the production library the lessons explain.

    from gemm import fp8_gemm_nt, per_token_cast_to_fp8, per_block_cast_to_fp8
    fp8_gemm_nt((a, sa), (b, sb), out)

The MoE grouped GEMMs (``m_grouped_fp8_gemm_nt_contiguous``, ``m_grouped_fp8_gemm_nt_masked``) live in
:mod:`gemm.grouped`, the weight-gradient GEMMs of training (``fp8_wgrad_gemm_nt``, ``k_grouped_fp8_wgrad_gemm_nt``)
in :mod:`gemm.wgrad`.
Every GEMM type takes one call path, :mod:`gemm.dispatch` (arguments -> config -> prepared launch). The kernel
generator lives in :mod:`gemm.kernel` (config, emitters, ``generate``, launch), its heuristics in
:mod:`gemm.heuristics`. Host-side FP8 basics live in :mod:`gemm.fp8`, argument checks in :mod:`gemm.validate`.
Test and benchmark support (problems, references, the timer, the peers, the emulated kernels, the benchmarks of
``python -m gemm bench``) live in :mod:`gemm.testing`, which ``import gemm`` does not import.
"""
from . import _compat  # noqa: F401  (before anything imports numba)
from .api import ScaleLayoutWarning, fp8_gemm_nt, get_mn_major_tma_aligned_tensor  # noqa: F401
from .deepgemm_api import (  # noqa: F401  (DeepGEMM's names: docs/deepgemm.md)
    get_col_major_tma_aligned_tensor, get_num_sms, get_tma_aligned_size, gemm_fp8_fp8_bf16_nt, set_num_sms,
    m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, m_grouped_gemm_fp8_fp8_bf16_nt_masked,
    k_grouped_wgrad_gemm_fp8_fp8_fp32_nt, wgrad_gemm_fp8_fp8_fp32_nt,
)
from .grouped import (  # noqa: F401  (MoE grouped GEMMs)
    get_m_alignment_for_contiguous_layout, m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked,
    masked_sa_to_mn_major,
)
from .fp8 import (  # noqa: F401
    AMAX_FLOOR, BF16, E4M3, E4M3_MAX, GROUP, calc_diff, ceil_to_ue8m0, ceil_div, e4m3_decode, e4m3_encode,
    k_grouped_transpose_cast_to_fp8, per_block_cast_to_fp8, per_token_cast_to_fp8, sa_to_mn_major,
    transpose_cast_to_fp8,
)
from .wgrad import fp8_wgrad_gemm_nt, k_grouped_fp8_wgrad_gemm_nt  # noqa: F401  (training: weight gradients)
from .prebuild import prebuild  # noqa: F401  (python -m gemm prebuild)
from ptx.driver import check_driver as _check_driver

_check_driver()  # a driver too old for our PTX: say so now, not at the first kernel load (no driver: no-op)

import sys as _sys

if "torch" in _sys.modules:  # torch is in use: register torch.ops.fp8_ladder.fp8_gemm_nt now (gemm.torch_ops)
    from . import torch_ops  # noqa: F401
