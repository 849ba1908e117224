"""``generate(config, n, k) -> PTX``: the production kernel, assembled from its emitters.

One kernel per (config, N, K); M arrives as a parameter, so every M reuses it (the scheduler computes the
M-block count at run time, TMA zero-fills rows past M on load and clips them on store, the staged epilogue
masks them). The pieces, each in its own module:

* :mod:`gemm.kernel.producer`: the TMA ring and its producer (inline thread 0, or a producer warpgroup);
* :mod:`gemm.kernel.math_warpgroups`: the math warpgroups (wgmma + promotion);
* :mod:`gemm.kernel.tile_scheduler`: which tiles a CTA computes, in which order;
* :mod:`gemm.kernel.epilogue`: totals -> BF16 D (staged ``st.global``, or ``stmatrix`` + TMA store).

Thread layout: the math warpgroups come first (threads 0 .. math_threads-1, so a math thread's index is its
``%tid.x``), the producer warpgroup, if any, last. Kernel parameters: the tensor maps of A, B and sa (and of
D for the TMA epilogue), the sb and D pointers, and M (1x128 B scales, wgrad: sb by tensor map instead of pointer,
and the K-block count ``k_blocks``); the grouped GEMMs (``config.gemm_type``) add the
``grouped_layout`` pointer (m_indices or masked_m, int32) and G. For them M is the rows of A (contiguous: sum of
the groups' rows) or of one group (masked: M_max), B's map has G*N rows, sb is G blocks of ceil(N/128) x K/128.
"""
from __future__ import annotations

import functools

from gemm.fp8 import ceil_div
from gemm.kernel.config import KernelConfig, SharedPlan, lead_share_end
from gemm.kernel.epilogue import StagedEpilogue, TmaEpilogue, math_barrier
from gemm.kernel.seams import NO_SEAMS, Seams
from gemm.kernel.math_warpgroups import ColumnScales, MathWarpgroups, PreIssued
from gemm.kernel.producer import InlineProducer, Ring, Stage, WarpgroupProducer
from gemm.kernel.tile_scheduler import TileScheduler
from ptx.builder import KernelBuilder, module
from ptx.vocab import barriers, bulk_copies, core, shared_memory
from ptx.vocab import wgmma as w

KERNEL = "fp8_gemm"
SMEM = "smem"


def kernel_params(config: KernelConfig) -> list[tuple[str, str]]:
    """1x128 B scales (wgrad) come by tensor map (``tmap_sb``) instead of the ``sb`` pointer, and K as ``k_blocks``."""
    row_scales = config.b_scales == "1x128"
    maps = ["tmap_a", "tmap_b", "tmap_sa"] + (["tmap_sb"] if row_scales else []) + \
        (["tmap_d"] if config.epilogue == "tma" else [])
    pointers = [("u64", "d")] if row_scales else [("u64", "sb"), ("u64", "d")]
    grouped = [("u64", "grouped_layout"), ("u32", "groups")] if config.grouped else []
    k_blocks = [("u32", "k_blocks")] if config.runtime_k else []
    return [("tmap", name) for name in maps] + pointers + [("u32", "m")] + k_blocks + grouped


def compiled_k(config: KernelConfig, k: int) -> int | None:
    """The K a kernel is generated for: ``k``, or None for a runtime-K config (one kernel serves every K)."""
    return None if config.runtime_k else k


def check_problem(config: KernelConfig, n: int, k: int | None) -> SharedPlan:
    if config.runtime_k:
        if k is not None:
            raise ValueError(f"{config.describe()} takes K at run time: generate it with k=None "
                             "(gemm.kernel.generator.compiled_k)")
    elif n <= 0 or k is None or k <= 0 or k % 16:
        raise ValueError(f"the generator needs N > 0 and K a positive multiple of 16 (TMA's 16-byte rows; the last "
                         f"128-wide K block is zero-filled), got N={n}, K={k}")
    elif k % 128 and config.producer == "inline":
        raise ValueError(f"the inline producer (stage 06) needs K a multiple of 128, got K={k}")
    if n <= 0:
        raise ValueError(f"the generator needs N > 0, got N={n}")
    if config.epilogue == "tma" and n * config.out_bytes % 16:
        raise ValueError(f"the TMA-store epilogue needs 16-byte rows of D (N % {16 // config.out_bytes} == 0 for "
                         f"{config.out_dtype}), got N={n}: use epilogue='staged' (BF16)")
    plan = SharedPlan(config, n, k)
    plan.check()
    return plan


