"""Exercise 19: the K blocks each CTA of a split computes when rank 0 takes a lead.

Hole: ``lead_share(rank, split_k, k_blocks, lead) -> (first, end)``: the K blocks [first, end) that cluster rank
``rank`` of ``split_k`` computes of a tile's ``k_blocks`` when rank 0 (the CTA that waits for the others' pushes,
adds them and stores D) takes ``lead`` blocks beyond an even share: rank 0 takes E = k_blocks // split_k + lead
(at most k_blocks - (split_k - 1), so no peer is left empty) and the peers share the rest evenly, in rank order,
each share rounded down as stage 12's even shares are. Stage 19's kernels compute exactly these shares in PTX
(:meth:`gemm.kernel.generator._Kernel._lead_shares`), and :func:`gemm.kernel.config.k_share` is the rule.

The emulator runs stage 19's kernel, its ring cut to two stages, its swapped tiles split over three CTAs with
production's lead (production's decode split; the stage splits them over two, where it gives no lead) so that the
peers' shares are a division, and its 256 x 64 tiles over two as the stage does. Every share a
graded kernel is built from must be that kernel's own, for every rank (a share that leaves blocks out or counts them
twice is a wrong answer the emulator would catch, but a share past K is a fault on a GPU); the rule check asks
every split of the stage's and production's K-block counts and leads, and 300 cases drawn afresh on every run,
naming the first it gets wrong.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 19
CPU_SPLIT = 3  # gemm.heuristics.SWAP_AB_MAX_SPLIT: production's swapped decode tiles split over three CTAs
PROMPT = """\
Stage 19 gives a split tile's rank 0 more of the K loop: rank 0 waits for its peers' pushed totals, adds them and
stores D, so if the peers finish first their messages land while rank 0 still multiplies, and its wait at the end
finds its inbox full. With split_k CTAs sharing k_blocks K blocks and a lead of `lead` blocks, rank 0 takes
E = k_blocks // split_k + lead of them (but never so many that a peer is left with none), and ranks 1 .. split_k - 1
share the other k_blocks - E evenly, in rank order, rounding down as stage 12's even shares do.

Fill in, in your copy of lessons/exercises/skeletons/ex19_lead_shares.py:
  * lead_share(rank, split_k, k_blocks, lead) -> (first, end): the K blocks [first, end) that rank computes. The
    shares must tile [0, k_blocks) in rank order, none empty.
Stage 19 builds its kernels with those shares (gemm/kernel/generator.py: _Kernel._lead_shares emits them in PTX)."""

QUESTIONS = (
    ("Predict: at 64 x 2112 x 7168 (56 K blocks), which K blocks does each CTA compute in stage 18 and in stage 19 "
     "(256 x 64 tiles over two), and at 16 x 2112 x 7168 in production's kernel (over three, lead 2)?",
     "check with gemm.kernel.config.k_share(rank, split_k, 56, config.split_k_lead) for lessons.stage(19).config("
     "64, 2112, 7168) and gemm.heuristics.choose_config(16, 2112, 7168), or the figure 19_split_k_lead"),
    ("Predict: why does stage 19 give no lead to swapped 16 x 64 tiles split over a pair (its rule, and "
     "production's), and why is a lead of 4 slower than 2 at 16 x 2112 x 7168 but not at 128 x 4096 x 7168?",
     "check with results/sweep_split_k_lead_pairs_memset.json and sweep_split_k_lead_memset.json (notebook 19's "
     "measured cell): the 16 x 64 swapped tiles push 4 KiB of partials, the 128 x 64 pair tiles 32 KiB"),
    ("Predict: what does the PTX spend on the shares, and where does it run?",
     "check with `python -m lessons diff 18 19 --m 64 --n 2112 --k 7168`: a few integer instructions once, "
     "before the first TMA load"),
    ("Predict: what happens at 16 x 2112 x 384 (3 K blocks over two CTAs) with a lead of 2?",
     "check with gemm.kernel.config.k_share(rank, 2, 3, 2): rank 0's share is bounded so the peer keeps one"),
)


def reference():
    """The generator's rule: :func:`gemm.kernel.config.k_share` with its lead."""
    from gemm.kernel.config import k_share

    def lead_share(rank, split_k, k_blocks, lead):
        return k_share(rank, split_k, k_blocks, lead)
    return SimpleNamespace(lead_share=lead_share)


RANDOM_CASES = 300
RANDOM_MAX_BLOCKS = 4096  # K blocks past any the generator builds (K = 512 Ki): no table holds the domain


