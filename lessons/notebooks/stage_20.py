"""Notebook 20: tiles as tall as M, split over pairs, at the stage's shape: the config at two shapes, the rule, what
each tiling costs, the PTX and SASS against stage 19's, the run and its ablation, and the emulator at small shapes."""
from __future__ import annotations

import lessons
from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.generator_stages import (CHECK_NOTE_GENERATED, emitter_cells, ladder_and_ablation_cells,
                                                opcode_table_cells, two_shape_config_cells)
from lessons.notebooks.ipynb import code, markdown

SHAPE = lessons.stage(20).SHAPE  # where the idea shows (64 x 2112 x 7168); the cells read stage.SHAPE

INTRO = """\
# 20 · Tiles as tall as M, split over pairs

**The one idea:** between decode and prefill (M = 33-128), size the tile to the GEMM. Stages 11-19 keep stage
11's 256-row tiles, chosen for M in the thousands; at 64 × 2112 × 7168 that is 33 tiles of 256 × 64, three
quarters of each tile's rows TMA zero-fill that the tensor cores multiply anyway, and stage 12's pairs make 66 CTAs
of them: half the SMs stream the weight, each through a ring of three 40 KiB stages, mostly zeros.

Tiles of 64 rows fix the zeros, but a wave of them, one per SM, is 132 tiles of 64 × 16: every CTA reads all 64
rows of A over the whole of K for a 16-column slice of B, 60 MB of A from L2 for 15 MB of B. So take the cost
model's tiles for *half* the SMs (64 × 32) and split each tile's K blocks over a pair, as stage 12 does: 132 CTAs,
30 MB of A, and room for a ring of ten stages (`gemm.heuristics.pair_split_blocks`; exercise 20).

**What changed vs 19:** where stage 19 does not swap and the rule splits (M = 33-128, K ≥ 4096, one-wave tiles at
most 32 wide, pairs that fit the SMs), the rule's tiles split over a pair (pushed, rank 0 ahead), one CTA per
tile, the deepest ring that fits. Elsewhere, the ladder's shape and decode, this stage *is* stage 19; this
notebook works at the stage's own shape, `stage.SHAPE`.

What to look for: the same emitters with a smaller tile (one 64-row wave of `m64n32k32`); the bytes each tiling
reads; the run against stage 19 and cuBLAS; each part of the new tile undone on its own.
"""

CONFIG_CELLS = two_shape_config_cells(20, """\
## The config and its change, at two shapes

Stage 19's config with the rule's tiles over pairs and the refilled ring, at the stage's shape and at the
ladder's, where nothing differs. Then what each tiling costs at the stage's shape: stage 19's, one 64 × 16 tile per
SM (the stage without its pair: its ablation), and stage 20's (the figure `20_narrow_pair_tiles` draws them).""", '''

from lessons.figures import pair_tile_variants

print(f"\\n{'':26s}{'tiles':>7s}{'CTAs':>6s}{'zero-fill':>11s}{'A read MB':>11s}{'B read MB':>11s}{'stages':>8s}")
for label, costs in pair_tile_variants(*SHAPE).items():
    config = costs["config"]
    print(f"{label:26s}{costs['tiles']:7d}{costs['ctas']:6d}{costs['zero_fill']:11.0%}"
          f"{costs['a_bytes'] / 1e6:11.1f}{costs['b_bytes'] / 1e6:11.1f}{config.stages:8d}")''')

EMITTER = """\
## The rule

`pair_split_blocks` is the whole change: the cost model (`choose_blocks`) asked twice, for every SM and for half
of them. `narrow_pair_tiles` gives it production's model at a shape, with the K gate; stage 20 asks it where stage
19 does not swap. Nothing in the generator changes."""

PTX = """\
## The generated PTX

At the stage's shape: one 64-row wave of `wgmma ... m64n32k32` per K block (4 wgmmas) instead of stage 19's two
waves per math warpgroup of `m64n64k32` (8), and the same push of the partials."""

