"""Exercise 02 (stage 02, shared-memory tiling): the shared tile pitch that keeps a warp's reads in 32 banks.

The hole is ``b_tile_pitch()``, the row pitch (in float32 words) of the B tile in shared memory; the stage's own
kernel is built with it by ``lessons/02_smem_tiling.py``'s ``make_kernel(b_pitch=...)``. A pitch below BLOCK_K
overlaps rows (wrong results, or an index error in the simulator); a pitch of exactly BLOCK_K is correct but puts a
warp's 32 reads of b_tile[tx, k] in one bank. Correctness cannot see that, so the exercise adds a technique check
(``EXERCISE.extra["checks"]``: each takes the solution and returns a list of failures): the 32 words a warp reads
must lie in 32 different banks.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise
from lessons.exercises.ex01_promotion import NUMBA_FORBIDDEN, NumbaCandidate, _stage

HOLES = ("b_tile_pitch",)


def reference():
    return SimpleNamespace(b_tile_pitch=_stage(2).b_tile_pitch, is_reference=True)


def _pitch(solution) -> int:
    pitch = solution.b_tile_pitch()
    if isinstance(pitch, bool) or int(pitch) != pitch or pitch <= 0:
        raise ValueError(f"b_tile_pitch() must return a positive whole number of float32 words, got {pitch!r}")
    return int(pitch)


def _factory(solution):
    return _stage(2).make_kernel(b_pitch=_pitch(solution))


def build(solution) -> NumbaCandidate:
    _pitch(solution)  # an unfilled skeleton fails here
    return NumbaCandidate(2, __name__, _factory, solution)


def bank_conflicts(solution) -> list[str]:
    """Technique: for every k, the words b_tile[tx, k] of the 32 threads tx of a warp are in 32 different banks."""
    stage = _stage(2)
    pitch = _pitch(solution)
    failures = []
    if pitch < stage.BLOCK_K:
        failures.append(f"pitch {pitch} < BLOCK_K = {stage.BLOCK_K}: rows of b_tile overlap")
    for k in range(stage.BLOCK_K):
        banks = {stage.shared_word(tx, k, pitch) % stage.BANKS for tx in range(stage.TILE)}
        if len(banks) < stage.TILE:
            failures.append(f"pitch {pitch}: a warp's reads of b_tile[tx, {k}] hit only {len(banks)} banks "
                            f"({stage.TILE // len(banks)}-way bank conflict)")
            break
    return failures


PROMPT = """\
Stage 02 stages one 128-wide K group of A and B through shared memory as float32, decoded once per block. In the
inner loop thread (ty, tx) reads a_tile[ty, k] (one address per warp: a broadcast) and b_tile[tx, k]: 32 different
rows of b_tile, same column. Shared memory has 32 banks of 4-byte words; word w sits in bank w % 32. Write
`b_tile_pitch()`: the number of float32 words between consecutive rows of b_tile (the kernel declares
cuda.shared.array((32, b_tile_pitch()), float32)). It must hold a row of BLOCK_K = 128 values, and a warp's 32 reads
must land in 32 different banks. Read lessons/02_smem_tiling.py (shared_word, BANKS) and the bank figure of
lessons/figures/numba_threads.py."""

EXERCISE = Exercise(
    stage=2,
    name="tile_pitch",
    objective="Lay out a shared-memory tile so that a warp's column reads are conflict-free: pad the row pitch.",
    prompt=PROMPT,
    holes=HOLES,
    questions=(
        ("Predict: with a pitch of 128 words, how many banks do the 32 reads of b_tile[tx, k] touch? How many with "
         "129?", "Check with lessons.figures' smem_banks figure (`python -m lessons figures 02_smem_tile_banks`) or "
         "`[shared_word(tx, 0, p) % 32 for tx in range(32)]` from lessons/02_smem_tiling.py."),
        ("Predict: how many bytes of shared memory does a block use with your pitch?",
         "Check with `python -m lessons inspect 2` (shared_bytes of the kernel: 32*128*4 + 32*pitch*4)."),
        ("Predict: does the padding change the SASS of the inner loop (the LDS count per k)?",
         "Check with `python -m lessons inspect 2`: LDS and FFMA counts are the same for pitch 128 and 129; only "
         "the addresses (and the measured time on a GPU) differ."),
    ),
    reference=reference,
    build=build,
    required_sass=("FFMA", "LDS"),
    forbidden_sass=NUMBA_FORBIDDEN,
    shapes_cpu=((33, 9, 256), (5, 40, 128)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    extra={"checks": (bank_conflicts,)},
)
