"""Exercise 02 - the shared tile pitch (lessons/02_smem_tiling.py).

Learning objective: lay out a shared-memory tile so that a warp's column reads are conflict-free: pad the row pitch.

Stage 02 stages one 128-wide K group of A and B through shared memory as float32, decoded once per block. In the
inner loop thread (ty, tx) reads a_tile[ty, k] (one address per warp: a broadcast) and b_tile[tx, k]: 32 different
rows of b_tile, same column. Shared memory has 32 banks of 4-byte words; word w sits in bank w % 32. Write
`b_tile_pitch()`: the number of float32 words between consecutive rows of b_tile (the kernel declares
cuda.shared.array((32, b_tile_pitch()), float32)). It must hold a row of BLOCK_K = 128 values, and a warp's 32 reads
must land in 32 different banks. Read lessons/02_smem_tiling.py (shared_word, BANKS) and the bank figure of
lessons/figures/numba_threads.py.

Grade it: python -m lessons grade 2 this_file.py
"""


def b_tile_pitch() -> int:
    """Words (float32) from one row of b_tile to the next: at least BLOCK_K = 128, and such that the words
    b_tile[tx, k] for tx = 0..31 fall in 32 different banks (bank = word % 32)."""
    raise NotImplementedError("b_tile_pitch: return the padded row pitch of the B tile, in float32 words")


# Predict, then check:
# 1. Predict: with a pitch of 128 words, how many banks do the 32 reads of b_tile[tx, k] touch? How many with 129?
#    Check with lessons.figures' smem_banks figure or [shared_word(tx, 0, p) % 32 for tx in range(32)] from
#    lessons/02_smem_tiling.py.
# 2. Predict: how many bytes of shared memory does a block use with your pitch?
#    Check with `python -m lessons inspect 2` (shared_bytes of the kernel: 32*128*4 + 32*pitch*4).
# 3. Predict: does the padding change the SASS of the inner loop (the LDS count per k)?
#    Check with `python -m lessons inspect 2`: LDS and FFMA counts are the same for pitch 128 and 129; only the
#    addresses (and the measured time on a GPU) differ.
