"""Exercise 17: how many CTAs a persistent walk needs to take as many waves as one CTA per SM.

Hole: ``even_ctas(tiles, sms, cluster) -> int``: the fewest CTAs that finish ``tiles`` tiles in as many waves as
``sms`` CTAs would (a wave: one tile per CTA), a whole number of ``cluster``-CTA clusters, at most ``sms``. Stage 17
launches that many (``KernelConfig.even_waves``; production's count is :func:`gemm.kernel.launch.even_wave_ctas`).
Any count computes D right (the walk steps by the grid's size), so the correctness checks cannot judge it; the rule
check does, over tile counts around each multiple of the SMs, several SM counts and clusters of one and two CTAs,
and 300 cases drawn afresh on every run, naming the first it gets wrong. Every count a graded kernel is built from
must be the launch's own (a solution that answered the rule check one way and the build another would otherwise
pass), and must be a positive int.

On the emulator the kernel is stage 17's walk made persistent on 4 SMs at small shapes (stage 16's config there
splits K instead), with the student's count asked for those 4 SMs: 9 tiles take 3 CTAs, 5 take 3.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 17
CPU_SMS = 4
PROMPT = """\
Stage 17 launches a persistent walk with the fewest CTAs that take as many waves as one CTA per SM: each CTA then
walks the same number of tiles (or one fewer), and each wave starts on whole blocks of the raster. At 4096 x 4096
x 7168 (512 tiles of 256 x 128 on 132 SMs) that is 128 CTAs of four tiles, not 116 of four and 16 of three.

Fill in, in your copy of lessons/exercises/skeletons/ex17_even_ctas.py:
  * even_ctas(tiles, sms, cluster) -> int: the fewest CTAs that finish `tiles` tiles in as many waves as `sms`
    CTAs would (a wave: one tile per CTA; one CTA per SM), as a whole number of clusters of `cluster` CTAs (stage
    09's pairs: 2), and never more than `sms`. Mind the rounding: rounding a count down to whole clusters adds a
    wave.
Stage 17 launches that many CTAs where it evens the waves (lessons/17_even_waves.py, evened)."""

QUESTIONS = (
    ("Predict: at 4096 x 2112 x 7168 with production's 128 x 192 tiles (352 tiles), how many CTAs, and how many tiles "
     "does each walk?", "check with gemm.kernel.launch.grid and production's config (gemm.heuristics.choose_config), "
     "or the figure 17_even_waves"),
    ("Predict: the kernel's SASS changes how, from stage 16 to 17?",
     "check with `python -m lessons diff 16 17` (the walk steps by %nctaid: only the launch changes)"),
    ("Predict: at 128 x 32768 x 512 (256 tiles: 2 waves either way) is 128 CTAs faster than 132?",
     "check with results/sweep_even_waves_paired.json (K = 512: every round slower)"),
    ("Predict: where does even waves launch 132 CTAs still, so that it changes nothing?",
     "check with 8192^3 in results/sweep_even_waves_paired.json (2752 tiles: 21 waves of 131.05)"),
)


def reference():
    """Production's count (:func:`gemm.kernel.launch.even_wave_ctas`)."""
    from gemm.kernel.launch import even_wave_ctas
    return SimpleNamespace(even_ctas=even_wave_ctas)


RANDOM_CASES = 300
RANDOM_MAX_SMS = 100_000


def _cases():
    """(tiles, sms, cluster): tile counts around each multiple of the SMs, at several SM counts, single CTAs and
    pairs, then :data:`RANDOM_CASES` more drawn afresh on every run (from the OS, not the grading seeds: the fixed
    cases alone are public, and a table of their answers passed a red team's grading). Pairs only where the SMs
    hold whole pairs: on an odd SM count a pair's count is cut to whole pairs by the launch, which adds a wave."""
    import random
    cases = []
    for sms in (132, 114, 78, 6, 4, 1):
        for cluster in (1, 2):
            if cluster > sms or sms % cluster:
                continue
            for tiles in sorted({1, 2, 3, sms - 1, sms, sms + 1, 2 * sms - 1, 2 * sms + 1, 3 * sms + 3, 512, 896,
                                 3072, 2752, 352, 7 * sms + 5}):
                if tiles >= 1:
                    cases.append((tiles, sms, cluster))
    draw = random.SystemRandom()
    for _ in range(RANDOM_CASES):
        cluster = draw.choice((1, 2, 4))
        # SM counts far past any GPU's and few waves (past about sms waves every count is sms itself): a domain of
        # some 10^10 cases no table can hold (a table of every case with up to 200 SMs passed a red team's grading)
        sms = cluster * draw.randint(1, RANDOM_MAX_SMS // cluster)
        cases.append((draw.randint(1, 8 * sms), sms, cluster))
    return cases


def check_rule(solution) -> None:
    """Raise AssertionError at the first (tiles, sms, cluster) whose count differs from the launch's."""
    from gemm.kernel.launch import even_wave_ctas
    for tiles, sms, cluster in _cases():
        got, want = solution.even_ctas(tiles, sms, cluster), even_wave_ctas(tiles, sms, cluster)
        if type(got) is not int or got != want:
            raise AssertionError(f"even_ctas(tiles={tiles}, sms={sms}, cluster={cluster}) = {got!r}; the fewest CTAs "
                                 f"taking as many waves, in whole clusters, is {want}")


def cta_counts(solution) -> list[str]:
    """The CTA count is right for every case checked, fixed and drawn.

    The count is the technique: the graded kernels compute D right whatever the grid."""
    return failures(check_rule, solution)


def checked(solution, tiles: int, sms: int, cluster: int) -> int:
    """The student's count for a graded launch: refused unless it is a positive int and the launch's own
    (:func:`gemm.kernel.launch.even_wave_ctas`). D does not depend on it, so a count that answered the rule check
    one way and the graded kernels another would otherwise pass."""
    from gemm.kernel.launch import even_wave_ctas
    value = solution.even_ctas(tiles, sms, cluster)
    if type(value) is not int or value < 1:
        raise ValueError(f"even_ctas(tiles={tiles}, sms={sms}, cluster={cluster}) returned {value!r}: a count of CTAs "
                         "is an int >= 1")
    want = even_wave_ctas(tiles, sms, cluster)
    if value != want:
        raise ValueError(f"even_ctas(tiles={tiles}, sms={sms}, cluster={cluster}) = {value}, but the graded launch "
                         f"takes {want} CTAs for as many waves as {sms}")
    return value


def _tiles(config, m: int, n: int) -> int:
    from gemm.fp8 import ceil_div
    return ceil_div(m, config.block_m) * ceil_div(n, config.block_n)


def build(solution):
    import lessons
    from gemm.heuristics import device_facts

    def config_of(m, n, k):
        config = lessons.stage(STAGE).config(m, n, k)
        if config.even_waves:
            checked(solution, _tiles(config, m, n), device_facts().sm_count, config.multicast)
        return config

    def cpu_config_of(m, n, k):  # stage 16 splits K at these shapes: its tiles as a persistent walk on CPU_SMS
        config = lessons.stage(STAGE - 1).config(m, n, k).replace(split_k=1, persistent=True, raster_group=2,
                                                                  even_waves=True)
        checked(solution, _tiles(config, m, n), CPU_SMS, config.multicast)
        return config.replace(stages=min(config.stages, 2))
    return _kernel(config_of, cpu_config_of)


def scaffold():
    """Stage 16's kernel, one CTA per SM: what the student starts from. The stub build (every count 0) is refused by
    :func:`checked`, so the technique checks compare against this instead."""
    import lessons

    def cpu_config_of(m, n, k):
        config = lessons.stage(STAGE - 1).config(m, n, k).replace(split_k=1, persistent=True, raster_group=2)
        return config.replace(stages=min(config.stages, 2))
    return _kernel(lessons.stage(STAGE - 1).config, cpu_config_of)


def _kernel(config_of, cpu_config_of):
    from lessons.exercises.holed import HoledKernel
    from lessons.ladder import LADDER_SHAPE
    return HoledKernel(config_of, lambda m, n, k: {}, cpu_config_of=cpu_config_of, sass_shape=LADDER_SHAPE,
                       sm_count_cpu=CPU_SMS)


EXERCISE = Exercise(
    stage=STAGE,
    name="even_ctas",
    objective="Count the fewest CTAs a persistent walk needs for as many waves as one CTA per SM.",
    prompt=PROMPT,
    holes=("even_ctas",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    scaffold=scaffold,
    required_sass=("UTMALDG", "QGMMA"),
    # stage 16's 256 x 64 tiles on 4 SMs: 9 tiles (3 waves: 3 CTAs) and 5 tiles (2 waves: 3 CTAs), M and N ragged
    shapes_cpu=((520, 192, 384), (200, 320, 384)),
    shapes_gpu=((4096, 4096, 7168), (3001, 3968, 4224)),
    perf_threshold=None,
    extra={"checks": (cta_counts,)},
    answer_sites={"gemm/kernel/launch.py": ("even_wave_ctas",)},
)
