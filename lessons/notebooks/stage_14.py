"""Notebook 14: the next stage's full barrier tested before the promotion, in SASS on the CPU and measured from the
committed runs."""
from __future__ import annotations

from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.generator_stages import (CHECK_NOTE_GENERATED, config_cells, emitter_cells,
                                                measured_against_production_cells, opcode_table_cells)
from lessons.notebooks.ipynb import code, markdown
from lessons.notebooks.stage_11 import SHAPES_GPU as SHAPES_GPU_11

INTRO = """\
# 14 · The next stage's barrier, tested early

**The one idea:** ask whether the next stage is full while there is still work to do, not when there is none
left. Per K block a math warpgroup waits for a stage, runs its wgmmas, waits for them, releases the stage and
promotes the partial sums (64 FFMAs per wave). Until now it polled the next stage's full barrier only after that,
at the top of the next K block: a round trip to the SM's barrier unit between the last FFMA and the next wgmma,
every K block, even when the data landed long ago.

Now, right after the release, the warps step the ring and *test* the next stage's full barrier with
`mbarrier.test_wait`, which does not block: it only says whether that phase has completed. The FFMAs, which need
nothing from it, hide its latency; the next K block skips its blocking wait when the test said yes, and waits as
before when it said no.

**What changed vs 13:** `early_poll=True`. The test must name the next K block's slot and the parity that slot's
next full phase will have (it flips on the ring's wrap): exercise 14.

What to look for: `mbarrier.test_wait` in the PTX and the predicated branch past the wait; `SYNCS.PHASECHK`
without `.TRYWAIT` among the FFMAs in the SASS; the measured gain, small and on the compute-bound shapes.
"""

CONFIG = """\
## The config and its one change

Stage 13's config plus `early_poll=True`, at the ladder's shape."""

EMITTER = """\
## The emitter: `_Kernel.k_loop`

With `early_poll` the release passed to `MathWarpgroups.k_block` also steps the ring and tests the next stage's
full barrier into a predicate; the top of the next K block branches past the blocking `try_wait` on it. The
predicate starts false at each tile's first K block."""

PTX = """\
## The generated PTX

The test, the predicate it sets, and the branch past the wait."""

PTX_EXTRA = '''

from lessons.diff_stages import ptx_diff
changed = [line for line in ptx_diff(13, 14, *SHAPE) if line[:1] in "+-" and line[:3] not in ("+++", "---")]
print(f"\\nPTX diff against stage 13 (register numbers ignored): {len(changed)} lines, e.g.:",
      *[line for line in changed if "test_wait" in line or "full_known" in line][:6], sep="\\n    ")'''

SASS = """\
## Resources and SASS

The same wgmmas and FFMAs; one more SYNCS per K block (the test), and a branch."""

OPCODES = """\
## What changed in the SASS (`lessons diff 13 14`)

One more SYNCS per K block and a few predicate and branch instructions; the tensor-core and promotion work is
the same."""

PLACEMENT_CELLS = [
    markdown("""\
## Where the test lands

From each cubin's last QGMMA to the K loop's back edge, in program order (what the figure `14_early_poll` draws):
stage 13 has no full-barrier instruction there; stage 14's test sits among the promotion FFMAs."""),
    code('''\
from lessons.figures import after_last_wgmma

for number in (13, 14):
    rows = after_last_wgmma(number, *SHAPE)
    tests = [i for i, (cls, text) in enumerate(rows) if text.startswith("SYNCS.PHASECHK")]
    if not tests:
        print(f"stage {number}: {len(rows)} instructions, no full-barrier instruction before the back edge")
        continue
    at = tests[0]
    before = sum(text.startswith("FFMA") for _, text in rows[:at])
    after = sum(text.startswith("FFMA") for _, text in rows[at:])
    print(f"stage {number}: {len(rows)} instructions; the test at {at + 1}: {rows[at][1]}")
    print(f"    {before} FFMAs before it, {after} after it")'''),
]

MEASURED_CELLS = measured_against_production_cells(
    14, "early_poll", ("early_poll.json", "early_poll_reversed.json"), """\
## Measured: the ladder, and production with and without

`results/ladder.json` has stages 13 and 14 at the ladder's shape, in one run; `results/early_poll.json` and
`results/early_poll_reversed.json` have the production config with `early_poll` on and off on eight shapes, in
both orders (the GPU's clock moves with heat: whichever config runs first at a shape has an edge).""")


def cells() -> list[dict]:
    return ptx_notebook(
        14, INTRO, PTX, ["mbarrier.test_wait", "p_full_known"],
        SASS, ["QGMMA", "FFMA", "SYNCS", "BRA"], [],
        CHECK_NOTE_GENERATED, SHAPES_GPU_11,
        before=[*config_cells(14, CONFIG), *emitter_cells(EMITTER, ["gemm.kernel.generator._Kernel.k_loop"])],
        extra=[*opcode_table_cells(14, OPCODES), *PLACEMENT_CELLS, *MEASURED_CELLS],
        ptx_extra=PTX_EXTRA,
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the ladder's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)")


__all__ = ["cells"]
