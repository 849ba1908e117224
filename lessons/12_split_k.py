"""Stage 12 — split-K over a thread-block cluster: where the tiles are fewer than the SMs, S CTAs share each tile.

Stages 07-11 give every tile to one CTA. At M = 4096 that is hundreds of tiles for 132 SMs; at decode (M = 1-16
tokens) the whole output is a handful of tiles: 16 x 2112 x 7168 on stage 11's tiles (256 x 64 at this shape) is
33 of them, walked by 32 persistent CTAs (pairs, for multicast: one CTA takes a second tile after the others are
done), so 32 SMs stream all 15 MB of B while 100 idle. Decode reads B once and does little else, so its bound is
HBM, and one SM cannot pull more than a small share of HBM's bandwidth: the idle SMs are idle bandwidth. Give each
tile a cluster of S CTAs (``.reqnctapercluster S, 1, 1``) and split its K blocks between them:

* **shares** (:func:`gemm.kernel.config.k_share`): cluster rank r computes K blocks [r·Kb/S, (r+1)·Kb/S) into
  its own FP32 totals (its producer loads only those blocks: ``k_first``, ``k_end`` in ``_Kernel.setup``);
* **exchange** (:meth:`gemm.kernel.generator._Kernel.gather_partials`): ranks 1.. write their totals into their
  own ring, idle by then (``st.shared.v4``, one coalesced row per four totals), and arrive on the cluster barrier;
  rank 0 waits for that phase, reads each peer's totals through distributed shared memory (``mapa`` +
  ``ld.shared::cluster.v4``) and adds them into its own, then runs the epilogue alone;
* **lifetime**: a CTA's shared memory vanishes when it exits, so the peers wait on a second cluster-barrier
  phase that rank 0 completes only after its reads (the producer warpgroups take part in both phases).

The config is stage 11's plus ``split_k=S``, ``persistent=False`` (one tile per cluster) and ``multicast=1`` where
S > 1: S = 2 where twice the tiles still give every CTA an SM of its own (:func:`gemm.kernel.config.widest_split`).
Where stage 11's tiles already fill the SMs (the ladder's 4096 x 4096 x 7168: 512 tiles) S = 1 and this stage
*is* stage 11: the idea costs nothing where it does not apply. Why not S = 4 at 16 x 2112 x 7168, 132 CTAs for
132 SMs? A cluster's CTAs must sit in one GPC, and the driver keeps only 30 clusters of four resident on the H100
(against all 66 pairs: ``cuOccupancyMaxActiveClusters``, GPU test ``test_split_k_cluster_residency``), so 33
clusters of four would run in two waves.

What the split costs: rank 1 writes and rank 0 reads 256 x 64 x 4 bytes = 64 KiB of totals over the cluster's
shared-memory network, and every rank keeps its tile's full A box per stage for a share of the K loop.
The production heuristics go further for decode (``gemm.heuristics``: split over 2 CTAs at M <= 16, and at
M <= 32 tiles of 8-32 token rows with the weight as wgmma's 64-row side, measured in docs/benchmarks.md "Decode:
wide tiles, and K split over a cluster" and "Swap AB"). Those swapped tiles split over *three* CTAs where three
per tile fit: a cluster need not be a power of two, 39 clusters of three are resident, and at 16 x 2112 x 7168
99 CTAs beat 66 by 8% on an H200 after the clean flush (docs/benchmarks.md, "Clusters of three"). Between
decode and prefill (M = 33-128, K >= 4096) the split pays for another reason: one wave of tiles 16-32 wide makes
every CTA re-read all of its A rows for a narrow slice of B (60 MB of A for 15 MB of B at 64 x 2112 x 7168), and
tiles twice as wide split over pairs keep the CTA count and halve those re-reads: +22% after the memset, +34%
after the clean flush there (docs/benchmarks.md, "M = 33-128: narrow tiles split over pairs").

The exchange this stage teaches is a pull with two cluster-barrier phases. Stage 18 makes it a one-way message
(``KernelConfig.split_k_push``: the peers ``st.async`` their totals into rank 0's shared memory and exit), which is
what production's splits run.

What it does not fix, measured at 16 x 2112 x 7168 in one run on an H200 (results/ladder_16x2112x7168.json):
stage 12 takes 31.6 us, 1.70x stage 11's 53.7, yet stage 10 took 25.1 and cuBLAS 15.4 (the H100 run read 31.8,
52.8, 25.0 and 14.8). Stage 11's tall tiles are a
prefill idea: at M = 16 a 256-row A box is 240 rows of TMA zero-fill, and with it only 4 ring stages fit (stage
10's 64 x 64 tiles had 8), so each SM keeps 32 KiB of B in flight instead of 64. Stage 15 (swap AB) gives decode
tiles of 16 token rows by 64 weight rows and a 10-stage ring, keeping this split: 8.8 us in the same run, 1.75x
cuBLAS; stage 18 pushes the partials instead of gathering them: 8.3 us.

Speed of light: HBM3, 3.35 TB/s: at 16 x 2112 x 7168 moving A, B, the scales and D once is 15.3 MB, 4.58 us,
which allows 106 TFLOP/s (the FP8 tensor cores would allow 1,979). The ladder's shape is compute-bound, and there
this stage is stage 11.

Measured: 15.3 TFLOP/s at M=16 N=2112 K=7168 on NVIDIA H200, 1.70x stage 11; 10% of its speed of light (HBM3e, 152
TFLOP/s), 0.78% of the FP8 peak (results/ladder_16x2112x7168.json, `python -m lessons ladder --m 16 --n 2112 --k
7168 --stages 10-18`).
"""
import functools

import lessons
from gemm.fp8 import ceil_div
from gemm.heuristics import device_facts
from gemm.kernel.config import tiles, widest_split
from lessons.generated import GeneratedStage

IDEA = "split-K over a cluster: where tiles < SMs, S CTAs share a tile's K blocks and sum through DSMEM"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.generator._Kernel.gather_partials"
SHAPE = (16, 2112, 7168)  # where the idea shows: stage 11 gives this decode GEMM 33 tiles for 132 SMs
LARGEST_SPLIT = 2  # all 66 pairs are resident on the H100, only 30 clusters of four (the docstring)


def split_of(m: int, n: int, k: int) -> int:
    """S for (m, n, k): the widest split (up to LARGEST_SPLIT) of stage 11's tiles that still gives every CTA an SM
    of this device (its SM count, as set_num_sms caps it, is part of the cached answer)."""
    return _split_of(m, n, k, device_facts().sm_count)


@functools.lru_cache(maxsize=256)
def _split_of(m: int, n: int, k: int, sms: int) -> int:
    previous = lessons.stage(11).config(m, n, k)
    return widest_split(tiles(previous, m, n), ceil_div(k, 128), sms, LARGEST_SPLIT)


def _kept_unless_split(field: str):
    """Stage 11's value of ``field`` where S = 1; ``value_if_split`` otherwise (one tile per cluster)."""
    value_if_split = {"persistent": False, "multicast": 1, "raster_group": 0}[field]
    return lambda m, n, k: (getattr(lessons.stage(11).config(m, n, k), field) if split_of(m, n, k) == 1
                            else value_if_split)


CHANGE = {"split_k": split_of, **{field: _kept_unless_split(field)
                                  for field in ("persistent", "multicast", "raster_group")}}

STAGE = GeneratedStage(12, CHANGE, previous=lessons.stage(11).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 12`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
