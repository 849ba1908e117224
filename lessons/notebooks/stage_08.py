"""Notebook 08: the persistent tile scheduler and the TMA-store epilogue, with their ablations."""
from __future__ import annotations

from lessons.notebooks.generator_stages import SPAN_HELPER, generated_notebook
from lessons.notebooks.ipynb import code, markdown
from lessons.notebooks.stage_07 import SHAPES_GPU as SHAPES_GPU_07


INTRO = """\
# 08 · Persistent tile scheduler + TMA-store epilogue

**The one idea:** stop paying per tile for what only needs paying once per SM. Stage 07 launched one CTA per
128×128 output tile: every CTA initialised its barriers, waited for its first copies with the tensor cores
idle, and at the end had every warp store D while nothing else ran. Stage 08 launches one CTA per SM and
lets each walk the tiles: CTA c computes tiles c, c + grid, c + 2·grid, … Two changes make that pay:

* **a persistent, grouped schedule** (`gemm.kernel.tile_scheduler`). The producer's (stage, parity) counters carry
  across tiles, so it loads the next tile's first K blocks while the math warpgroups finish this one. Tiles
  are numbered in groups of G n-blocks (n fastest inside a group), so the ~132 tiles in flight read few
  distinct rows of A and of B, and those stay in L2.
* **a TMA-store epilogue** (`gemm.kernel.epilogue.TmaEpilogue`). `stmatrix` writes each warp's BF16 fragments
  into a 128B-swizzled shared tile without bank conflicts, one thread issues one TMA store per 64-column
  atom, and nobody waits for it: the next tile's epilogue first waits until those stores have *read* the
  tile (`cp.async.bulk.wait_group.read 0`), so D drains while the next main loop runs.

**What changed vs 07:** `persistent=True, raster_group=G, epilogue="tma"` (the staged epilogue stays where
N % 8 ≠ 0: a TMA store needs 16-byte rows). This is two ideas in one stage, so it carries ablations: each
idea turned off on its own (`python -m lessons ablate 8`). It is also the production kernel's shape:
`gemm.fp8_gemm_nt` runs this generator with the heuristics' blocks.

What to look for: `%nctaid.x` (the grid size, the tile stride) and `div.u32`/`rem.u32` (the grouped order,
computed at run time because M is a parameter), `stmatrix`, `cp.async.bulk.tensor.2d.global` (the store,
SASS `UTMASTG`) with `commit_group`/`wait_group.read`, and in SASS `STSM` replacing the staged epilogue's
STS/LDS/STG.
"""


CONFIG = """\
## The config and its one change

Stage 07's config with the schedule and the epilogue changed (the raster group G comes from
`gemm.heuristics.raster_group` for the block shape and this device's SM count). The ring may lose a stage:
the D tile now has its own shared region, since the ring is busy with the next tile while D is stored.
"""


EMITTER = """\
## The emitters that implement it

`TileScheduler.tiles` is the tile walk each role runs (the producer and the math warpgroups each run their
own copy; a static schedule needs no communication): start at `%ctaid.x`, step by `%nctaid.x`, map the tile
number to (m0, n0). `TmaEpilogue.store` is the new epilogue: wait for the previous tile's stores to have read
the shared tile, `stmatrix` the BF16 values, fence the async proxy, one thread issues the TMA stores and
commits them as a bulk group.
"""


PTX = """\
## The generated PTX

The key instructions, then the math warpgroups' tile loop head (the grouped tile → (m0, n0) map) and the
epilogue: the deferred wait, the first `stmatrix`, … the last one, the proxy fence, the TMA stores.
"""


PTX_EXTRA = SPAN_HELPER + '''


print("\\nthe math warpgroups' tile walk")
show_span(ptx_text, "%ctaid.x", "mul.lo.u32 %n0")
print("\\nthe epilogue: deferred wait, stmatrix into the swizzled tile ...")
show_span(ptx_text, "cp.async.bulk.wait_group.read", "stmatrix")
print("    ... then the TMA stores")
show_span(ptx_text, "stmatrix", "cp.async.bulk.commit_group", nth=-1)'''


