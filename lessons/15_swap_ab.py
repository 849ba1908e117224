"""Stage 15 — swap A and B at decode: the weight's rows as wgmma's 64-row side, the tokens as its narrow N.

A wgmma multiplies a 64-row A operand (M = 64 per warpgroup, fixed) by an N-column B operand (N = 8, 16, ... 256).
Stages 07-14 give wgmma the tokens as A, so a tile has at least 64 token rows, and stage 11 makes it 256. At
decode there are 1-32 tokens: at 16 x 2112 x 7168 stage 14's 256 x 64 tile is 240 rows of TMA zero-fill per K
block, its 4-stage ring holds 128 KiB of A per SM (15/16 of it zeros) beside 32 KiB of weight, and the math
warpgroups multiply and promote 16 times the products that exist. Swap the operands, D^T = B A^T: the weight tile is wgmma's A (its
64 rows per warpgroup), the token rows wgmma's B (N = 8, 16 or 32: the fewest that hold M), and the accumulators
hold D transposed (:meth:`gemm.kernel.math_warpgroups.MathWarpgroups._swapped_k_block`):

* **the scales follow the transpose**: a row of the accumulator is a weight row, one 128 x 128 block's scale for
  all of them; a column is a token, with its own A scale per K block. So the promotion is
  ``total += partial * (sb * sa[token])``, the token of accumulator ``i`` of lane ``l`` being the fragment's
  column 8(i // 4) + 2(l % 4) + i % 2 (exercise 15: get it wrong and a token's sum is scaled by another's);
* **the epilogue writes the transpose back**: ``stmatrix .trans`` stores each 8 x 8 block of the fragment
  transposed into the same swizzled D tile (:meth:`gemm.kernel.epilogue.TmaEpilogue._write_transposed`), so D's
  tensor map and TMA store do not change;
* **the ring is refilled**: a stage is now 16 x 128 bytes of A and 64 x 128 of B, so the ring that held 4 stages
  of 256-row tiles holds 10 (production's deepest): 80 KiB of weight in flight per SM instead of 32.

The config is stage 14's plus ``swap_ab=True`` where M <= 32 (production's bound, ``gemm.heuristics``: at M = 64
a swapped tile lost 26% on the H200), tiles of the fewest power-of-two token rows >= M (at least 8) by 64 weight
rows, no multicast, stage 12's split and the persistent walk recounted for the new tiles, and the ring refilled.
Elsewhere (the ladder's 4096 x 4096 x 7168) this stage *is* stage 14.

What it buys, measured at 16 x 2112 x 7168 (H200): 8.8 us against stage 14's 31.1 and cuBLAS's 15.4 in one run
(results/ladder_16x2112x7168.json: 3.53x stage 14, 1.75x cuBLAS, 1.74 TB/s), where stage 10's 64 x 64 tiles took
25.1; on the H100, 10.2 us, 3.06x stage 14 and 1.46x cuBLAS. The two bundled ideas, each undone on its own in one
run on the H100 (results/ablation_15.json, ``python -m lessons ablate 15 --m 16 --n 2112 --k 7168``): 9.9 us for
the stage; 12.2 (0.82x) with stage 14's 4-stage ring; 11.6
(0.86x) with 64 token rows, as an unswapped tile must have. Production's kernel at M = 1 says the same: the swap
alone buys nothing. At 1 x 7168 x 2048 the swapped kernel with 64 token rows takes 9.86 us against the unswapped
64 x 64 tile's 9.59; with 32, 16 and 8 rows, 8.66, 8.45 and 8.06 (``results/sweep_swap_ab_tile_rows.json``). The
gain is the rows that do not exist, and swapping is what lets a tile have fewer than 64 of them.

Ablations measured: the full stage, 48.7 TFLOP/s at M=16 N=2112 K=7168 on NVIDIA H100 80GB HBM3; with one idea off,
its speed as a share of that: ring kept at stage 14's depth 0.82x (39.7 TFLOP/s); 64 token rows 0.86x (41.8 TFLOP/s)
(results/ablation_15.json, `python -m lessons ablate 15 --m 16 --n 2112 --k 7168`).

Speed of light: HBM3, 3.35 TB/s: at 16 x 2112 x 7168 moving A, B, the scales and D once is 15.3 MB, 4.58 us,
which allows 106 TFLOP/s. The ladder's shape is compute-bound (the FP8 tensor cores, 1,979 TFLOP/s), and there
this stage is stage 14.

Measured: 55.1 TFLOP/s at M=16 N=2112 K=7168 on NVIDIA H200, 3.53x stage 14; 36% of its speed of light (HBM3e, 152
TFLOP/s), 2.8% of the FP8 peak (results/ladder_16x2112x7168.json, `python -m lessons ladder --m 16 --n 2112 --k 7168
--stages 10-18`).
"""
import functools

