"""Exercise 10 (stage 10, FFMA interleave): the yield-bit rule.

Objective: choose which promotion FFMAs yield so one math warpgroup's FFMAs overlap the other's WGMMAs, and patch
a real cubin safely.

Stage 10 edits the assembled cubin. In a run of n >= 8 consecutive FFMAs (the promotion: total += scale *
accumulator), some FFMAs get the *yield* bit, so the warp scheduler may switch to the other math warpgroup there
and its WGMMAs overlap our FFMAs. A yielding warp cannot keep the operand reuse cache, so a flipped FFMA also
loses its Rb-reuse bit. DeepGEMM's rule, which stage 10 uses:
  * look only at the first floor(9 n / 16) FFMAs of the run, in order;
  * an FFMA is flipped if it has the Rb-reuse bit and a register Rb, and either its Rb was not seen before in
    the run, or the previous FFMA kept its reuse bit with the same Rb;
  * a flipped FFMA counts as "no reuse" for the next step; every FFMA's Rb counts as seen.

Fill in, in your copy of lessons/exercises/skeletons/ex10_yield_rule.py:
  * select_flips(run) -> list: the FFMAs of `run` (a list of ptx.sass.Instruction, consecutive FFMAs of one
    function) to flip, in order. Helpers: ptx.passes.reuse_b(ins.encoding), ptx.passes.second_source_register(
    ins.text), ptx.passes.is_yield.
The cubin pass (ptx/passes.py interleave_ffma) flips exactly the instructions you return.

Grade it: ``python -m lessons grade 10 path/to/this_file.py``.
"""

# Predict, then check:
# 1. How many FFMAs does the rule flip in a run of 32 whose Rb alternates between two registers, every one with its
#    reuse bit?  Check with `python -m lessons inspect 10` and ptx.passes.interleave_ffma's report.
# 2. Does the pass change the instruction count, or any instruction's text other than `.reuse`?
#    Check with `python -m lessons diff 9 10` (the SASS diff: only FFMA control bits).
# 3. Can the pass change D?
#    Check with the emulator (stages 09 and 10 have the same PTX) and, on a GPU, the grader's comparison.

from ptx.passes import reuse_b, second_source_register  # noqa: F401  (the helpers the rule needs)


def select_flips(run: list) -> list:
    """The FFMAs of ``run`` (a list of ptx.sass.Instruction: consecutive FFMAs of one function, each with
    ``.text`` like "FFMA R12, R40, R207.reuse, R12" and ``.encoding``, 128 bits) to give the yield bit, in order.
    Return instructions of ``run`` itself, each at most once. ``reuse_b(ins.encoding)``: the Rb-reuse bit;
    ``second_source_register(ins.text)``: Rb ("R207"), or None when it is not a register."""
    raise NotImplementedError("select_flips: which FFMAs of the run yield?")
