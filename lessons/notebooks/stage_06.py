"""Notebook 06: TMA and an mbarrier pipeline, with the shared-memory plan."""
from __future__ import annotations

from lessons.notebooks.cells import CHECK_NOTE_PTX, PTX_NOTE, ptx_notebook
from lessons.notebooks.ipynb import code, markdown


INTRO = """\
# 06 · TMA and an mbarrier pipeline

**The one idea:** stop spending threads on loads. The Tensor Memory Accelerator copies a whole tile with
one instruction, `cp.async.bulk.tensor.2d`, described by a 128-byte tensor map built on the host
(`ptx.tensor_maps.tensor_map_2d`); the tile lands in shared memory already in the 128-byte-swizzled layout wgmma
reads, rows past M or N zero-filled, and the copy reports completion to an `mbarrier` by counting bytes. A
ring of S stages, each guarded by a *full* barrier (the producer arrives with `expect_tx` = the stage's byte
count; the TMA engine completes the transaction) and an *empty* barrier (each math warp arrives when its
MMAs on that stage are done), keeps the loads for the next groups in flight while the tensor cores work
on this one.

**What changed vs 05:** A and B tiles and A's scales arrive by TMA, issued by one thread; there is no
CTA-wide barrier left in the K loop, warps wait only for the bytes they need; the ring is as deep as the
shared-memory budget allows; the block shape follows the problem.

What to look for: UTMALDG (the TMA load) and the SYNCS family (mbarrier operations) in the SASS, the
transaction byte count per stage (A tile + B tile + scales), and the phase parity each wait checks, which
flips every time the ring wraps: waiting on the wrong parity is the classic deadlock (or silent race).
"""


SASS = """\
## Resources and SASS

`UTMALDG.2D` is a TMA tile load. The mbarrier operations are the SYNCS family: `SYNCS.EXCH.64` is
`mbarrier.init`, `SYNCS.ARRIVE.TRANS64` the producer's arrive-with-expected-bytes,
`SYNCS.PHASECHK.TRANS64.TRYWAIT` a `try_wait.parity` poll, and the plain consumer arrive shows up as
`SYNCS.ARRIVE.TRANS64.A1T0` (one arrival, zero bytes). The ring lives in dynamic shared memory (sized at
launch), so the static figure below stays 0.
"""


PLAN_CELLS = [
    markdown("""\
## The shared-memory plan

How deep the ring is follows from bytes: one stage holds an A tile, a B tile and BLOCK_M scales, and as many
stages as fit in 227 KiB (with two 8-byte mbarriers each, and 1 KiB of slack to align the ring to 1024 bytes at
run time) are used, up to 8. The block shape follows the problem, as
DeepGEMM's heuristics do: one math warpgroup (BLOCK_M = 64) for decode-sized M, and narrower BLOCK_N when
128-wide tiles would leave SMs idle."""),
    code('''\
for m, n, k in [(4096, 4096, 7168), (64, 7168, 16384), (128, 2112, 7168)]:
    plan = stage.Plan(m, n, k)
    barriers = plan.shared_bytes - plan.full_region - stage.ALIGN_SLACK  # a full and an empty mbarrier per stage
    terms = [plan.stages * plan.stage_bytes, barriers, stage.ALIGN_SLACK]
    assert sum(terms) == plan.shared_bytes  # the line below adds up
    print(f"M={m:5d} N={n:5d} K={k:5d}: block {plan.block_m}x{plan.block_n}, {plan.threads} threads, "
          f"{plan.grid[0] * plan.grid[1]} blocks for 132 SMs")
    print(f"    {plan.stages} stages x {plan.stage_bytes} B (A {plan.a_tile} + B {plan.b_tile} + A's scales "
          f"{plan.sa_tile}) + {plan.stages} x {barriers // plan.stages} B mbarriers + {stage.ALIGN_SLACK} B "
          f"alignment slack = {plan.shared_bytes} B")'''),
    markdown("""\
The BF16 epilogue needs no bytes of its own: it stages the output tile in the A tiles' space, free once the last
K block is computed. B's scales are read from global memory, one value per K group."""),
]


def cells() -> list[dict]:
    return ptx_notebook(
        6, INTRO, PTX_NOTE, ["cp.async.bulk.tensor", "mbarrier", "wgmma.mma_async"], SASS,
        ["UTMALDG", "SYNCS", "QGMMA", "FFMA"], ["UTMALDG", "SYNCS"], CHECK_NOTE_PTX,
        [(128, 256, 512), (100, 2112, 512), (300, 1000, 1024), (64, 7168, 1024)], extra=PLAN_CELLS)