PTX_EXTRA = '''

from lessons.diff_stages import ptx_diff

signs = [line[:1] for line in ptx_diff(19, 20, *SHAPE) if line[:3] not in ("+++", "---")]
print(f"PTX diff against stage 19 (register numbers ignored): +{signs.count('+')} -{signs.count('-')} lines "
      "(python -m lessons diff 19 20 --m {} --n {} --k {} prints it all)".format(*SHAPE))'''

SASS = """\
## Resources and SASS

The cubin that runs, at the stage's shape (ptxas, then stage 10's FFMA pass): `QGMMA.64x32x32` and the same
`STAS` messages as stage 19's."""

OPCODES = """\
## What changed in the SASS (`lessons diff 19 20`, at the stage's shape)

Per K block each of stage 19's two math warpgroups runs two 64-row waves of its 256 × 64 tile (8 `m64n64k32`
wgmmas); stage 20's one math warpgroup runs one wave of a 64 × 32 tile (4 `m64n32k32`) and promotes a quarter as
many accumulators."""

MEASURED_CELLS = ladder_and_ablation_cells(20, name_width=40, note="""\
## Measured: the run at the stage's shape, and the ablation

`results/ladder_64x2112x7168.json` has stages 10-20 and cuBLAS in one run; `results/ablation_20.json` has stage 20
with each part of the new tile undone (`python -m lessons ablate 20 --m 64 --n 2112 --k 7168`): stage 19's ring
depth, one 64 × 16 tile per SM without the pair, and 64 × 64 tiles over pairs. No number here is typed in.""")

EMULATOR_SHAPE = (100, 200, 1280)  # on 8 SMs the rule takes 128 x 56 tiles over pairs: ragged M and N, 10 K blocks

EMULATOR_CELLS = [
    markdown(f"""\
## Run it on the CPU

The rule needs K ≥ 4096 and 132 SMs to split at the stage's shape; on the emulator's 8 SMs it is asked without its
K gate at M, N, K = {EMULATOR_SHAPE} (exercise 20's CPU shape): the model's tiles for 8 CTAs are 128 × 32, so
the pair takes its tiles for 4, 128 × 56 (a tile straddling two B-scale blocks, the last one ragged), 8 CTAs.
Exact under several random schedules."""),
    code(f'''\
from gemm.heuristics import choose_blocks, pair_split_blocks
from gemm.testing.emulated import run_gemm

m, n, k = {EMULATOR_SHAPE!r}
SMS = 8
tiles = pair_split_blocks(m, n, SMS, lambda ctas: choose_blocks(m, n, ctas, k=k))
print(f"one CTA per SM: {{choose_blocks(m, n, SMS, k=k)}}; the pair's tiles: {{tiles}}")
config = stage.paired(lessons.stage(19).config(m, n, k), m, tiles).replace(stages=2)  # the ring wraps
print(config.describe())
problem = random_problem(m, n, k, np.random.default_rng(0))
reference = reference_gemm(*problem)
for seed in (None, 1, 2):
    out = run_gemm(config, *problem, sm_count=SMS, seed=seed)
    print(f"schedule {{seed}}: every element written: {{bool(np.isfinite(out).all())}}, "
          f"diff = {{calc_diff(out, reference):.1e}}")'''),
]

SHAPES_GPU = [SHAPE, (100, 2112, 7168), (128, 4096, 7168), (48, 2112, 7168)]  # 64 x 32, 128 x 32, 128 x 64, 64 x 32


def cells() -> list[dict]:
    """ptx_notebook at the stage's shape, with its config at two shapes, the rule, the costs, the run and the
    emulator."""
    return ptx_notebook(
        20, INTRO, PTX, ["m64n32k32", "st.async"],
        SASS, ["QGMMA", "STAS", "UTMALDG"], ["QGMMA"],
        CHECK_NOTE_GENERATED, SHAPES_GPU,
        before=[*CONFIG_CELLS, *emitter_cells(EMITTER, ["gemm.heuristics.pair_split_blocks",
                                                         "gemm.heuristics.narrow_pair_tiles"])],
        extra=[*opcode_table_cells(20, OPCODES), *MEASURED_CELLS, *EMULATOR_CELLS],
        ptx_extra=PTX_EXTRA,
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the stage's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)", shape=SHAPE)


__all__ = ["cells", "SHAPES_GPU"]
