"""Exercise 07 (stage 07, warp specialization + setmaxnreg): the producer/consumer roles and the register split.

Objective: split a CTA into a producer warpgroup and math warpgroups and divide the SM's registers between them
with setmaxnreg.

Stage 07 gives the TMA producer a warpgroup of its own. One thread of it issues every copy, so it needs few
registers; the math warpgroups hold a 64 x BLOCK_N FP32 accumulator per warpgroup (plus the promoted totals)
and need many. `setmaxnreg` moves registers between warpgroups at run time: the producer gives some back
(`setmaxnreg.dec`), the math warpgroups take them (`setmaxnreg.inc`). An SM has 65536 32-bit registers; a
count must be a multiple of 8 in 24..256.

Fill in, in your copy of lessons/exercises/skeletons/ex07_warp_roles.py:
  * register_split(math_warpgroups) -> (producer, math): the per-thread register counts of the producer
    warpgroup and of each math warpgroup (128 threads each), with 128 * producer + 128 * math_warpgroups * math
    <= 65536;
  * producer_warpgroup(math_warpgroups) -> index: which warpgroup of the CTA (1 + math_warpgroups of them)
    produces: the first (0) or the last (math_warpgroups). The math warpgroups must stay consecutive (a math
    thread's index is then %tid.x, or %tid.x - 128).
The generator emits the role branch and both setmaxnreg instructions from your answers
(gemm/kernel/generator.py warp_specialized_body, gemm/kernel/producer.py WarpgroupProducer).

Grade it: ``python -m lessons grade 7 path/to/this_file.py``.
"""

# Predict, then check:
# 1. With two math warpgroups and 40 producer registers, what is the most a math thread may ask for?
#    Check with `python -m lessons inspect 7` (setmaxnreg in the PTX, USETMAXREG in the SASS) and
#    gemm.kernel.KernelConfig(registers=...), which refuses a split over 65536.
# 2. What changes in the PTX between stage 06 and 07: which new instructions, and which barrier no longer appears
#    in the math K loop?  Check with `python -m lessons diff 6 7`.
# 3. Does putting the producer first or last change the result? the instruction count?
#    Check with the emulator (`EXERCISE.build(this_module).run_cpu(...)`) and `.sass()`.


def register_split(math_warpgroups: int) -> tuple[int, int]:
    """(producer registers, math registers) per thread, for a CTA of one producer warpgroup and
    ``math_warpgroups`` math warpgroups (128 threads each).

    Both multiples of 8 in 24..256, and 128 * producer + 128 * math_warpgroups * math <= 65536. The math side needs
    room for its accumulators (64 x BLOCK_N floats per warpgroup: 64 registers a thread for BLOCK_N = 128, twice
    that for the promoted totals) and its addresses.
    """
    raise NotImplementedError("register_split: how many registers for the producer, and for each math thread?")


def producer_warpgroup(math_warpgroups: int) -> int:
    """The index of the producer warpgroup among the CTA's 1 + ``math_warpgroups`` warpgroups: 0 (first) or
    ``math_warpgroups`` (last). The math warpgroups must stay consecutive."""
    raise NotImplementedError("producer_warpgroup: which warpgroup issues the TMA copies?")
