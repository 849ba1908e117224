"""Exercise 18: how many bytes rank 0's inbox barrier expects when a split's peers push their partials.

Hole: ``inbox_bytes(split_k, block_m, block_n) -> int``: the transaction bytes rank 0's thread 0 announces at the
start (``mbarrier.arrive.expect_tx``) on its inbox barrier when K is split over ``split_k`` CTAs of a cluster and
each CTA holds the FP32 totals of one block_m x block_n tile. The phase completes when that many bytes of the peers'
``st.async`` messages have landed, so it must be every peer's totals: fewer and rank 0 reads an inbox still being
written (or a message lands after the phase), more and it waits forever. Stage 18's inbox is sized by the same
number (:attr:`gemm.kernel.config.SharedPlan.inbox_bytes`), and the generator's ``expect_tx`` is that number.

The emulator runs stage 18's kernel, its ring cut to two stages, its swapped tiles split over three CTAs
(production's decode split, ``gemm.heuristics.SWAP_AB_MAX_SPLIT``; the stage splits over two) so that one peer's
bytes are not the answer. Every count a graded kernel is built from must be that kernel's own (a wrong count
deadlocks the emulator, but on a GPU it could hang or race), and must be a positive int; the rule check asks the
stage's and production's tiles, every split, and 300 cases drawn afresh on every run, naming the first it gets
wrong. The drawn tiles go past what the generator builds (the rule is arithmetic); a real inbox fits in shared
memory (at most 227 KiB), far below the largest count an mbarrier's transaction count holds (2^20 - 1 bytes).
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 18
CPU_SPLIT = 3  # gemm.heuristics.SWAP_AB_MAX_SPLIT: production's swapped decode tiles split over three CTAs
PROMPT = """\
Stage 18 ends a split-K tile with a push: ranks 1 .. split_k - 1 of the cluster each send their FP32 totals of the
block_m x block_n tile into an inbox in rank 0's shared memory with st.async, and exit. Each message completes its
bytes (complete_tx) on rank 0's inbox mbarrier. Rank 0 cannot count messages, only bytes: at the start its thread
0 arrives once on that barrier with mbarrier.arrive.expect_tx, announcing how many bytes will land, and after the K
loop rank 0's math threads wait for the phase before they add the inbox into their own totals.

Fill in, in your copy of lessons/exercises/skeletons/ex18_inbox_bytes.py:
  * inbox_bytes(split_k, block_m, block_n) -> int: the bytes rank 0's expect_tx announces, so that the phase
    completes exactly when every peer's totals have landed. Rank 0 sends nothing to itself.
Stage 18 builds its kernels with that count (gemm/kernel/generator.py: the inbox barrier's arrive in
_Kernel.setup) and sizes the inbox by it."""

QUESTIONS = (
    ("Predict: at 16 x 2112 x 7168, how many bytes does rank 0 expect in stage 18 (16 x 64 tiles split over two), "
     "and in production's kernel (the same tiles split over three)?",
     "check with gemm.kernel.config.SharedPlan(config, 2112, 7168).inbox_bytes for lessons.stage(18).config(16, "
     "2112, 7168) and gemm.heuristics.choose_config(16, 2112, 7168), or the figure 18_split_k_push"),
    ("Predict: what does the emulator report if rank 0 expects one peer's bytes fewer? 16 bytes more?",
     "check with notebook 18's emulator cell: a deadlock on the inbox barrier, a barrier left mid-phase with bytes "
     "still due, or a message to a CTA that has exited, depending on the schedule"),
    ("Predict: how many cluster-barrier instructions are left in the SASS, and why can the last one not go?",
     "check with `python -m lessons diff 17 18 --m 16 --n 2112 --k 7168` (UCGABAR_ARV and UCGABAR_WAIT, 8 to 1): "
     "a peer must not send to a barrier rank 0 has not initialised yet"),
    ("Predict: what does the inbox cost stage 18's 256 x 64 tiles at 64 x 2112 x 7168?",
     "check with lessons.stage(17).config and lessons.stage(18).config there: a 64 KiB inbox, one ring stage fewer"),
)


def reference():
    """The generator's count: the inbox :class:`gemm.kernel.config.SharedPlan` lays out for those tiles."""
    from gemm.kernel.config import SharedPlan

    def inbox_bytes(split_k, block_m, block_n):
        tiles = SimpleNamespace(split_k=split_k, block_m=block_m, block_n=block_n, split_k_push=True)
        return SharedPlan(tiles, 0, None).inbox_bytes
    return SimpleNamespace(inbox_bytes=inbox_bytes)


