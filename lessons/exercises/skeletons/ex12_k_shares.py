"""Exercise 12 (stage 12, split-K over a cluster): which K blocks each CTA of a cluster computes.

Objective: divide a tile's K blocks between the CTAs of a split-K cluster so that none waits on another.

Stage 12 gives each decode tile a cluster of split_k CTAs (2 at the graded shapes) and divides the tile's
k_blocks K blocks (K / 128) between them. Each CTA loads and multiplies only its own run of K blocks into its own
FP32 totals; then ranks 1.. hand their totals to rank 0 through distributed shared memory, rank 0 adds them and
stores D. The whole cluster finishes when its slowest CTA does, so the runs should be as even as they can be.

Fill in, in your copy of lessons/exercises/skeletons/ex12_k_shares.py:
  * k_share(rank, split_k, k_blocks) -> (first, end): the K blocks [first, end) that cluster rank `rank`
    (0 .. split_k - 1) computes. Together the ranks' runs must cover 0 .. k_blocks - 1 exactly once, in rank order
    (rank 0 first), none empty (k_blocks >= split_k), and no two may differ in length by more than one block.
The generator evaluates it for every rank when it writes the kernel (gemm/kernel/generator.py _Kernel.setup: the
k_share_table), so it is plain Python arithmetic on ints.

Grade it: ``python -m lessons grade 12 path/to/this_file.py``.
"""

# Predict, then check:
# 1. At 16 x 2112 x 7168, how many CTAs does stage 11 launch, and how many does stage 12?
#    Check with `python -m lessons inspect 12` (the config line) or gemm.kernel.launch.grid.
# 2. Why does stage 12 not split four ways there, to fill all 132 SMs?
#    Check the stage's docstring (lessons/12_split_k.py): clusters of four and the GPCs.
# 3. If rank 1 also computes rank 0's last block (shares that overlap by one), what is wrong in D?
#    Check with the emulator (`EXERCISE.build(this_module).run_cpu(...)`).
# 4. How many bytes of totals does rank 1 hand to rank 0 for one 256 x 64 tile, and by which instructions?
#    Check with `python -m lessons inspect 12` (the SASS opcodes: LD, FADD, UCGABAR).


def k_share(rank: int, split_k: int, k_blocks: int) -> tuple[int, int]:
    """The K blocks [first, end) that cluster rank ``rank`` of ``split_k`` computes, of a tile's ``k_blocks``:
    the ranks' runs cover 0 .. k_blocks - 1 once, in rank order, none empty, lengths within one block."""
    raise NotImplementedError("k_share: which run of the tile's K blocks does cluster rank `rank` compute?")