def _cases():
    """(rank, split_k, k_blocks, lead): every rank of the stage's and production's K-block counts at every split and
    a few leads, then :data:`RANDOM_CASES` drawn afresh on every run from the OS (the fixed cases are public; a table
    of their answers must not pass)."""
    import random

    from gemm.kernel.config import SPLIT_K
    cases = [(rank, split, blocks, lead) for split in SPLIT_K[1:] for blocks in (split, split + 1, 5, 9, 10, 32, 56, 57)
             if blocks >= split for lead in (1, 2, 3, 7) for rank in range(split)]
    draw = random.SystemRandom()
    for _ in range(RANDOM_CASES):
        split = draw.choice(SPLIT_K[1:])
        cases.append((draw.randrange(split), split, draw.randint(split, RANDOM_MAX_BLOCKS), draw.randint(1, 64)))
    return cases


def check_rule(solution) -> None:
    """Raise AssertionError at the first (rank, split_k, k_blocks, lead) whose share differs from the generator's."""
    own = reference().lead_share
    for rank, split_k, k_blocks, lead in _cases():
        got, want = solution.lead_share(rank, split_k, k_blocks, lead), own(rank, split_k, k_blocks, lead)
        if type(got) is not tuple or got != want or not all(type(x) is int for x in got):
            raise AssertionError(f"lead_share(rank={rank}, split_k={split_k}, k_blocks={k_blocks}, lead={lead}) = "
                                 f"{got!r}; that rank computes K blocks {want}")


def lead_shares(solution) -> list[str]:
    """The shares are right for every case checked, fixed and drawn.

    The graded kernels are built only from shares that are their own, so the rule over every split, K-block count
    and lead is the technique."""
    return failures(check_rule, solution)


def checked(solution, config, k: int) -> None:
    """The student's shares for a graded kernel, every rank: refused unless each is a pair of ints and the kernel's
    own (:func:`gemm.kernel.config.k_share` with its lead, what its PTX computes)."""
    from gemm.kernel.config import k_share
    blocks = -(-k // 128)
    for rank in range(config.split_k):
        asked = f"lead_share(rank={rank}, split_k={config.split_k}, k_blocks={blocks}, lead={config.split_k_lead})"
        value = solution.lead_share(rank, config.split_k, blocks, config.split_k_lead)
        if type(value) is not tuple or len(value) != 2 or not all(type(x) is int for x in value):
            raise ValueError(f"{asked} returned {value!r}: a share is a pair of ints (first, end)")
        want = k_share(rank, config.split_k, blocks, config.split_k_lead)
        if value != want:
            raise ValueError(f"{asked} = {value}, but the graded kernel's rank {rank} computes K blocks {want}: the "
                             "kernel would leave blocks out, count them twice or read past K")


def _cpu_config(config):
    """The emulator's kernel: the ring cut to two stages (it wraps at small K), swapped tiles split over three with
    production's lead there (the stage splits them over pairs, where it gives none)."""
    from gemm.heuristics import split_lead
    if config.split_k > 1 and config.swap_ab:
        config = config.replace(split_k=CPU_SPLIT, split_k_lead=split_lead(CPU_SPLIT, swap_ab=True))
    return config.replace(stages=min(config.stages, 2))


def build(solution):
    import lessons
    from lessons.exercises.holed import checked_kernel

    def check(config, m, n, k):
        if config.split_k_lead:
            checked(solution, config, k)
    return checked_kernel(lessons.stage(STAGE).config, _cpu_config, lessons.stage(STAGE).SHAPE, check)


def scaffold():
    """Stage 18's kernel, even shares: what the student starts from. The stub build (every share (0, 0)) is refused
    by :func:`checked`, so the technique checks compare against this instead."""
    import lessons
    from lessons.exercises.holed import checked_kernel
    return checked_kernel(lessons.stage(STAGE - 1).config, _cpu_config, lessons.stage(STAGE).SHAPE)


EXERCISE = Exercise(
    stage=STAGE,
    name="lead_shares",
    objective="Split a tile's K blocks so that rank 0, which waits for the others' partials, takes a lead.",
    prompt=PROMPT,
    holes=("lead_share",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    scaffold=scaffold,
    required_sass=("UTMALDG", "QGMMA", "STAS"),
    # swapped 16- and 32-token tiles split over three (ragged M and N, 10 and 5 K blocks: 5, 2, 3 and 3, 1, 1); a
    # 256 x 64 tile over two (5 K blocks: 4 and 1)
    shapes_cpu=((13, 200, 1280), (27, 136, 640), (40, 136, 640)),
    shapes_gpu=((64, 2112, 7168), (100, 2112, 7168)),  # 256 x 64 tiles over pairs: 56 K blocks as 30 and 26
    perf_threshold=None,
    extra={"checks": (lead_shares,)},
    answer_sites={"gemm/kernel/config.py": ("k_share", "lead_share_end")},
)
