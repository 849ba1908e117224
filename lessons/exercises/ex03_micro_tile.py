"""Exercise 03 (stage 03, register tiling): the micro-tile offsets, which rows and columns a thread owns.

The hole is ``micro_offset(i, thread)``: the tile row (or column) of a thread's i-th row (column), i < 8. The stage's
own kernel calls it for the fragment loads from shared memory, the promotion's scale rows and the epilogue's
stores (``lessons/03_register_tiling.py``'s ``make_kernel(micro_offset=...)``). An offset map that is not a
bijection onto the 128 rows leaves outputs unwritten or writes them twice: wrong. One that is correct but loses the
two-runs-of-4 shape costs the 128-bit shared loads; ``EXERCISE.extra["sass_checks"]`` asks for LDS.128.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise
from lessons.exercises.ex01_promotion import NUMBA_FORBIDDEN, NumbaCandidate, _stage, as_device_function

HOLES = ("micro_offset",)


def reference():
    offset = _stage(3).micro_offset
    return SimpleNamespace(micro_offset=getattr(offset, "py_func", offset), is_reference=True)


def _factory(solution):
    return _stage(3).make_kernel(micro_offset=as_device_function(solution.micro_offset))


def build(solution) -> NumbaCandidate:
    solution.micro_offset(0, 0)  # an unfilled skeleton fails here
    return NumbaCandidate(3, __name__, _factory, solution)


def ownership(solution) -> list[str]:
    """Every (row) of the 128-row tile is owned by exactly one (thread, i): a cheap check before the simulator."""
    stage = _stage(3)
    owners = {}
    for thread in range(stage.THREADS_M):
        for i in range(stage.THREAD_M):
            owners.setdefault(int(solution.micro_offset(i, thread)), []).append((thread, i))
    missing = [row for row in range(stage.BLOCK_M) if row not in owners]
    shared = {row: who for row, who in owners.items() if len(who) > 1}
    outside = [row for row in owners if not 0 <= row < stage.BLOCK_M]
    failures = []
    if missing:
        failures.append(f"rows {missing[:8]}{'...' if len(missing) > 8 else ''} belong to no thread")
    if shared:
        row, who = next(iter(shared.items()))
        failures.append(f"{len(shared)} rows belong to several (thread, i), e.g. row {row}: {who}")
    if outside:
        failures.append(f"offsets {sorted(outside)[:8]} fall outside the 0..127 tile")
    return failures


def wide_shared_loads(instructions) -> list[str]:
    """Technique on the SASS (base opcodes cannot show it): the fragment loads are 128-bit (LDS.128)."""
    wide = [i for i in instructions if i.opcode == "LDS" and "128" in i.modifiers]
    return [] if wide else ["no LDS.128: the fragment loads are not 128-bit (two runs of 4 aligned words?)"]


PROMPT = """\
Stage 03 gives each of 16 x 16 threads an 8 x 8 micro-tile of the block's 128 x 128 tile of D, held in registers.
Per k, thread (tx, ty) loads its 8 values of A (rows micro_offset(i, ty)) and its 8 values of B (columns
micro_offset(j, tx)) from k-major shared tiles, then does 64 FFMAs. Write `micro_offset(i, thread)`: the tile row
(column) of a thread's i-th row (column), for i in 0..7 and thread in 0..15. Every row must belong to exactly one
(thread, i); and for 128-bit shared loads a thread's 8 offsets should be two runs of 4 consecutive words (16-byte
aligned), laid out so that the 16 threads of a half-warp read 256 contiguous bytes. Use integer arithmetic only
(// % * +): it runs inside the kernel. Read lessons/03_register_tiling.py and its figure in
lessons/figures/numba_threads.py."""

EXERCISE = Exercise(
    stage=3,
    name="micro_tile",
    objective="Map threads to an 8x8 register micro-tile so every output is owned once and the fragment loads "
              "become 128-bit, conflict-free shared loads.",
    prompt=PROMPT,
    holes=HOLES,
    questions=(
        ("Predict: how many ld.shared.v4.f32 per k does the kernel issue with the two-runs-of-4 layout? With "
         "micro_offset(i, t) = 8*t + i?", "Check with `python -m lessons inspect 3` (ld.shared.v4.f32 in the PTX, "
         "LDS.128 in the SASS) for the stage; for yours, Exercise.build(solution).sass()."),
        ("Predict: with 8*t + i, how many 16-byte chunks do the 16 threads of a half-warp touch per load, and how "
         "many bank conflicts follow?", "Check with the micro-tile figure of lessons/figures/numba_threads.py "
         "(bank of each word a half-warp reads)."),
        ("Predict: how many registers does a thread need (partials, totals, fragments)?",
         "Check with `python -m lessons inspect 3` (registers, spills)."),
    ),
    reference=reference,
    build=build,
    required_sass=("FFMA", "LDS"),
    forbidden_sass=NUMBA_FORBIDDEN,
    shapes_cpu=((5, 130, 128),),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    extra={"checks": (ownership,), "sass_checks": (wide_shared_loads,)},
    hole_kinds={"micro_offset": ("expression", ("i", "thread"))},
)