SASS = """\
## Resources and SASS

`STSM.16.M88.4` is `stmatrix.x4` (four 8×8 matrices of 16-bit values per warp), `UTMASTG.2D` the TMA store,
`UTMACMDFLUSH` the `commit_group` and `DEPBAR.LE SB0` the bulk-group wait. The registers are 07's: the
schedule and the epilogue are cheap in registers; USETMAXREG is still there.
"""


OPCODES = """\
## What changed in the SASS (`lessons diff 7 8`)

UTMASTG, STSM and DEPBAR appear; STG disappears (D leaves by TMA) and most STS/LDS with it (the staged
epilogue's shared round trip); BAR rises by the epilogue's named barriers. The math is untouched.
"""


FIGURE_CELLS = [
    markdown("""\
## The persistent schedule, drawn from the scheduler

`gemm.kernel.tile_scheduler.schedule(cta, grid, m_blocks, n_blocks, raster_group)` is the tile walk the PTX
computes, in Python. Below: a 12 × 20 grid of tiles and 13 CTAs (a toy GPU), colored by the CTA that computes
each tile and labeled with its step (the step-0 tiles run together, then step 1, …). Boxed: the first wave,
the 13 tiles in flight at once. Row-major (G = 0) the wave is a strip across all of B's columns; grouped
(G = 4) it is a compact block, so it reads fewer A row blocks + B column blocks, and a neighbouring wave
re-reads what is still in L2."""),
    code('''\
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from gemm.heuristics import device_facts
from lessons.figures import tile_raster, wave_footprint  # the figure drawn from the scheduler's own functions

display(tile_raster(12, 20, 13, (0, 4)))

m_blocks, n_blocks = -(-SHAPE[0] // config.block_m), -(-SHAPE[1] // config.block_n)
grid = min(device_facts().sm_count, m_blocks * n_blocks)
print(f"the ladder's shape: {m_blocks} x {n_blocks} tiles on {grid} CTAs; A+B blocks read per wave: "
      f"row-major {wave_footprint(m_blocks, n_blocks, grid, 0):.1f}, "
      f"G = {config.raster_group} {wave_footprint(m_blocks, n_blocks, grid, config.raster_group):.1f}")'''),
    markdown("""\
## The D tile in shared memory, drawn from `d_tile_offset`

`stmatrix` writes 8×8 matrices of 16-bit values: 8 rows of one 8-column group, 16 bytes per row. Shared
memory serves 128 bytes per cycle as 8 chunks of 16 bytes (4 banks each); 8 rows that land in the same chunk
serialise 8 ways. The TMA store's 128-byte swizzle puts chunk c of row r at chunk c ⊕ (r mod 8), so the 8 rows
of any column group fill all 8 chunks. Below, the top-left 16 × 64 corner of the tile: which 16-byte chunk
of its 128-byte row each (row, 8-column group) occupies, without and with the swizzle;
`gemm.kernel.epilogue.d_tile_offset` is the function the emitted addresses and the emulator use. The boxes
are two of the 8×8 matrices `stmatrix` writes (an `.x4` writes four: two column groups × two row halves)."""),
    code('''\
from gemm.kernel.config import tma_store_box_columns
from gemm.kernel.epilogue import d_tile_offset

ROWS, GROUPS = 16, 8  # a 16 x 64 corner: 8-column groups of 16 bytes
row_bytes = 2 * tma_store_box_columns(config.block_n)  # one row of a 64-column BF16 atom: 128 bytes
swizzled = np.array([[d_tile_offset(r, 8 * g, config.block_m, config.block_n) % row_bytes // 16 for g in range(GROUPS)]
                     for r in range(ROWS)])
plain = np.tile(np.arange(GROUPS), (ROWS, 1))  # the same tile, row-major without the swizzle
fig, axes = plt.subplots(1, 2, figsize=(8, 5.5))
for ax, chunks, title in ((axes[0], plain, "row-major: 8-way conflicts"), (axes[1], swizzled, "128B swizzle")):
    ax.imshow(chunks, cmap=plt.get_cmap("tab10", 10), vmin=-0.5, vmax=9.5)
    for (r, g), chunk in np.ndenumerate(chunks):
        ax.text(g, r, chunk, ha="center", va="center", fontsize=8)
    for r0, g in ((0, 0), (8, 3)):  # two of the 8x8 matrices stmatrix writes
        ax.add_patch(Rectangle((g - 0.5, r0 - 0.5), 1, 8, fill=False, lw=2.5, ec="black"))
    ax.set_title(f"{title}\\n(number = 16-byte chunk of the row)", fontsize=10)
    ax.set_xlabel("8-column group (16 bytes of BF16)")
    ax.set_ylabel("row of D")
plt.tight_layout()
plt.show()
conflict_free = all(len(set(swizzled[r0:r0 + 8, g])) == 8 for r0 in range(0, ROWS, 8) for g in range(GROUPS))
print("every 8-row matrix of the swizzled tile covers 8 distinct chunks:", conflict_free)'''),
]


