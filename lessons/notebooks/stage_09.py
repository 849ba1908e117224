"""Notebook 09: TMA multicast across 2-CTA clusters, with the measured gain or loss."""
from __future__ import annotations

from lessons.notebooks.emulator import emulator_cells
from lessons.notebooks.generator_stages import SPAN_HELPER, SWEEP_HELPER, generated_notebook
from lessons.notebooks.ipynb import code, markdown
from lessons.notebooks.stage_08 import SHAPES_GPU as SHAPES_GPU_08


INTRO = """\
# 09 · TMA multicast across 2-CTA clusters

**The one idea:** two SMs that need the same bytes should fetch them once. In stage 08's grouped order,
consecutive tiles are neighbours along N, so tiles 2i and 2i + 1 usually read the same rows of A. Launch the
persistent grid in *clusters* of two CTAs (`.reqnctapercluster 2, 1, 1`): CTAs 2c and 2c + 1 run on two SMs of
one GPC and, since the grid is even, walk tiles 2i and 2i + 1 side by side. Then the pair needs A (and A's
scales) once. Four things make that safe:

* **issue**: rank 0's producer loads A with `cp.async.bulk.tensor ... .multicast::cluster` and CTA mask 0b11: the
  box lands at the same shared-memory offset in both CTAs and completes its bytes on the *full* barrier at the
  same offset in each. Rank 1 issues only B; its full barrier still expects A's bytes, which come from rank 0.
* **release**: rank 0's next multicast overwrites the stage in *both* CTAs, so a stage may be refilled only when
  both CTAs' math warps are done with it. Every *empty* barrier counts the math warps of both CTAs, and each
  warp releases twice: lane 0 on CTA 0's barrier, lane 1 on CTA 1's, the address translated into the peer's
  shared memory by `mapa` and signalled with `mbarrier.arrive.shared::cluster`.
* **agreement**: both CTAs compute, from the pair's first tile, whether the peer has a tile at this step and
  whether the two tiles share their rows. A pair split by a row or group edge, or an odd last tile, loads A
  without multicast, and a CTA without a peer sends both releases to itself. Both sides compute the same flags,
  so nobody waits for bytes that are never sent.
* **start and end**: a cluster barrier after the barriers are initialised (the peer must not arrive on a barrier
  that does not exist yet) and, before exit, each producer drains its ring (waits for the last `stages`
  releases) and the cluster meets again, so no remote arrive or multicast lands in a CTA that has exited.

**What changed vs 08:** `multicast=2` wherever stage 08 is persistent (a one-CTA-per-tile grid has no walk to
pair). Per K block a tile reads BLOCK_M rows of A and BLOCK_N rows of B from L2; a pair sharing rows now reads
A once for both. Stage 08's profile (`results/ncu_08_4096x4096x7168.txt`, summarised in docs/ladder.md) is
where to look for how busy L2 was before.

What to look for: the cluster header and `%cluster_ctarank`; the two cluster barriers; the predicated loads
(`@%p_own_a` plain, `@%p_lead_a` multicast); `mapa` + the cluster-scope arrive in the release; in SASS
`UTMALDG.2D.MULTICAST`, `SYNCS.ARRIVE.TRANS64.RED` (the remote arrive) and `UCGABAR_ARV` / `UCGABAR_WAIT`
(the cluster barrier).
"""


CONFIG = """\
## The config and its one change

Stage 08's config plus `multicast=2`. Blocks, ring depth and the shared-memory plan are 08's: the barriers only
count more arrivals. `gemm.kernel.config.KernelConfig` refuses multicast without a producer warpgroup and a
persistent walk, since the pairing *is* the walk.
"""


EMITTER = """\
## The emitters that implement it

Four places, one per rule above. `TileScheduler.pair_flags` is the agreement (both roles of both CTAs run it
on the same tile numbers); `Ring.load` is the issue (own A, or multicast by the leader, then B);
`_Kernel.release` is a math warp's release (local, or lanes 0 and 1 to CTA 0 and CTA 1); and the end of
`WarpgroupProducer.emit` is the drain. The cluster barriers themselves are in `_Kernel.setup` and
`_Kernel.warp_specialized_body`.
"""


PTX = """\
## The generated PTX

The key instructions, then the four places in order: the start (barrier init fenced at cluster scope, the rank,
the first cluster barrier), the producer's pair flags and one K block's loads, a math warp's release, and the
end (the drain, one wait per stage, then the cluster barrier).
"""


PTX_EXTRA = SPAN_HELPER + '''


print("\\nstart: barriers initialised, then both CTAs meet before anyone arrives remotely")
show_span(ptx_text, "fence.mbarrier_init", "barrier.cluster.wait")
print("\\nthe producer's pair flags for a tile (the math warpgroups run the same rule) ...")
show_span(ptx_text, "setp.lt.u32 %p_peer", "mov.b16 %cta_mask", nth=-1)
print("    ... and one K block: own A (or rank 0 multicasts it), then B")
show_span(ptx_text, "mbarrier.arrive.expect_tx", "[%tmap_b")
print("\\na math warp's release: lane l targets CTA l when there is a peer, else its own CTA ...")
show_span(ptx_text, "selp.u32 %release_rank", "selp.u32 %release_rank")
print("    ... mapa translates the empty barrier's address into that CTA's shared memory")
show_span(ptx_text, "bar.warp.sync", "mbarrier.arrive.shared::cluster")
print("\\nend: the producer drains its ring (the first of its waits) ...")
show_span(ptx_text, "$drain_empty", "bra $drain_empty")
print("    ... and the cluster meets again before exit")
show_span(ptx_text, "$end", "ret;", nth=-1)'''


