"""Exercise 20: the tiles a pair of CTAs splits between decode and prefill.

Hole: ``pair_tiles(m, n, sms, one_wave, half_wave) -> (block_m, block_n) or None``: at M = 33-128, where the
cost model's tiles for one CTA per SM (``one_wave``) are at most 32 columns wide, the model's tiles for half the SMs
(``half_wave``), if two CTAs for each still fit the SMs; None where one CTA per tile stays (M outside 33-128, fewer
than two SMs, wider tiles, or pairs that would not fit). The model's answers come in as numbers: the grader sends
a solution nothing else. Stage 20 builds its kernels from those
tiles, split over a pair (:func:`gemm.heuristics.pair_split_blocks` is the rule; production and the stage ask it at
K >= 4096).

The rule check runs the student's function over fixed cases and 300 drawn afresh on every run, each with made-up
model answers (any tiles for either count: the rule must hold for whatever the model answers), naming the first it
gets wrong. The student's tiles for every graded kernel must be the rule's own there, and the kernel is built from
them (a tile that is not the rule's computes D right, so the correctness checks alone could not tell). On the emulator the
kernel runs on 8 SMs at small shapes, where the rule (asked there without its K gate) splits 64 x 56 and 128 x 56 /
128 x 32 tiles over pairs.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 20
CPU_SMS = 8
PROMPT = """\
Stage 20 sizes the tile to a GEMM of 33-128 rows. A tile of 256 rows (stage 11's) is mostly zero-fill there, and a
wave of narrow 64-row tiles, one per SM, makes every CTA read all of A over K for a thin slice of B. So the stage
takes tiles chosen for half the SMs (twice as wide, or as tall) and splits each tile's K blocks over a pair of
CTAs: as many CTAs, half the reads of A.

Fill in, in your copy of lessons/exercises/skeletons/ex20_pair_tiles.py:
  * pair_tiles(m, n, sms, one_wave, half_wave) -> (block_m, block_n) or None. one_wave and half_wave are the cost
    model's tiles (block_m, block_n) at this shape for sms CTAs and for sms // 2 CTAs: use them as given (the
    rule check also sends made-up answers, which the rule must hold for). Split over pairs only where
    32 < m <= 128, sms >= 2, and one_wave is at most 32 columns wide; then the pair takes half_wave's tiles, but
    only if two CTAs for each of them (ceil(m / block_m) * ceil(n / block_n) tiles) still fit in sms. Else None.