import lessons
from gemm.fp8 import ceil_div
from gemm.heuristics import (MAX_STAGES, SWAP_AB_BLOCK_N, SWAP_AB_MAX_M, device_facts, raster_group,
                             swap_ab_token_rows)
from gemm.kernel.config import widest_split
from lessons.generated import GeneratedStage

IDEA = "swap AB at decode: the weight as wgmma's 64-row side, 8-32 token rows as its N, scales per column"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.math_warpgroups.MathWarpgroups._swapped_k_block"
SHAPE = (16, 2112, 7168)  # stage 12's decode shape: stage 14 runs it on 256 x 64 tiles, 240 rows of them zero-fill
LARGEST_SPLIT = lessons.stage(12).LARGEST_SPLIT


def swapped(m: int, n: int, k: int) -> bool:
    """Whether the stage swaps at (m, n, k): decode-sized M, and stage 14's D written by the TMA epilogue (the
    transposed stmatrix writes into its tile)."""
    return m <= SWAP_AB_MAX_M and lessons.stage(14).config(m, n, k).epilogue == "tma"


def token_rows(m: int) -> int:
    """The tile's token rows, production's rule (:func:`gemm.heuristics.swap_ab_token_rows`): the fewest that hold
    M, a power of two (the tile scheduler divides by shifts) and at least 8 (wgmma's narrowest N)."""
    return swap_ab_token_rows(m)


def walk(m: int, n: int, k: int) -> dict:
    """The swapped tiles' split and walk: stage 12's split rule and stage 11's persistence, recounted for tiles of
    ``token_rows(m)`` x 64 on this device's SMs (part of the cached answer); stage 14's own values where the stage
    does not swap."""
    return _walk(m, n, k, device_facts().sm_count)


@functools.lru_cache(maxsize=256)
def _walk(m: int, n: int, k: int, sms: int) -> dict:
    previous = lessons.stage(14).config(m, n, k)
    if not swapped(m, n, k):
        return {field: getattr(previous, field) for field in ("split_k", "persistent", "raster_group", "multicast")}
    tile_count = ceil_div(m, token_rows(m)) * ceil_div(n, SWAP_AB_BLOCK_N)
    split = widest_split(tile_count, ceil_div(k, 128), sms, LARGEST_SPLIT)
    persistent = tile_count * split > sms
    return {"split_k": split, "persistent": persistent, "multicast": 1,
            "raster_group": raster_group(token_rows(m), SWAP_AB_BLOCK_N, sms) if persistent else 0}


def _swapped_or_kept(field: str, value_if_swapped):
    """``value_if_swapped(m)`` where the stage swaps, stage 14's value of ``field`` elsewhere."""
    return lambda m, n, k: (value_if_swapped(m) if swapped(m, n, k)
                            else getattr(lessons.stage(14).config(m, n, k), field))


CHANGE = {"swap_ab": lambda m, n, k: swapped(m, n, k),
          "block_m": _swapped_or_kept("block_m", token_rows),
          "block_n": _swapped_or_kept("block_n", lambda m: SWAP_AB_BLOCK_N),
          **{field: (lambda name: lambda m, n, k: walk(m, n, k)[name])(field)
             for field in ("split_k", "persistent", "raster_group", "multicast")}}


def refilled_ring(m: int, n: int, k: int) -> int | None:
    """Production's deepest ring where the stage swaps (its small tiles leave room); None keeps stage 14's."""
    return MAX_STAGES if swapped(m, n, k) else None


# At the stage's home shape (python -m lessons ablate 15 --m 16 --n 2112 --k 7168): the swap with stage 14's ring
# depth (4 stages at 16 x 2112 x 7168), and with 64 token rows, the fewest an unswapped tile may have
ABLATIONS = {"ring kept at stage 14's depth": {"stages": 4},
             "64 token rows": {"block_m": 64}}

STAGE = GeneratedStage(15, CHANGE, previous=lessons.stage(14).STAGE, refill=refilled_ring)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 15`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
