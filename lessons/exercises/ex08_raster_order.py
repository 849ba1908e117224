"""Exercise 08: the raster order of the persistent tile scheduler.

Hole: ``tile_coords(tile, m_blocks, n_blocks, raster_group) -> (m_block, n_block)``. The seam:
:meth:`gemm.kernel.tile_scheduler.TileScheduler._coords` (every place the kernel turns a tile index into a tile: the
producer's walk, the math warpgroups' walk, the cluster pair flags) emits the student's function as a table for
the M it runs at (``Seams(tile_coords=..., rows=M)``, :mod:`gemm.kernel.seams`). The emulator shows a map that is not a bijection
(a tile twice, one never: NaN left in D); the order itself is then checked against the grouped raster the stage
uses (which the prompt specifies), with the first tile that differs named.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise, failures

STAGE = 8
PROMPT = """\
Stage 08 is persistent: the grid is one CTA per SM, and CTA c computes tiles c, c + grid, c + 2*grid, ...
Which (m block, n block) tile number t is decides which A rows and B columns the ~132 CTAs read at the same
time, and so how often they hit L2. Row-major order (n fastest over all n blocks) streams all of B past every
A row block. The stage uses a grouped raster: the n blocks are cut into groups of `raster_group` consecutive
n blocks (the last group may be narrower); the tiles of group 0 come first, then those of group 1, ...; inside a
group the tiles go m-block by m-block, with n varying fastest across the group's width. raster_group = 0 means
plain row-major.

Fill in, in your copy of lessons/exercises/skeletons/ex08_raster_order.py:
  * tile_coords(tile, m_blocks, n_blocks, raster_group) -> (m_block, n_block), for 0 <= tile < m_blocks*n_blocks.
The generator turns your function into the kernel's tile map (gemm/kernel/tile_scheduler.py TileScheduler)."""

QUESTIONS = (
    ("Predict: with 4 m blocks, 5 n blocks and raster_group 2, which tiles are tiles 0..9?",
     "check with gemm.kernel.tile_scheduler.tile_coords / schedule, or `python -m lessons figures` (the raster figure)"),
    ("Predict: if tile_coords sends two tiles to the same (m_block, n_block), what does D look like?",
     "check with the emulator: run_cpu returns NaN where no tile wrote"),
    ("Predict: what does stage 08 add to the SASS over stage 07 (the epilogue's store)?",
     "check with `python -m lessons diff 7 8` (UTMASTG)"),
)


def reference():
    from gemm.kernel.tile_scheduler import tile_coords
    return SimpleNamespace(tile_coords=tile_coords)


def check_order(solution) -> None:
    """Raise AssertionError at the first tile whose coordinates differ from the grouped raster the prompt
    specifies (row-major for raster_group 0)."""
    from gemm.kernel.tile_scheduler import tile_coords
    for m_blocks in (1, 2, 3, 5):
        for n_blocks in (1, 2, 5, 7):
            for group in (0, 1, 2, 3, 4, 16):
                for t in range(m_blocks * n_blocks):
                    got, want = solution.tile_coords(t, m_blocks, n_blocks, group), tile_coords(t, m_blocks, n_blocks,
                                                                                                group)
                    if tuple(got) != want:
                        raise AssertionError(f"tile_coords({t}, m_blocks={m_blocks}, n_blocks={n_blocks}, "
                                             f"raster_group={group}) = {got}, the stage's raster order gives {want}")


def build(solution):
    import lessons
    from lessons.exercises.holed import HoledKernel
    stage = lessons.stage(STAGE)

    def cpu_config(m, n, k):  # raster groups of 2 n blocks (narrower than N: the grouped path); 3 stages
        config = stage.config(m, n, k)
        return config.replace(raster_group=2, stages=min(config.stages, 3))

    return HoledKernel(stage.config, lambda m, n, k: dict(tile_coords=solution.tile_coords, rows=m),
                       cpu_config_of=cpu_config)


def raster_order(solution) -> list[str]:
    """The tiles come in the stage's grouped raster order (the prompt's). Any bijection computes D right (the
    correctness checks see a map that is not one); the order is the technique."""
    return failures(check_order, solution)


EXERCISE = Exercise(
    stage=STAGE,
    name="raster_order",
    objective="Map a persistent CTA's tile index to an output tile in a grouped (L2-friendly) raster order.",
    prompt=PROMPT,
    holes=("tile_coords",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("UTMASTG", "UTMALDG", "USETMAXREG", "QGMMA"),
    # 3 CTAs walking 6-20 tiles each, raster groups of 2 with a narrower last group, ragged M and N
    shapes_cpu=((130, 136, 384), (200, 328, 512)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    extra={"checks": (raster_order,)},
    answer_sites={"gemm/kernel/tile_scheduler.py": ("tile_coords", "schedule")},
)
