"""Exercise 01 - the promotion (lessons/01_naive.py).

Learning objective: apply DeepGEMM's fine-grained scales the way the kernel does: one FFMA per K group that
promotes an FP32 partial sum, scaled by sa*sb, into the running total.

Stage 01 computes D = (A*sA)(B*sB)^T with one thread per output. Inside a 128-wide K group the thread sums the
decoded e4m3 products in an FP32 `partial`; at the end of the group it must *promote* that partial into the running
FP32 `total`, applying the group's two scales once (not once per product). Write
`promote(total, partial, sa_value, sb_value)`: return the new total, where sa_value = sa[m, g] (the activation's
per-token scale of this row and group) and sb_value = sb[n // 128, g] (the weight's 128x128-block scale). It runs
inside the stage's own kernel (lessons/01_naive.py, make_kernel) in the CUDA simulator and on the GPU: plain float
arithmetic only. Read the module docstring of lessons/01_naive.py and gemm/fp8.py's reference_gemm.

Grade it: python -m lessons grade 1 this_file.py
"""


def promote(total, partial, sa_value, sb_value):
    """The running FP32 total after K group g: ``partial`` is the group's sum of decoded e4m3 products,
    ``sa_value`` = sa[m, g], ``sb_value`` = sb[n // 128, g]. Returns the new total (float32 arithmetic)."""
    raise NotImplementedError("promote: scale the group's partial sum by both scales and add it to the total")


# Predict, then check:
# 1. Predict: how many FFMA does the promotion cost per output element at K=7168, and how many the products?
#    Check with `python -m lessons inspect 1`: the SASS FFMA count of the loop (56 groups: 56 promotion FFMAs
#    against 7168 product FFMAs per output).
# 2. Predict: if the scales were applied to every product instead, how many more FMULs per output?
#    Check with `python -m lessons inspect 1`; the promotion's FMUL (sa*sb) appears once per group in the SASS.
# 3. Predict: is (partial * sa) * sb bit-identical to partial * (sa * sb)? Does the grader care?
#    Check by running both in the simulator (Exercise.build(...).run_cpu) and gemm.fp8.calc_diff against the
#    reference (both pass; BF16 rounding hides the difference).
