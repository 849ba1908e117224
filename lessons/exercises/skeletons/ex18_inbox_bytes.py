"""Exercise 18 (stage 18, split-K partials pushed with st.async): the bytes rank 0's inbox expects.

Objective: count the bytes rank 0's inbox barrier must expect when a split's peers push their partials.

Stage 18 ends a split-K tile with a push: ranks 1 .. split_k - 1 of the cluster each send their FP32 totals of the
block_m x block_n tile into an inbox in rank 0's shared memory with st.async, and exit. Each message completes its
bytes (complete_tx) on rank 0's inbox mbarrier. Rank 0 cannot count messages, only bytes: at the start its thread
0 arrives once on that barrier with mbarrier.arrive.expect_tx, announcing how many bytes will land, and after the K
loop rank 0's math threads wait for the phase before they add the inbox into their own totals.

Fill in, in your copy of lessons/exercises/skeletons/ex18_inbox_bytes.py:
  * inbox_bytes(split_k, block_m, block_n) -> int: the bytes rank 0's expect_tx announces, so that the phase
    completes exactly when every peer's totals have landed. Rank 0 sends nothing to itself.
Stage 18 builds its kernels with that count (gemm/kernel/generator.py: the inbox barrier's arrive in
_Kernel.setup) and sizes the inbox by it.

Grade it: ``python -m lessons grade 18 path/to/this_file.py``.
"""

# Predict, then check:
# 1. At 16 x 2112 x 7168, how many bytes does rank 0 expect in stage 18 (16 x 64 tiles split over two), and in
#    production's kernel (the same tiles split over three)?
#    Check with gemm.kernel.config.SharedPlan(config, 2112, 7168).inbox_bytes, or the figure 18_split_k_push.
# 2. What does the emulator report if rank 0 expects one peer's bytes fewer? 16 bytes more?
#    Check with notebook 18's emulator cell.
# 3. How many cluster-barrier instructions are left in the SASS, and why can the last one not go?
#    Check with `python -m lessons diff 17 18 --m 16 --n 2112 --k 7168`.
# 4. What does the inbox cost stage 18's 256 x 64 tiles at 64 x 2112 x 7168?
#    Check with lessons.stage(17).config and lessons.stage(18).config there.


def inbox_bytes(split_k: int, block_m: int, block_n: int) -> int:
    """The bytes rank 0's inbox barrier expects from the peers of a ``split_k``-CTA cluster, each holding the FP32
    totals of a block_m x block_n tile."""
    raise NotImplementedError("inbox_bytes: who sends, and how many bytes does each one's totals take?")
