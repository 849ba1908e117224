"""Exercise 16: how many tiles load each byte of B, so where B's loads may go to L2 as evict_first.

Hole: ``b_reads(m, n, k, block_m, block_n, split_k, multicast) -> int``: the number of tiles that load each byte of
B (the weight) from L2 when tiles of block_m x block_n cover M = m rows (K split over ``split_k`` CTAs of a cluster,
A multicast to ``multicast`` CTAs). Stage 16 loads B evict_first exactly where the answer is 1 (its config is built
from the answer: :func:`lessons.16_evict_first.hinted` with ``reads=``), since a line no other tile will ask for
is the one to give up first. The answer is data on the host: D is the same whatever it says, so the correctness
checks cannot judge it; the rule check does, on dense tiles of 64-256 rows with ragged M, swapped tiles of 8-32
token rows, K split over clusters of 2-4 CTAs, multicast pairs and masked groups (M: a group's expected tokens),
naming the first config it gets wrong; and every count a graded kernel is built from must be that kernel's own (a
solution that answered the rule check one way and the build another would otherwise pass). An answer that is not a
positive int is refused before any kernel is built.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 16
PROMPT = """\
Stage 16 loads B (the weight) into L2 as evict_first where no other tile will read the same bytes again: those
lines are then the first their L2 set gives up, and the weight stream replaces its own lines instead of evicting
(and writing back) what the L2 held. So the stage needs, for a config and M, how many tiles load each byte of B.

Fill in, in your copy of lessons/exercises/skeletons/ex16_b_reads.py:
  * b_reads(m, n, k, block_m, block_n, split_k, multicast) -> int: how many tiles load each byte of B from L2
    when tiles of block_m rows of A (and D) by block_n rows of B cover an M = m by N = n output, K = k deep.
    Mind what each argument means: a swapped tile (stage 15) has block_m token rows still; split_k > 1 gives
    each of that many CTAs of a cluster its own K blocks of one tile; multicast == 2 has the two CTAs of a pair
    share A; a masked grouped GEMM passes one group's expected tokens as m.
Stage 16 sets b_eviction="first" where your answer is 1 (lessons/16_evict_first.py, hinted)."""

QUESTIONS = (
    ("Predict: at 32 x 4096 x 7168, how many times is each byte of B loaded? At the ladder's 4096 x 4096 x 7168?",
     "check with `python -m lessons inspect 16` (the configs: block_m against M) and the figure 16_evict_first"),
    ("Predict: after a 256 MiB fill leaves the L2 dirty, how many MB does a call at 64 x 7168 x 16384 write back "
     "to HBM, without the hint and with it (D itself is 0.9 MB)?",
     "check with results/ncu_l2_eviction_64x7168x16384.txt (ncu's dram__bytes_write.sum, three calls each)"),
    ("Predict: after the timer's clean flush (an L2 full of clean lines) does the hint still pay?",
     "check with results/sweep_l2_eviction_clean.json against sweep_l2_eviction_memset.json"),
    ("Predict: how many SASS instructions does the hint add to the producer's loop?",
     "check with `python -m lessons diff 15 16` at 32 x 4096 x 7168 (B's UTMALDG takes a desc[UR] operand)"),
)


def reference():
    """Production's count (:func:`gemm.heuristics.b_reads`), asked with the hole's numbers."""
    from gemm.heuristics import b_reads

    def counted(m, n, k, block_m, block_n, split_k, multicast):
        return b_reads(m, SimpleNamespace(block_m=block_m, block_n=block_n, split_k=split_k, multicast=multicast))
    return SimpleNamespace(b_reads=counted)


def _cases():
    """(m, config) the rule check walks: each field that could change the count, and ragged M around each tile."""
    from gemm.kernel import KernelConfig
    dense = [KernelConfig(block_m=rows, block_n=128) for rows in (64, 128, 256)]
    swapped = [KernelConfig(block_m=rows, block_n=64, swap_ab=True, persistent=False, raster_group=0)
               for rows in (8, 16, 32)]
    split = [KernelConfig(block_m=64, block_n=64, split_k=s, persistent=False, raster_group=0) for s in (2, 3, 4)]
    split += [KernelConfig(block_m=16, block_n=64, swap_ab=True, split_k=3, persistent=False, raster_group=0)]
    pairs = [KernelConfig(block_m=128, block_n=128, multicast=2), KernelConfig(block_m=256, block_n=128, multicast=2)]
    masked = [KernelConfig(block_m=rows, block_n=64, gemm_type="masked", swap_ab=rows <= 32) for rows in (16, 64)]
    cases = []
    for config in dense + swapped + split + pairs + masked:
        rows = config.block_m
        for m in sorted({1, rows - 1, rows, rows + 1, 2 * rows, 3 * rows - 5, 4096}):
            if m >= 1:
                cases.append((m, config))
    return cases


def _ask(b_reads, m: int, n: int, k: int, config):
    """A hole's answer for ``config``'s tiles: the plain numbers it takes."""
    return b_reads(m, n, k, config.block_m, config.block_n, config.split_k, config.multicast)


def check_rule(solution) -> None:
    """Raise AssertionError at the first (M, config) whose count differs from the tiles' own."""
    from gemm.heuristics import b_reads
    for m, config in _cases():
        got, want = _ask(solution.b_reads, m, 4096, 7168, config), b_reads(m, config)
        if type(got) is not int or got != want:
            raise AssertionError(f"b_reads(m={m}, n=4096, k=7168, block_m={config.block_m}, "
                                 f"block_n={config.block_n}, split_k={config.split_k}, "
                                 f"multicast={config.multicast}) = {got!r} ({config.describe()}); that walk loads "
                                 f"each byte of B {want} time{'s' * (want != 1)}")