SASS = """\
## Resources and SASS

`UTMALDG.2D.MULTICAST` is the multicast load (its last operand is the CTA mask); the plain `UTMALDG.2D` loads of
A stay for pairs that do not share rows. `SYNCS.ARRIVE.TRANS64.RED.A1T0` is the release through `mapa`: an
arrive on a barrier addressed in the cluster's shared window, possibly the peer's. `UCGABAR_ARV` /
`UCGABAR_WAIT` are `barrier.cluster.arrive` / `.wait` (CGA, "cooperative grid array", is the hardware's name for
a cluster), each arrive after the fences its `.release` asks for and each wait followed by the cache invalidation
its `.acquire` asks for. More `SYNCS.PHASECHK` polls: the drain.
"""


OPCODES = """\
## What changed in the SASS (`lessons diff 8 9`)

UTMALDG rises (the multicast copies of A and its scales beside the plain ones), SYNCS rises (the remote release
and the drain's waits); the math (QGMMA, FFMA, F2FP) is untouched. The second table counts families the key
list does not include: the cluster barrier and the fences around it, absent from stage 08.
"""


SHAPES_GPU = SHAPES_GPU_08 + [(1100, 2112, 512), (300, 4000, 512)]  # split pairs and a CTA without a peer


CHECK_NOTE = """\
## Is it right?

On a Hopper GPU: fresh random operands, NaN-poisoned output, `diff` against the float64 reference (a correct
kernel lands near 1e-6; the pass mark is 1e-3), on stage 08's shapes plus two whose walks contain every case
of the agreement: at 1100 × 2112 × 512 and 300 × 4000 × 512 some pairs straddle a row edge (each CTA loads its
own A) and the tile count is odd (the last CTA has no peer and releases to itself). A disagreement between the
two CTAs would not show as a wrong number but as a hang. Without a GPU this cell only says so.
"""


FIGURE_CELLS = [
    markdown("""\
## Which tiles share A, drawn from the scheduler

`schedule(cta, grid, m_blocks, n_blocks, raster_group)` is each CTA's walk; in a cluster, CTAs 2c and 2c + 1
walk theirs side by side, so at step j they hold tiles t and t + 1. Below, each tile is colored by its cluster
(lighter: rank 1) and labeled rank·step. Boxed pairs share their m block: A is multicast. A dashed link is a pair
whose tiles sit in different rows (each CTA loads its own A); a dotted box is a CTA whose peer has no tile at
that step. Left: 6 × 10 tiles on 8 CTAs (4 clusters), G = 4, where every pair shares rows. Right: 5 × 9 tiles,
same grid and G: the last group is one n-block wide, so its pairs are vertical, and the tile count is odd."""),
    code('''\
from gemm.heuristics import device_facts
from gemm.kernel.launch import grid as launch_grid
from lessons.figures import census, cluster_multicast, cluster_steps  # pair_flags' rule, drawn

display(cluster_multicast(((6, 10), (5, 9)), grid=8, group=4))

# The same census for this stage's config on the ladder's shape: how many A loads the pairs save.
m_blocks, n_blocks = -(-SHAPE[0] // config.block_m), -(-SHAPE[1] // config.block_n)
ctas = launch_grid(config, SHAPE[0], SHAPE[1], device_facts().sm_count)
shared, split, lone = census(cluster_steps(ctas, m_blocks, n_blocks, config.raster_group))
tiles = m_blocks * n_blocks
rows_before = tiles * (config.block_m + config.block_n)  # rows of A and B fed from L2 per K block, all tiles
rows_after = rows_before - shared * config.block_m
print(f"the ladder's shape: {tiles} tiles on {ctas} CTAs ({ctas // 2} clusters, G = {config.raster_group}): "
      f"{shared} pairs share A, {split} split, lone CTA steps: {lone}")
print(f"rows read from L2 per K block, summed over the tiles: {rows_before} -> {rows_after} "
      f"({rows_after / rows_before:.2f}x; A alone: {(tiles - shared) / tiles:.2f}x)")'''),
]


MULTICAST_COMMAND = ('python -m gemm bench configs "4096,4096,7168;4096,7168,16384;4096,2112,7168" production '
                     '"production:multicast=2" --json results/multicast.json')


