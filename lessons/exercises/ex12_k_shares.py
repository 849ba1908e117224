"""Exercise 12: which K blocks each CTA of a split-K cluster computes.

Hole: ``k_share(rank, split_k, k_blocks) -> (first, end)``: the run of a tile's K blocks that cluster rank ``rank``
of ``split_k`` multiplies into its FP32 totals before rank 0 sums them. The seam: ``_Kernel.setup`` in
:mod:`gemm.kernel.generator` (:mod:`gemm.kernel.seams`), which evaluates it for every rank and keeps the answers as
a ``.const`` table each CTA reads with its ``%cluster_ctarank``; both the producer (which K blocks to load) and the
math warpgroups (which to multiply) start at ``first`` and stop at ``end``. The seam refuses what would fault or
hang (an empty share, one past the tile's K blocks, not a pair of ints); shares that overlap count a block twice
and shares with a gap skip one: D is written, with the wrong values, a correctness failure. Shares that are right
but lopsided (rank 0 taking nearly all the blocks) compute D right and buy nothing, since the cluster waits for its
slowest rank: the technique check names the first one that is not the balanced, in-order split.
"""
from __future__ import annotations

import random
import secrets
from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 12
PROMPT = """\
Stage 12 gives each decode tile a cluster of split_k CTAs (2 at the graded shapes) and divides the tile's
k_blocks K blocks (K / 128) between them. Each CTA loads and multiplies only its own run of K blocks into its own
FP32 totals; then ranks 1.. hand their totals to rank 0 through distributed shared memory, rank 0 adds them and
stores D. The whole cluster finishes when its slowest CTA does, so the runs should be as even as they can be.

Fill in, in your copy of lessons/exercises/skeletons/ex12_k_shares.py:
  * k_share(rank, split_k, k_blocks) -> (first, end): the K blocks [first, end) that cluster rank `rank`
    (0 .. split_k - 1) computes. Together the ranks' runs must cover 0 .. k_blocks - 1 exactly once, in rank order
    (rank 0 first), none empty (k_blocks >= split_k), and no two may differ in length by more than one block.
The generator evaluates it for every rank when it writes the kernel (gemm/kernel/generator.py _Kernel.setup: the
k_share_table), so it is plain Python arithmetic on ints."""

QUESTIONS = (
    ("Predict: at 16 x 2112 x 7168, how many CTAs does stage 11 launch, and how many does stage 12?",
     "check with gemm.kernel.launch.grid or the figure 12_split_k_cluster: 33 tiles of 256 x 64, walked by 32 "
     "persistent CTAs (multicast pairs: one takes a second tile); split over 2, 66 CTAs in 33 clusters of two"),
    ("Predict: why does stage 12 not split four ways there, to fill all 132 SMs?",
     "check the stage's docstring: a cluster's CTAs must share a GPC, and the driver keeps only 30 clusters of "
     "four resident on the H100 (GPU test test_split_k_cluster_residency), so 33 would need two waves"),
    ("Predict: if rank 1 also computes rank 0's last block (shares that overlap by one), what is wrong in D?",
     "check with the emulator (`EXERCISE.build(this_module).run_cpu(...)`): every element of D counts that K block "
     "twice, so all of D is off (not NaN: everything is written)"),
    ("Predict: how many bytes of totals does rank 1 hand to rank 0 for one 256 x 64 tile, and by which instructions?",
     "check: 256 x 64 FP32 = 64 KiB, st.shared.v4 into its own ring, then ld.shared::cluster.v4 by rank 0 "
     "(`python -m lessons inspect 12`: LD and FADD in the SASS, UCGABAR for the two cluster-barrier phases)"),
)


def reference():
    from gemm.kernel.config import k_share
    return SimpleNamespace(k_share=k_share)


def check_shares(solution, draws: int = 48) -> None:
    """Raise AssertionError at the first (split_k, k_blocks) whose shares are not a balanced, in-order split: every
    small case, then ``draws`` more at random (fresh each grading, so no table of the checked cases can pass)."""
    cases = [(split_k, k_blocks) for split_k in (2, 3, 4, 8) for k_blocks in range(split_k, 70)]
    chooser = random.Random(secrets.randbits(64))
    cases += [(chooser.choice((2, 3, 4, 5, 8, 16)), chooser.randrange(70, 1 << 16)) for _ in range(draws)]
    for split_k, k_blocks in cases:
        shares = [solution.k_share(rank, split_k, k_blocks) for rank in range(split_k)]
        where = f"k_share(rank, split_k={split_k}, k_blocks={k_blocks}) for ranks 0..{split_k - 1} gave {shares}"
        if shares[0][0] != 0 or shares[-1][1] != k_blocks or any(
                before[1] != after[0] for before, after in zip(shares, shares[1:])):
            raise AssertionError(f"{where}: the runs must cover 0..{k_blocks - 1} once, in rank order")
        lengths = [end - first for first, end in shares]
        if min(lengths) < 1 or max(lengths) - min(lengths) > 1:
            raise AssertionError(f"{where}: lengths {lengths}; the cluster waits for its slowest rank, so no "
                                 "run may be empty or longer than another by more than one block")


def balanced_shares(solution) -> list[str]:
    """The ranks' runs cover the tile's K blocks once, in rank order, their lengths within one block of each other,
    for any split and K block count (small ones, and more drawn at random). Lopsided shares compute D right at the
    graded shapes; the balance, and the rule holding at every K, is the technique."""
    return failures(check_shares, solution)


def build(solution):
    import lessons
    from lessons.exercises.holed import HoledKernel
    stage = lessons.stage(STAGE)
    return HoledKernel(stage.config, lambda m, n, k: dict(k_share=solution.k_share), cpu_stages=2,
                       sass_shape=stage.SHAPE, sm_count_cpu=4)  # the ring wraps at small K


EXERCISE = Exercise(
    stage=STAGE,
    name="k_shares",
    objective="Divide a tile's K blocks between the CTAs of a split-K cluster so that none waits on another.",
    prompt=PROMPT,
    holes=("k_share",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("UTMALDG", "QGMMA", "UCGABAR", "LD.", "FADD"),  # LD.: the ld.shared::cluster reads
    # Few tiles, so stage 12 splits each over 2 CTAs: K = 896 is 7 K blocks (shares of 3 and 4), K = 384 three;
    # ragged M (one 256-row tile, mostly TMA zero-fill) and N (a last 64-wide tile cut short)
    shapes_cpu=((20, 200, 896), (5, 72, 384)),
    shapes_gpu=((16, 2112, 7168), (5, 576, 1152)),
    perf_threshold=None,
    extra={"checks": (balanced_shares,)},
    answer_sites={"gemm/kernel/config.py": ("k_share",)},
)
