"""Notebook 15: swap AB at decode, at the stage's shape: the config, the swapped K block and the transposed store,
the ring, the run and its ablation, and the emulator on a wrong token column."""
from __future__ import annotations

import lessons
from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.generator_stages import (CHECK_NOTE_GENERATED, emitter_cells, ladder_and_ablation_cells,
                                                opcode_table_cells, two_shape_config_cells)
from lessons.notebooks.ipynb import code, markdown

SHAPE = lessons.stage(15).SHAPE  # where the idea shows (16 x 2112 x 7168); the cells read stage.SHAPE

INTRO = """\
# 15 · Swap AB at decode

**The one idea:** at decode, give wgmma the weight as its 64-row side and the tokens as its narrow N. A wgmma's A
operand has 64 rows per warpgroup, fixed; its B operand has N = 8, 16, ... 256 columns. Stages 07-14 give it the
tokens as A, so a tile has at least 64 token rows, and stage 11 makes it 256. At 16 × 2112 × 7168 that is 240 rows
of TMA zero-fill per K block, a ring mostly holding zeros, and 16 times the products that exist. Swapped,
Dᵀ = B Aᵀ: each math warpgroup multiplies 64 weight rows by the tile's 16 token rows, and nothing is empty.

Three things follow:

* **the scales follow the transpose**: an accumulator row is a weight row (one 128 × 128 block scale for all of
  them), a column is a token (its own A scale per K block), so the promotion is `total += partial * (sb * sa[token])`
  (`MathWarpgroups._swapped_k_block`; exercise 15 asks which token each accumulator holds);
* **the epilogue writes the transpose back**: `stmatrix .trans` stores each 8 × 8 block transposed into the same
  swizzled D tile (`TmaEpilogue._write_transposed`): D's tensor map and TMA store are unchanged;
* **the ring is refilled**: the small tiles leave room for 10 stages (stage 14 had 4).

**What changed vs 14:** `swap_ab=True`, tiles of the fewest power-of-two token rows ≥ M (at least 8) by 64 weight
rows, no multicast, stage 12's split and the walk recounted for them, a 10-stage ring: where M ≤ 32. Elsewhere this
stage *is* stage 14; this notebook works at the stage's own shape, `stage.SHAPE`.

What to look for: `wgmma ... m64n16k32` with the B tile's descriptor first; `stmatrix ... .trans`; fewer
instructions per K block; a ring of weight, not zeros; 3x stage 14 in the run; each bundled idea undone on its own.
"""

CONFIG_CELLS = two_shape_config_cells(15, """\
## The config and its change, at two shapes

Stage 14's config plus the fields of `CHANGE` in lessons/15_swap_ab.py and the refilled ring, at the stage's shape
and at the ladder's, where nothing differs.""")

EMITTER = """\
## The emitters: the swapped K block and the transposed store

`_swapped_k_block` builds the weight tile's descriptor as wgmma's A and the token tile's as its B, loads the
thread's token scales while the tensor cores run (`_load_column_scales`: pairs of columns by `ld.shared.v2`), and
promotes with one scale product per column. `_write_transposed` hands each 8 × 8 block of the fragment to
`stmatrix .trans`, lane l naming the row of D it writes."""

PTX = """\
## The generated PTX

At the stage's shape: the swapped wgmma (64 weight rows × 16 tokens), the column scales, the transposed store."""

SASS = """\
## Resources and SASS

The cubin that runs, at the stage's shape (ptxas, then stage 10's FFMA pass): `QGMMA.64x16x32` and `STSM...MT88`
(stmatrix's transposed form)."""

OPCODES = """\
## What changed in the SASS (`lessons diff 14 15`, at the stage's shape)

Per K block a stage 14 math thread runs two 64-row waves (2 × 4 QGMMA) and promotes 2 × 32 accumulators (64 FFMA);
a stage 15 thread runs 4 QGMMA (m64n16k32) and promotes 8. The epilogue's eight stmatrix become one transposed
`STSM...MT88`, and stage 10's FFMA pass finds no FFMA run long enough to set a yield bit in."""

