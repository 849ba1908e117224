"""Notebook 05: warpgroup tensor cores, wgmma.mma_async."""
from __future__ import annotations

from lessons.notebooks.cells import CHECK_NOTE_PTX, PTX_NOTE, ptx_notebook


INTRO = """\
# 05 · Warpgroup tensor cores: `wgmma.mma_async`

**The one idea:** Hopper's native FP8 instruction. Four warps (a warpgroup, 128 threads) issue one
`wgmma.mma_async.m64nNk32.f32.e4m3.e4m3` whose operands are read *directly from shared memory* through
64-bit matrix descriptors (start address, leading/stride byte offsets, swizzle mode), asynchronously: the
warps issue, `wgmma.commit_group` closes the batch, and only after `wgmma.wait_group` may they read the
accumulators. Four k32 MMAs cover one 128-wide scale group; then the accumulators are promoted with FFMA,
exactly as before.

**What changed vs 04:** no `ldmatrix`, no A/B fragments in registers, no FP8→FP16 unpacking: QGMMA runs FP8
at full rate. The tiles must sit in shared memory in the 128-byte-swizzled layout the descriptor names,
and since wgmma reads shared memory through the *async proxy*, the threads that wrote a tile with
`cp.async` execute `fence.proxy.async` before the barrier that publishes it. Loads are still issued by
threads.

What to look for: `wgmma.fence` before the first MMA, the `commit_group`/`wait_group` pair, the proxy fence,
and in SASS the QGMMAs with the first of each group reading `RZ` as its accumulator: `scale-d = 0` starts a
fresh partial sum without zeroing 64 registers. Check also whether `wait_group 0` follows the commit at
once: then each warpgroup waits for its MMAs before promoting, and the tensor cores idle during its
FFMAs unless another warpgroup fills the gap.
"""


SASS = """\
## Resources and SASS

QGMMA is the FP8 warpgroup MMA (`QGMMA.64x128x32.F32.E4M3.E4M3`: 64×128 outputs, k = 32, FP32
accumulators, `gdesc` = the two shared-memory descriptors); `WARPGROUP.ARRIVE` / `WARPGROUP.DEPBAR` are what
`wgmma.fence` and `wgmma.wait_group` become. An m64n128 FP32 accumulator is 64 registers per thread and the
promoted totals need as many again: watch the register count. Compare the F2FP count with stage 04's: here
it is only the BF16 packing of the output.
"""


def cells() -> list[dict]:
    return ptx_notebook(
        5, INTRO, PTX_NOTE, ["wgmma.fence", "wgmma.mma_async", "wgmma.commit_group", "wgmma.wait_group",
                              "fence.proxy.async"],
        SASS, ["QGMMA", "WARPGROUP", "LDGSTS", "FFMA", "F2FP"], ["QGMMA", "WARPGROUP"], CHECK_NOTE_PTX,
        [(128, 256, 512), (100, 2112, 512), (300, 1000, 1024)])
