"""Notebook 13: the uniform datapath, counted in SASS on the CPU and measured from the committed runs."""
from __future__ import annotations

from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.generator_stages import (CHECK_NOTE_GENERATED, config_cells, emitter_cells,
                                                measured_against_production_cells, opcode_table_cells)
from lessons.notebooks.ipynb import code, markdown
from lessons.notebooks.stage_11 import SHAPES_GPU as SHAPES_GPU_11

INTRO = """\
# 13 · The uniform datapath

**The one idea:** tell ptxas which values every lane of a warp shares. A Hopper SM has two integer datapaths:
the vector one computes a value per thread in `R` registers, the *uniform* one a single value per warp in `UR`
registers, on its own issue slot. `wgmma` reads its shared-memory descriptors from `UR` registers, so a
descriptor built on the vector datapath has to be moved over (`R2UR`) before every `wgmma` that uses it.
Which datapath a value lives on is ptxas's call, from what it can prove.

Since stage 05 each math warpgroup finds its 64 rows of A from `%tid`: `wg_a = (tid >> 7) * 8192`. All 32 lanes
of a warp agree on it, but ptxas cannot prove that from `%tid`, so every A descriptor, and every +32-byte K step
of one, is rebuilt per thread and moved with `R2UR`, in every K block. One instruction fixes it:
`shfl.sync.idx.b32 wg_a, wg_a, 0, 31, -1` (every lane takes lane 0's value; a shuffle from a constant lane is
provably warp-uniform). DeepGEMM does the same with `__shfl_sync(threadIdx.x / 128, 0)`; we found it by
comparing its SASS with ours instruction by instruction.

**What changed vs 12:** `uniform_offsets=True`. No data moves differently, no arithmetic changes: what it saves is
issue slots and the FMA pipe's time in the K loop, so it shows where the math warpgroups are the limit.

What to look for: the one `shfl.sync` in the PTX; `R2UR` and `IMAD` gone from the SASS, the uniform `U*`
instructions taking their place; the same answer on the emulator; the measured gain on the compute-bound shapes
and none at decode.
"""

CONFIG = """\
## The config and its one change

Stage 12's config plus `uniform_offsets=True`, at the ladder's shape."""

EMITTER = """\
## The emitter: `MathWarpgroups.warp_uniform_values`

`__init__` computes a math thread's values from `%tid` (its lane, its warp, its first row of the accumulator
fragment, its warpgroup's byte offset in the A tile), then broadcasts from lane 0 the ones
`warp_uniform_values` names: the warpgroup offset when `uniform_offsets`, or what exercise 13's seam answers."""

PTX = """\
## The generated PTX

The one new instruction, right after the offset is computed. Everything below it in the PTX is the same text as
stage 12's; the difference is in what ptxas can prove about it."""

PTX_EXTRA = '''

from lessons.diff_stages import ptx_diff
changed = [line for line in ptx_diff(12, 13, *SHAPE) if line[:1] in "+-" and line[:3] not in ("+++", "---")]
print(f"\\nPTX diff against stage 12 (register numbers ignored): {len(changed)} line(s):", *changed, sep="\\n    ")'''

SASS = """\
## Resources and SASS

The same PTX but for one line, through the same ptxas: count `R2UR` (vector to uniform moves) and the vector
`IMAD` beside the uniform-datapath instructions (`ULEA`, `UIADD3`, `ULOP3`, `UMOV`)."""

OPCODES = """\
## What changed in the SASS (`lessons diff 12 13`)

The QGMMA, FFMA, loads and stores are the same; the vector integer work that fed the descriptors (`R2UR`,
`IMAD`, `IADD3`) is gone, and uniform instructions (`U*`) do it instead, once per warp."""

K_LOOP_CELLS = [
    markdown("""\
## Per K block, stage 12 against 13

The math warpgroups' K loop is the stretch of SASS between the first and the last QGMMA of the cubin (at the
ladder's shape: one K block, two waves of four QGMMA). Count its instructions by datapath: the vector integer ones,
the uniform ones (`U*`, `R2UR` moves between them), the FFMAs of the promotion, everything."""),
    code('''\
from collections import Counter

from lessons.diff_stages import stage_cubin
from ptx.sass import disassemble, span


def k_loop(number):
    return span(disassemble(stage_cubin(number, *SHAPE)), "QGMMA")


def families(loop):
    counts = Counter(ins.opcode for ins in loop)
    uniform = sum(v for op, v in counts.items() if op.startswith("U") and op != "UTMALDG")
    return {"instructions": len(loop), "QGMMA": counts["QGMMA"], "FFMA": counts["FFMA"], "R2UR": counts["R2UR"],
            "IMAD": counts["IMAD"], "IADD3": counts["IADD3"], "uniform (U*)": uniform}


rows = {number: families(k_loop(number)) for number in (12, 13)}
print(f"{'first to last QGMMA':22s}{'stage 12':>10s}{'stage 13':>10s}")
for field in rows[12]:
    print(f"{field:22s}{rows[12][field]:>10}{rows[13][field]:>10}")'''),
]

MEASURED_CELLS = measured_against_production_cells(13, 'uniform_offsets', ('uniform_offsets.json',), """\
## Measured: the ladder, and production with and without

`results/ladder.json` has stage 12 and 13 at the ladder's shape, in one run; `results/uniform_offsets.json` has
the production config with `uniform_offsets` on and off on seven shapes, four rounds in alternating order. The
cell prints both; a missing file prints the command that writes it.""")


def cells() -> list[dict]:
    return ptx_notebook(
        13, INTRO, PTX, ["shfl.sync"],
        SASS, ["QGMMA", "FFMA", "R2UR", "IMAD", "ULEA", "UIADD3", "ULOP3"], [],
        CHECK_NOTE_GENERATED, SHAPES_GPU_11,
        before=[*config_cells(13, CONFIG),
                *emitter_cells(EMITTER, ["gemm.kernel.math_warpgroups.MathWarpgroups.warp_uniform_values"])],
        extra=[*opcode_table_cells(13, OPCODES), *K_LOOP_CELLS, *MEASURED_CELLS],
        ptx_extra=PTX_EXTRA,
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the ladder's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)")


__all__ = ["cells"]
