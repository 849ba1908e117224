"""Exercise 11: which rows of a 256-row tile each math warpgroup's waves compute.

Hole: ``wave_offset(wave, warpgroups) -> rows``: how far below its wave 0 a math warpgroup's wave ``wave`` starts.
The seam: :meth:`gemm.kernel.math_warpgroups.MathWarpgroups.wave_row` (:mod:`gemm.kernel.seams`), which every
address of a wave adds: its A rows and A scales in the stage (``k_block``), its rows of the TMA epilogue's shared
tile (:class:`gemm.kernel.epilogue.TmaEpilogue`) and of D. The seam refuses what no tile can hold (not a multiple
of 64, negative, past the tile); an offset that fits but overlaps another wave computes some rows twice and leaves
a slab of the tile never computed: the TMA store copies out whatever the shared D tile held there (zeros on the
emulator's first tile, a previous tile's rows after), so D is wrong there (not NaN: D is written, with the wrong
values), a correctness failure. The offsets themselves are then checked against the stage's rule, with the first
difference named.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 11
PROMPT = """\
Stage 11 gives each CTA a 256 x 128 tile, but there are still only two math warpgroups, and one wgmma m64n128k32
covers 64 rows. So each warpgroup computes its rows in two 64-row *waves*, one after the other, against the
same B tile. The stage's rule: warpgroup g's wave w covers rows 64*g + 64*warpgroups*w of the tile (warpgroups =
2: warpgroup 0 owns rows 0-63 and 128-191, warpgroup 1 rows 64-127 and 192-255), so that wave w of both
warpgroups is one contiguous 128-row slab. Wave 0 of warpgroup g starts at row 64*g as in stages 07-10; what
you decide is how much further down wave w starts.

Fill in, in your copy of lessons/exercises/skeletons/ex11_wave_rows.py:
  * wave_offset(wave, warpgroups) -> int: the rows from a warpgroup's wave 0 to its wave `wave` (the same for
    every warpgroup), for `warpgroups` math warpgroups. It must be a multiple of 64 (wgmma's M) in [0, 256).
The generator adds it to every address of the wave (gemm/kernel/math_warpgroups.py MathWarpgroups.k_block: the
A tile and the A scales; the epilogue's shared tile in gemm/kernel/epilogue.py TmaEpilogue, and D)."""

QUESTIONS = (
    ("Predict: which rows of the 256-row tile do warpgroup 1's two waves compute?",
     "check with gemm.kernel.math_warpgroups.tile_rows(256), or `python -m lessons figures` (the tall-tile figure)"),
    ("Predict: if both waves of a warpgroup sit 64 rows apart (offset 64 * wave), what does D look like?",
     "check with the emulator (`EXERCISE.build(...).run_cpu(...)` at M = 250): rows 64-127 computed twice, rows "
     "192-255 never, and the TMA store copies out what the shared D tile held there (zeros or a previous tile's "
     "rows, not NaN): D rows 192-249 are wrong, rows 0-191 right"),
    ("Predict: how many FP32 registers does a math thread keep for a 256 x 128 tile (partial sum + totals)?",
     "check: 64 accumulators + 2 x 64 totals = 192 of the 232 setmaxnreg gives (`python -m lessons inspect 11`, "
     "the resource line: no spills)"),
    ("Predict: how many 256 x 128 stages fit in shared memory, where 128 x 128 tiles had 5?",
     "check with gemm.kernel.config.max_stages, or `python -m lessons inspect 11` (the config line: 3 stages)"),
)


def reference():
    return SimpleNamespace(wave_offset=lambda wave, warpgroups: 64 * warpgroups * wave)


def check_offsets(solution) -> None:
    """Raise AssertionError at the first (wave, warpgroups) whose offset differs from the stage's rule."""
    for warpgroups in (1, 2):
        for wave in range(256 // (64 * warpgroups)):
            got, want = solution.wave_offset(wave, warpgroups), 64 * warpgroups * wave
            if got != want:
                raise AssertionError(f"wave_offset({wave}, warpgroups={warpgroups}) = {got!r}, the stage's rule "
                                     f"(64 * warpgroups * wave) gives {want}")


def wave_rows(solution) -> list[str]:
    """Each warpgroup's waves start where the stage's rule puts them (wave w of all warpgroups: one 128-row slab)."""
    return failures(check_offsets, solution)


def build(solution):
    import lessons
    from lessons.exercises.holed import HoledKernel
    stage = lessons.stage(STAGE)
    return HoledKernel(stage.config, lambda m, n, k: dict(wave_offset=solution.wave_offset),
                       cpu_stages=2, sm_count_cpu=4)  # the ring wraps at small K


EXERCISE = Exercise(
    stage=STAGE,
    name="wave_rows",
    objective="Lay out a 256-row tile's 64-row waves over two math warpgroups so one B tile serves twice the rows.",
    prompt=PROMPT,
    holes=("wave_offset",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("UTMASTG", "UTMALDG", "USETMAXREG", "QGMMA"),
    # 256 x 64 tiles, two waves per warpgroup: M = 250 ends inside the last wave's slab (rows 192-249: enough rows
    # that a misplaced wave shows in the whole-D diff), M = 300 a second tile row that only warpgroup 0's first wave
    # reaches; ragged N; the ring (2 stages) wraps
    shapes_cpu=((250, 136, 384), (300, 200, 384)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    extra={"checks": (wave_rows,)},
    answer_sites={"gemm/kernel/math_warpgroups.py": ("wave_row", "tile_rows")},
)
