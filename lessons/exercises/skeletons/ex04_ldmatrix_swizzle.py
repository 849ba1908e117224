"""Exercise 04 - the ldmatrix addresses and the swizzle (lessons/04_mma_sync.py).

Learning objective: address ldmatrix so each lane's 16-byte row read lands on the swizzled chunk where cp.async put
it, and the tensor cores get the mma.sync fragment layout.

Stage 04 feeds mma.sync m16n8k32 (e4m3) from shared memory with ldmatrix.x4: each lane hands ldmatrix the address
of one 16-byte row of one of four 8x8 .b16 matrices, and gets back exactly the fragment registers mma.sync wants.
The A and B tiles are 128 rows of 128 bytes, and cp.async stored them swizzled: 16-byte chunk c of row r sits at
chunk c ^ (r % 8) (lessons/04_mma_sync.py, load_shared_offset). Warps are 2 (M) x 4 (N), each 64 x 32 of the tile.
Write
  a_fragment_offset(warp_m, lane, m_tile, k_step): byte offset in the A tile of the row lane gives ldmatrix for the
      A fragment of m tile m_tile (16 rows, 0..3) at k step k_step (32 bytes of K, 0..3): lanes 0-15 address rows
      0-15 of the tile at K bytes 0-15 of the step, lanes 16-31 the same rows at K bytes 16-31;
  b_fragment_offset(warp_n, lane, n_pair, k_step): the same in the B tile for n tiles 2*n_pair and 2*n_pair+1
      (8 rows each): lanes 0-7 and 8-15 address the first n tile's 8 rows (K bytes 0-15, then 16-31), lanes 16-31
      the second's.
Both must undo the swizzle. They run on registers while the PTX is generated, so use only integers and
+ - * // % & | ^ << >> (no `if` on lane or warp values).

Grade it: python -m lessons grade 4 this_file.py
"""
WARP_M, WARP_N = 64, 32  # rows of A, rows of B (columns of D) per warp
ROW_BYTES = 128  # one tile row: 128 e4m3 values, 8 chunks of 16 bytes


def a_fragment_offset(warp_m, lane, m_tile, k_step):
    """Byte offset in the A tile (swizzled) that ``lane`` gives ldmatrix.x4 for m tile ``m_tile``, k step
    ``k_step`` of warp row ``warp_m`` (0 or 1)."""
    raise NotImplementedError("a_fragment_offset: row * 128 + the swizzled 16-byte chunk * 16")


def b_fragment_offset(warp_n, lane, n_pair, k_step):
    """Byte offset in the B tile (swizzled) that ``lane`` gives ldmatrix.x4 for n tiles 2*n_pair, 2*n_pair+1 at k
    step ``k_step`` of warp column ``warp_n`` (0..3)."""
    raise NotImplementedError("b_fragment_offset: row * 128 + the swizzled 16-byte chunk * 16")


# Predict, then check:
# 1. Predict: how many LDSM (ldmatrix) instructions per warp and K block? And HMMA?
#    Check with `python -m lessons inspect 4` (SASS key opcodes: LDSM 24, HMMA 128).
# 2. Predict: which banks do the 8 rows of one 8x8 matrix hit with the swizzle, and without it?
#    Check with `python -m lessons ablate 4` on a CPU (the "without the XOR swizzle" variant) or the swizzle figure
#    of lessons/figures/tensor_core_layouts.py.
# 3. Predict: what does D look like if your offsets forget the swizzle (which outputs go wrong)?
#    Check with the emulator: lessons.stage(4).emulate(a, sa, b, sb, fragment_offsets=(your_a, your_b)) against
#    gemm.fp8.reference_gemm on a 70x200x256 problem.
