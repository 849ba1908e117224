"""Stage 09 — TMA multicast across 2-CTA clusters: two SMs computing tiles with the same rows load A once.

Stage 08's grouped order already makes consecutive tiles share their rows of A: tile 2i and tile 2i + 1 are
neighbours along N. Launch the persistent grid in *clusters* of two CTAs (``.reqnctapercluster 2, 1, 1``; CTAs
2c and 2c + 1 walk tiles 2i and 2i + 1 side by side) and the pair needs A (and A's scales) only once:

* **issue**: rank 0's producer loads A with ``cp.async.bulk.tensor ... .multicast::cluster`` and CTA mask 0b11:
  the box lands at the same shared offset in both CTAs and completes its bytes on the full barrier at the same
  offset in each. Rank 1 issues only B; its full barrier still expects A's bytes, which arrive from rank 0.
* **release**: a stage may be refilled only when *both* CTAs' math warps are done with it, so every empty barrier
  counts the math warps of both CTAs; lane 0 of each math warp arrives on CTA 0's barrier and lane 1 on CTA 1's
  (``mapa`` + ``mbarrier.arrive.shared::cluster``). This is the invariant that makes leader-only issue safe.
* **agreement**: both CTAs compute, from the pair's first tile, whether the two tiles share rows and whether the
  peer has a tile at all; a pair split by a group edge or an odd last tile loads A without multicast, and a lone
  CTA sends both lanes' releases to itself. They never disagree, so nobody waits for bytes never sent.
* **start and end**: a cluster barrier after barrier init (the peer must not arrive on uninitialised barriers),
  and before exit each producer drains its ring (waits for the last ``stages`` releases) and the cluster meets
  again, so no remote arrive or multicast targets a CTA that has exited.

The config is stage 08's plus ``multicast=2``; the emitters are :meth:`gemm.kernel.tile_scheduler.TileScheduler.pair_flags`,
:meth:`gemm.kernel.producer.Ring.load` (multicast issue) and the cluster release in
:meth:`gemm.kernel.generator._Kernel.release`. A's L2 reads halve: with 128 x 128 tiles, the bytes per tile fed
from L2 drop from (128 + 128) to (64 + 128) rows of K.

The other operand: ``multicast_operand="b"`` walks the tiles along M instead (tile_coords(..., along_m=True)), so
the pair shares B's columns and rank 0 multicasts B. Measured on an H200 at seven prefill shapes against production
(results/sweep_multicast_b.json, six paired rounds): 0.963-1.001, below A multicast's 0.981-1.005. ncu at
4096 x 4096 x 7168 (results/ncu_multicast_4096x4096x7168_*.txt): either pair costs about 2% in SM cycles, the L2
sectors read do not drop, and the walk along M reads more from DRAM (141 against 104 MB); docs/benchmarks.md,
"The other operand".

Speed of light: the FP8 tensor cores, 1979 TFLOP/s dense, as for stage 08; the stage 08 profile
(results/ncu_08_4096x4096x7168.txt) showed the 128 x 128 tile feed-bound at L2 (77% of its throughput), which is
the traffic multicast halves for A.

Measured: 1,244 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 0.99x stage 08; 63% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 63% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
import lessons
from lessons.generated import GeneratedStage

IDEA = "TMA multicast: 2-CTA clusters share A; both CTAs' warps release every stage (remote mbarrier arrives)"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.tile_scheduler.TileScheduler.pair_flags, gemm.kernel.producer.Ring.load"
CHANGE = {"multicast": lambda m, n, k: 2 if lessons.stage(8).config(m, n, k).persistent else 1}

STAGE = GeneratedStage(9, CHANGE, previous=lessons.stage(8).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm
