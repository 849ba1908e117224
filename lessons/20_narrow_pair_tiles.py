"""Stage 20 — between decode and prefill, tiles as tall as the tokens and narrow enough that pairs fill the SMs.

Stages 11-19 take their tiles from stage 11: 256 rows, because a tall tile reads less operand per FLOP where M is
in the thousands. Stage 15 swaps A and B for M <= 32. Between the two, at M = 33-128 (a decode batch of many
sequences, a speculative-decoding verify, a small prefill chunk), every tile is still 256 rows: at 64 x 2112 x 7168
stage 19 runs 33 tiles of 256 x 64, 192 of each tile's rows TMA zero-fill that the tensor cores multiply anyway,
split over pairs (stage 12) into 66 CTAs, so half the SMs stream the weight and each holds a ring of three
40 KiB stages, most of it zeros.

The idea: size the tile to the shape. Rows: as few as M needs (64 or 128: wgmma's 64-row side, once or twice).
Columns: the cost model's (:func:`gemm.heuristics.choose_blocks`) for a wave of tiles. One CTA per SM would need
132 tiles, 64 x 16 at this shape, and each would read all 64 rows of A over the whole of K for a 16-column slice of
B: 132 x 64 x 7168 bytes = 60 MB of A from L2 for 15 MB of B. Tiles chosen for *half* the SMs instead, twice as
wide (64 x 32: 66 of them), with each tile's K blocks split over a pair as stage 12 splits them (pushed, stage 18;
rank 0 ahead, stage 19), keep 132 CTAs and halve those re-reads. Production's rule
(:func:`gemm.heuristics.pair_split_blocks`; exercise 20) takes the pair's tiles where the one-wave tiles are at most
32 wide, M is 33-128 and K >= 4096, and two CTAs per tile still fit the SMs. Smaller tiles leave room for a deeper
ring, so the stage refills it (as stage 15 does): a 64 x 32 stage is 12 KiB, and ten of them fit.

The change (``paired``): stage 19's config with the pair rule's tiles, split over 2 (pushed, rank 0 two blocks
ahead), one CTA per tile, B's L2 hint recounted for the new tiles (stage 16's rule: evict_first only where one row
of them reads B once), and the deepest ring that fits (up to production's ``MAX_STAGES``), where the rule splits;
elsewhere (the ladder's 4096 x 4096 x 7168, and decode, which stage 15 swaps) stage 20 *is* stage 19. Nothing in
the generator changes: the same emitters, a smaller tile (``python -m lessons diff 19 20 --m 64 --n 2112 --k
7168``). What production still adds at these shapes: two K blocks in flight per math warpgroup
(``accumulators=2``) and programmatic dependent launch, and it runs no FFMA pass.

Speed of light: HBM3, 3.35 TB/s: at 64 x 2112 x 7168 moving A, B, the scales and D once is 15.9 MB, 4.74 us,
which allows 409 TFLOP/s (the H200's HBM3e, 4.8 TB/s: 586). The tile does not change the bytes that must move;
it changes how many SMs move them and how much of their shared memory holds zeros.

Measured on an H200 at the stage's shape, in one run with stages 10-19 and cuBLAS (results/ladder_64x2112x7168.json,
below): stage 20 takes 8.6 us against stage 19's 28.3 (3.3x) and cuBLAS's 22.5 (2.6x), 1.85 TB/s, the first stage
ahead of cuBLAS at this shape; at 128 x 4096 x 7168 (128 x 64 tiles over pairs, results/ladder_128x4096x7168.json)
13.1 us against stage 19's 35.2 (2.7x) and cuBLAS's 22.7. The ablation at the stage's shape (results/ablation_20.json,
below) takes the bundle apart: 64 x 64 tiles over the same pairs, stage 19's width without its zero-fill and with
the refilled ring, run at 0.94x the stage (8.8 us against 28.1 for stage 19 in that run): the tile's height, and
the ring its room buys, are most of the gain; with stage 19's three stages the stage's own tiles run at 0.72x; one
64 x 16 tile per SM without the pair at 0.79x, the re-reads of A the pair halves. Production's config at this shape
adds two K blocks in flight and PDL (1.98 TB/s in the same-run bench, results/gemm_bench_h200.json). Exact against
the float64 reference (NaN-poisoned D) on the GPU at 64 x 2112 x 7168 and 128 x 4096 x 7168 (the runs' own checks
and exercise 20's GPU test) and on the emulator with the rule's tiles on 8 SMs.

Measured: 226 TFLOP/s at M=64 N=2112 K=7168 on NVIDIA H200, 3.31x stage 19; 39% of its speed of light (HBM3e, 586
TFLOP/s), 11% of the FP8 peak (results/ladder_64x2112x7168.json, `python -m lessons ladder --m 64 --n 2112 --k 7168
--stages 10-20`).

Ablations measured: the full stage, 235 TFLOP/s at M=64 N=2112 K=7168 on NVIDIA H200; with one idea off, its speed
as a share of that: ring kept at stage 19's depth 0.72x (169 TFLOP/s); one 64 x 16 tile per SM, no pair 0.79x (186
TFLOP/s); 64 x 64 tiles over pairs 0.94x (221 TFLOP/s) (results/ablation_20.json, `python -m lessons ablate 20 --m
64 --n 2112 --k 7168`).
"""
import functools

