"""What one generated kernel is: a frozen :class:`KernelConfig` plus (N, K), and the shared-memory plan they imply.

The generator (:mod:`gemm.kernel.generator`) turns ``(config, n, k)`` into PTX; M is a kernel parameter, so one
kernel serves every M. Each field is one idea of the ladder, and stages 07+ are configs that differ from the
previous stage's in one field (``lessons/07_*``, ``lessons/08_*``):

* ``producer``: ``"inline"`` (stage 06: thread 0 is also a math thread and refills the ring between its own
  K blocks) or ``"warpgroup"`` (stage 07: a dedicated producer warpgroup, one elected thread issuing TMA);
* ``registers``: ``setmaxnreg`` counts (producer, math) for a warpgroup producer, or None;
* ``persistent``: one CTA per SM walking the tiles (stage 08) instead of one CTA per tile;
* ``raster_group``: n-blocks per group of the grouped (swizzled) tile order (m-blocks when the walk runs along M,
  ``multicast_operand="b"``); 0 = row-major (column-major along M);
* ``epilogue``: ``"staged"`` (BF16 through a padded shared tile, coalesced ``st.global``) or ``"tma"``
  (``stmatrix`` into a swizzled tile, one TMA store per 64-column atom, its wait deferred to the next tile);
* ``multicast``: 2 = clusters of two CTAs computing tiles with the same rows, A (and its scales) loaded once
  and multicast to both (stage 09);
* ``multicast_operand``: which operand a pair shares. ``"a"`` (stage 09): the walk runs along N inside a raster
  group (n varies fastest), so tiles 2i and 2i + 1 have the same rows and rank 0 multicasts A and sa. ``"b"``
  (DeepGEMM's multicast on B): the walk runs along M instead (groups of ``raster_group`` m-blocks by all n-blocks,
  m fastest), so the pair's tiles have the same columns and rank 0 multicasts B (and, with 1x128 B scales, sb);
* ``out_dtype``: D's element type, ``"bf16"`` or ``"f32"`` (the FP32 totals stored as they are; TMA epilogue);
* ``accumulate``: D = C + A*B: the TMA epilogue adds the tile into D (``cp.reduce.async.bulk.tensor .add``, done
  by the copy engine at L2) instead of overwriting it, so D must hold C when the kernel starts (FP32 only);
* ``d_buffer``: (rows, columns) of the TMA epilogue's shared D buffer: the whole tile (the default, None), or a
  part of it that the tile passes through in turn: rows = one wave (128 of a 256-row tile), columns = one store
  atom (64 BF16 / 32 FP32). A 256 x 128 BF16 tile through a 128 x 64 buffer frees the 48 KiB a fourth ring stage
  needs (2 -> 3 stages measured +9-19%), for three waits per tile until a pass's store has read the buffer;
* ``post_passes``: cubin passes run after assembly (stage 10's FFMA interleave, :mod:`ptx.passes`);
* ``gemm_type``: ``"normal"`` (one GEMM), or one of the MoE grouped GEMMs (:mod:`gemm.grouped`), where B is a
  stack of G expert weights (G, N, K) seen by TMA as one (G*N, K) tensor:

  - ``"contiguous"``: A holds every expert's tokens one after another (each group's rows aligned to
    :data:`CONTIGUOUS_ALIGNMENT`), and a device array ``m_indices`` gives each row's group (-1: padding). A tile
    reads the group of its first row once per role (producer, math) and skips itself when that is not in 0..G-1;
    otherwise B and its scales come from that group. BLOCK_M must divide the alignment.
  - ``"masked"``: A is (G, M_max, K) and only the first ``masked_m[g]`` rows of group g (a device array, so a CUDA
    graph replays it with new counts) are computed and stored. Persistent only: the scheduler walks the groups'
    tiles in order (:class:`gemm.kernel.tile_scheduler.TileScheduler`), and the epilogue stores rows below the group's
    count only.

  Grouped kernels use the warpgroup producer and no multicast (a cluster pair would have to agree on its group
  per tile; not implemented, so ``multicast=2`` is refused).
* ``b_scales``: the granularity of B's scales. ``"128x128"`` (the forward pass and dgrad: one scale per 128x128
  block of the weight, sb is (ceil(N/128), K/128), read once per tile into shared memory) or ``"1x128"`` (the
  weight-gradient GEMM, wgrad: B is an activation or gradient too, scaled per row and 128-wide K group like A, sb
  is (N, K/128) stored N-major as sa is M-major). With 1x128 every output column has its own B scale per K block:
  the producer loads the tile's BLOCK_N B scales with each stage (a fourth TMA copy), and the promotion multiplies
  each accumulator by sa[row] * sb[column] (one FMUL + one FFMA per accumulator instead of one FFMA, and BLOCK_N/4
  more registers per thread). K is wgrad's token axis, different at every step and, k-grouped, for every expert,
  so a 1x128 kernel takes its K-block count as a parameter (``k_blocks``): one kernel per (config, N) serves
  every K, and K need only be a multiple of 16 (TMA zero-fills the last block).
* ``split_k``: S = 2 to 8 CTAs of a cluster share one tile's K blocks (decode: fewer tiles than SMs, each CTA's
  K loop a chain of dependent round trips). CTA rank r computes K blocks [r*Kb/S, (r+1)*Kb/S) into its totals
  (``split_k_lead`` = L: rank 0 takes Kb // S + L of them and the others share the rest evenly, ``k_share``);
  the others write theirs into their own (idle) ring, a cluster barrier publishes them, and rank 0 reads them
  through distributed shared memory (``ld.shared::cluster``), adds them and runs the epilogue. One tile per
  cluster (persistent=False), the 128x128 forward kernel only. With ``split_k_push`` the peers instead send their
  totals into an inbox in rank 0's shared memory (``st.async``, each message's bytes completed on rank 0's inbox
  barrier) and exit: rank 0 waits on that barrier (acquire at cluster scope), not on a cluster barrier, and reads
  its own shared memory; the only cluster barrier is one phase every thread arrives on at the start (after the
  inbox barrier's init), which a peer waits on before its first message.
* ``accumulators``: wgmma accumulator sets per math warpgroup. With 1, a K block is a chain: wait for its stage,
  four wgmmas, ``wait_group 0``, release, promotion, then the next. With 2 (DeeperGEMM's idea), K block k+1's
  wgmmas are issued into the second set before K block k's promotion, and ``wait_group 1`` waits for k's only, so
  the tensor cores' latency overlaps the promotion, the release and the next barrier wait. Where the K loop's round
  trip, not the operand feed, sets the pace (decode: a tile's K blocks follow each other, each K block's bytes
  arrive in a fraction of the round trip), that takes the wgmma latency off the chain. One 64-row wave per
  warpgroup (block_m <= 128); block_n / 2 more registers per thread. Measured +0.4-4.7% at decode (docs/benchmarks.md,
  "Two K blocks in flight").
* ``l2_prefetch``: P > 0 has the producer ask L2 for the tile's B P K blocks ahead of its loads
  (``cp.async.bulk.prefetch.tensor``): the first P before its first load, then block k + P with block k. A measured
  loss at every decode shape and P tried (docs/benchmarks.md, "B asked of L2 ahead of the ring"); production never
  sets it, and it stays so that the measurement can be repeated.
* ``swap_ab``: the weight as wgmma's 64-row side (decode, DeepGEMM's swap-AB): the math warpgroups multiply B's
  rows (64 per warpgroup, BLOCK_N = 64 or 128) by the tile's BLOCK_M rows of A as wgmma's N (8, 16, 32 or 64), so a
  tile of a few tokens no longer pads its activations to 64 rows of wgmma work and 64 rows of shared memory per
  stage. The producer loads exactly what it loads unswapped (A, sa and B boxes; B's scales once per tile); only the
  operands' roles in the wgmma change. The accumulators hold D transposed (weight rows x tokens): the promotion
  multiplies each by the weight block's scale times its column's (token's) scale, read from the stage's sa like
  wgrad's column scales, and the TMA epilogue writes them back transposed with ``stmatrix .trans`` into the usual
  D tile, so D, its tensor map and its TMA stores are unchanged. The dense GEMM and the masked grouped one (MoE
  decode: a few tokens per expert) take it; since the tile's rows, boxes and D tile are the unswapped ones, the
  masked walk, the groups' row offsets and the row-bounded store of the last tile of a group carry over as they are.
  Not the contiguous GEMM: its groups are padded to 128 rows, so there are no missing rows to skip.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gemm.fp8 import ceil_div, is_power_of_two
from gemm.kernel.math_warpgroups import staging_pitch
from ptx.vocab.bulk_copies import L2_EVICTION

BLOCK_K = 128  # one scale group = one 128-byte swizzle row of e4m3
WARPGROUP = 128  # threads
SHARED_LIMIT = 227 * 1024  # H100: the most dynamic shared memory one block may have (cuDeviceGetAttribute agrees)
ALIGN_SLACK = 1024  # the dynamic shared base is aligned up to 1024 bytes at run time
SWIZZLE_ROW_BYTES = 128  # one 128B-swizzle row: the TMA store's box width (64 BF16 or 32 FP32 columns)
OUT_BYTES = {"bf16": 2, "f32": 4}  # bytes per element of D
# cubin -> cubin passes a config may ask for (ptx.passes), by name: the FFMA interleave with DeepGEMM's rule, or
# with one yield every other FFMA (stage 10)
POST_PASSES = {"ffma_deepgemm": "deepgemm", "ffma_every_other": "every_other"}
GEMM_TYPES = ("normal", "contiguous", "masked")
B_SCALES = ("128x128", "1x128")  # B's scale granularity: per 128x128 weight block, or per row and K group (wgrad)
SPLIT_K = tuple(range(1, 9))  # CTAs sharing a tile's K blocks: a cluster of up to the portable cluster size
CONTIGUOUS_ALIGNMENT = 128  # rows: every group of an m-grouped contiguous A starts at a multiple of this
# FP32 registers a math thread may spend on totals, accumulators and column scales: 256x128 forward tiles (192)
# fit under setmaxnreg 232 with their addresses; 256x144 (216) did not
MATH_REGISTER_BUDGET = 200
SWAP_AB_BLOCK_M = (8, 16, 32, 64)  # wgmma's N when A's rows are: a power of two (the scheduler's shifts)


@dataclass(frozen=True)
class KernelConfig:
    block_m: int = 128
    block_n: int = 128
    stages: int = 5
    producer: str = "warpgroup"
    registers: tuple[int, int] | None = (40, 232)
    persistent: bool = True
    raster_group: int = 16
    epilogue: str = "tma"
    multicast: int = 1
    multicast_operand: str = "a"
    post_passes: tuple[str, ...] = ()
    gemm_type: str = "normal"
    out_dtype: str = "bf16"
    accumulate: bool = False
    d_buffer: tuple[int, int] | None = None
    pdl: bool = False  # programmatic dependent launch: the prologue overlaps the previous kernel's tail
    b_scales: str = "128x128"
    split_k: int = 1
    # split-K: ranks 1.. push their totals into rank 0's shared memory with st.async, completed on a barrier there,
    # instead of a cluster barrier after which rank 0 reads them remotely (see the module docstring)
    split_k_push: bool = False
    # split-K: rank 0 (the CTA that adds the partials and stores D) takes this many K blocks more than an even
    # share and its peers share the rest, so that their partials arrive while it still multiplies (k_share)
    split_k_lead: int = 0
    # the math warpgroup's A offset broadcast from lane 0 (shfl.sync), so ptxas builds its wgmma descriptors on the
    # uniform datapath; False: computed from %tid per thread (the ablation, docs/benchmarks.md)
    uniform_offsets: bool = True
    # the math warps test the next stage's full barrier (mbarrier.test_wait) right after releasing this one, before
    # the promotion FFMAs, and skip the blocking wait when it has already completed; False: they poll after. With
    # accumulators=2 the next stage is waited for before the promotion anyway, and this field changes nothing
    early_poll: bool = True
    # wgmma accumulator sets per math warpgroup: 2 issues K block k+1's wgmmas before K block k's promotion, so two
    # K blocks are in flight (see the module docstring)
    accumulators: int = 1
    # K blocks of B the producer asks L2 for ahead of its loads (cp.async.bulk.prefetch.tensor); 0: none
    l2_prefetch: int = 0
    # B's rows as wgmma's 64-row side and A's BLOCK_M rows as its N (see the module docstring)
    swap_ab: bool = False
    # persistent: launch ceil(tiles / waves) CTAs instead of one per SM, so every CTA walks the same number of tiles
    # (DeepGEMM's "minimal number of SMs"); the generated kernel is the same, only the grid changes
    even_waves: bool = False
    # a tile's coordinates by shifts where the raster group (or, without one, the N blocks) is a power of two that
    # divides the N blocks: one div.u32 instead of two per tile (ptxas emits a reciprocal sequence of about ten
    # instructions for each, on the path from one tile to the next)
    raster_shifts: bool = False
    # persistent dense walk: the next tile's B scales are read from global memory into registers before this tile's
    # epilogue, so the load's latency runs under the epilogue instead of at the next tile's start (128x128 B scales)
    prefetch_b_scales: bool = False
    # the tile's first K block is taken out of the K loop and its promotion writes the totals (total = partial *
    # scale, an FMUL) instead of adding to totals zeroed at the tile's start: a tile's BLOCK_N/2 x waves MOVs fewer
    first_block_assigns: bool = False
    # where the stages divide the K blocks or the K blocks divide the stages, each K block's ring slot is its tile's
    # first slot plus a compile-time offset: the math K loop is unrolled over a round of the ring, so the slot
    # addresses and the ring's stage counter leave the per-K-block path (DeepGEMM's compile-time stage index)
    constant_stages: bool = False
    # L2 eviction priority of the producer's TMA loads of A (and sa) and of B (and sb): "normal" emits no cache hint
    # (the PTX of a config without these fields); "first" marks an operand the kernel reads once (a decode weight
    # stream), so that its lines are the first its own later lines replace and the stream recycles them instead of
    # evicting what else the L2 holds (dirty lines, whose write-back would share HBM with the stream); "last" one
    # every CTA re-reads (createpolicy + .L2::cache_hint, ptx.vocab.bulk_copies.create_l2_policy)
    a_eviction: str = "normal"
    b_eviction: str = "normal"
    # persistent dense walk: where this CTA has a next tile, the math warpgroups wait for its first stage and issue
    # its first wave of wgmmas before this tile's epilogue, so the tensor cores run under the epilogue and the next
    # tile's start (B scales, zeroed totals) instead of idling there; that K block then skips its wait and its
    # first wave's issue
    overlap_epilogue: bool = False
    # with overlap_epilogue: the wave is issued after the epilogue has written the tile to shared memory (the stage
    # has had that long to land) instead of before the epilogue; it still runs under the fence, the barriers and
    # the next tile's start
    overlap_after_writes: bool = False

    def __post_init__(self):
        if self.swap_ab:
            self._check_swap_ab()
        elif self.block_m not in (64, 128, 256):
            raise ValueError(f"block_m must be 64 (one math warpgroup), 128 (two) or 256 (two, two waves each), "
                             f"got {self.block_m}")
        if self.block_n % 8 or not 8 <= self.block_n <= 256:
            raise ValueError(f"block_n must be a multiple of 8 in 8..256 (wgmma's N), got {self.block_n}")
        if self.accumulators not in (1, 2):
            raise ValueError(f"accumulators must be 1 or 2 (wgmma accumulator sets per math warpgroup), "
                             f"got {self.accumulators}")
        if self.block_n > 128 and math.gcd(self.block_n, 128) != self.block_n - 128 and self.b_scales == "128x128":
            raise ValueError(f"block_n={self.block_n}: a tile may span at most two 128-wide B-scale blocks, which "
                             "for BLOCK_N > 128 needs gcd(BLOCK_N, 128) == BLOCK_N - 128 (144, 160, 192, 256)")
        if self.producer == "inline" and 128 % self.block_n:
            raise ValueError(f"the inline producer (stage 06) reads one B scale per K block: block_n must divide "
                             f"128, got {self.block_n}")
        if self.producer not in ("inline", "warpgroup"):
            raise ValueError(f"producer must be 'inline' or 'warpgroup', got {self.producer!r}")
        if self.producer == "inline" and (self.persistent or self.registers):
            raise ValueError("the inline producer (stage 06) runs one tile per CTA without setmaxnreg: "
                             "use persistent=False, registers=None, or producer='warpgroup'")
        if self.registers is not None:
            low, high = self.registers
            if low % 8 or high % 8 or not 24 <= low <= high <= 256:
                raise ValueError(f"registers (producer, math) must be multiples of 8 in 24..256, got {self.registers}")
            if low * WARPGROUP + high * self.math_threads > 65536:
                raise ValueError(f"registers {self.registers}: {low}x128 + {high}x{self.math_threads} exceeds the "
                                 "65536 registers of an SM")
        if self.epilogue not in ("staged", "tma"):
            raise ValueError(f"epilogue must be 'staged' or 'tma', got {self.epilogue!r}")
        if self.epilogue == "staged" and self.block_n & (self.block_n - 1):
            raise ValueError(f"the staged epilogue splits a row over a power-of-two number of lanes: block_n must "
                             f"be a power of two, got {self.block_n} (use epilogue='tma')")
        if self.b_scales not in B_SCALES:
            raise ValueError(f"b_scales must be one of {B_SCALES}, got {self.b_scales!r}")
        if self.math_registers_needed > MATH_REGISTER_BUDGET:
            waves = self.block_m // (64 * self.math_warpgroups)
            scales = f" + {self.block_n // 4} B scales" if self.b_scales == "1x128" else ""
            raise ValueError(f"{self.block_m} x {self.block_n} tiles with {self.b_scales} B scales need "
                             f"{waves} x {self.block_n // 2} totals + {self.accumulators} x {self.block_n // 2} "
                             f"accumulators{scales} "
                             f"= {self.math_registers_needed} registers per thread: more than the "
                             f"{MATH_REGISTER_BUDGET} a math thread can hold beside its addresses")
        if not 0 <= self.raster_group <= 65535:  # a group's tile count, G x the other side's blocks, is a u32
            raise ValueError(f"raster_group must be in 0..65535 (blocks per group; 0: no groups), "
                             f"got {self.raster_group}")
        if self.stages < 2:
            raise ValueError(f"stages must be >= 2, got {self.stages}")
        if self.producer == "inline" and self.stages < 3:
            raise ValueError("the inline producer keeps stages - 2 K blocks in flight: it needs stages >= 3")
        if self.multicast not in (1, 2):
            raise ValueError(f"multicast must be 1 or 2 (CTAs per cluster sharing A; larger clusters measured "
                             f"slower in DeepGEMM), got {self.multicast}")
        if self.multicast_operand not in ("a", "b"):
            raise ValueError(f"multicast_operand must be 'a' (the pair shares A's rows) or 'b' (B's columns), "
                             f"got {self.multicast_operand!r}")
        if self.multicast_operand == "b" and (self.multicast != 2 or self.raster_shifts):
            raise ValueError("multicast_operand='b' walks the tiles along M for a 2-CTA pair sharing B: it needs "
                             f"multicast=2 and raster_shifts=False (the shifts divide the N-fastest walk), got "
                             f"multicast={self.multicast}, raster_shifts={self.raster_shifts}")
        if self.multicast == 2 and (self.producer != "warpgroup" or not self.persistent):
            raise ValueError("TMA multicast pairs the tiles of a persistent walk between the two CTAs of a "
                             "cluster: it needs producer='warpgroup' and persistent=True")
        if self.out_dtype not in OUT_BYTES:
            raise ValueError(f"out_dtype must be one of {sorted(OUT_BYTES)}, got {self.out_dtype!r}")
        if self.out_dtype != "bf16" and self.epilogue != "tma":
            raise ValueError(f"out_dtype={self.out_dtype!r} is stored by the TMA epilogue: use epilogue='tma'")
        if self.accumulate and self.out_dtype != "f32":
            raise ValueError("accumulate (D = C + A*B) adds into D in FP32: it needs out_dtype='f32'")
        if self.d_buffer is not None:
            rows, cols = self.d_buffer
            atom = tma_store_box_columns(self.block_n, self.out_bytes)
            if self.epilogue != "tma" or rows not in {self.block_m, 128 if self.block_m == 256 else self.block_m} \
                    or cols not in (self.block_n, atom):
                raise ValueError(f"d_buffer (rows, columns) sizes the TMA epilogue's D buffer: rows {self.block_m} "
                                 f"or one wave (128, for 256-row tiles), columns {self.block_n} or one store atom "
                                 f"({atom}); got {self.d_buffer} with epilogue={self.epilogue!r}")
        unknown = [name for name in self.post_passes if name not in POST_PASSES]
        if unknown:
            raise ValueError(f"post_passes {unknown}: known cubin passes are {sorted(POST_PASSES)}")
        if self.gemm_type not in GEMM_TYPES:
            raise ValueError(f"gemm_type must be one of {GEMM_TYPES}, got {self.gemm_type!r}")
        if self.grouped:
            if self.producer != "warpgroup":
                raise ValueError(f"gemm_type={self.gemm_type!r} needs producer='warpgroup' (the producer reads "
                                 "each tile's group)")
            if self.multicast != 1:
                raise ValueError(f"gemm_type={self.gemm_type!r} with multicast={self.multicast}: the two CTAs of a "
                                 "cluster would have to be in one group at every step, which is not implemented; "
                                 "grouped GEMMs use multicast=1")
            if self.accumulate or self.out_dtype != "bf16":
                raise ValueError(f"gemm_type={self.gemm_type!r} writes a BF16 D (out_dtype='bf16', no accumulate)")
        if self.gemm_type == "contiguous" and CONTIGUOUS_ALIGNMENT % self.block_m:
            raise ValueError(f"gemm_type='contiguous': block_m must divide the groups' alignment "
                             f"({CONTIGUOUS_ALIGNMENT} rows), so that no tile spans two groups; got {self.block_m}")
        if self.b_scales == "1x128" and (self.producer != "warpgroup" or self.grouped):
            raise ValueError("b_scales='1x128' (wgrad) loads B's scales with each stage: it needs "
                             "producer='warpgroup' and gemm_type='normal' (k-grouped wgrad runs one such kernel per "
                             "group)")
        if self.split_k not in SPLIT_K:
            raise ValueError(f"split_k must be one of {SPLIT_K} (CTAs of a cluster sharing a tile's K blocks), "
                             f"got {self.split_k}")
        if self.split_k_push and self.split_k == 1:
            raise ValueError("split_k_push sends split-K partial totals to rank 0: it needs split_k > 1")
        if self.split_k_lead < 0 or self.split_k_lead and self.split_k == 1:
            raise ValueError(f"split_k_lead is the K blocks split-K's rank 0 takes beyond an even share: it needs "
                             f"split_k > 1 and a count >= 0, got split_k_lead={self.split_k_lead} with "
                             f"split_k={self.split_k}")
        if self.split_k > 1 and (self.persistent or self.producer != "warpgroup" or self.multicast != 1
                                 or self.grouped or self.b_scales != "128x128"):
            raise ValueError("split_k > 1 gives each cluster one tile of the dense forward GEMM: it needs "
                             "persistent=False, producer='warpgroup', multicast=1, gemm_type='normal' and "
                             "b_scales='128x128'")
        if self.prefetch_b_scales and (not self.persistent or self.grouped or self.b_scales != "128x128"):
            raise ValueError("prefetch_b_scales=True fetches the next tile's 128x128 B scales of a persistent dense "
                             "walk: it needs persistent=True, gemm_type='normal' and b_scales='128x128'")
        if (self.first_block_assigns or self.constant_stages) and (self.producer != "warpgroup"
                                                                   or self.accumulators != 1):
            raise ValueError("first_block_assigns and constant_stages shape the math warpgroups' K loop of one K block "
                             "in flight: they need producer='warpgroup' and accumulators=1")
        if self.constant_stages and (self.split_k > 1 or self.runtime_k):
            raise ValueError("constant_stages unrolls the K loop over the ring's stages for a compile-time K-block "
                             "count: it needs split_k=1 and b_scales='128x128' (K known when the kernel is built)")
        if self.even_waves and (not self.persistent or self.gemm_type == "masked"):
            raise ValueError("even_waves=True sizes a persistent grid by its tile count: it needs persistent=True and "
                             "a tile count known on the host (not gemm_type='masked')")
        if self.accumulators == 2 and (self.block_m > 128 or self.producer != "warpgroup"
                                       or self.b_scales != "128x128"):
            raise ValueError("accumulators=2 keeps two K blocks of one 64-row wave in flight: it needs block_m <= 128 "
                             "(one wave per warpgroup), producer='warpgroup' and b_scales='128x128'")
        if not 0 <= self.l2_prefetch <= 64 or self.l2_prefetch and (self.producer != "warpgroup" or self.grouped):
            raise ValueError(f"l2_prefetch (K blocks of B asked of L2 ahead of the loads) must be in 0..64, with "
                             f"producer='warpgroup' and gemm_type='normal'; got {self.l2_prefetch}")
        for name in ("a_eviction", "b_eviction"):
            if getattr(self, name) not in L2_EVICTION:
                raise ValueError(f"{name} must be one of {L2_EVICTION} (an L2 eviction priority), "
                                 f"got {getattr(self, name)!r}")
        if (self.a_eviction, self.b_eviction) != ("normal", "normal") and self.producer != "warpgroup":
            raise ValueError("a_eviction and b_eviction set the cache hint of the producer warpgroup's loads: they "
                             "need producer='warpgroup'")
        if self.overlap_epilogue and (not self.persistent or self.gemm_type != "normal" or self.swap_ab
                                      or self.producer != "warpgroup" or self.accumulators != 1
                                      or not self.early_poll or self.constant_stages
                                      or self.prefetch_b_scales or self.b_scales != "128x128"
                                      or self.epilogue != "tma" or self.d_buffer_shape != (self.block_m, self.block_n)):
            raise ValueError("overlap_epilogue=True issues the next tile's first wgmmas of a persistent dense walk "
                             "before this tile's epilogue: it needs persistent=True, gemm_type='normal', swap_ab=False, "
                             "producer='warpgroup', accumulators=1, early_poll=True (its test says the stage has "
                             "landed), b_scales='128x128', epilogue='tma' with the whole tile in one pass "
                             "(d_buffer=None: a later pass's wait for the stores would complete the wave), and constant_stages and "
                             "prefetch_b_scales off")
        if self.overlap_after_writes and not self.overlap_epilogue:
            raise ValueError("overlap_after_writes=True says where overlap_epilogue issues the next tile's first wave: "
                             "it needs overlap_epilogue=True")
        if self.gemm_type == "masked" and not self.persistent:
            raise ValueError("gemm_type='masked' walks the groups' tiles in a persistent loop (their count is only "
                             "known on the device): it needs persistent=True")

    def _check_swap_ab(self) -> None:
        if self.block_m not in SWAP_AB_BLOCK_M or self.block_n not in (64, 128):
            raise ValueError(f"swap_ab: block_m is wgmma's N, one of {SWAP_AB_BLOCK_M} (a power of two, the tile "
                             f"scheduler divides by shifts), and block_n the weight rows, 64 or 128 (one or two math "
                             f"warpgroups of 64); got {self.block_m}x{self.block_n}")
        if self.gemm_type == "contiguous":
            raise ValueError("swap_ab takes gemm_type='normal' or 'masked', got 'contiguous': the contiguous layout "
                             f"pads every group to {CONTIGUOUS_ALIGNMENT} rows and serves groups of hundreds of "
                             "tokens (prefill, training), so its tiles have no missing rows for an 8-32-row token "
                             "tile to skip (swap AB's only gain); it is neither tested nor measured swapped")
        needs = {"producer": ("warpgroup", "the warpgroup producer"),
                 "b_scales": ("128x128", "the weight's block scales, one per 64-row warpgroup"),
                 "multicast": (1, "no cluster pair"), "epilogue": ("tma", "the TMA epilogue's transposed stmatrix"),
                 "out_dtype": ("bf16", "a BF16 D"), "accumulate": (False, "a BF16 D, overwritten"),
                 "d_buffer": (None, "the whole D tile"), "accumulators": (1, "one accumulator set"),
                 "l2_prefetch": (0, "no L2 prefetch")}
        for field, (wanted, why) in needs.items():
            if getattr(self, field) != wanted:
                raise ValueError(f"swap_ab (the decode kernel) needs {field}={wanted!r} ({why}), "
                                 f"got {getattr(self, field)!r}")

    @property
    def cluster_size(self) -> int:
        """CTAs per thread-block cluster: the multicast pair or the split-K group (1: no cluster)."""
        return max(self.multicast, self.split_k)

    @property
    def grouped(self) -> bool:
        return self.gemm_type != "normal"

    @property
    def runtime_k(self) -> bool:
        """K is a kernel parameter (1x128 B scales: wgrad's K is the token count), not a compile-time constant."""
        return self.b_scales == "1x128"

    @property
    def math_registers_needed(self) -> int:
        """Per-thread FP32 registers of the math loop: the totals of every wave, the wgmma accumulator sets and,
        with 1x128 B scales, the thread's BLOCK_N/4 column scales."""
        if self.swap_ab:  # one wave; the column scales are the tile's BLOCK_M token scales
            return (1 + self.accumulators) * self.block_m // 2 + self.block_m // 4
        waves = self.block_m // (64 * self.math_warpgroups)
        return ((waves + self.accumulators) * self.block_n // 2
                + (self.block_n // 4 if self.b_scales == "1x128" else 0))

    @property
    def d_buffer_shape(self) -> tuple[int, int]:
        return self.d_buffer or (self.block_m, self.block_n)

    @property
    def out_bytes(self) -> int:
        return OUT_BYTES[self.out_dtype]

    @property
    def math_warpgroups(self) -> int:
        return self.block_n // 64 if self.swap_ab else min(self.block_m // 64, 2)

    @property
    def math_threads(self) -> int:
        return WARPGROUP * self.math_warpgroups

    @property
    def threads(self) -> int:
        return self.math_threads + (WARPGROUP if self.producer == "warpgroup" else 0)

    @property
    def uniform_scale_b(self) -> bool:
        """Every tile lies inside one 128-wide B-scale block (BLOCK_N divides 128): one B scale per K block."""
        return 128 % self.block_n == 0

    @property
    def former_groups_variants(self) -> tuple[int, ...]:
        """The 8-column groups a tile takes from its first B-scale block, over every tile position: the tile's
        n0 % 128 is a multiple of gcd(BLOCK_N, 128), so few values occur and each gets its own compiled K loop
        (the switch point is a compile-time constant there, as in DeepGEMM's num_former_iters)."""
        if self.uniform_scale_b:
            return (self.block_n // 8,)
        step = math.gcd(self.block_n, 128)
        return tuple(sorted({min(self.block_n, 128 - offset) // 8 for offset in range(0, 128, step)}))

    def replace(self, **changes) -> "KernelConfig":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        fields = [f"{self.block_m}x{self.block_n}", f"{self.stages} stages", f"{self.producer} producer"]
        if self.registers:
            fields.append("setmaxnreg {}/{}".format(*self.registers))
        walk = "".join(note for on, note in ((self.even_waves, ", even waves"), (self.raster_shifts, ", by shifts"),
                                             (self.prefetch_b_scales, ", B scales fetched a tile ahead")) if on)
        fields.append(f"persistent (raster group {self.raster_group}{walk})" if self.persistent else "one CTA per tile")
        fields.append(f"{self.epilogue} epilogue")
        if self.multicast > 1:
            fields.append(f"{self.multicast_operand.upper()} multicast to {self.multicast} CTAs")
        if self.d_buffer_shape != (self.block_m, self.block_n):
            rows, cols = self.d_buffer_shape
            fields.append(f"D through a {rows}x{cols} buffer in {self.block_m * self.block_n // (rows * cols)} passes")
        if self.out_dtype != "bf16" or self.accumulate:
            fields.append(f"{self.out_dtype} out" + (", D += A*B" if self.accumulate else ""))
        fields += [f"pass {name}" for name in self.post_passes]
        if self.pdl:
            fields.append("programmatic dependent launch")
        if self.b_scales != "128x128":
            fields.append(f"{self.b_scales} B scales")
        if self.split_k > 1:
            fields.append(f"K split over {self.split_k} CTAs" + (", partials pushed (st.async)" if self.split_k_push
                                                                   else ""))
            if self.split_k_lead:
                # the bound in lead_share_end depends on K, which a config does not know
                fields.append(f"rank 0 takes up to {self.split_k_lead} more K blocks")
        if not self.uniform_offsets:
            fields.append("per-thread A offsets")
        if not self.early_poll and self.producer == "warpgroup" and self.accumulators == 1:
            fields.append("full barrier polled after the promotion")
        if self.accumulators == 2:
            fields.append("two K blocks in flight")
        if self.swap_ab:
            fields.append("swap AB (B rows as wgmma M)")
        if self.first_block_assigns:
            fields.append("first K block assigns the totals")
        if self.constant_stages:
            fields.append("ring slots at compile-time offsets")
        if self.overlap_epilogue:
            fields.append("next tile's first wave issued " + ("after the epilogue's shared writes"
                                                              if self.overlap_after_writes else "before the epilogue"))
        if self.l2_prefetch:
            fields.append(f"B prefetched {self.l2_prefetch} K blocks ahead into L2")
        fields += [f"{operand} loaded evict_{priority} in L2" for operand, priority in
                   (("A", self.a_eviction), ("B", self.b_eviction)) if priority != "normal"]
        if self.grouped:
            fields.insert(0, f"m-grouped {self.gemm_type}")
        return ", ".join(fields)


def tma_store_box_columns(block_n: int, out_bytes: int = 2) -> int:
    """Columns of one TMA-store box: a 128B-swizzled atom (64 BF16 or 32 FP32) when BLOCK_N allows, else the whole
    (unswizzled) row."""
    atom = SWIZZLE_ROW_BYTES // out_bytes
    return atom if block_n % atom == 0 else block_n


@dataclass(frozen=True)
class SharedPlan:
    """Byte offsets of everything in dynamic shared memory (from the 1024-aligned base)."""
    config: KernelConfig
    n: int
    k: int | None

    @property
    def kb(self) -> int:
        """K blocks, a compile-time constant; a runtime-K config (``config.runtime_k``) has none (k is None)."""
        if self.k is None:
            raise ValueError(f"{self.config.describe()} takes K at run time: its plan has no K-block count")
        return ceil_div(self.k, BLOCK_K)  # a last partial block is zero-filled by TMA

    @property
    def a_tile(self) -> int:
        return self.config.block_m * BLOCK_K

    @property
    def b_tile(self) -> int:
        return self.config.block_n * BLOCK_K

    @property
    def sa_tile(self) -> int:
        return 4 * self.config.block_m

    @property
    def sa_tile_pitch(self) -> int:
        """Stage-to-stage distance of the A-scale tiles: a TMA destination is 128-byte aligned (BLOCK_M >= 32
        keeps them back to back; swap_ab's 8 and 16 rows pad)."""
        return -(-self.sa_tile // 128) * 128

    @property
    def sb_tile(self) -> int:
        """Bytes of a stage's B scales (1x128: BLOCK_N floats; 128x128: none, they are read once per tile)."""
        return 4 * self.config.block_n if self.config.b_scales == "1x128" else 0

    @property
    def sb_tile_pitch(self) -> int:
        """Stage-to-stage distance of the B-scale tiles: a TMA destination must be 128-byte aligned."""
        return -(-self.sb_tile // 128) * 128

    @property
    def stage_bytes(self) -> int:
        """What one stage's full barrier expects: the A and B tiles, A's scales (and, 1x128, B's)."""
        return self.a_tile + self.b_tile + self.sa_tile + self.sb_tile

    @property
    def b_region(self) -> int:
        return self.config.stages * self.a_tile

    @property
    def sa_region(self) -> int:
        return self.b_region + self.config.stages * self.b_tile

    @property
    def d_bytes(self) -> int:
        """The epilogue's own tile; 0 when it reuses the ring (one tile per CTA: the ring is idle by then)."""
        c = self.config
        if c.epilogue == "tma":
            rows, cols = c.d_buffer_shape
            return rows * cols * c.out_bytes
        return c.block_m * staging_pitch(c.block_n) if c.persistent else 0

    @property
    def sb_stage_region(self) -> int:
        """The stages' B-scale tiles (1x128 only; empty otherwise), 128-byte aligned."""
        return -(-(self.sa_region + self.config.stages * self.sa_tile_pitch) // 128) * 128

    @property
    def d_region(self) -> int:
        end = self.sb_stage_region + self.config.stages * self.sb_tile_pitch
        return -(-end // 1024) * 1024  # the swizzled D atoms need 1024-byte alignment

    @property
    def sb_region(self) -> int:
        return self.d_region + self.d_bytes

    @property
    def sb_rows(self) -> int:
        """B-scale rows a tile needs: one, or two when BLOCK_N does not divide 128."""
        return 1 if self.config.uniform_scale_b else 2

    @property
    def sb_bytes(self) -> int:
        """The tile's B scales (one per K block and row), read once per tile by the warpgroup-producer kernels."""
        if self.config.producer != "warpgroup" or self.config.b_scales == "1x128":
            return 0
        return -(-4 * self.kb * self.sb_rows // 16) * 16

    @property
    def full_region(self) -> int:
        return self.sb_region + self.sb_bytes

    @property
    def empty_region(self) -> int:
        return self.full_region + 8 * self.config.stages

    @property
    def inbox_barrier(self) -> int:
        """split_k_push: the barrier rank 0's inbox completes on (8 bytes after the empty barriers)."""
        return self.empty_region + 8 * self.config.stages

    @property
    def inbox_region(self) -> int:
        """split_k_push: rank 0's inbox, one CTA's partials per peer (rank r's at (r - 1) * partials_bytes)."""
        return -(-(self.inbox_barrier + 8) // 16) * 16

    @property
    def inbox_bytes(self) -> int:
        return (self.config.split_k - 1) * self.partials_bytes if self.config.split_k_push else 0

    @property
    def shared_bytes(self) -> int:
        if self.config.split_k_push:
            return self.inbox_region + self.inbox_bytes + ALIGN_SLACK
        return self.empty_region + 8 * self.config.stages + ALIGN_SLACK

    @property
    def staging(self) -> int:
        """Offset of the staged epilogue's tile: its own region when persistent, else the (idle) A ring."""
        return self.d_region if self.d_bytes else 0

    def check(self) -> None:
        c = self.config
        if self.shared_bytes > SHARED_LIMIT:
            raise ValueError(f"{c.describe()} at K={self.k or 'any'} needs {self.shared_bytes} bytes of shared memory, "
                             f"more than the {SHARED_LIMIT} a block may have: use fewer stages")
        if c.epilogue == "staged" and not self.d_bytes and c.block_m * staging_pitch(c.block_n) > self.b_region:
            raise ValueError(f"{c.describe()}: the staged epilogue tile does not fit in the A ring; add stages")
        if c.split_k > 1 and not c.split_k_push and self.partials_bytes > self.sa_region:
            raise ValueError(f"{c.describe()}: a CTA's partial totals ({self.partials_bytes} bytes) do not fit in "
                             f"its ring ({self.sa_region} bytes of A and B tiles); add stages")
        if c.split_k > 1 and self.k and self.kb < c.split_k:
            raise ValueError(f"{c.describe()}: K={self.k} has {self.kb} K blocks, fewer than the {c.split_k} CTAs "
                             "that would share them; use a smaller split_k")
        if c.constant_stages and self.k and self.kb % c.stages and c.stages % self.kb:
            raise ValueError(f"{c.describe()}: K={self.k} has {self.kb} K blocks; constant_stages needs the "
                             f"{c.stages} stages to divide them or them to divide the stages (a divisor or a "
                             f"multiple of {self.kb} as stages, or constant_stages=False)")

    @property
    def partials_bytes(self) -> int:
        """Split-K: one CTA's FP32 totals, written into its ring (offset 0) for rank 0 to read."""
        return self.config.block_m * self.config.block_n * 4


def max_stages(config: KernelConfig, n: int, k: int, limit: int = 12, budget: int = SHARED_LIMIT) -> int:
    """The most stages that fit ``budget`` bytes of shared memory (at most ``limit``)."""
    best = 0
    for stages in range(3 if config.producer == "inline" else 2, limit + 1):
        plan = SharedPlan(config.replace(stages=stages), n, k)
        if plan.shared_bytes <= budget:
            best = stages
    return best


def tiles(config: KernelConfig, m: int, n: int) -> int:
    return ceil_div(m, config.block_m) * ceil_div(n, config.block_n)


def k_share(rank: int, split_k: int, k_blocks: int, lead: int = 0) -> tuple[int, int]:
    """Split-K: the K blocks [first, end) that cluster rank ``rank`` of ``split_k`` computes of a tile's
    ``k_blocks``: rank * Kb / S rounded down to (rank + 1) * Kb / S, so the shares tile [0, Kb) in order, differ
    by at most one block and none is empty while Kb >= S. The generator emits this in PTX (``_Kernel.setup``).

    ``lead`` (``KernelConfig.split_k_lead``): rank 0 takes E = Kb // S + lead blocks, at most Kb - (S - 1) so that
    no peer's share is empty, and ranks 1.. share the other R = Kb - E evenly the same way: rank r >= 1 computes
    [E + (r - 1) * R / (S - 1), E + r * R / (S - 1))."""
    if not lead:
        return rank * k_blocks // split_k, (rank + 1) * k_blocks // split_k
    first_end = lead_share_end(split_k, k_blocks, lead)
    rest, peers = k_blocks - first_end, split_k - 1
    if rank == 0:
        return 0, first_end
    return first_end + (rank - 1) * rest // peers, first_end + rank * rest // peers


def lead_share_end(split_k: int, k_blocks: int, lead: int) -> int:
    """The end of rank 0's share under ``split_k_lead`` = ``lead`` (:func:`k_share`): Kb // S + lead, bounded so
    that every peer keeps at least one K block."""
    return max(1, min(k_blocks // split_k + lead, k_blocks - (split_k - 1)))


def widest_split(tile_count: int, k_blocks: int, sm_count: int, largest: int = 8, powers_of_two: bool = True) -> int:
    """The most CTAs (up to ``largest``; a power of two unless ``powers_of_two`` is False) that may share each
    tile's K blocks so that every CTA has an SM of its own and at least one K block: 1 where the tiles alone fill
    the SMs."""
    choices = (s for s in SPLIT_K if s <= largest and (not powers_of_two or is_power_of_two(s)))
    return max((s for s in choices if s * tile_count <= sm_count and s <= k_blocks), default=1)


__all__ = ["KernelConfig", "SharedPlan", "GEMM_TYPES", "B_SCALES", "SPLIT_K", "CONTIGUOUS_ALIGNMENT",
           "BLOCK_K", "WARPGROUP", "SHARED_LIMIT", "staging_pitch",
           "tma_store_box_columns", "max_stages", "tiles", "k_share", "lead_share_end", "widest_split"]