def tile_reads(solution) -> list[str]:
    """The count is the technique: the graded kernels compute D right whatever it says (only the L2 priority of
    B's loads follows it), so every case the rule names is checked here."""
    return failures(check_rule, solution)


def checked(solution, n: int, k: int):
    """The student's count as ``hinted``'s ``reads(m, config)``: refused unless it is a positive int, and unless it
    is the graded kernel's own count (:func:`gemm.heuristics.b_reads`). D does not depend on it, so a count that
    answered the rule check one way and the graded kernels another would otherwise pass with the wrong priority."""
    from gemm.heuristics import b_reads

    def reads(m, config):
        value = _ask(solution.b_reads, m, n, k, config)
        if type(value) is not int or value < 1:
            raise ValueError(f"b_reads(m={m}, ...) returned {value!r}: a count of tiles is an int >= 1")
        want = b_reads(m, config)
        if value != want:
            raise ValueError(f"b_reads(m={m}, n={n}, k={k}, block_m={config.block_m}, block_n={config.block_n}, "
                             f"split_k={config.split_k}, multicast={config.multicast}) = {value}, but the graded "
                             f"kernel's tiles load each byte of B {want} time{'s' * (want != 1)}: its B loads would "
                             "take the wrong L2 priority")
        return value
    return reads


def build(solution):
    import lessons
    stage = lessons.stage(STAGE)

    def config_of(m, n, k):
        hinted = stage.hinted(m, n, k, reads=checked(solution, n, k))
        return lessons.stage(STAGE - 1).config(m, n, k).replace(b_eviction="first" if hinted else "normal")
    return _kernel(config_of)


def scaffold():
    """Stage 15's kernel, no hint: what the student starts from. The stub build (every count 0) is refused by
    :func:`checked`, so the technique checks compare against this instead: its UTMALDG and QGMMA are the
    scaffold's, not the student's."""
    import lessons
    return _kernel(lessons.stage(STAGE - 1).config)


def _kernel(config_of):
    import lessons
    from lessons.exercises.holed import HoledKernel
    return HoledKernel(config_of, lambda m, n, k: {}, cpu_stages=2, sass_shape=lessons.stage(STAGE).SHAPE,
                       sm_count_cpu=2)


EXERCISE = Exercise(
    stage=STAGE,
    name="b_reads",
    objective="Count how many tiles load each byte of B, and so where B's TMA loads may be marked evict_first in L2.",
    prompt=PROMPT,
    holes=("b_reads",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    scaffold=scaffold,
    required_sass=("UTMALDG", "QGMMA"),
    # swapped 8- and 32-token tiles with K split over 2 CTAs (one row: hinted), 256-row tiles over 300 and 520 rows
    # (two and three rows: not hinted)
    shapes_cpu=((5, 136, 384), (27, 136, 640), (300, 136, 256), (520, 72, 128)),
    shapes_gpu=((32, 4096, 7168), (1, 7168, 2048)),
    perf_threshold=None,
    extra={"checks": (tile_reads,)},
    answer_sites={"gemm/heuristics.py": ("b_reads", "reads_b_once")},
)