MEASURED_CELLS = [
    markdown("""\
## Measured: gain or no gain, the honest result

`python -m gemm bench configs` checks and times named configs with the one kernel timer: the production config
with and without `multicast=2` on three large shapes (stages 08 and 09 themselves, 128 × 128 tiles, side by side:
`python -m lessons ladder --stages 8,9`). The cell prints the result when `results/multicast.json` exists, and
otherwise the command that writes it."""),
    code(SWEEP_HELPER + f'''


show_sweep("multicast.json", {MULTICAST_COMMAND!r},
           ratios=[("production:multicast=2", "production")])

from gemm.heuristics import choose_config
print(f"\\nthe production heuristics' config at {{SHAPE}}: {{choose_config(*SHAPE).describe()}}")'''),
    markdown("""\
## Reading the result

Multicast trades L2 traffic for coupling. What it saves is printed under the figure above: the rows of A the
pairs no longer read. What it costs is not in any count: each stage is refilled only after the slower of two CTAs
released it, rank 1's A arrives when rank 0's producer gets to it, and the cluster barriers at start and end.
If L2 was not what limited stage 08, the saving buys nothing and the coupling remains, so a ratio below 1 is a
possible honest outcome; the profile of stage 08 (`results/ncu_08_4096x4096x7168.txt`) is the evidence to read
next to it. The production heuristics' choice is printed above (`A multicast` appears in it only when it is on);
docs/benchmarks.md keeps the table, regenerated from the same file."""),
]


MULTICAST_B_COMMAND = ('python -m gemm bench configs "4096,4096,7168;4096,7168,16384;8192,8192,8192;4096,24576,1536;'
                       '2048,24576,1536;4096,2112,7168;4096,7168,2048" production production:multicast=2 '
                       'production:multicast=2,multicast_operand=b "production:multicast=2,multicast_operand=b,'
                       'raster_group=8" --rounds 6 --warmup 1 --clocks --json results/sweep_multicast_b.json')


OTHER_OPERAND_CELLS = [
    markdown("""\
## The other operand: B

A pair can share B instead: then tiles 2i and 2i + 1 must sit in the same *column*, so the walk runs along M
(groups of G m-blocks by all n-blocks, m fastest: `schedule(..., along_m=True)`), and rank 0 multicasts B where
it multicast A. One field, `multicast_operand="b"`; the flags, releases and drain are this stage's. DeepGEMM picks
the operand per shape. Below, the same two toy grids walked along M, then the pairs' census at the ladder's shape:
sharing B saves BLOCK_N rows per pair and K block where sharing A saves BLOCK_M."""),
    code('''\
from lessons.figures import cluster_multicast_b

display(cluster_multicast_b(((6, 10), (5, 9)), grid=8, group=4))

b_shared, b_split, b_lone = census(cluster_steps(ctas, m_blocks, n_blocks, config.raster_group, along_m=True))
rows_after_b = rows_before - b_shared * config.block_n
print(f"B pairs at the ladder's shape: {b_shared} share B, {b_split} split, lone CTA steps: {b_lone}; rows read "
      f"from L2 per K block {rows_before} -> {rows_after_b} ({rows_after_b / rows_before:.2f}x; A pairs: "
      f"{rows_after / rows_before:.2f}x)")'''),
    code(f'''\
multicast_b_sweep = show_sweep("sweep_multicast_b.json", {MULTICAST_B_COMMAND!r},
                               ratios=[("production:multicast=2", "production"),
                                       ("production:multicast=2,multicast_operand=b", "production")])'''),
    markdown("""\
Read it as this stage's own result: each pair costs about 2% in SM cycles whatever it shares (ncu, in
docs/benchmarks.md "The other operand"), the L2 was not the limit, and the walk along M at M = 4096 keeps all of A
in flight, so B's pairs also read more from DRAM (141 against 104 MB at 4096 × 4096 × 7168). A loss at six of
seven shapes, a tie at the seventh; production multicasts neither operand."""),
]


def cells() -> list[dict]:
    return generated_notebook(
        9, intro=INTRO, config_note=CONFIG, emitter_note=EMITTER,
        emitters=["gemm.kernel.tile_scheduler.TileScheduler.pair_flags", "gemm.kernel.producer.Ring.load",
                  "gemm.kernel.generator._Kernel.release", "gemm.kernel.producer.WarpgroupProducer.emit"],
        ptx_note=PTX, keywords=["%cluster_ctarank", "barrier.cluster", ".multicast::cluster", "mapa",
                                   "mbarrier.arrive.shared::cluster", ".reqnctapercluster"],
        ptx_extra=PTX_EXTRA, sass_note=SASS,
        key_opcodes=["UTMALDG", "UCGABAR_ARV", "UCGABAR_WAIT", "SYNCS", "QGMMA", "FFMA"],
        sass_opcodes=["UTMALDG", "SYNCS", "UCGABAR_ARV", "UCGABAR_WAIT"], opcodes_note=OPCODES,
        opcode_families=["UCGABAR_ARV", "UCGABAR_WAIT", "MEMBAR", "ERRBAR", "CGAERRBAR", "CCTL"],
        figures=FIGURE_CELLS, extra=MEASURED_CELLS + OTHER_OPERAND_CELLS, shapes_gpu=SHAPES_GPU, check_note=CHECK_NOTE,
        emulator=emulator_cells(9))
