"""Notebook 17: even waves at the ladder's shape: the config and the count, the launch that computes it, the same
SASS, the tiles each CTA walks, what the runs measured round by round, and the walk on the emulator with fewer
CTAs."""
from __future__ import annotations

from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.generator_stages import CHECK_NOTE_GENERATED, config_cells, opcode_table_cells
from lessons.notebooks.ipynb import code, markdown

INTRO = """\
# 17 · Even waves

**The one idea:** launch only the CTAs that set the walk's length. A persistent kernel (stage 08 on) launches one
CTA per SM. At the ladder's 4096 x 4096 x 7168 that is 132 CTAs for 512 tiles: 116 walk four tiles and 16 walk three.
The kernel takes four tiles' time either way, and the 16 short walks shorten nothing.

The change: launch ceil(tiles / waves) CTAs, waves = ceil(tiles / SMs), in whole clusters (stage 09's pairs): 128
CTAs of four tiles. The walk already steps by the grid's size, so the kernel is the same PTX; only the launch
changes.

**What changed vs 16:** `even_waves=True` on persistent walks with K >= 4096 (production's rule). Exercise 17: the
count.

Why it is faster: in cycles, not by a higher clock, the hypothesis the stage started from. Recorded through every
round (`bench configs --clocks`), the even grid's median SM clock is 1,714 against 1,718 MHz, both at the power cap;
with the clock locked by ncu it still takes 262.0k against 266.1k cycles. At this shape it reads 108 MB from DRAM
against 123: a wave of 128 CTAs starts on whole 8 x 16 blocks of tiles. What was measured is the time: +2.3% at this shape with production's kernels, every round of eight ahead,
and a loss at K = 512.

What to look for: the same SASS as stage 16; fewer CTAs in the launch; each CTA's walk as long as the longest or one
tile shorter.
"""

CONFIG = """\
## The config and its change

Stage 16's config plus `even_waves`, at the ladder's shape."""

LAUNCH_CELLS = [
    markdown("""\
## The launch: the count, and the grid that uses it

`gemm.kernel.launch.even_wave_ctas` is the count (exercise 17); `grid` calls it for a config with `even_waves`. The
kernel's walk (`gemm.kernel.tile_scheduler.schedule`) takes tiles `cta, cta + grid, ...`, so any grid computes D."""),
    code('''\
import inspect
from gemm.kernel.launch import even_wave_ctas, grid

print(inspect.getsource(even_wave_ctas))
print(inspect.getsource(grid))
for number in (16, 17):
    print(f"stage {number}: {grid(lessons.stage(number).config(*SHAPE), SHAPE[0], SHAPE[1], 132)} CTAs at {SHAPE}")'''),
]

PTX = """\
## The generated PTX

The same text as stage 16's: the walk's stride is `%nctaid.x`, the grid's size, read at run time."""

SASS = """\
## Resources and SASS

The cubin that runs, at the ladder's shape: stage 16's."""

OPCODES = """\
## What changed in the SASS (`lessons diff 16 17`)

Nothing: every count is the same."""

WALK_CELLS = [
    markdown("""\
## The tiles each CTA walks

`lessons.figures.walk_lengths`: the stage's config, its grid and the scheduler's walk for every CTA (the figure
`17_even_waves` draws the first shape). These are the stage's 256 x 128 tiles, not production's: at 4096 x 2112 x 7168
they make 272 tiles, and even waves launches 92 CTAs, a case no run measured (production's 128 x 192 tiles there make
352 tiles on 118 CTAs: +3.0%). Where K is short the stage keeps one CTA per SM."""),
    code('''\
from collections import Counter
from lessons.figures import walk_lengths

for shape in [SHAPE, (4096, 2112, 7168), (4096, 7168, 16384), (8192, 8192, 8192), (4096, 32768, 512)]:
    before, after = walk_lengths(16, *shape), walk_lengths(17, *shape)
    print(f"{str(shape):20s} {before['tiles']:5d} tiles: stage 16 {before['ctas']:3d} CTAs "
          f"{dict(sorted(Counter(before['lengths']).items()))}, stage 17 {after['ctas']:3d} CTAs "
          f"{dict(sorted(Counter(after['lengths']).items()))}   (walk length: CTAs)")'''),
]