import lessons
from gemm.heuristics import MAX_STAGES, device_facts, narrow_pair_tiles, reads_b_once, split_lead
from lessons.generated import GeneratedStage

IDEA = "tiles as tall as M and narrow enough that pairs fill the SMs (M = 33-128): no zero-fill rows, half the A reads"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.heuristics.pair_split_blocks"
SHAPE = (64, 2112, 7168)  # stage 19: 33 tiles of 256 x 64 over pairs (66 CTAs); here 66 of 64 x 32 over pairs
PAIR = 2


def narrowed(m: int, n: int, k: int) -> tuple[int, int] | None:
    """The pair's tiles (block_m, block_n) at (m, n, k) on this device, production's rule
    (:func:`gemm.heuristics.narrow_pair_tiles`); None where the stage keeps stage 19's config (decode, which stage 15
    swaps, a D stored by threads, or a shape outside the rule)."""
    return _narrowed(m, n, k, device_facts())  # the SMs (set_num_sms, another device) are part of the answer


@functools.lru_cache(maxsize=256)
def _narrowed(m: int, n: int, k: int, device) -> tuple[int, int] | None:
    return narrow_pair_tiles(m, n, k, device)


def paired(config, m: int, tiles: tuple[int, int]):
    """``config`` (stage 19's) with ``tiles`` split over a pair, as the stage builds it: pushed, rank 0 ahead, one
    CTA per tile, and B loaded evict_first only where one row of the new tiles reads it once (stage 16's rule)."""
    config = config.replace(block_m=tiles[0], block_n=tiles[1], split_k=PAIR, split_k_push=True,
                            split_k_lead=split_lead(PAIR, swap_ab=False), persistent=False, multicast=1,
                            raster_group=0, even_waves=False)
    return config.replace(b_eviction="first" if reads_b_once(m, config) else "normal")


def _paired_or_kept(field: str):
    """The paired config's ``field`` where the stage narrows the tiles, stage 19's elsewhere."""
    def value(m, n, k):
        previous, tiles = lessons.stage(19).config(m, n, k), narrowed(m, n, k)
        return getattr(previous if tiles is None else paired(previous, m, tiles), field)
    return value


CHANGE = {field: _paired_or_kept(field) for field in
          ("block_m", "block_n", "split_k", "split_k_push", "split_k_lead", "persistent", "multicast", "raster_group",
           "even_waves", "b_eviction")}


def refilled_ring(m: int, n: int, k: int) -> int | None:
    """Production's deepest ring where the stage narrows the tiles (they leave room); None keeps stage 19's."""
    return MAX_STAGES if narrowed(m, n, k) is not None else None


# At the stage's home shape (python -m lessons ablate 20 --m 64 --n 2112 --k 7168): each part of the new tile undone
# on its own: stage 19's ring depth, one CTA per tile for every SM (132 of 64 x 16, no pair), and stage 19's width
# (33 tiles of 64 x 64 over pairs: 66 CTAs, no zero-fill rows)
ABLATIONS = {"ring kept at stage 19's depth": {"stages": 3},
             "one 64 x 16 tile per SM, no pair": {"block_n": 16, "split_k": 1, "split_k_push": False,
                                                  "split_k_lead": 0},
             "64 x 64 tiles over pairs": {"block_n": 64}}

STAGE = GeneratedStage(20, CHANGE, previous=lessons.stage(19).STAGE, refill=refilled_ring)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 20`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
