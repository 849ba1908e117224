"""The math warpgroups of stages 05 and 06 (wgmma issue, scale promotion, BF16 epilogue).

Their one home is the production generator's :mod:`gemm.kernel.math_warpgroups`, which every later stage shares; this
module keeps the name the stage-05 and stage-06 texts use.
"""
from gemm.kernel.math_warpgroups import (A_ROW_BYTES, BLOCK_K, K_STEPS, WARPGROUP_ROWS, MathWarpgroups,  # noqa: F401
                              staging_bytes, staging_pitch, store_slots, store_vector_elements)

__all__ = ["MathWarpgroups", "staging_pitch", "staging_bytes", "store_vector_elements", "store_slots",
           "BLOCK_K", "K_STEPS", "WARPGROUP_ROWS"]