MEASURED_CELLS = [
    markdown("""\
## Measured: round by round

`results/sweep_even_waves_paired.json`: production's config with and without even waves on every persistent dense
bench shape, 8 rounds in palindrome order after a warm-up pass, on an H200. Each row: the median over the rounds of
the time without over the time with (> 1: even waves faster), its range, and how many rounds fell above 1.
`results/sweep_cta_count_paired.json` repeats four shapes, with stage 09's multicast pairs among its configs. No
number here is typed in."""),
    code('''\
from lessons import results_store
from gemm.testing.records import read_result

for name in ("sweep_even_waves_paired.json", "sweep_cta_count_paired.json"):
    path = results_store.find(name)
    if path is None:
        print(f"{name}: not in this checkout")
        continue
    result = read_result(path)
    print(f"{results_store.shown(path)}: {result['device'].get('name', '?')}, {result['date'][:10]}")
    by_shape = {}
    for row in result["rows"]:
        by_shape.setdefault((row["m"], row["n"], row["k"]), {})[row["name"]] = row
    for shape, rows in by_shape.items():
        first = rows.get("production")
        for config, row in rows.items():
            speed = row.get("vs_first_paired")
            if first is None or speed is None:
                continue
            ahead = sum(a > b for a, b in zip(first["round_us"], row["round_us"]))
            print(f"  {str(shape):20s} {config[11:]:36s} {speed['median']:.3f} "
                  f"({speed['low']:.3f}-{speed['high']:.3f}), ahead in {ahead} of {len(row['round_us'])}")'''),
]

EMULATOR_SHAPE = (520, 192, 384)  # 3 x 3 tiles of 256 x 64 on 4 SMs: 3 waves, so 3 CTAs of 3 tiles

EMULATOR_CELLS = [
    markdown(f"""\
## Run it on the CPU with fewer CTAs

At M, N, K = {EMULATOR_SHAPE} stage 16's tiles split K instead of walking; made a persistent walk on 4 SMs (as
exercise 17's CPU runs are), 9 tiles take 3 waves, so even waves launches 3 CTAs where one per SM is 4. Both grids
compute D exactly."""),
    code(f'''\
from gemm.kernel.launch import grid
from gemm.testing.emulated import run_gemm

m, n, k = {EMULATOR_SHAPE!r}
problem = random_problem(m, n, k, np.random.default_rng(0))
reference = reference_gemm(*problem)
walk = lessons.stage(16).config(m, n, k).replace(split_k=1, persistent=True, raster_group=2, stages=2)
for config in (walk, walk.replace(even_waves=True)):
    out = run_gemm(config, *problem, sm_count=4)
    print(f"{{grid(config, m, n, 4)}} CTAs: every element written: {{bool(np.isfinite(out).all())}}, "
          f"diff = {{calc_diff(out, reference):.1e}}")'''),
]

SHAPES_GPU = [(4096, 4096, 7168), (3001, 3968, 4160)]  # 128 and 124 CTAs


def cells() -> list[dict]:
    """ptx_notebook at the ladder's shape, with the config, the launch, the walks, the measurements and the
    emulator run."""
    return ptx_notebook(
        17, INTRO, PTX, ["nctaid"],
        SASS, ["UTMALDG", "QGMMA"], [],
        CHECK_NOTE_GENERATED, SHAPES_GPU,
        before=[*config_cells(17, CONFIG), *LAUNCH_CELLS],
        extra=[*opcode_table_cells(17, OPCODES), *WALK_CELLS, *MEASURED_CELLS, *EMULATOR_CELLS],
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)")


__all__ = ["cells", "SHAPES_GPU"]
