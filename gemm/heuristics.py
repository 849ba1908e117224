"""Which kernel config a problem gets: block shape, stages, schedule, epilogue; read off the device, not assumed.

Block shapes (BLOCK_M in {64, 128, 256}; BLOCK_N in 16..192, including widths that do not divide 128, whose
tiles take two B scales) are scored by a
small cost model: *waves* (a wave = one tile per SM; a persistent grid runs ceil(tiles / SMs) of them) times the
time of one wave, which is the larger of the tensor-core work and the operand feed of one tile
(:func:`wave_cost`). DeepGEMM's April rule (fewest waves, then the fullest last wave) compares waves of
different sizes as if they cost the same; at 4096 x 2112 it would pick 256 x 128 tiles and leave the third wave
with 8 of them. Stages: as many as the shared-memory
budget allows. A problem of one wave gets one CTA per tile (nothing to walk); larger ones a persistent grid,
whose raster group minimises what one wave of tiles reads: ``g * BLOCK_N + ceil(SMs / g) * BLOCK_M``
rows for groups of ``g`` n-blocks (DeepGEMM HEAD's rule). The TMA-store epilogue needs 16-byte rows of D
(N % 8 == 0); other N take the staged one.

The device is read through the driver (SM count, opt-in shared memory per block); without a GPU the facts of an
H100 SXM stand in, so CPU tests and ``python -m lessons inspect`` see the configs the H100 gets.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

from gemm.fp8 import ceil_div
from gemm.kernel.config import SHARED_LIMIT, KernelConfig, max_stages, widest_split

BLOCK_M_CANDIDATES = (64, 128, 256)
# 56 = 7168 / 128: DeepSeek's N = 7168 in one wave of 128 tiles. Every multiple of 8 works (two B scales where
# BLOCK_N does not divide 128), but the cost model below ranks them no better than the measurements do: with all
# of them it picks 128 x 160 at 4096 x 7168 x 16384, measured 13% slower than 256 x 128 (issue 8 sweeps).
BLOCK_N_CANDIDATES = (16, 32, 56, 64, 128, 192)
RASTER_GROUPS = (8, 16)
MAX_STAGES = 10
FEED_WEIGHT = 72  # see wave_cost
# One math warpgroup's K-block round trip (full-barrier wait, wgmma, wait, promotion, release) takes longer the
# wider its 64 x BLOCK_N accumulator: a floor under one wave's time per K block for tiles of one or two warpgroups.
LATENCY_BASE, LATENCY_PER_COLUMN = 8000, 64
TILE_OVERHEAD = FEED_WEIGHT * 256
# A persistent walk at K >= 4096 launches the fewest CTAs that take as many waves (KernelConfig.even_waves: 128
# instead of 132 at 512 tiles): each walks the longest walk or one tile fewer. The CTAs left out would not shorten
# the longest walk. Fewer run faster in cycles, not by a higher clock: the median clock is not higher (bench configs
# --clocks, results/sweep_even_waves_clocks.json), and with the clock locked by ncu they take 1.5-2.4% fewer cycles
# (results/ncu_graph_ew_*.txt); at 4096 x 4096 x 7168 they read 108 against 123 MB from DRAM (docs/benchmarks.md
# "Even waves at long K"). Measured on an H200, round by round against production in one
# run (results/sweep_even_waves_paired.json, results/sweep_cta_count_paired.json, 8 rounds, median of the per-round
# ratios): +3.0% at 4096 x 2112 x 7168 (every round ahead), +2.3/+2.4% at 4096 x 4096 x 7168 (every round ahead
# in both runs), +2.7/+1.4% at 4096 x 7168 x 16384 (7 of 8 rounds ahead in both); at K = 512, -1.2%
# (128 x 32768 x 512) and -1.4% (4096 x 32768 x 512), every round behind; at K = 1536-2048 within the rounds'
# spread; +0.6% in a third run at 4096 x 7168 x 16384, not decided (results/sweep_even_waves_clocks.json). The
# threshold was set between K = 2048 (within the spread) and 7168 (decided). A later sweep
# (results/sweep_even_waves_k.json) finds no step at 4096: from K = 2048 to 5120 every shape is ahead in every round
# (one a tie), by +0.3 to +1.0% (+2.4% at 2048 x 7168 x 4096), none decided by docs/benchmarks.md's 1.3% rule, so
# the threshold stays until a run decides below it. A BF16 D through the TMA epilogue only; no H100 was lent.
EVEN_WAVES_MIN_K = 4096
TALL_TILE_MAX_EXTRA_WORK = 1.03  # see power_capped_block


def evens_waves(persistent: bool, k: int, out_dtype: str = "bf16", accumulate: bool = False,
                epilogue: str = "tma") -> bool:
    """Production's even-waves rule (EVEN_WAVES_MIN_K): a persistent walk at long K, measured with a BF16 D through
    the TMA epilogue only (stage 17 asks the same of its config)."""
    return persistent and k >= EVEN_WAVES_MIN_K and out_dtype == "bf16" and not accumulate and epilogue == "tma"


# Decode (M <= 32): tiles at least 64 wide, and M <= 16 with K >= 4096 and few tiles splits each tile's K blocks
# over a 2-CTA cluster. Measured on the H100 (results/sweep_decode_split.json): at 16 x 2112 x 7168, 33 tiles of
# 64 x 64 ran 1.20x faster than the 132 of 64 x 16 the model prefers (a narrow tile's A box is mostly TMA zero-fill
# and its ring holds 2 KiB of B per stage), and split over 2 CTAs 1.24x; at 1 x 2112 x 7168 1.65x (split), at
# 1 x 4096 x 7168 1.11x (split), at 32 x 4096 x 7168 1.05x (64 wide, not split: split was 1% slower than
# 64 x 32). Not at K = 2048 (1 x 7168 x 2048: split 4% slower, its exchange does not pay for 8 K blocks) nor
# for M = 64 (64 x 32 stays 2.5% ahead of 64 x 64 at 64 x 4096 x 7168).
DECODE_MAX_M, DECODE_MIN_BLOCK_N = 32, 64
SPLIT_K_MAX_M, SPLIT_K_MIN_K = 16, 4096
FULLER_WAVE_BLOCK_N, FULLER_WAVE_MAX_K = 112, 10240  # see fuller_wave_block_n
PAIRED_MAX_BLOCK_N = 112  # see paired_k_blocks
SWAP_AB_MAX_M, SWAP_AB_BLOCK_N = 32, 64  # see swap_ab_config
# Swap AB's decode tiles split K over clusters of up to three CTAs: at 16 x 2112 x 7168 (33 tiles) 99 CTAs in
# clusters of three ran 7.4 us against 7.7-7.8 for 66 in pairs and 10.4 for 132 in fours, of which only 30 clusters
# are resident at once (H200, results/sweep_split3_clean.json); a cluster of three's K blocks are a third each
# (config.k_share), and all 33 clusters are resident (test_split_k_cluster_residency). Unlike the unswapped tiles
# (SPLIT_K_MAX_M), swapped ones split up to M = 32: at 32 x 2112 x 7168 8.8 us split against 11.6 unsplit, at
# 32 x 4096 x 7168 (64 tiles: pairs) 13.0 against 13.5 after the memset and 11.0 against 12.2 after the clean flush
# (H200, results/sweep_split_m32_memset.json, _clean.json). The K >= SPLIT_K_MIN_K gate is the unswapped rule's,
# not re-measured at M = 17-32 (32 x 7168 x 2048, forced to split, ran 10.3 against 7.5 us, but its 112 tiles
# leave no SM for a second CTA: that measures oversubscription, not K).
SWAP_AB_MAX_SPLIT = 3
# M = 33-128 at K >= SPLIT_K_MIN_K: where the one-wave tiles are at most PAIR_SPLIT_MAX_BLOCK_N wide, every CTA reads
# all of its 64-128 rows of A over K for a narrow slice of B, and those re-reads of A from L2 outweigh B itself (at
# 64 x 2112 x 7168, 132 tiles of 64 x 16 read 60 MB of A for 15 MB of B). Tiles chosen for half the SMs (twice as
# wide or tall), their K blocks split over a pair, halve A's re-reads at the same CTA count. Measured on an H200
# against the unsplit tiles, same run (memset / clean flush; results/sweep_decode64_2112_*.json,
# sweep_decode128_2112_*.json, sweep_decode4096_*.json, sweep_pair_split_*.json): 64 x 2112 x 7168 +22 / +34%,
# 48 x 2112 +22 / +32%, 128 x 2112 +15 / +23%, 64 x 4096 +1 / +5%, 128 x 4096 +1 / +11%; not at 64 and
# 128 x 7168 x 16384, whose unsplit tiles are 56 wide (-2 to +2%), hence the width bound; clusters of three
# (64 x 2112: 99 CTAs) measured below pairs.
PAIR_SPLIT_MAX_M, PAIR_SPLIT_MAX_BLOCK_N = 128, 32
# Every split above pushes its partial totals (KernelConfig.split_k_push: the peers st.async them into rank 0's
# inbox and exit; one cluster-barrier phase at the start instead of two around the exchange). Measured on an H200
# against the gathered exchange, eight rounds paired, every round ahead (results/sweep_split_k_push_memset.json,
# _clean.json): after the memset +4.4% at 16 x 2112 x 7168 (split over three), +2.1% at 32 x 4096 x 7168, +5.2% at
# 64 x 2112 x 7168 (a pair of 64-row tiles), +4.5% at 128 x 2112, +3.1 to +4.1% at M = 1 and 5; after the clean
# flush +2.1 to +7.1%. Those kernels armed rank 0's inbox barrier after the K loop; armed at the start, as now,
# +1.8 to +5.3% after the memset (+4.0% at 16 x 2112 x 7168, 1,970 GB/s; results/sweep_split_k_push_start_memset.json).
# The inbox costs 128-row pair tiles a ring stage (128 x 32: 9 instead of 10; the +4.5% at
# 128 x 2112 x 7168 is with it). The FP32-output splits (unswapped, M <= 16) push by the same rule: the exchange runs
# before the epilogue and is the same code; not timed there.
# Rank 0, which waits for the pushes, adds them and stores D, takes SPLIT_K_LEAD more K blocks than an even share
# (KernelConfig.split_k_lead: at 16 x 2112 x 7168, 56 K blocks over three as 20, 18, 18 instead of 18, 19, 19), so
# the peers finish first and their partials land while rank 0 still multiplies. Measured on an H200 against even
# shares, paired rounds (results/sweep_split_k_lead_memset.json, 8 rounds; _clean.json, 6), leads of 1, 2 and 4:
# with 2, after the memset +1.6 to +3.2% at seven of eight split shapes, every round ahead (16 x 2112 x 7168 +1.8%,
# 128 x 4096 x 7168 +3.2%), +0.6% at 32 x 4096 x 7168 (seven of eight); after the clean flush +0.4 to +2.5%. A lead
# of 4 lost 1.6-2.4% at the 2112-wide shapes of up to 64 rows (rank 0 then finishes last; +0.0% at 128 x 2112)
# and gained as 2 did at the 4096-wide 64- and 128-row pair tiles; 1 read -0.3 to +1.5% (to +1.6% after the clean
# flush). Stage 18's 256 x 64 pair
# tiles (64 KiB of partials) gain +3.0 to +6.3% with 2 at four M = 64-128 shapes, every round
# (results/sweep_split_k_lead_256x64.json). Swapped tiles split over a pair are the exception: their partials are
# small (16 x 64 FP32: 4 KiB) and a lead of 2 puts rank 0 four blocks behind its one peer: at 16 x 2112 x 7168,
# 1 x 2112 and 16 x 4096 x 7168 over pairs -0.4 to -0.5%, behind in 8-9 of 10 rounds (a lead of 1: -0.0 to +0.6%;
# results/sweep_split_k_lead_pairs_memset.json; production splits the first two over three). Production's own
# swapped pairs, N = 4096, ten rounds (results/sweep_split_k_lead_swapped_pairs.json): -0.5 to +0.0% at M = 1, 8
# and 16, behind in most rounds; +0.5% at 32 x 4096 x 7168 (32-token tiles, 8 KiB of partials), every round ahead
# but below the A/A spread of 1.3% that a rule needs: so swapped pairs keep even shares (split_lead). Measured with a BF16 D only, so the FP32-output splits keep even shares too.
SPLIT_K_LEAD = 2


def split_lead(split_k: int, swap_ab: bool) -> int:
    """The K blocks a BF16 split's rank 0 takes beyond an even share (KernelConfig.split_k_lead): SPLIT_K_LEAD,
    except where nothing is split and for swapped tiles split over a pair (see SPLIT_K_LEAD)."""
    return SPLIT_K_LEAD if split_k > 2 or split_k == 2 and not swap_ab else 0


# Short K on a persistent walk (no more K blocks than the stages that fit, at least SHORT_K_MIN_BLOCKS of them): as
# many stages as K blocks, so every tile is one round of the ring and each K block's slot a compile-time offset
# (KernelConfig.constant_stages), as DeepGEMM 2507 runs 64 x 32768 x 512 (4 stages, ncu). Measured on an H200 against
# production's deeper rolled ring, same run, five rounds (results/sweep_32768_dg_shape_{memset,clean}.json): at
# 128 x 32768 x 512 +2.3% / +1.3% (memset / clean flush; +1.5% in results/sweep_constant_stages_128x32768.json), at
# 64 x 32768 x 512 +1.4% / +0.9%; shorter rings (K = 256-384), other tiles (128 x 192, 256 x 64) and other D
# (FP32, staged) not measured, hence the floor and the gates (exact wherever it applies: tests/test_k_loop.py).
SHORT_K_MIN_BLOCKS = 4
# Clusters of three resident at once on the 132 SMs of a GH100 (H100, H200; cuOccupancyMaxActiveClusters, GPU test
# test_split_k_cluster_residency): past it a split over three would run its last clusters in a second wave, so
# more tiles split over pairs. Scaled by the SM count elsewhere (not measured on other parts).
RESIDENT_CLUSTERS_OF_THREE = 39
D_BUFFER_MIN_K = 10240  # from this K on, 256-row tiles store D in passes through a quarter buffer (_choose_config)  # a tile's fixed cost, about one K block of a 128 x 128 tile (choose_blocks)
REGISTERS = (40, 232)  # producer / math warpgroups (DeepGEMM's split): 128 x 40 + 256 x 232 <= 65536


@dataclass(frozen=True)
class DeviceFacts:
    """What the heuristics read off a device. Two GPUs of one model have equal facts, so they share every cached
    config; the device ordinal is not a fact (it picks the context, not the kernel)."""
    sm_count: int
    shared_limit: int  # dynamic shared memory one block may opt in to
    name: str = "NVIDIA H100 80GB HBM3 (assumed: no GPU)"
    l2_bytes: int = 50 << 20


H100 = DeviceFacts(132, SHARED_LIMIT)


# set_num_sms: at most this many SMs on every device (None: all). Process-wide, as DeepGEMM's is: a serving process
# drives one GPU per rank with one communication kernel beside it, so one cap serves every device it uses.
_SM_LIMIT: int | None = None


def set_num_sms(count: int) -> None:
    """Use at most ``count`` SMs from now on, on every device of this process (e.g. to leave SMs to a concurrent
    communication kernel), as DeepGEMM's ``set_num_sms``. Checked against the current device's SM count; a
    device with fewer SMs uses all of its own. The heuristics and the persistent grids follow it; 0 or None
    restores all."""
    global _SM_LIMIT
    available = _device_facts(_current_device()).sm_count
    if count and not 1 <= int(count) <= available:
        raise ValueError(f"set_num_sms: count must be in 1..{available} (the device's SMs), got {count}")
    _SM_LIMIT = int(count) if count else None


def get_num_sms(device: int | None = None) -> int:
    """The SM count the heuristics and grids use on ``device`` (default: the current device): the device's own,
    or what set_num_sms chose."""
    return device_facts(device).sm_count


def _current_device() -> int:
    from ptx.device import current_device, has_gpu
    return current_device() if has_gpu() else 0


def device_facts(device: int | None = None) -> DeviceFacts:
    """The facts of CUDA device ``device`` (default: the calling thread's current device; an H100 SXM without a
    GPU), with the SM count capped by :func:`set_num_sms`."""
    facts = _device_facts(_current_device() if device is None else device)
    if _SM_LIMIT and _SM_LIMIT < facts.sm_count:
        return dataclasses.replace(facts, sm_count=_SM_LIMIT)
    return facts


@functools.lru_cache(maxsize=None)
def _device_facts(device: int) -> DeviceFacts:
    from ptx.device import check, check_ordinal, driver, has_gpu
    if not has_gpu():
        return H100
    check_ordinal(device)
    cuda = driver()
    attr = cuda.CUdevice_attribute

    def read(which):
        return int(check(cuda.cuDeviceGetAttribute(which, device), f"cuDeviceGetAttribute({which})"))
    sms = read(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    shared = read(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    l2 = read(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
    name = check(cuda.cuDeviceGetName(256, device), "cuDeviceGetName")
    return DeviceFacts(sms, min(shared, SHARED_LIMIT), name.split(b"\0")[0].decode(), l2)


def wave_cost(block_m: int, block_n: int) -> int:
    """Relative time of one wave of (block_m x block_n) tiles: the larger of its tensor-core work (BM*BN) and its
    operand feed ((BM + BN) rows of K per tile). The weight is fitted to two measurements on the H100
    (results/gemm_bench.json): 256 x 128 tiles run ~1.12x faster per FLOP than 128 x 128 ones at 4096x4096x7168,
    and 3 waves of them take 1.08x longer than 5 waves of 128 x 128 at 4096x2112x7168. So 128 x 128 tiles are
    feed-bound (Nsight Compute agrees: L2 at 81% of its throughput, results/ncu_06_4096x7168x16384.txt) and
    256 x 128 ones are not. Small tiles hit a third floor, a math warpgroup's round trip per K block, which grows
    with BLOCK_N (LATENCY_*): fitted to one-wave problems (results/sweep_m128.json) where 128 x 32 tiles beat
    64 x 64 ones by 13% at 128 x 4096 x 7168 (same CTA count, two warpgroups with half-wide chains) while
    64 x 32 still beats 128 x 16 at 128 x 2112 x 7168 (the narrow tile's extra A rows cost more there)."""
    latency = LATENCY_BASE + LATENCY_PER_COLUMN * block_n if block_m <= 128 else 0
    return max(block_m * block_n, FEED_WEIGHT * (block_m + block_n), latency)


def choose_blocks(m: int, n: int, sms: int, staged: bool = False, k: int = 7168, fits=None,
                  groups: int = 1, block_ns=BLOCK_N_CANDIDATES, min_block_n: int = 0) -> tuple[int, int]:
    """Fewest modelled cycles: waves x (K blocks x wave_cost + TILE_OVERHEAD); ties go to fewer waves, the larger
    block, then the taller one (two math warpgroups hide each other's promotion: 128 x 64 beat 64 x 128 by 4% at
    128 x 7168 x 2048). The per-tile overhead (prologue, epilogue) matters at small K: at 4096 x 32768 x 512,
    4096 tiles of 256 x 128 beat 5472 of 128 x 192 by 3%, while at K = 7168 and 8192 the 128 x 192 ones won
    (H100, before even waves; on an H200 at the power cap they no longer do where the two are within 3% of each
    other's modelled work: :func:`power_capped_block`, applied after this choice).
    ``groups``: ``groups`` problems of M rows each (the masked grouped GEMM: tiles are counted per group).
    ``block_ns``: the BLOCK_N to try; ``min_block_n``: none narrower than this (decode; unless none is left)."""
    if min_block_n and any(block_n >= min(min_block_n, n) for block_n in block_ns):
        block_ns = tuple(block_n for block_n in block_ns if block_n >= min(min_block_n, n))
    best_key, best = None, None
    for block_m in BLOCK_M_CANDIDATES:
        if block_m > 64 and m <= 64 or block_m > 128 and m <= 128:
            continue
        for block_n in block_ns:
            if block_m == 256 and block_n > 128 or staged and block_n & (block_n - 1):
                continue
            if fits is not None and not fits(block_m, block_n):
                continue
            waves = ceil_div(groups * ceil_div(m, block_m) * ceil_div(n, block_n), sms)
            cost = waves * (ceil_div(k, 128) * wave_cost(block_m, block_n) + TILE_OVERHEAD)
            key = (cost, waves, -block_m * block_n, -block_m)
            if best_key is None or key < best_key:
                best_key, best = key, (block_m, block_n)
    return best


def fuller_wave_block_n(m: int, n: int, k: int, block_m: int, block_n: int, sms: int, fits) -> int:
    """128 x 128 tiles of one partial wave give way to 128 x 112 ones where 112 divides N (no ragged last n-block),
    the narrower tiles still fit one wave and K is short enough for the tensor cores, not HBM, to set the pace: at
    N = 7168 and M in (128, 256], 128 tiles of 112 columns keep 128 SMs busy instead of 112 (DeepGEMM's fullest-wave
    rule picks the same tile there). Measured on the H100 (results/sweep_n112.json): +0.9-3.7% at K = 2048-7168
    (M = 160-256); at 256 x 7168 x 16384, where HBM sets the pace, -0.6% (and -1.4% in results/sweep_m256_n112.json),
    so not from FULLER_WAVE_MAX_K on. The cost model alone would not choose it (nor should it everywhere: at N = 4096,
    with a ragged last n-block, 128 x 112 measured 15% slower, results/sweep_m256_n112.json)."""
    narrower = FULLER_WAVE_BLOCK_N
    more_tiles_in_one_wave = (ceil_div(n, block_n) < ceil_div(n, narrower)
                              and ceil_div(m, 128) * ceil_div(n, narrower) <= sms)
    if (block_m, block_n) == (128, 128) and n % narrower == 0 and k < FULLER_WAVE_MAX_K and more_tiles_in_one_wave:
        return narrower if fits(128, narrower) else block_n
    return block_n


def power_capped_block(m: int, n: int, k: int, block_m: int, block_n: int, sms: int, fits) -> tuple[int, int]:
    """128 x 192 tiles of a walk of several waves at EVEN_WAVES_MIN_K <= K < D_BUFFER_MIN_K give way to 256 x 128
    ones where those take at most TALL_TILE_MAX_EXTRA_WORK more modelled work (waves x tile area). The cost model
    counts both tiles as tensor-bound, the same per output; but such walks run at the power cap, where the clock
    follows the energy a tile takes, and a 256 x 128 tile reads 10% fewer operand bytes from L2 per output (384
    rows of K for 32,768 outputs against 320 for 24,576). Measured on an H200 (results/sweep_256x128_vs_128x192.json,
    10 rounds paired, SM clock and power logged): at the model's +1.6% (8192 x 8192 x 8192 and x 4096,
    4096 x 16384 x 7168) and +0.9% (16384 x 7168 x 7168) 256 x 128 is 2.4-5.1% faster at a median SM clock 60-75 MHz
    higher (701-722 W against 676-713), every round ahead at two of the four; at +4.8% (6144 x 7168 x 7168) within
    the spread (-0.7%). Hence the bound between. This overrides what choose_blocks' model was fitted to on the
    H100 before even waves (128 x 192 ahead at K = 7168 and 8192); no H100 was lent to re-measure it, and the H100
    SXM's cap is the same 700 W. Not measured: short K, K from D_BUFFER_MIN_K on (where the 256 x 128 tile would
    also store D in passes), the grouped kernels (whose contiguous tiles are at most 128 rows)."""
    if ((block_m, block_n) != (128, 192) or not EVEN_WAVES_MIN_K <= k < D_BUFFER_MIN_K
            or not fits(256, 128)):
        return block_m, block_n
    waves = ceil_div(ceil_div(m, 128) * ceil_div(n, 192), sms)
    tall_waves = ceil_div(ceil_div(m, 256) * ceil_div(n, 128), sms)
    if waves > 1 and tall_waves * 256 * 128 <= TALL_TILE_MAX_EXTRA_WORK * waves * 128 * 192:
        return 256, 128
    return block_m, block_n


def three_stage_fits(n: int, k: int, epilogue: str, out_dtype: str, device: DeviceFacts):
    """fits(block_m, block_n): whether such tiles leave room for at least 3 ring stages, the candidates
    :func:`choose_blocks` may take for production."""
    def fits(block_m: int, block_n: int) -> bool:
        trial = KernelConfig(block_m=block_m, block_n=block_n, stages=2, epilogue=epilogue, out_dtype=out_dtype)
        return max_stages(trial, n, k, limit=3, budget=device.shared_limit) >= 3
    return fits


def pair_split_blocks(m: int, n: int, sms: int, tiles_for) -> tuple[int, int] | None:
    """The tiles whose K blocks a pair of CTAs splits at M = 33-128 (PAIR_SPLIT_MAX_M), or None where one CTA per
    tile stays. ``tiles_for(ctas)``: the cost model's (block_m, block_n) at this shape for that many CTAs. Where the
    model's tiles for every SM are at most PAIR_SPLIT_MAX_BLOCK_N wide, its tiles for half the SMs, if two CTAs
    for each still fit the SMs. Production asks it at K >= SPLIT_K_MIN_K for a BF16 D through the TMA epilogue."""
    if not DECODE_MAX_M < m <= PAIR_SPLIT_MAX_M or sms < 2:  # one SM: no half to choose tiles for
        return None
    if tiles_for(sms)[1] > PAIR_SPLIT_MAX_BLOCK_N:
        return None
    halved = tiles_for(sms // 2)
    return halved if 2 * ceil_div(m, halved[0]) * ceil_div(n, halved[1]) <= sms else None


def narrow_pair_tiles(m: int, n: int, k: int, device: DeviceFacts | None = None) -> tuple[int, int] | None:
    """Production's pair-split tiles at (m, n, k) for a BF16 D through the TMA epilogue, or None where it keeps one
    CTA per tile (what stage 20 takes)."""
    device = device or device_facts()
    if k < SPLIT_K_MIN_K or n % 8:
        return None
    return pair_split_blocks(m, n, device.sm_count, pair_model(m, n, k, device))


def pair_model(m: int, n: int, k: int, device: DeviceFacts):
    """tiles_for(ctas): the cost model's tiles at (m, n, k) for that many CTAs, among those that leave production's
    BF16 TMA-epilogue D room for three ring stages: what :func:`narrow_pair_tiles` asks the rule with."""
    fits = three_stage_fits(n, k, "tma", "bf16", device)
    return lambda ctas: choose_blocks(m, n, ctas, k=k, fits=fits)


def paired_k_blocks(config: KernelConfig) -> bool:
    """Two K blocks in flight (KernelConfig.accumulators=2) for one wave of one-CTA tiles at most 128 x 112, the
    widths measured, with a BF16 D through the TMA epilogue. Measured on the H100 against one set, same run
    (results/sweep_acc2_memset.json, _clean.json; tiles 64 x 16-64 and 128 x 32-112): +0.4-4.7% on 11 of 14 decode
    and M <= 256 shapes (1 x 2112 x 7168 +4.7%, 16 x 7168 x 2048 +3.1%, 16 x 2112 x 7168 +2.0%, 256 x 7168 x 2048
    +1.5%, 64 x 7168 x 16384 +0.6% and +0.9% after the clean flush), -0.1 to -0.6% on three (64 x 2112 x 7168, 32
    and 1 x 4096 x 7168), which keep it: within the run-to-run spread. A persistent walk (more tiles than SMs), wider
    tiles and the staged epilogue were not measured with it."""
    if (config.persistent or config.block_n > PAIRED_MAX_BLOCK_N or config.out_dtype != "bf16" or config.accumulate
            or config.epilogue != "tma"):
        return False
    try:  # KernelConfig refuses 256-row tiles, 1x128 B scales, an inline producer and too many registers
        config.replace(accumulators=2)
    except ValueError:
        return False
    return True


def decode_split_k(m: int, k: int, tile_count: int, sms: int, largest: int = 2, max_m: int = SPLIT_K_MAX_M) -> int:
    """CTAs sharing each tile's K blocks for M <= ``max_m`` and K >= SPLIT_K_MIN_K: the most, up to ``largest``,
    for which the tiles still give every CTA an SM of its own (see SPLIT_K_MAX_M's measurements; swap AB's tiles
    split up to M = 32 and over up to three CTAs, SWAP_AB_MAX_SPLIT), else one."""
    if m <= max_m and k >= SPLIT_K_MIN_K:
        split = widest_split(tile_count, ceil_div(k, 128), sms, largest=largest, powers_of_two=False)
        if split == 3 and tile_count > RESIDENT_CLUSTERS_OF_THREE * sms // 132:  # the last ones: a second wave
            split = widest_split(tile_count, ceil_div(k, 128), sms, largest=2)
        return split
    return 1


def swap_ab_config(m: int, n: int, k: int, device: DeviceFacts) -> KernelConfig:
    """Decode (M <= SWAP_AB_MAX_M) with a BF16 D through the TMA epilogue: B's rows as wgmma's 64-row side
    (KernelConfig.swap_ab), tiles of the fewest power-of-two token rows >= M (at least 8) by 64 weight rows, K split
    over two or three CTAs for K >= SPLIT_K_MIN_K where the split tiles fit the SMs (SWAP_AB_MAX_SPLIT). Measured
    against the unswapped decode kernel in one run on the H100 (results/sweep_swap_ab_memset.json, _n24576.json;
    docs/benchmarks.md, "Swap AB"): +1 to +18% at all eleven
    M <= 32 shapes (1 x 7168 x 2048 +18%, 16 x 2112 x 7168 +5%, 32 x 4096 x 7168 +1%); on an H200 a swapped 64 x 64
    tile lost 26% to the unswapped 64 x 16 at 64 x 2112 x 7168 (results/sweep_swap_ab_h200_m64.json), hence the
    bound. Weight tiles of 128 rows and more stages were no better."""
    block_m = swap_ab_token_rows(m)
    tile_count = ceil_div(n, SWAP_AB_BLOCK_N)
    persistent = tile_count > device.sm_count
    split_k = decode_split_k(m, k, tile_count, device.sm_count, largest=SWAP_AB_MAX_SPLIT, max_m=SWAP_AB_MAX_M)
    config = KernelConfig(block_m=block_m, block_n=SWAP_AB_BLOCK_N, stages=2, producer="warpgroup",
                          registers=REGISTERS, persistent=persistent,
                          raster_group=raster_group(block_m, SWAP_AB_BLOCK_N, device.sm_count) if persistent else 0,
                          pdl=not persistent, split_k=split_k, split_k_push=split_k > 1,
                          split_k_lead=split_lead(split_k, swap_ab=True), swap_ab=True)
    return config.replace(stages=max_stages(config, n, k, limit=MAX_STAGES, budget=device.shared_limit))


def swap_ab_token_rows(m: int) -> int:
    """A swapped tile's token rows (wgmma's N) for M (or expected) rows: the fewest power of two >= M, at least 8."""
    return max(8, 1 << (m - 1).bit_length())


def masked_swap_ab_config(m: int, n: int, k: int, device: DeviceFacts) -> KernelConfig:
    """The masked grouped GEMM at decode (MoE: ``m`` = expected_m <= SWAP_AB_MAX_M tokens per expert, a BF16 D
    through the TMA epilogue): the dense decode kernel's swapped tile (:func:`swap_ab_config`: the fewest power-of-two
    token rows >= expected_m, at least 8, by 64 weight rows), persistent as every masked kernel, as many stages as
    fit. A group whose count exceeds expected_m takes more token tiles; the kernel stays correct for any count in
    0..M_max. No split K: the split kernel runs one tile per cluster, not the persistent walk the masked counts need,
    and G x N/64 tiles (8 x 64 = 512 at N = 4096) already outnumber the SMs. Measured on the H100 in one run
    (results/grouped_bench.json, docs/benchmarks.md "Swap AB"): +3 to +9% over the unswapped masked kernel on four
    DeepSeek-V3 decode shapes (16 x 32 and 8 x 16 tokens), 1.02-1.04x DeepGEMM's best (results/gemm_bench.json)."""
    block_m = swap_ab_token_rows(m)
    config = KernelConfig(block_m=block_m, block_n=SWAP_AB_BLOCK_N, stages=2, producer="warpgroup",
                          registers=REGISTERS, persistent=True,
                          raster_group=raster_group(block_m, SWAP_AB_BLOCK_N, device.sm_count), gemm_type="masked",
                          swap_ab=True)
    return config.replace(stages=max_stages(config, n, k, limit=MAX_STAGES, budget=device.shared_limit))


def post_passes() -> tuple[str, ...]:
    """Cubin passes for production kernels: none by default (the FFMA interleave measured no gain on the H100,
    results/ffma_pass.json); FP8LADDER_FFMA_INTERLEAVE=deepgemm|every_other turns one on (ptx.passes)."""
    from ptx.passes import pass_from_environment
    rule = pass_from_environment()
    return (f"ffma_{rule}",) if rule else ()


def raster_group(block_m: int, block_n: int, sms: int) -> int:
    return min(RASTER_GROUPS, key=lambda g: (g * block_n + ceil_div(sms, g) * block_m, -g))


def choose_config(m: int, n: int, k: int, device: DeviceFacts | None = None, *, out_dtype: str = "bf16",
                  accumulate: bool = False, allow_swap_ab: bool = True) -> KernelConfig:
    """The production config for (M, N, K) on ``device`` (the facts of the call's device; default: the current
    device's as set_num_sms caps it, or an H100 without a GPU), for a BF16 or FP32 (``out_dtype="f32"``) D, added into (``accumulate``: D = C + A*B) or
    overwritten. ``allow_swap_ab=False``: the unswapped kernel's choice at decode too (what production ran before
    swap AB; ``python -m gemm bench configs`` compares them). ``FP8LADDER_PRINT_CONFIGS=1`` prints each choice once."""
    return _choose_config(m, n, k, device or device_facts(), post_passes(), out_dtype, accumulate, allow_swap_ab)


@functools.lru_cache(maxsize=4096)
def _choose_config(m: int, n: int, k: int, device: DeviceFacts, passes: tuple[str, ...], out_dtype: str = "bf16",
                   accumulate: bool = False, allow_swap_ab: bool = True) -> KernelConfig:
    config = _production_config(m, n, k, device, out_dtype, accumulate, allow_swap_ab).replace(post_passes=passes)
    config = with_b_hint(m, config)
    if os.environ.get("FP8LADDER_PRINT_CONFIGS"):
        print(f"fp8_gemm_nt M={m} N={n} K={k}: {config.describe()}")
    return config


def b_reads(m: int, config: KernelConfig) -> int:
    """How many tiles load each byte of B from L2: one per row of tiles, ceil(M / BLOCK_M) (swap AB: BLOCK_M is the
    token rows; a masked grouped GEMM: ``m`` is a group's expected_m, its tiles' rows per expert). Splitting K gives
    each CTA of a cluster its own K blocks of the tile: that does not change it. Multicast pairs are not counted (no
    production config has them): an A pair leaves it as it is, a B pair (multicast_operand="b") would halve it."""
    return ceil_div(max(m, 1), config.block_m)


def hint_measured(config: KernelConfig) -> bool:
    """Where B's evict_first hint was measured (reads_b_once): a BF16 D through the TMA epilogue, no accumulate,
    tiles of at most 128 rows. FP32 or accumulated D, the staged epilogue and 256-row tiles read B once too, but
    were not timed with the hint, so production leaves them as they were."""
    return (config.out_dtype == "bf16" and not config.accumulate and config.epilogue == "tma"
            and config.block_m <= 128)


def with_b_hint(m: int, config: KernelConfig) -> KernelConfig:
    """Production's config with B's loads marked evict_first where one row of tiles reads B once and the hint was
    measured (:func:`reads_b_once`, :func:`hint_measured`); unchanged elsewhere."""
    return config.replace(b_eviction="first") if reads_b_once(m, config) and hint_measured(config) else config


def reads_b_once(m: int, config: KernelConfig, reads=None) -> bool:
    """One row of tiles (M <= BLOCK_M): every byte of B is read once, so its TMA loads go to L2 as evict_first
    (KernelConfig.b_eviction) and the stream recycles its own lines instead of evicting what the L2 held. Measured
    on an H200 against the same config without the hint, same run (results/sweep_l2_eviction_*.json; docs/benchmarks.md,
    "B read once, evicted first"): after the timer's memset flush, whose dirty lines the stream would otherwise write
    back, +1.8 to +10.5% at the eight decode and short-K shapes (64 x 7168 x 16384 +10.5%, 32 x 4096 x 7168 +8.8%,
    16 x 2112 x 7168 +3.3%, 64 x 32768 x 512 +3.6%); after the clean flush -1.0 to +1.6%. Where B is re-read by
    other rows of tiles it loses: 4096 x 7168 x 16384 -2.4% after the clean flush (+1.5% after the memset). The
    masked grouped GEMM, ``m`` its expected_m, reads each expert's weight once where one token tile holds the expert's tokens: the four MoE decode
    shapes -1.3 to +11.5% after the memset, -0.6 to +2.3% after the clean flush (results/grouped_beside_*.json);
    production hints its swapped (decode) kernels, the ones measured; a group whose count exceeds expected_m takes a
    second token tile and re-reads its expert's weight from HBM rather than L2 (correct, a little slower). Not the
    contiguous layout, whose groups span many rows of tiles. Measured on an H200 only (no H100 was lent); the rule
    applies on every device. ``reads``: the count to use instead of :func:`b_reads` (a course exercise's)."""
    count = (reads or b_reads)(m, config)
    return count == 1 and config.gemm_type != "contiguous" and config.producer == "warpgroup"


def _production_config(m: int, n: int, k: int, device: DeviceFacts, out_dtype: str, accumulate: bool,
                       allow_swap_ab: bool) -> KernelConfig:
    # FP32 D is stored by the TMA epilogue only (gemm.validate asks N % 4 == 0 for it)
    epilogue = "tma" if n % 8 == 0 or out_dtype == "f32" else "staged"
    if allow_swap_ab and m <= SWAP_AB_MAX_M and epilogue == "tma" and out_dtype == "bf16" and not accumulate:
        return swap_ab_config(m, n, k, device)

    fits = three_stage_fits(n, k, epilogue, out_dtype, device)
    block_m, block_n = choose_blocks(m, n, device.sm_count, staged=n % 8 != 0, k=k, fits=fits,
                                     min_block_n=DECODE_MIN_BLOCK_N if m <= DECODE_MAX_M else 0)
    if out_dtype == "bf16" and not accumulate:  # measured with a BF16 D only
        block_n = fuller_wave_block_n(m, n, k, block_m, block_n, device.sm_count, fits)
        block_m, block_n = power_capped_block(m, n, k, block_m, block_n, device.sm_count, fits)
    split_k = 1
    bf16_tma = epilogue == "tma" and out_dtype == "bf16" and not accumulate
    paired = narrow_pair_tiles(m, n, k, device) if bf16_tma else None
    if paired is not None:
        (block_m, block_n), split_k = paired, 2
    # one wave needs no persistent loop: a CTA per tile skips the walk (measured 2-3% at 64 x 7168 x 2048)
    tile_count = ceil_div(m, block_m) * ceil_div(n, block_n)
    persistent = tile_count > device.sm_count
    if split_k == 1:
        split_k = decode_split_k(m, k, tile_count, device.sm_count)
    # Programmatic dependent launch: a call's prologue overlaps the previous call's tail. Back to back (50 calls in
    # one graph, results/pdl_back_to_back.json) 1-11% faster per call at M <= 128 (one wave of one-CTA tiles); 3-4%
    # slower at 256 x 7168 x 2048 (two runs) and 1-4% at the persistent 4096 x 4096 x 7168 (three): off there.
    config = KernelConfig(block_m=block_m, block_n=block_n, stages=2, producer="warpgroup", registers=REGISTERS,
                          persistent=persistent,
                          raster_group=raster_group(block_m, block_n, device.sm_count) if persistent else 0,
                          epilogue=epilogue, out_dtype=out_dtype, accumulate=accumulate,
                          pdl=m <= 128 and not persistent, split_k=split_k, split_k_push=split_k > 1,
                          split_k_lead=split_lead(split_k, swap_ab=False) if (out_dtype == "bf16" and not accumulate
                                                                              and epilogue == "tma") else 0,
                          even_waves=evens_waves(persistent, k, out_dtype, accumulate, epilogue))
    if paired_k_blocks(config):
        config = config.replace(accumulators=2)
    stages = max_stages(config, n, k, limit=MAX_STAGES, budget=device.shared_limit)
    # Long K: D through a quarter of the tile, if that buys a ring stage. Measured on 256 x 128 tiles
    # (results/sweep_d_buffer.json): +8% at K = 16384, -1% at 7168, -5..-16% at K <= 2048, where the three waits
    # per tile for a pass's store to read the buffer weigh more than the deeper ring; break-even near K = 8192.
    if block_m == 256 and epilogue == "tma" and k >= D_BUFFER_MIN_K:
        atom = 128 // config.out_bytes
        if block_n % atom == 0:
            smaller = config.replace(d_buffer=(128, atom))
            smaller_stages = max_stages(smaller, n, k, limit=MAX_STAGES, budget=device.shared_limit)
            if smaller_stages > stages:
                config, stages = smaller, smaller_stages
    # a persistent walk has one accumulator set and no split (paired_k_blocks, decode_split_k); see SHORT_K_MIN_BLOCKS
    if (persistent and SHORT_K_MIN_BLOCKS <= ceil_div(k, 128) <= stages and block_m <= 128 and block_n <= 128
            and epilogue == "tma" and out_dtype == "bf16" and not accumulate):
        return config.replace(stages=ceil_div(k, 128), constant_stages=True)
    return config.replace(stages=stages)


# -- the weight-gradient GEMM (gemm.wgrad) ----------------------------------------------------------------

# wgrad's B scales are per column, so any multiple of 8 up to what the registers hold may be BLOCK_N (no B-scale
# block boundary to split at), and the widths 144-160 fill the last wave better at N = 2112 and 7168; yet on all
# 12 of DeepGEMM's wgrad shapes 128 x 128 (4 stages) ran fastest, 1.04-1.22x 128 x 144, 128 x 152 and 128 x 160
# (3-4 stages), 256 x 96 and 128 x 128 with D in four passes (6 stages) (results/sweep_wgrad_blocks.json, H200):
# the column scales and the extra FMUL per accumulator make a wider tile's promotion the longer pole.
WGRAD_BLOCK_N_CANDIDATES = (16, 32, 64, 128)
WGRAD_BLOCK_M_CANDIDATES = (64, 128)


def choose_wgrad_config(m: int, n: int, k: int, device: DeviceFacts | None = None) -> KernelConfig:
    """The config of a weight-gradient GEMM (1x128 scales on both operands, FP32 D += A*B^T, :mod:`gemm.wgrad`)
    on ``device``: the dense cost model's block shape among those whose column scales fit the math threads'
    registers (:attr:`KernelConfig.math_registers_needed`: 256 x 128 does not, 128 x 128 does), as many stages as
    fit, persistent past one wave. ``k`` (tokens) only weighs the model: the kernel takes K at run time, so one
    kernel per (config, N) serves every K."""
    return _choose_wgrad_config(m, n, max(k, 128), device or device_facts(), post_passes())


@functools.lru_cache(maxsize=1024)
def _choose_wgrad_config(m: int, n: int, k: int, device: DeviceFacts, passes: tuple[str, ...]) -> KernelConfig:
    def trial(block_m: int, block_n: int, stages: int = 2) -> KernelConfig:
        return KernelConfig(block_m=block_m, block_n=block_n, stages=stages, producer="warpgroup",
                            registers=REGISTERS, epilogue="tma", out_dtype="f32", accumulate=True, b_scales="1x128")

    def fits(block_m: int, block_n: int) -> bool:
        if block_m not in WGRAD_BLOCK_M_CANDIDATES:
            return False
        try:
            config = trial(block_m, block_n)
        except ValueError:  # more registers than a math thread holds
            return False
        return max_stages(config, n, None, limit=3, budget=device.shared_limit) >= 3
    block_m, block_n = choose_blocks(m, n, device.sm_count, k=k, fits=fits, block_ns=WGRAD_BLOCK_N_CANDIDATES)
    persistent = ceil_div(m, block_m) * ceil_div(n, block_n) > device.sm_count
    config = trial(block_m, block_n).replace(
        persistent=persistent, raster_group=raster_group(block_m, block_n, device.sm_count) if persistent else 0)
    config = config.replace(stages=max_stages(config, n, None, limit=MAX_STAGES, budget=device.shared_limit),
                            post_passes=passes)
    if os.environ.get("FP8LADDER_PRINT_CONFIGS"):
        print(f"wgrad M={m} N={n} K={k}: {config.describe()}")
    return config


# -- MoE grouped GEMMs (gemm.grouped) ----------------------------------------------------------------------
# Block rows a grouped GEMM may use: contiguous tiles must not span two groups, so BLOCK_M divides the groups'
# alignment (128). Masked ones may take 256 (the cost model counts the tiles per group, so a partial last block
# weighs in): on DeepGEMM's six masked shapes 256 x 128 tiles measured 1.03-1.12x the best 128-row ones on the
# H100 (1224-1306 TFLOP/s at K = 7168), where DeepGEMM itself uses {64, 128}.
GROUPED_BLOCK_M = {"contiguous": (64, 128), "masked": (64, 128, 256)}


def choose_grouped_config(gemm_type: str, m: int, n: int, k: int, groups: int,
                          device: DeviceFacts | None = None, *, allow_swap_ab: bool = True) -> KernelConfig:
    """The config of an m-grouped GEMM (``gemm_type`` "contiguous" or "masked", :mod:`gemm.grouped`) on ``device``.

    ``m``: contiguous, the rows of A (the sum of the groups' aligned rows, padding included); masked, the rows a
    group is expected to use (``expected_m``: the counts themselves are known on the device only). The block shape
    comes from the dense cost model (:func:`choose_blocks`) with BLOCK_M in :data:`GROUPED_BLOCK_M` and the masked
    tiles counted per group; stages as many as fit; no multicast (both CTAs of a cluster would have to be in one
    group). Contiguous runs one CTA per tile when the tiles fit in one wave, else persistent like the dense kernel;
    masked is always persistent (its walk follows the device's counts). Masked decode (expected_m <= SWAP_AB_MAX_M,
    N % 8 == 0 for the TMA epilogue) swaps A and B (:func:`masked_swap_ab_config`); ``allow_swap_ab=False`` gives the
    unswapped kernel's choice there too (what it ran before, for comparisons: ``python -m gemm bench grouped``)."""
    return _choose_grouped_config(gemm_type, m, n, k, groups, device or device_facts(), post_passes(),
                                  allow_swap_ab)


@functools.lru_cache(maxsize=1024)
def _choose_grouped_config(gemm_type: str, m: int, n: int, k: int, groups: int, device: DeviceFacts,
                           passes: tuple[str, ...], allow_swap_ab: bool = True) -> KernelConfig:
    if gemm_type not in GROUPED_BLOCK_M:
        raise ValueError(f"gemm_type must be one of {sorted(GROUPED_BLOCK_M)}, got {gemm_type!r}")
    epilogue = "tma" if n % 8 == 0 else "staged"
    masked = gemm_type == "masked"
    if masked and allow_swap_ab and m <= SWAP_AB_MAX_M and epilogue == "tma":
        config = masked_swap_ab_config(m, n, k, device).replace(post_passes=passes)
        return _printed(with_b_hint(m, config), gemm_type, m, n, k, groups)

    def fits(block_m: int, block_n: int) -> bool:
        if block_m not in GROUPED_BLOCK_M[gemm_type]:
            return False
        trial = KernelConfig(block_m=block_m, block_n=block_n, stages=2, epilogue=epilogue, gemm_type=gemm_type)
        return max_stages(trial, n, k, limit=3, budget=device.shared_limit) >= 3
    block_m, block_n = choose_blocks(max(m, 1), n, device.sm_count, staged=n % 8 != 0, k=k, fits=fits,
                                     groups=groups if masked else 1)
    tiles = (groups if masked else 1) * ceil_div(max(m, 1), block_m) * ceil_div(n, block_n)
    persistent = masked or tiles > device.sm_count
    config = KernelConfig(block_m=block_m, block_n=block_n, stages=2, producer="warpgroup", registers=REGISTERS,
                          persistent=persistent,
                          raster_group=raster_group(block_m, block_n, device.sm_count) if persistent else 0,
                          epilogue=epilogue, gemm_type=gemm_type)
    config = config.replace(stages=max_stages(config, n, k, limit=MAX_STAGES, budget=device.shared_limit),
                            post_passes=passes)
    return _printed(config, gemm_type, m, n, k, groups)


def _printed(config: KernelConfig, gemm_type: str, m: int, n: int, k: int, groups: int) -> KernelConfig:
    if os.environ.get("FP8LADDER_PRINT_CONFIGS"):
        print(f"m-grouped {gemm_type} M={m} N={n} K={k} G={groups}: {config.describe()}")
    return config


__all__ = ["choose_config", "choose_blocks", "choose_grouped_config", "choose_wgrad_config", "GROUPED_BLOCK_M",
           "swap_ab_config", "masked_swap_ab_config", "swap_ab_token_rows",
           "raster_group", "device_facts", "DeviceFacts", "H100", "set_num_sms", "get_num_sms",
           "pair_split_blocks", "narrow_pair_tiles", "pair_model", "three_stage_fits"]