Stage 20 builds its kernels with those tiles (lessons/20_narrow_pair_tiles.py, narrowed)."""

QUESTIONS = (
    ("Predict: at 64 x 2112 x 7168 on 132 SMs, what tiles does the model choose for one CTA per SM, what does stage "
     "20 take, and how many bytes of A does each wave read from L2 in the two cases?",
     "check with gemm.heuristics.choose_blocks(64, 2112, 132) and (..., 66), or the figure 20_narrow_pair_tiles"),
    ("Predict: which is faster at 64 x 2112 x 7168: stage 20, its 64 x 16 tiles one per SM, or 64 x 64 tiles over "
     "pairs (stage 19's width, without the zero-fill rows)?",
     "check with `python -m lessons ablate 20 --m 64 --n 2112 --k 7168` (results/ablation_20.json)"),
    ("Predict: why does the rule not split at 64 x 7168 x 16384?",
     "check with choose_blocks(64, 7168, 132, k=16384): 56-wide tiles, where A's re-reads no longer dominate"),
    ("Predict: how deep is stage 20's ring at 64 x 2112 x 7168, against stage 19's?",
     "check with lessons.stage(20).config(64, 2112, 7168).stages and `python -m lessons diff 19 20 --m 64 --n 2112 "
     "--k 7168`"),
)


def reference():
    """Production's rule, :func:`gemm.heuristics.pair_split_blocks`, given the model's two answers."""
    from gemm.heuristics import pair_split_blocks

    def pair_tiles(m, n, sms, one_wave, half_wave):
        return pair_split_blocks(m, n, sms, lambda ctas: tuple(one_wave if ctas == sms else half_wave))
    return SimpleNamespace(pair_tiles=pair_tiles)


RANDOM_CASES = 300
RANDOM_MAX_SMS = 100_000


def model_answers(m: int, n: int, k: int, sms: int, tiles_for=None) -> tuple[tuple[int, int], tuple[int, int]]:
    """The cost model's tiles at (m, n, k) for ``sms`` CTAs and for half of them: ``tiles_for(ctas)``, by default
    :func:`gemm.heuristics.choose_blocks` over every candidate (the GPU build passes production's,
    :func:`gemm.heuristics.pair_model`)."""
    from gemm.heuristics import choose_blocks
    tiles_for = tiles_for or (lambda ctas: choose_blocks(m, n, ctas, k=k))
    return tiles_for(sms), tiles_for(max(sms // 2, 1))


def _cases():
    """(m, n, sms, one_wave, half_wave): the stage's and production's shapes on 132, 114, 8 (the emulator's), 2 and
    1 SMs with the real model's answers, each of the rule's bounds on both sides, then :data:`RANDOM_CASES` drawn
    afresh on every run from the OS with made-up answers (the fixed cases are public; a table of their answers must
    not pass)."""
    import random

    from gemm.heuristics import BLOCK_M_CANDIDATES, BLOCK_N_CANDIDATES
    cases = [(m, n, sms, *model_answers(m, n, k, sms)) for sms in (132, 114, CPU_SMS, 2, 1)
             for m in (1, 32, 33, 48, 64, 100, 128, 129, 256) for n, k in ((2112, 7168), (4096, 7168), (7168, 16384),
                                                                           (136, 640), (200, 1280), (24576, 1536))]
    # each of the rule's bounds on both sides, with answers a model could give (at 64 x 2112: 66 pairs fit 132
    # SMs, 67 do not)
    cases += [(64, 2112, 132, (64, 16), (64, 32)), (64, 2144, 132, (64, 16), (64, 32)),
              (64, 2112, 132, (64, 40), (64, 64)), (33, 2112, 132, (64, 16), (64, 32)),
              (32, 2112, 132, (64, 16), (64, 32)), (128, 2112, 132, (64, 32), (128, 32)),
              (129, 2112, 132, (64, 32), (128, 32)), (100, 256, 1, (128, 32), (128, 32))]
    draw = random.SystemRandom()
    for _ in range(RANDOM_CASES):
        m = draw.choice((draw.randint(1, 300), draw.randint(33, 128)))  # half of them inside the rule's rows
        n = 8 * draw.randint(1, 8192)
        one_wave = (draw.choice(BLOCK_M_CANDIDATES), draw.choice((8, 16, 24, 32, 40, 48)))
        half_wave = (draw.choice(BLOCK_M_CANDIDATES), draw.choice(BLOCK_N_CANDIDATES))
        pairs = 2 * -(-m // half_wave[0]) * -(-n // half_wave[1])
        # half of them with the SMs near what the pairs need, where the fit decides
        sms = draw.choice((draw.randint(1, RANDOM_MAX_SMS), draw.randint(max(1, pairs - 3), pairs + 3)))
        cases.append((m, n, sms, one_wave, half_wave))
    return cases


def check_rule(solution) -> None:
    """Raise AssertionError at the first (m, n, sms, one_wave, half_wave) whose tiles differ from the rule's."""
    own = reference().pair_tiles
    for m, n, sms, one_wave, half_wave in _cases():
        want = own(m, n, sms, one_wave, half_wave)
        got = solution.pair_tiles(m, n, sms, one_wave, half_wave)
        if got != want or not _is_tiles_or_none(got):
            raise AssertionError(f"pair_tiles(m={m}, n={n}, sms={sms}, one_wave={one_wave}, half_wave={half_wave}) "
                                 f"= {got!r}; the rule gives {want!r}")


def _is_tiles_or_none(value) -> bool:
    return value is None or (type(value) is tuple and len(value) == 2 and all(type(x) is int for x in value))


def pair_tile_rule(solution) -> list[str]:
    """The tiles are right for every case checked, fixed and drawn.

    The graded kernels are built only from tiles that are the rule's, so the rule over every shape, SM count and
    model is the technique."""
    return failures(check_rule, solution)


def checked(solution, m: int, n: int, sms: int, answers):
    """The student's tiles for a graded kernel, given the model's ``answers`` (one_wave, half_wave): refused unless
    they are None or a pair of ints, and the rule's own at that shape (:func:`gemm.heuristics.pair_split_blocks`)."""
    one_wave, half_wave = answers
    asked = f"pair_tiles(m={m}, n={n}, sms={sms}, one_wave={one_wave}, half_wave={half_wave})"
    value = solution.pair_tiles(m, n, sms, one_wave, half_wave)
    if not _is_tiles_or_none(value):
        raise ValueError(f"{asked} returned {value!r}: tiles are a pair of ints (block_m, block_n), or None")
    want = reference().pair_tiles(m, n, sms, one_wave, half_wave)
    if value != want:
        raise ValueError(f"{asked} = {value}, but the graded kernel takes {want}")
    return value


def build(solution):
    import lessons
    from gemm.heuristics import device_facts, pair_model
    from lessons.exercises.holed import HoledKernel

    def config_of(m, n, k):
        config = lessons.stage(STAGE).config(m, n, k)
        if lessons.stage(STAGE).narrowed(m, n, k) is not None:
            device = device_facts()
            answers = model_answers(m, n, k, device.sm_count, pair_model(m, n, k, device))
            checked(solution, m, n, device.sm_count, answers)
        return config

    def cpu_config_of(m, n, k):
        tiles = checked(solution, m, n, CPU_SMS, model_answers(m, n, k, CPU_SMS))
        config = lessons.stage(STAGE - 1).config(m, n, k)
        if tiles is not None:
            config = lessons.stage(STAGE).paired(config, m, tiles)
        return config.replace(stages=min(config.stages, 2))
    return HoledKernel(config_of, lambda m, n, k: {}, cpu_config_of=cpu_config_of,
                       sass_shape=lessons.stage(STAGE).SHAPE, sm_count_cpu=CPU_SMS)


def scaffold():
    """Stage 19's kernel, its 256-row tiles: what the student starts from. The stub build (pair_tiles raises) is
    refused, so the technique checks compare against this instead."""
    import lessons
    from lessons.exercises.holed import checked_kernel
    return checked_kernel(lessons.stage(STAGE - 1).config, lambda config: config.replace(
        stages=min(config.stages, 2)), lessons.stage(STAGE).SHAPE, sm_count_cpu=CPU_SMS)


EXERCISE = Exercise(
    stage=STAGE,
    name="pair_tiles",
    objective="Choose the tiles a pair of CTAs splits at M = 33-128: as tall as M, narrow enough to fill the SMs.",
    prompt=PROMPT,
    holes=("pair_tiles",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    scaffold=scaffold,
    required_sass=("UTMALDG", "QGMMA", "STAS"),
    # on 8 SMs: 64 x 56 tiles over pairs (ragged M and N, 5 K blocks as 4 and 1), 128 x 56 (10 as 7 and 3) and
    # 128 x 32 (ragged M)
    shapes_cpu=((40, 136, 640), (100, 200, 1280), (120, 128, 640)),
    shapes_gpu=((64, 2112, 7168), (100, 2112, 7168)),  # 64 x 32 and 128 x 32 tiles over pairs, 132 CTAs
    perf_threshold=None,
    extra={"checks": (pair_tile_rule,)},
    answer_sites={"gemm/heuristics.py": ("pair_split_blocks",)},
)