RANDOM_CASES = 300
RANDOM_MAX_ROWS = 4096  # tiles past any the generator builds: a domain of some 10^8 cases no table can hold


def _cases():
    """(split_k, block_m, block_n): the stage's and production's split tiles (8-32 token rows swapped, 64-256 rows
    unswapped) at every split, then :data:`RANDOM_CASES` drawn afresh on every run from the OS (the fixed cases
    are public; a table of their answers must not pass)."""
    import random

    from gemm.kernel.config import SPLIT_K
    cases = [(split, rows, columns) for split in SPLIT_K[1:] for rows, columns in
             ((8, 64), (16, 64), (32, 64), (64, 16), (64, 32), (64, 64), (128, 32), (256, 64), (64, 56), (128, 128))]
    draw = random.SystemRandom()
    cases += [(draw.choice(SPLIT_K[1:]), draw.randint(1, RANDOM_MAX_ROWS), draw.randint(1, RANDOM_MAX_ROWS))
              for _ in range(RANDOM_CASES)]
    return cases


def check_rule(solution) -> None:
    """Raise AssertionError at the first (split_k, block_m, block_n) whose count differs from the generator's."""
    own = reference().inbox_bytes
    for split_k, block_m, block_n in _cases():
        got, want = solution.inbox_bytes(split_k, block_m, block_n), own(split_k, block_m, block_n)
        if type(got) is not int or got != want:
            raise AssertionError(f"inbox_bytes(split_k={split_k}, block_m={block_m}, block_n={block_n}) = {got!r}; "
                                 f"rank 0's peers send {want} bytes of totals")


def inbox_counts(solution) -> list[str]:
    """The count is right for every case checked, fixed and drawn.

    The graded kernels are built only from counts that are their own, so the rule over every split and tile is the
    technique."""
    return failures(check_rule, solution)


def checked(solution, config, n: int, k: int) -> int:
    """The student's count for a graded kernel: refused unless it is a positive int and the kernel's own
    (:attr:`gemm.kernel.config.SharedPlan.inbox_bytes`, what its expect_tx announces)."""
    from gemm.kernel.config import SharedPlan
    asked = f"inbox_bytes(split_k={config.split_k}, block_m={config.block_m}, block_n={config.block_n})"
    value = solution.inbox_bytes(config.split_k, config.block_m, config.block_n)
    if type(value) is not int or value < 1:
        raise ValueError(f"{asked} returned {value!r}: a count of bytes is an int >= 1")
    want = SharedPlan(config, n, k).inbox_bytes
    if value != want:
        raise ValueError(f"{asked} = {value}, but the graded kernel's peers send {want} bytes: rank 0 would read "
                         "its inbox before it is full, or wait forever")
    return value


def _cpu_config(config):
    """The emulator's kernel: the ring cut to two stages (it wraps at small K), swapped tiles split over three."""
    if config.split_k > 1 and config.swap_ab:
        config = config.replace(split_k=CPU_SPLIT)
    return config.replace(stages=min(config.stages, 2))


def build(solution):
    import lessons
    from lessons.exercises.holed import checked_kernel

    def check(config, m, n, k):
        if config.split_k_push:
            checked(solution, config, n, k)
    return checked_kernel(lessons.stage(STAGE).config, _cpu_config, lessons.stage(STAGE).SHAPE, check)


def scaffold():
    """Stage 17's kernel, the gathered exchange: what the student starts from. The stub build (every count 0) is
    refused by :func:`checked`, so the technique checks compare against this instead."""
    import lessons
    from lessons.exercises.holed import checked_kernel
    return checked_kernel(lessons.stage(STAGE - 1).config, _cpu_config, lessons.stage(STAGE).SHAPE)


EXERCISE = Exercise(
    stage=STAGE,
    name="inbox_bytes",
    objective="Count the bytes rank 0's inbox barrier must expect when a split's peers push their partials.",
    prompt=PROMPT,
    holes=("inbox_bytes",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    scaffold=scaffold,
    required_sass=("UTMALDG", "QGMMA", "STAS"),  # STAS: the peers' st.async messages
    # swapped 16- and 32-token tiles split over three (ragged M and N, 10 and 5 K blocks); a 256 x 64 tile over two
    shapes_cpu=((13, 200, 1280), (27, 136, 640), (40, 136, 640)),
    shapes_gpu=((16, 2112, 7168), (5, 576, 1152)),
    perf_threshold=None,
    extra={"checks": (inbox_counts,)},
    answer_sites={"gemm/kernel/config.py": ("inbox_bytes", "partials_bytes")},
)