RING_CELLS = [
    markdown("""\
## What one CTA's ring holds

From the configs and `SharedPlan` (the byte plan the kernel is built from; the figure `15_swap_ab` draws it): A's
rows that hold tokens, A's zero-filled rows, B's rows, for stage 14, the swap with stage 14's ring depth, and stage
15. Decode reads B once: the weight in flight per SM is what feeds HBM's bandwidth."""),
    code('''\
from lessons.figures import ring_bytes

print(f"{'KiB per CTA':34s}{'A tokens':>10s}{'A zeros':>10s}{'B weight':>10s}")
for label, ring in ring_bytes(*SHAPE).items():
    print(f"{label:34s}" + "".join(f"{size / 1024:10.1f}" for size in ring["parts"]))'''),
]

MEASURED_CELLS = ladder_and_ablation_cells(15, """\
## Measured: the run at the stage's shape, and the ablation

`results/ladder_16x2112x7168.json` has stages 10-15 and cuBLAS in one run; `results/ablation_15.json` has stage
15 with each bundled idea undone (`python -m lessons ablate 15 --m 16 --n 2112 --k 7168`): stage 14's ring depth,
and 64 token rows (the fewest an unswapped tile may have). No number here is typed in.""")

EMULATOR_SHAPE = (13, 200, 640)  # 16-token tiles, a last tile of 8 weight rows, 5 K blocks split 2 / 3

BREAK_CELLS = [
    markdown(f"""\
## Run it on the CPU, then give a token another's scale

`gemm.testing.emulated.run_gemm` runs this stage's PTX on the emulator at M, N, K = {EMULATOR_SHAPE}: tiles of 16
token rows (13 real), a last tile of 8 weight rows, 5 K blocks over a 2-CTA cluster. Then the seam
`Seams(token_column=...)` (exercise 15's hole) replaces the generator's rule with one that gives accumulator pairs
the wrong column: every token's partial sums scaled by a neighbour's A scales."""),
    code(f'''\
from gemm.kernel.seams import Seams
from gemm.testing.emulated import run_gemm

m, n, k = {EMULATOR_SHAPE!r}
problem = random_problem(m, n, k, np.random.default_rng(0))
reference = reference_gemm(*problem)
config = stage.config(m, n, k)
out = run_gemm(config, *problem)
print(config.describe())
print(f"every element written: {{bool(np.isfinite(out).all())}}, diff = {{calc_diff(out, reference):.1e}}")


def neighbours_column(register, lane):
    """The fragment's column with the pair's order and the lane's pair swapped: a neighbouring token."""
    return 8 * (register // 4) + 2 * (3 - lane % 4) + 1 - register % 2


wrong = run_gemm(config, *problem, seams=Seams(token_column=neighbours_column))
print(f"with neighbours' scales: diff = {{calc_diff(wrong, reference):.2f}}")
assert calc_diff(out, reference) < 1e-3 < calc_diff(wrong, reference)'''),
]

SHAPES_GPU = [SHAPE, (1, 7168, 2048), (5, 576, 1152), EMULATOR_SHAPE]  # 16-, 8-, 8- and 16-token tiles


def cells() -> list[dict]:
    """ptx_notebook at the stage's shape, with its config at two shapes, the ring, the runs and a wrong column."""
    return ptx_notebook(
        15, INTRO, PTX, ["m64n16k32", "ld.shared.v2.f32", "stmatrix"],
        SASS, ["QGMMA", "STSM", "FFMA", "UTMASTG"], ["STSM"],
        CHECK_NOTE_GENERATED, SHAPES_GPU,
        before=[*CONFIG_CELLS, *emitter_cells(EMITTER, [
            "gemm.kernel.math_warpgroups.MathWarpgroups._swapped_k_block",
            "gemm.kernel.epilogue.TmaEpilogue._write_transposed"])],
        extra=[*opcode_table_cells(15, OPCODES), *RING_CELLS, *MEASURED_CELLS, *BREAK_CELLS],
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the stage's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)", shape=SHAPE)


__all__ = ["cells", "SHAPES_GPU"]