class _Kernel:
    def __init__(self, plan: SharedPlan, seams: Seams = NO_SEAMS):
        self.plan, self.config, self.seams = plan, plan.config, seams
        self.pre_issued = self.full_known = None  # KernelConfig.overlap_epilogue's registers (math_body)
        self.b = KernelBuilder(KERNEL, params=kernel_params(self.config), max_threads=self.config.threads,
                               min_blocks_per_sm=1,
                               cluster=(self.config.cluster_size, 1, 1) if self.config.cluster_size > 1 else None)

    def setup(self) -> None:
        b, e, r, c = self.b, self.b.emit, self.b.reg, self.config
        self.tid, self.smem, self.m = r("u32", "tid"), r("u32", "smem"), r("u32", "m")
        e(f"mov.u32 {self.tid}, %tid.x;", shared_memory.shared_address_of(self.smem, SMEM),
          # TMA's 128B swizzle and wgmma's descriptors both assume 1024-byte aligned tiles
          f"add.u32 {self.smem}, {self.smem}, 1023;", f"and.b32 {self.smem}, {self.smem}, -1024;",
          f"ld.param.u32 {self.m}, [{b.param('m')}];")
        self.tmaps = {}
        for kind, name in kernel_params(c):
            if kind == "tmap":
                self.tmaps[name] = r("u64", name)
                e(bulk_copies.tensormap_address(self.tmaps[name], b.param(name)))
        self.sb = None  # 1x128 B scales come by tensor map
        if c.b_scales == "128x128":
            self.sb = r("u64", "ptr_sb")
        self.d = r("u64", "ptr_d")
        if self.sb:
            e(core.global_pointer_param(self.sb, b.param("sb")))
        e(core.global_pointer_param(self.d, b.param("d")))
        self.k_blocks = str(self.plan.kb) if not c.runtime_k else r("u32", "k_blocks")
        if c.runtime_k:
            e(f"ld.param.u32 {self.k_blocks}, [{b.param('k_blocks')}];")
        self.k_first, self.rank = "0", None
        if c.split_k > 1:  # this CTA's K blocks (config.k_share: even shares, or rank 0 ahead by split_k_lead)
            self.rank, self.k_first, k_end = r("u32", "rank"), r("u32", "k_first"), r("u32", "k_end")
            e(core.cluster_rank(self.rank))
            if self.seams.k_share is not None and c.split_k_lead:
                raise ValueError(f"a k_share seam gives every rank's share itself: it takes a config without "
                                 f"split_k_lead (got split_k_lead={c.split_k_lead}), or the lead would be ignored")
            if self.seams.k_share is not None:  # a caller's shares (gemm.kernel.seams), else the generator's
                self._k_share_table(self.seams.k_share, k_end)
            elif c.split_k_lead:
                self._lead_shares(k_end)
            else:
                e(f"mul.lo.u32 {self.k_first}, {self.rank}, {self.plan.kb};",
                  f"add.u32 {k_end}, {self.k_first}, {self.plan.kb};",
                  core.divide_by_constant(self.k_first, self.k_first, c.split_k),
                  core.divide_by_constant(k_end, k_end, c.split_k))
            self.k_blocks = k_end
        self.layout = self.groups = None
        if c.grouped:
            self.layout, self.groups = r("u64", "ptr_layout"), r("u32", "groups")
            e(core.global_pointer_param(self.layout, b.param("grouped_layout")),
              f"ld.param.u32 {self.groups}, [{b.param('groups')}];")
        self.ring = Ring(b, self.plan, self.smem, {k: v for k, v in self.tmaps.items() if k != "tmap_d"},
                         self.k_blocks)
        self.inbox = None
        if c.split_k_push:  # rank 0's inbox barrier: one arrival (its expect_tx) and the peers' message bytes
            self.inbox = r("u32", "inbox_bar")
            e(f"add.u32 {self.inbox}, {self.smem}, {self.plan.inbox_barrier};")
        first = r("pred", "p_first")
        skip = b.label("init_done")
        e(f"setp.eq.u32 {first}, {self.tid}, 0;", f"@!{first} bra {skip};")
        if self.inbox:  # initialised before the ring's, so the ring's fence.mbarrier_init covers it too
            e(barriers.mbarrier_init(self.inbox, 1))
        # empty: one arrival per math warp of every CTA that reads the stage's A (both CTAs of a cluster pair)
        arrivals = self.seams.empty_arrivals  # a caller's count (gemm.kernel.seams), else the generator's
        self.ring.init_barriers(empty_arrivals=c.multicast * c.math_threads // 32 if arrivals is None
                                else _arrival_count(arrivals(c.multicast, c.math_threads // 32)))
        if self.inbox:  # rank 0 expects every peer's bytes here, before the start's cluster phase that the peers wait
            # on: the tail has no arrive, and in practice the tx-count does not go below zero (the relaxed arrive orders
            # nothing; either order is correct, as PTX allows a negative count and rank 0's arrive is the phase's one).
            # Not a peer: its own inbox is never used, and a phase left pending at exit is an error on the emulator
            owner, inbox_bytes = r("pred", "p_inbox_owner"), (c.split_k - 1) * self.plan.partials_bytes
            e(f"setp.eq.u32 {owner}, {self.rank}, 0;",
              f"@{owner} " + barriers.mbarrier_arrive_expect_tx(self.inbox, inbox_bytes))
        if "tmap_d" in self.tmaps:
            e(bulk_copies.prefetch_tensormap(self.tmaps["tmap_d"]))
        b.place(skip)
        if c.multicast > 1:  # the peer's barriers must be initialised before anything may arrive on them
            self.rank = r("u32", "rank")
            e(core.cluster_rank(self.rank), barriers.cluster_sync())
        else:
            e(core.bar_sync(0))
        if c.split_k_push:  # the phase a peer waits on before its first message: rank 0's inbox is initialised
            e(barriers.cluster_arrive_relaxed())
        if c.pdl:  # the prologue above touched no global memory: from here on the previous grid must be done
            e(barriers.grid_dependency_wait(), barriers.launch_dependents())

    def epilogue(self, math: MathWarpgroups):
        if self.config.epilogue == "tma":
            return TmaEpilogue(self.b, self.plan, math, self.smem, self.tmaps["tmap_d"], self.d)
        return StagedEpilogue(self.b, self.plan, math, self.smem, self.d, self.m)

    def release(self, math: MathWarpgroups, empty: str, target: str | None = None):
        """Emits a warp's release of a stage: lane 0 arrives on the empty barrier; in a cluster, lanes 0 and 1
        arrive on the barrier in CTA ``target`` (a per-lane rank register: both CTAs' producers wait for it)."""
        def emit():
            lane0 = self.b.reg("pred")
            self.b.emit("bar.warp.sync 0xffffffff;")  # every lane's reads of the stage precede the release
            if target is None:
                self.b.emit(f"setp.eq.u32 {lane0}, {math.lane}, 0;", f"@{lane0} {barriers.mbarrier_arrive(empty)}")
                return
            remote = self.b.reg("u32", "remote_empty")
            self.b.emit(f"setp.lt.u32 {lane0}, {math.lane}, 2;", shared_memory.mapa(remote, empty, target),
                        f"@{lane0} {barriers.mbarrier_arrive_cluster(remote)}")
        return emit

    # -- stage 06: thread 0 produces between its own K blocks -------------------------------------------
    def inline_body(self) -> None:
        b, e, r, p = self.b, self.b.emit, self.b.reg, self.plan
        scheduler = TileScheduler(b, self.config, p.n, self.m, "t", seams=self.seams)
        with scheduler.tiles() as (m0, n0):
            math = MathWarpgroups(b, self.config.block_m, self.config.block_n, self.tid, self.seams,
                                  self.config.uniform_offsets)
            is_producer = r("pred", "p_producer")
            e(f"setp.eq.u32 {is_producer}, {self.tid}, 0;")
            producer = InlineProducer(self.ring, is_producer, m0, n0)
            j, p_stage, p_parity = producer.prologue()
            sb = r("u64", "sb_k")  # sb[n0 // 128, k]: BLOCK_N divides 128, so the tile shares one scale row
            row, wide = r("u32"), r("u64")
            e(f"shr.u32 {row}, {n0}, 7;", f"mul.wide.u32 {wide}, {row}, {p.kb * 4};", f"add.u64 {sb}, {self.sb}, {wide};")
            c_stage, c_parity = self.ring.counters("c")
            kb, more = r("u32", "kb"), r("pred")
            top = b.label("k_block")
            e(f"mov.u32 {kb}, 0;")
            b.place(top)
            producer.refill(j, p_stage, p_parity)
            sb_value = r("f32", "sb")
            e(f"ld.global.nc.f32 {sb_value}, [{sb}];", f"add.u64 {sb}, {sb}, 4;")
            slot = self.ring.stage(c_stage)
            self.ring.wait(slot.full, c_parity, "wait_full")
            math.k_block(slot.a_tile, slot.b_tile, slot.sa_tile, sb_value)
            self.release(math, slot.empty)()
            self.ring.advance(c_stage, c_parity)
            e(f"add.u32 {kb}, {kb}, 1;", f"setp.lt.u32 {more}, {kb}, {p.kb};", f"@{more} bra {top};")
            epilogue = self.epilogue(math)
            epilogue.store(m0, n0)
            epilogue.finish()

    # -- stage 07+: a producer warpgroup and math warpgroups --------------------------------------------
    def math_body(self) -> None:
        b, e, r, p, c = self.b, self.b.emit, self.b.reg, self.plan, self.config
        if c.registers:
            e(w.setmaxnreg(c.registers[1], increase=True))
        math = MathWarpgroups(b, c.block_m, c.block_n, self.tid, self.seams, c.uniform_offsets, c.accumulators,
                              c.swap_ab)
        epilogue = self.epilogue(math)
        sb_tile = r("u32", "sb_tile")
        e(f"add.u32 {sb_tile}, {self.smem}, {p.sb_region};")
        c_stage, c_parity = self.ring.counters("c")
        scheduler = self.scheduler("mt")
        if c.overlap_epilogue:  # one flag and one early-poll result for every K loop variant of the walk
            self.pre_issued, self.full_known = PreIssued(b), r("pred", "p_full_known")
            e(f"setp.ne.u32 {self.pre_issued.flag}, {self.tid}, {self.tid};")  # the first tile: nothing issued
        fetched = None
        if c.prefetch_b_scales:  # the next tile's B scales, fetched into registers before this tile's epilogue
            fetched = ([r("f32", "sb_next") for _ in self._b_scale_chunks()], r("pred", "p_sb_fetched"))
            e(f"setp.ne.u32 {fetched[1]}, {self.tid}, {self.tid};")  # none yet: the first tile fetches its own
        with scheduler.tiles() as (m0, n0):
            if c.b_scales == "128x128":  # 1x128 scales arrive with each stage instead
                self.load_b_scales(math, sb_tile, n0, scheduler.group, fetched)
            if not c.first_block_assigns:  # else the tile's first K block writes them
                math.zero_totals()
            self.release_target = None
            if c.multicast > 1:  # lane l releases CTA l's stage; with no peer at this step, both go to this CTA
                pair = scheduler.pair_flags(self.rank)
                self.release_target = r("u32", "release_rank")  # lane & 1: every lane's mapa names a real CTA
                e(f"and.b32 {self.release_target}, {math.lane}, 1;",
                  f"selp.u32 {self.release_target}, {self.release_target}, {self.rank}, {pair.peer_alive};")
            variants = c.former_groups_variants
            if c.b_scales == "1x128" or len(variants) == 1:
                self.k_loop(math, sb_tile, c_stage, c_parity, None)
            else:  # one K loop per place the tile's B-scale boundary can fall, chosen once per tile
                former, pick, done = r("u32", "former"), r("pred"), b.label("k_loop_done")
                labels = [b.label(f"k_loop_{v}") for v in variants]
                e(f"and.b32 {former}, {n0}, 127;", f"sub.u32 {former}, 128, {former};",
                  f"min.u32 {former}, {former}, {c.block_n};", f"shr.u32 {former}, {former}, 3;")
                for variant, label in zip(variants, labels):
                    e(f"setp.eq.u32 {pick}, {former}, {variant};", f"@{pick} bra {label};")
                for variant, label in zip(variants, labels):
                    b.place(label)
                    self.k_loop(math, sb_tile, c_stage, c_parity, variant)
                    e(f"bra {done};")
                b.place(done)
            if fetched is not None:  # the LDG's latency runs under this tile's epilogue, not the next tile's start
                more, following = scheduler.next_tile()
                skip = b.label("sb_prefetch_done")
                e(f"mov.pred {fetched[1]}, {more};", f"@!{more} bra {skip};")
                self.fetch_b_scales(scheduler.coords(following)[1], fetched[0])
                b.place(skip)
            drained = self.pre_issued is not None  # a TMA epilogue of one pass (KernelConfig.overlap_epilogue)
            if drained:  # before the wgmmas below: ptxas completes them at a bulk wait_group
                epilogue.drain()
            def issue_next():
                self.issue_next_first_wave(math, scheduler, c_stage, c_parity)
            if self.pre_issued is not None and not c.overlap_after_writes:
                issue_next()
            given = None
            if c.split_k > 1:
                given = b.label("partials_given")
                (self.push_partials if c.split_k_push else self.gather_partials)(math, given)
            if scheduler.row_bound is not None:  # masked: rows g*M_max + m0.., stored below the group's count
                epilogue.store(scheduler.a_row, n0, scheduler.row_bound)
            elif drained:
                epilogue.store(m0, n0, drained=True, after_writes=issue_next if c.overlap_after_writes else None)
            else:
                epilogue.store(m0, n0)
        if self.pre_issued is not None:  # the walk's last tile issued nothing ahead, but ptxas cannot tell: without
            e(w.wgmma_wait_group(0))  # this wait on the exit path it completes the wave before the loop's exit test
        epilogue.finish()
        if given:  # rank 0 completes the second phase it arrived on after reading its peers, then exits
            if not c.split_k_push:  # (pushed partials: no second phase; rank 0 waited for its inbox)
                e(barriers.cluster_wait())
            b.place(given)

    def _lead_shares(self, k_end: str) -> None:
        """This CTA's [k_first, k_end) under ``split_k_lead`` (config.k_share with its lead): rank 0 takes [0, E),
        rank r >= 1 [E + (r - 1) * R / (S - 1), E + r * R / (S - 1)) with E and R = Kb - E known at compile time."""
        e, r, c, kb = self.b.emit, self.b.reg, self.config, self.plan.kb
        first_end = lead_share_end(c.split_k, kb, c.split_k_lead)
        rest, peers = kb - first_end, c.split_k - 1
        before, is_first = r("u32", "peer_index"), r("pred")

        def over_peers(value: str) -> list[str]:  # one peer (S = 2): nothing to divide
            return [core.divide_by_constant(value, value, peers)] if peers > 1 else []
        e(f"mul.lo.u32 {k_end}, {self.rank}, {rest};", *over_peers(k_end), f"add.u32 {k_end}, {k_end}, {first_end};",
          f"sub.u32 {before}, {self.rank}, 1;",  # rank 0's value wraps and is not chosen below
          f"mul.lo.u32 {before}, {before}, {rest};", *over_peers(before),
          f"add.u32 {before}, {before}, {first_end};",
          core.setp("eq", "u32", is_first, self.rank, "0"),
          f"selp.u32 {self.k_first}, 0, {before}, {is_first};")

    def _k_share_table(self, function, k_end: str) -> None:
        """This CTA's [k_first, k_end) from a Python ``function(rank, split_k, k_blocks)`` evaluated for every rank,
        kept as a ``.const`` table of packed (first << 16 | end) and read with one ``ld.const`` (the exercise seam).
        Shares must be non-empty and inside [0, Kb): the K loop runs its body at least once, and TMA must not be
        asked for a block past K. Overlapping or missing shares are allowed: they are wrong answers, not faults."""
        e, r, c, kb = self.b.emit, self.b.reg, self.config, self.plan.kb
        values = []
        for rank in range(c.split_k):
            share = function(rank, c.split_k, kb)
            if (type(share) is not tuple or len(share) != 2 or not all(type(x) is int for x in share)
                    or not 0 <= share[0] < share[1] <= kb):
                raise ValueError(f"k_share({rank}, {c.split_k}, {kb}) must be a pair of ints (first, end) with "
                                 f"0 <= first < end <= {kb} (a non-empty run of the tile's K blocks), got {share!r}")
            values.append(share[0] << 16 | share[1])
        table = self.b.const_table("k_share_table", values)
        packed, offset, address = r("u32", "k_share"), r("u64", "k_share_off"), r("u64", "k_share_at")
        e(f"mul.wide.u32 {offset}, {self.rank}, 4;", f"mov.u64 {address}, {table};",
          f"add.s64 {address}, {address}, {offset};", f"ld.const.u32 {packed}, [{address}];",
          f"shr.u32 {self.k_first}, {packed}, 16;", f"and.b32 {k_end}, {packed}, 65535;")

    def _next_full_table(self, c_stage: str, c_parity: str) -> tuple[str, str]:
        """(stage, parity) registers from the seam ``next_full(stage, parity, stages)`` evaluated for every slot and
        parity, kept as a ``.const`` table of packed (stage << 1 | parity) read at index 2 * stage + parity (the
        exercise seam). Each answer must name a slot of the ring and a parity; a wrong one is a wrong answer (the
        test then vouches for a stage it did not look at), not a fault."""
        e, r, stages = self.b.emit, self.b.reg, self.config.stages
        values = []
        for stage in range(stages):
            for parity in (0, 1):
                answer = self.seams.next_full(stage, parity, stages)
                if (type(answer) is not tuple or len(answer) != 2 or not all(type(x) is int for x in answer)
                        or not 0 <= answer[0] < stages or answer[1] not in (0, 1)):
                    raise ValueError(f"next_full({stage}, {parity}, {stages}) must be a pair of ints (stage, parity) "
                                     f"with 0 <= stage < {stages} and parity 0 or 1, got {answer!r}")
                values.append(answer[0] << 1 | answer[1])
        table = self.b.const_table("next_full_table", values)
        index, offset, address, packed = r("u32"), r("u64"), r("u64"), r("u32", "next_full")
        stage, parity = r("u32", "test_stage"), r("u32", "test_parity")
        e(f"mad.lo.u32 {index}, {c_stage}, 2, {c_parity};", f"mul.wide.u32 {offset}, {index}, 4;",
          f"mov.u64 {address}, {table};", f"add.s64 {address}, {address}, {offset};",
          f"ld.const.u32 {packed}, [{address}];", f"shr.u32 {stage}, {packed}, 1;", f"and.b32 {parity}, {packed}, 1;")
        return stage, parity

    def push_partials(self, math: MathWarpgroups, given: str) -> None:
        """Split-K with ``split_k_push``: ranks 1.. wait for the start's cluster phase (rank 0's inbox barrier is
        initialised), send their totals into rank 0's inbox with st.async (thread t's four-total group j at
        16 (j * threads + t) of the rank's slot), completed on rank 0's inbox barrier, and branch to ``given``.
        Rank 0's thread 0 arrived on the barrier at the start, expecting every peer's bytes (``setup``); rank 0's
        math threads wait for the phase, then add each peer's totals, read from their own shared memory, into theirs."""
        b, e, r, c = self.b, self.b.emit, self.b.reg, self.config
        leader, received = r("pred", "p_rank0"), b.label("partials_received")
        groups = _total_groups(math)
        stride, partials = 16 * c.math_threads, self.plan.partials_bytes
        slot = r("u32", "inbox_slot")
        e(f"setp.eq.u32 {leader}, {self.rank}, 0;", f"mad.lo.u32 {slot}, {self.tid}, 16, {self.smem};",
          f"@{leader} bra {received};")
        remote, remote_bar, offset = r("u32", "inbox_at"), r("u32", "inbox_bar_at"), r("u32", "inbox_offset")
        e(f"sub.u32 {offset}, {self.rank}, 1;", f"mad.lo.u32 {offset}, {offset}, {partials}, {self.plan.inbox_region};",
          f"add.u32 {slot}, {slot}, {offset};", barriers.cluster_wait(),
          shared_memory.mapa(remote, slot, 0), shared_memory.mapa(remote_bar, self.inbox, 0),
          *(shared_memory.st_async_v4(remote, group, remote_bar, i * stride) for i, group in enumerate(groups)),
          f"bra {given};")
        b.place(received)
        ready = r("pred")
        e(barriers.mbarrier_wait_parity(self.inbox, 0, ready, b.label("wait_inbox"), cluster=True))
        for peer in range(1, c.split_k):
            at = self.plan.inbox_region + (peer - 1) * partials
            self._add_peer_totals(math, groups, lambda loaded, i: shared_memory.ld_shared_v4(loaded, slot,
                                                                                             at + i * stride))

    def _add_peer_totals(self, math: MathWarpgroups, groups: list, load) -> None:
        """Add one peer's totals into this CTA's, group by group: ``load(registers, i)`` is the instruction that
        reads group i of the peer's into four registers (the idle wgmma accumulators hold them)."""
        for i, group in enumerate(groups):
            first = 4 * (i % (len(math.acc) // 4))
            loaded = math.acc[first:first + 4]
            self.b.emit(load(loaded, i), *(f"add.f32 {total}, {total}, {value};" for total, value in zip(group, loaded)))

    def gather_partials(self, math: MathWarpgroups, given: str) -> None:
        """Split-K: ranks 1.. write their totals into their own ring (thread t's four-total group j at
        16 (j * threads + t): one coalesced row per j), arrive on the cluster barrier and, after a second phase
        that rank 0 completes once it has read them, branch to ``given``. Rank 0 waits for the first phase, then
        adds every peer's totals, read through distributed shared memory, into its own."""
        b, e, r, c = self.b, self.b.emit, self.b.reg, self.config
        leader, written = r("pred", "p_rank0"), b.label("partials_written")
        base = r("u32", "partials")
        e(f"setp.eq.u32 {leader}, {self.rank}, 0;", f"mad.lo.u32 {base}, {self.tid}, 16, {self.smem};")
        groups = _total_groups(math)
        stride = 16 * c.math_threads
        e(f"@{leader} bra {written};")
        if c.math_warpgroups > 1:  # the other warpgroup's wgmmas may still read the ring's last stage
            e(math_barrier(c))
        e(*(shared_memory.st_shared_v4(base, group, i * stride) for i, group in enumerate(groups)),
          barriers.cluster_sync(), barriers.cluster_sync(), f"bra {given};")
        b.place(written)
        e(barriers.cluster_sync())
        for peer in range(1, c.split_k):
            remote = r("u32", "peer_partials")
            e(shared_memory.mapa(remote, base, peer))
            self._add_peer_totals(math, groups, lambda loaded, i, remote=remote:
                                  shared_memory.ld_shared_cluster_v4(loaded, remote, i * stride))
        e(barriers.cluster_arrive())  # the peers may exit once every rank-0 thread has read them

    def scheduler(self, name: str) -> TileScheduler:
        return TileScheduler(self.b, self.config, self.plan.n, self.m, name, self.layout, self.groups,
                             0 if self.config.runtime_k else self.plan.kb, seams=self.seams)

    def k_loop(self, math: MathWarpgroups, sb_tile: str, c_stage: str, c_parity: str, former: int | None) -> None:
        if self.config.accumulators == 2:
            return self.paired_k_loop(math, sb_tile, c_stage, c_parity, former)
        if self.config.constant_stages:
            return self.constant_stage_k_loop(math, sb_tile, c_stage, c_parity, former)
        b, e, r = self.b, self.b.emit, self.b.reg
        kb, more = r("u32", "kb"), r("pred")
        top = b.label("k_block")
        e(f"mov.u32 {kb}, {self.k_first};")
        full_known = None
        if self.pre_issued is not None:  # the first K block's stage was waited for before its wave 0 was issued
            full_known = self.full_known
            e(f"mov.pred {full_known}, {self.pre_issued.flag};")
        elif self.config.early_poll:  # the next stage's full barrier, tested before the promotion: false before the
            full_known = r("pred", "p_full_known")  # tile's first
            e(f"setp.ne.u32 {full_known}, {kb}, {kb};")
        past = None
        if self.config.first_block_assigns:  # the first K block, out of the loop: its promotion writes the totals
            self.rolled_k_block(math, sb_tile, c_stage, c_parity, former, kb, full_known, assign=True)
            past = b.label("k_loop_end")
            e(f"add.u32 {kb}, {kb}, 1;", f"setp.ge.u32 {more}, {kb}, {self.k_blocks};", f"@{more} bra {past};")
        b.place(top)
        self.rolled_k_block(math, sb_tile, c_stage, c_parity, former, kb, full_known)
        e(f"add.u32 {kb}, {kb}, 1;", f"setp.lt.u32 {more}, {kb}, {self.k_blocks};", f"@{more} bra {top};")
        if past:
            b.place(past)

    def rolled_k_block(self, math: MathWarpgroups, sb_tile: str, c_stage: str, c_parity: str, former: int | None,
                       kb: str, full_known: str | None, assign: bool = False) -> None:
        """K block ``kb`` from the ring slot ``c_stage`` (a register): wait for it (unless ``full_known`` says it
        has landed), multiply, release, advance the ring; with early poll, test the next slot's full barrier."""
        e = self.b.emit
        sb_values = self.read_b_scales(sb_tile, kb) if self.config.b_scales == "128x128" else None
        slot = self.ring.stage(c_stage)
        self.wait_full(slot, c_parity, full_known)
        release = self.release(math, slot.empty, self.release_target)
        if full_known is not None:
            def release_and_test_next():
                """Release this stage, step the ring, and test the next stage's full barrier: its result is
                wanted only after this K block's promotion FFMAs, which hide the test's latency."""
                release()
                tested = self._next_full_table(c_stage, c_parity) if self.seams.next_full else None
                self.ring.advance(c_stage, c_parity)
                stage, parity = tested or (c_stage, c_parity)
                e(barriers.mbarrier_test_parity(self.ring.stage(stage).full, parity, full_known))
        # the overlap's first-K-block work: in the peeled first block where the tile's first block is peeled
        # (first_block_assigns), else in every block of the rolled loop, behind its flags
        ahead = self.pre_issued if assign or not self.config.first_block_assigns else None
        math.k_block(slot.a_tile, slot.b_tile, slot.sa_tile, self.b_scale_operand(slot, sb_values, former),
                     release=release_and_test_next if full_known is not None else release, former_groups=former,
                     assign=assign, pre_issued=ahead)
        if ahead is not None:  # only a tile's first K block can have been issued ahead
            e(f"setp.ne.u32 {ahead.flag}, {kb}, {kb};")
        if full_known is None:
            self.ring.advance(c_stage, c_parity)

    def issue_next_first_wave(self, math: MathWarpgroups, scheduler: TileScheduler, c_stage: str,
                              c_parity: str) -> None:
        """KernelConfig.overlap_epilogue, after a tile's K loop: where the walk has a next tile, wait for the ring's
        next stage (that tile's first K block; the early poll may already have seen it land) and issue its wave 0
        now, so the tensor cores run it under this tile's epilogue and the next tile's start. The choice must be
        the same for every warp of a warpgroup (wgmma is a warpgroup's collective: a wave issued by some of its
        warps hangs the GPU), so it rests on the tile walk alone, never on a warp's own poll of the barrier."""
        b, e = self.b, self.b.emit
        more, _ = scheduler.next_tile()
        flag, skip = self.pre_issued.flag, b.label("next_wave_held")
        e(f"mov.pred {flag}, {more};", f"@!{flag} bra {skip};")
        slot = self.ring.stage(c_stage)
        self.wait_full(slot, c_parity, self.full_known)
        math.issue_first_wave(slot.a_tile, slot.b_tile, slot.sa_tile, self.pre_issued)
        b.place(skip)

    def wait_full(self, slot: Stage, parity: str, full_known: str | None) -> None:
        """Wait for ``slot``'s full barrier, skipped where the early poll (``full_known``) saw it complete."""
        if full_known is None:
            return self.ring.wait(slot.full, parity, "wait_full")
        known = self.b.label("full_known")
        self.b.emit(f"@{full_known} bra {known};")
        self.ring.wait(slot.full, parity, "wait_full")
        self.b.place(known)

    def b_scale_operand(self, slot: Stage, sb_values: tuple[str, ...] | None, former: int | None):
        if self.config.b_scales == "1x128":
            return ColumnScales(slot.sb_tile)
        return sb_values if former is not None else sb_values[0]

    def constant_stage_k_loop(self, math: MathWarpgroups, sb_tile: str, c_stage: str, c_parity: str,
                              former: int | None) -> None:
        """KernelConfig.constant_stages: the tile's K blocks in rounds of min(stages, K blocks), the round unrolled
        with each K block's slot a compile-time offset from the round's first. Where the stages divide the K blocks
        every tile starts at slot 0 and the parity flips after each round; where the K blocks divide the stages the
        tile starts at ``c_stage`` (kept per tile, as the producer's continuing count has it) and the tile's end steps
        it by the K blocks. The early poll tests the round's next slot; at a round's end, slot 0 with the flipped
        parity (where another round follows), never past the tile's last K block (the next tile forgets it)."""
        b, e, r, c = self.b, self.b.emit, self.b.reg, self.config
        if self.seams.next_full is not None:  # its table answers for a rolled ring's counter, which is not kept here
            raise ValueError("the next_full seam names the slot a rolled K loop tests next; constant_stages=True "
                             "tests compile-time slots: use constant_stages=False with it")
        stages, blocks = c.stages, self.plan.kb
        per_round = min(stages, blocks)
        rounds = blocks // per_round
        shared_ring = stages > blocks  # several tiles per round of the ring: the tile's first slot is c_stage
        full_known = None
        if c.early_poll:
            full_known = r("pred", "p_full_known")
            e(f"setp.ne.u32 {full_known}, {c_stage}, {c_stage};")

        def one_round(round_k: str | None) -> None:
            """K blocks round_k + s (round_k None: the first round, K blocks s), s = 0 .. per_round - 1."""
            first_slot = self.ring.stage(c_stage) if shared_ring else None
            for step in range(per_round):
                slot = (self.ring.stage_after(first_slot, step) if step else first_slot) if shared_ring \
                    else self.ring.stage(step)
                sb_values = self.read_b_scales(sb_tile, step if round_k is None else round_k,
                                               offset=0 if round_k is None else step)
                self.wait_full(slot, c_parity, full_known)
                release = self.release(math, slot.empty, self.release_target)
                last = step == per_round - 1

                def release_and_step(release=release, last=last, step=step):
                    release()
                    if last and not shared_ring:
                        e(f"xor.b32 {c_parity}, {c_parity}, 1;")  # a round fills the ring: it wraps here
                    if full_known is None or last and rounds == 1:
                        return
                    following = self.ring.stage(0) if last else (
                        self.ring.stage_after(first_slot, step + 1) if shared_ring else self.ring.stage(step + 1))
                    e(barriers.mbarrier_test_parity(following.full, c_parity, full_known))
                math.k_block(slot.a_tile, slot.b_tile, slot.sa_tile, self.b_scale_operand(slot, sb_values, former),
                             release=release_and_step, former_groups=former,
                             assign=round_k is None and step == 0 and c.first_block_assigns)

        # the first round on its own only where its first K block differs (it assigns) or it is the only one
        first_apart = rounds == 1 or c.first_block_assigns
        if first_apart:
            one_round(None)
        if rounds > 1:
            round_k, more, top = r("u32", "round_k"), r("pred"), b.label("k_round")
            e(f"mov.u32 {round_k}, {per_round if first_apart else 0};")
            b.place(top)
            one_round(round_k)
            e(f"add.u32 {round_k}, {round_k}, {per_round};", f"setp.lt.u32 {more}, {round_k}, {blocks};",
              f"@{more} bra {top};")
        if shared_ring:  # the next tile's first slot: K blocks further on, the parity flipped where the ring wraps
            wrap, flipped = r("pred"), r("u32")
            e(f"add.u32 {c_stage}, {c_stage}, {blocks};", f"setp.eq.u32 {wrap}, {c_stage}, {stages};",
              f"selp.u32 {c_stage}, 0, {c_stage}, {wrap};", f"xor.b32 {flipped}, {c_parity}, 1;",
              f"selp.u32 {c_parity}, {flipped}, {c_parity}, {wrap};")

    def paired_k_loop(self, math: MathWarpgroups, sb_tile: str, c_stage: str, c_parity: str,
                      former: int | None) -> None:
        """The K loop with two K blocks in flight (KernelConfig.accumulators == 2): K block k+1's wgmmas are issued
        into the other accumulator set before K block k is waited for (``wait_group 1``), released and promoted.
        The loop body is unrolled twice, once per set (PTX registers are named at compile time); the last K block is
        waited for with ``wait_group 0`` on the way out. A stage is released after its own group completes, never
        earlier (the emulator reads a wgmma's operands at its wait, so a stage refilled too soon is a wrong
        answer there)."""
        b, e, r, p = self.b, self.b.emit, self.b.reg, self.plan
        sets = (math.acc, math.second_acc)
        held_stage = [r("u32", "held_stage") for _ in sets]  # the ring slot each set's K block came from
        row_scales = [(r("f32", "sa"), r("f32", "sa")) for _ in sets]
        b_scales = [tuple(r("f32", "sb") for _ in range(p.sb_rows)) for _ in sets]

        def issue(into: int, k_block: str) -> None:
            e(f"mov.u32 {held_stage[into]}, {c_stage};")
            self.read_b_scales(sb_tile, k_block, b_scales[into])
            slot = self.ring.stage(c_stage)
            self.ring.wait(slot.full, c_parity, "wait_full")
            math.issue_k_block(slot.a_tile, slot.b_tile, slot.sa_tile, sets[into], row_scales[into])
            self.ring.advance(c_stage, c_parity)

        def finish(held: int, pending: int) -> None:
            e(w.wgmma_wait_group(pending))  # the slot's address is recomputed (ptxas keeps only the empty barrier's)
            self.release(math, self.ring.stage(held_stage[held]).empty, self.release_target)()
            scales = b_scales[held] if former is not None else b_scales[held][0]
            math.promote_k_block(sets[held], row_scales[held], scales, former)

        kb, following, last = r("u32", "kb"), r("u32", "kb_next"), r("pred")
        top, done = b.label("k_pair"), b.label("k_loop_end")
        drains = [b.label("k_drain"), b.label("k_drain")]
        e(f"mov.u32 {kb}, {self.k_first};")
        issue(0, kb)
        b.place(top)
        for held in (0, 1):  # set `held` holds K block kb, in flight
            e(f"add.u32 {following}, {kb}, 1;", f"setp.ge.u32 {last}, {following}, {self.k_blocks};",
              f"@{last} bra {drains[held]};")
            issue(1 - held, following)
            finish(held, pending=1)
            e(f"mov.u32 {kb}, {following};")
        e(f"bra {top};")
        for held in (0, 1):
            b.place(drains[held])
            finish(held, pending=0)
            if held == 0:
                e(f"bra {done};")
        b.place(done)

    def read_b_scales(self, sb_tile: str, k_block: str | int, values: tuple[str, ...] | None = None,
                      offset: int = 0) -> tuple[str, ...]:
        """K block ``k_block`` + ``offset``'s B scales of the tile, from the tile's copy in shared memory
        (:meth:`load_b_scales`) into ``values`` (fresh registers if None): one, or two where the tile spans two
        128-wide scale blocks. ``k_block`` a register, or a compile-time int (constant_stages' first round)."""
        e, r, p = self.b.emit, self.b.reg, self.plan
        if isinstance(k_block, int):
            sb_address, offset = sb_tile, k_block + offset
        else:
            sb_address = r("u32")
            e(f"mad.lo.u32 {sb_address}, {k_block}, 4, {sb_tile};")
        values = values or tuple(r("f32", "sb") for _ in range(p.sb_rows))
        for row, value in enumerate(values):  # row 1 (the next scale block) sits kb floats further
            e(f"ld.shared.f32 {value}, [{sb_address}+{4 * (offset + p.kb * row)}];")
        return values

    def load_b_scales(self, math: MathWarpgroups, sb_tile: str, n0: str, group: str | None = None,
                      fetched: tuple[list[str], str] | None = None) -> None:
        """The tile's K/128 B scales into shared memory, once per tile (every thread of the tile reads each one).
        ``group``: a grouped GEMM's tile group (its scales are the g-th ceil(N/128) x K/128 block of sb).
        ``fetched``: (registers, predicate) of KernelConfig.prefetch_b_scales: where the predicate is set, the
        registers already hold this tile's scales (:meth:`fetch_b_scales` at the previous tile's end)."""
        b, e, r, c = self.b, self.b.emit, self.b.reg, self.config
        e(math_barrier(c))  # every warp finished reading the previous tile's scales
        if fetched is not None:
            values, ready = fetched
            skip = b.label("sb_fetched")
            e(f"@{ready} bra {skip};")
            self.fetch_b_scales(n0, values)
            b.place(skip)
            self._store_b_scales(sb_tile, values)
            e(math_barrier(c))
            return
        base, limit, count = self._b_scale_source(n0, group)
        for first in range(0, count, c.math_threads):
            index, inside, skip = r("u32"), r("pred"), b.label("sb_done")
            e(f"add.u32 {index}, {self.tid}, {first};", f"setp.ge.u32 {inside}, {index}, {count};",
              f"@{inside} bra {skip};")
            value, source, target, clamped = r("f32"), r("u64"), r("u32"), r("u32")
            e(f"min.u32 {clamped}, {index}, {limit};",
              core.element_address(source, base, clamped, 4), f"ld.global.nc.f32 {value}, [{source}];",
              f"mad.lo.u32 {target}, {index}, 4, {sb_tile};", f"st.shared.f32 [{target}], {value};")
            b.place(skip)
        e(math_barrier(c))

    def _b_scale_chunks(self) -> list[int]:
        """The first index of each math_threads-wide chunk of the tile's scales (one scale per thread a chunk)."""
        return list(range(0, self.plan.kb * self.plan.sb_rows, self.config.math_threads))

    def _b_scale_source(self, n0: str, group: str | None) -> tuple[str, str, int]:
        """(the u64 address of the tile's first B scale, the last index it may read, the scales to read): K/128
        per scale block the tile spans. ``group``: a grouped GEMM's tile group (the g-th ceil(N/128) x K/128 block
        of sb)."""
        e, r, p = self.b.emit, self.b.reg, self.plan
        sb = self.sb
        if group is not None:
            sb, offset = r("u64", "sb_group"), r("u64")
            e(f"mul.wide.u32 {offset}, {group}, {ceil_div(p.n, 128) * p.kb * 4};",
              f"add.u64 {sb}, {self.sb}, {offset};")
        row, base = r("u32"), r("u64")
        e(f"shr.u32 {row}, {n0}, 7;", f"mul.wide.u32 {base}, {row}, {p.kb * 4};", f"add.u64 {base}, {base}, {sb};")
        # two rows when the tile may span two scale blocks; the last tile's second row may not exist (its
        # columns are past N and never stored), so indices past the last row read its last scale instead
        limit = r("u32")
        e(f"mul.lo.u32 {limit}, {row}, {p.kb};", f"sub.u32 {limit}, {ceil_div(p.n, 128) * p.kb - 1}, {limit};")
        return base, limit, p.kb * p.sb_rows

    def fetch_b_scales(self, n0: str, values: list[str] | None = None) -> list[str]:
        """prefetch_b_scales (dense GEMMs): the tile at column ``n0``'s K/128 B scales from global memory into
        registers (``values``, fresh if None), this thread's one per chunk (:meth:`_b_scale_chunks`); the copy into
        shared memory (:meth:`_store_b_scales`) follows at the tile's start."""
        e, r = self.b.emit, self.b.reg
        values = values or [r("f32", "sb_fetched") for _ in self._b_scale_chunks()]
        base, limit, count = self._b_scale_source(n0, None)
        for first, value in zip(self._b_scale_chunks(), values):
            index, inside, source, clamped = r("u32"), r("pred"), r("u64"), r("u32")
            e(f"add.u32 {index}, {self.tid}, {first};", f"setp.lt.u32 {inside}, {index}, {count};",
              f"min.u32 {clamped}, {index}, {limit};", core.element_address(source, base, clamped, 4),
              f"@{inside} ld.global.nc.f32 {value}, [{source}];")
        return values

    def _store_b_scales(self, sb_tile: str, values: list[str]) -> None:
        e, r, p = self.b.emit, self.b.reg, self.plan
        count = p.kb * p.sb_rows
        for first, value in zip(self._b_scale_chunks(), values):
            index, inside, target = r("u32"), r("pred"), r("u32")
            e(f"add.u32 {index}, {self.tid}, {first};", f"setp.lt.u32 {inside}, {index}, {count};",
              f"mad.lo.u32 {target}, {index}, 4, {sb_tile};", f"@{inside} st.shared.f32 [{target}], {value};")

    def warp_specialized_body(self) -> None:
        b, e, r, c = self.b, self.b.emit, self.b.reg, self.config
        is_producer, leader = r("pred", "p_producer_wg"), r("pred", "p_leader")
        producer_label, end = b.label("producer"), b.label("end")
        math_wgs = c.math_threads // 128
        choose = self.seams.producer_warpgroup  # a caller's choice (gemm.kernel.seams), else the generator's
        first = choose is not None and _producer_index(choose(math_wgs), math_wgs) == 0
        if not first:  # the generator's layout: math warpgroups 0.., the producer last
            e(f"setp.ge.u32 {is_producer}, {self.tid}, {c.math_threads};", f"@{is_producer} bra {producer_label};")
        else:  # the producer is warpgroup 0: a math thread's index is %tid.x - 128
            thread = self.tid
            e(f"setp.lt.u32 {is_producer}, {thread}, 128;", f"@{is_producer} bra {producer_label};")
            self.tid = r("u32", "math_tid")
            e(f"sub.u32 {self.tid}, {thread}, 128;")
        self.math_body()
        e(f"bra {end};")
        b.place(producer_label)
        if first:
            self.tid = thread
        e(f"setp.eq.u32 {leader}, {self.tid}, {0 if first else c.math_threads};")
        producer_end = b.label("producer_end") if c.split_k > 1 and not c.split_k_push else end
        WarpgroupProducer(self.ring, c.registers, leader, producer_end if self.rank else None,
                          self.rank if c.multicast > 1 else None, self.k_first).emit(self.scheduler("pt"))
        if c.split_k > 1 and not c.split_k_push:  # the producer warpgroup takes part in both exchange phases
            b.place(producer_end)
            e(barriers.cluster_sync(), barriers.cluster_sync())
        b.place(end)
        if c.multicast > 1:  # neither CTA leaves while the other may still touch its shared memory
            e(barriers.cluster_sync())

    def build(self) -> str:
        self.setup()
        if self.config.producer == "inline":
            self.inline_body()
        else:
            self.warp_specialized_body()
        return module([self.b], extra_globals=shared_memory.dynamic_shared_declaration(SMEM, align=1024))


def _total_groups(math: MathWarpgroups) -> list[list[str]]:
    """A math thread's totals in the groups of four that split-K's exchange moves as one 16-byte vector."""
    return [total[j:j + 4] for total in math.totals for j in range(0, len(total), 4)]


def _arrival_count(count) -> int:
    if type(count) is not int or not 1 <= count < 2**20:  # exactly int: a subclass could format as PTX
        raise ValueError(f"empty_arrivals must be an int in 1..2^20-1 (an mbarrier's arrival count), got {count!r}")
    return count


def _producer_index(index, math_wgs: int) -> int:
    if type(index) is not int or index not in (0, math_wgs):
        raise ValueError(f"producer_warpgroup must be 0 (first) or {math_wgs} (last, after the {math_wgs} math "
                         f"warpgroups): the math warpgroups must be consecutive; got {index!r}")
    return index


@functools.lru_cache(maxsize=256)
def generate(config: KernelConfig, n: int, k: int | None, seams: Seams = NO_SEAMS) -> str:
    """The PTX text of ``config``'s kernel for (N, K); M is its run-time parameter (and K too, k=None, for a
    runtime-K config: :func:`compiled_k`). ``seams``: a caller's functions in place of some of the generator's
    decisions (:mod:`gemm.kernel.seams`; part of the cache key)."""
    return _Kernel(check_problem(config, n, k), seams).build()


__all__ = ["generate", "kernel_params", "check_problem", "compiled_k", "KERNEL"]