ABLATION_CELLS = [
    markdown("""\
## Ablations: each idea of this stage turned off on its own

`ABLATIONS` lists, per idea, the config change that undoes it. `python -m lessons ablate 8` checks and times
stage 07, stage 08 and each ablation on the same shape with the same timer (a Hopper GPU is needed) and
writes `results/ablation_08.json`, which this cell prints when it exists."""),
    code('''\
import json
from pathlib import Path

from lessons.ablate import ablation_configs

for label, change in stage.ABLATIONS.items():
    print(f"{label:24s} {change}")
print()
for name, ablated in ablation_configs(8, *SHAPE).items():
    print(f"  {name:32s} {ablated.describe()}")

ablation = Path(ROOT, "results", "ablation_08.json")
if ablation.exists():
    from gemm.testing.bench_configs import CONFIG_COLUMNS
    from gemm.testing.records import Column, format_table
    result = json.loads(ablation.read_text())
    print(f"\\nresults/ablation_08.json ({result['device'].get('name', '?')}, {result['date'][:10]}), "
          f"M={result['shape']['m']} N={result['shape']['n']} K={result['shape']['k']}:")
    print(format_table(CONFIG_COLUMNS + [Column("vs_stage", "vs stage 08", "{:.2f}x")], result["rows"]))
else:
    print("\\nNo results/ablation_08.json yet: on a Hopper GPU, python -m lessons ablate 8 writes it.")'''),
]


# more tiles than SMs: every CTA walks several tiles, so the ring and the deferred store wait cross tiles
SHAPES_GPU = SHAPES_GPU_07 + [(1000, 4096, 512)]


def cells() -> list[dict]:
    return generated_notebook(
        8, intro=INTRO, config_note=CONFIG, emitter_note=EMITTER,
        emitters=["gemm.kernel.tile_scheduler.TileScheduler.tiles", "gemm.kernel.epilogue.TmaEpilogue.store"],
        ptx_note=PTX, keywords=["div.u32", "%nctaid", "stmatrix", "cp.async.bulk.tensor.2d.global",
                                   "cp.async.bulk.wait_group"], ptx_extra=PTX_EXTRA,
        sass_note=SASS, key_opcodes=["UTMASTG", "STSM", "UTMALDG", "USETMAXREG", "STG", "QGMMA"],
        sass_opcodes=["UTMASTG", "STSM"], opcodes_note=OPCODES, figures=FIGURE_CELLS,
        shapes_gpu=SHAPES_GPU, extra=ABLATION_CELLS)
