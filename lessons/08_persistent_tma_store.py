"""Stage 08 — persistent tile scheduler + TMA-store epilogue: one CTA per SM walks the tiles; D leaves by TMA.

Stage 07 still launched one CTA per output tile. Each CTA paid its prologue (barrier init, the first copies'
latency) and its epilogue (every warp storing D) with the tensor cores idle, and the grid's order walked all of
B past each row block of A. Two changes, one idea each (the ablation flags below turn each off):

* **persistent, grouped schedule** (:mod:`gemm.kernel.tile_scheduler`): the grid is the SM count; CTA c computes
  tiles c, c + grid, ... The producer's (stage, parity) counters carry across tiles, so it starts loading the
  next tile while the math warpgroups finish this one. Tiles are numbered in groups of G n-blocks (n fastest),
  so the ~132 tiles in flight share A rows and B rows in L2.
* **TMA-store epilogue** (:class:`gemm.kernel.epilogue.TmaEpilogue`): ``stmatrix`` puts each warp's BF16
  fragments into a 128B-swizzled shared tile (conflict-free), one thread issues a TMA store per 64-column atom,
  and its completion is awaited only at the next tile's epilogue, so the store overlaps the next main loop.

The config is stage 07's plus ``persistent=True, raster_group=G, epilogue="tma"`` (the staged epilogue stays
where N % 8 != 0: TMA needs 16-byte rows). This is the production kernel's shape: ``gemm.fp8_gemm_nt`` runs this
generator with the heuristics' blocks (:mod:`gemm.heuristics`).

Speed of light: the FP8 tensor cores, 1979 TFLOP/s dense. At 4096 x 4096 x 7168 moving A, B and D once is 93 MB,
28 us at HBM3's 3.35 TB/s, against 122 us of FP8 math: compute-bound, so the bar is the tensor cores' busy fraction.
Persistence does not change the tile count: 1024 tiles over 132 CTAs are still 7.76 rounds (97% at best).

Measured: 1,261 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 1.13x stage 07; 64% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 64% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
from gemm.heuristics import device_facts, raster_group
from lessons.generated import GeneratedStage

IDEA = "persistent grouped tile schedule + stmatrix/TMA-store epilogue overlapping the next tile"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.tile_scheduler.TileScheduler, gemm.kernel.epilogue.TmaEpilogue"


def _raster(m, n, k):
    from lessons.generated import stage06_config
    c = stage06_config(m, n, k)
    return raster_group(c.block_m, c.block_n, device_facts().sm_count)


CHANGE = {"persistent": True, "raster_group": _raster, "epilogue": lambda m, n, k: "tma" if n % 8 == 0 else "staged"}
# Each idea of this stage, turned off on its own (python -m lessons ablate 8).
ABLATIONS = {"without the TMA store": {"epilogue": "staged"},
             "without persistence": {"persistent": False, "raster_group": 0},
             "row-major raster": {"raster_group": 0}}

import lessons  # noqa: E402  (stage 07 is a module whose name starts with a digit)

STAGE = GeneratedStage(8, CHANGE, previous=lessons.stage(7).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm
