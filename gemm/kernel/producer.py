"""The producer emitters: the TMA ring of S stages in shared memory and who fills it.

Each stage holds one K block's A tile (BLOCK_M x 128 bytes), B tile (BLOCK_N x 128) and A's scales (BLOCK_M
floats), with 1x128 B scales (wgrad) also B's (BLOCK_N floats), and two mbarriers: *full* (one arrival with ``expect_tx`` = the stage's bytes, plus the bytes the
TMA engine delivers) and *empty* (one arrival per math warp once it no longer needs the stage). Waits poll a
phase parity; the (stage, parity) counters wrap and flip exactly as :mod:`ptx.vocab.barriers` describes, and they
carry on across tiles, so a persistent CTA never drains its ring between tiles.

Two producers:

* :class:`InlineProducer` (stage 06): thread 0 is also a math thread; before computing K block i it refills
  the stage of K block i + S - 2 (one stage of slack, so it rarely waits for the other warpgroup).
* :class:`WarpgroupProducer` (stage 07+): a warpgroup of its own gives up registers (``setmaxnreg.dec``), all
  but one thread exit, and that thread walks the tiles issuing TMA for every K block as soon as its stage is
  empty. It runs up to S K blocks ahead of the math warpgroups, across tile boundaries.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gemm.kernel.config import BLOCK_K, SharedPlan
from ptx.builder import KernelBuilder
from ptx.vocab import barriers, bulk_copies, core
from ptx.vocab import wgmma as w


@dataclass(frozen=True)
class PairFlags:
    """Per-tile predicates of a 2-CTA cluster (from :meth:`gemm.kernel.tile_scheduler.TileScheduler.pair_flags`)."""
    own: str  # this CTA loads its own copy of the shared operand (the pair's tiles differ there, or no peer tile)
    lead: str  # this CTA is rank 0 of a pair whose tiles share the operand: it multicasts it to both
    peer_alive: str  # the peer CTA computes a tile at this step too (else releases go to this CTA only)
    mask: str  # the u16 CTA mask of the multicast (0b11)
    operand: str = "a"  # the operand the pair shares: "a" (A and sa: same rows) or "b" (B and a 1x128 sb)


@dataclass(frozen=True)
class Stage:
    """u32 shared addresses of one stage's tiles and barriers."""
    a_tile: str
    b_tile: str
    sa_tile: str
    full: str
    empty: str
    sb_tile: str | None = None  # 1x128 B scales only


class Ring:
    """The ring's addresses and counters; ``smem`` is the 1024-aligned shared base (u32 register). ``k_blocks``:
    the K-block count as an operand: an immediate, or (runtime-K configs) the register holding the parameter."""

    def __init__(self, b: KernelBuilder, plan: SharedPlan, smem: str, tmaps: dict[str, str], k_blocks: str):
        self.b, self.plan, self.smem, self.tmaps, self.k_blocks = b, plan, smem, tmaps, k_blocks
        self.policies: dict[str, str] = {}  # "a" / "b" -> the b64 cache policy of that operand's loads

    def create_policies(self) -> None:
        """The L2 cache policies of KernelConfig.a_eviction / b_eviction, created once by the loading thread; an
        operand left "normal" keeps its loads without a cache hint."""
        for operand in ("a", "b"):
            priority = getattr(self.plan.config, f"{operand}_eviction")
            if priority != "normal":
                self.policies[operand] = self.b.reg("b64", f"{operand}_policy")
                self.b.emit(bulk_copies.create_l2_policy(self.policies[operand], priority))

    def _fields(self) -> tuple[list[str], list[int], list[int]]:
        """(name, region offset, stage-to-stage size) of every field of a :class:`Stage`."""
        p = self.plan
        names = ["a_tile", "b_tile", "sa_tile", "full", "empty"]
        regions = [0, p.b_region, p.sa_region, p.full_region, p.empty_region]
        sizes = [p.a_tile, p.b_tile, p.sa_tile_pitch, 8, 8]
        if p.sb_tile:
            names.append("sb_tile"), regions.append(p.sb_stage_region), sizes.append(p.sb_tile_pitch)
        return names, regions, sizes

    def stage_after(self, first: Stage, steps: int) -> Stage:
        """The slot ``steps`` stages after ``first`` (which must not wrap past the ring's end): each address plus a
        compile-time offset (KernelConfig.constant_stages)."""
        names, _, sizes = self._fields()
        out = []
        for name, size, address in zip(names, sizes, dataclasses.astuple(first)):
            reg = self.b.reg("u32", name)
            self.b.emit(f"add.u32 {reg}, {address}, {steps * size};")
            out.append(reg)
        return Stage(*out)

    def stage(self, stage: str | int) -> Stage:
        b = self.b
        names, regions, sizes = self._fields()
        out = []
        for name, region, size in zip(names, regions, sizes):
            reg = b.reg("u32", name)
            if isinstance(stage, int):
                b.emit(f"add.u32 {reg}, {self.smem}, {region + stage * size};")
            else:
                b.emit(f"mad.lo.u32 {reg}, {stage}, {size}, {self.smem};")
                if region:
                    b.emit(f"add.u32 {reg}, {reg}, {region};")
            out.append(reg)
        return Stage(*out)

    def init_barriers(self, empty_arrivals: int) -> None:
        """Emitted for one thread: full counts the producer's one arrive.expect_tx; empty one arrival per math warp."""
        for s in range(self.plan.config.stages):
            stage = self.stage(s)
            self.b.emit(barriers.mbarrier_init(stage.full, 1), barriers.mbarrier_init(stage.empty, empty_arrivals))
        self.b.emit(barriers.fence_mbarrier_init(), barriers.fence_proxy_async(),  # visible to the TMA unit
                    *(bulk_copies.prefetch_tensormap(x) for x in self.tmaps.values()))

    def counters(self, name: str, first_stage: int = 0, first_parity: int = 0) -> tuple[str, str]:
        stage, parity = self.b.reg("u32", f"{name}_stage"), self.b.reg("u32", f"{name}_parity")
        self.b.emit(f"mov.u32 {stage}, {first_stage};", f"mov.u32 {parity}, {first_parity};")
        return stage, parity

    def advance(self, stage: str, parity: str) -> None:
        """stage += 1; on the wrap to 0 the parity flips (pipeline bookkeeping of ptx.vocab.barriers)."""
        e, r = self.b.emit, self.b.reg
        wrap, flipped = r("pred"), r("u32")
        e(f"add.u32 {stage}, {stage}, 1;", f"setp.eq.u32 {wrap}, {stage}, {self.plan.config.stages};",
          f"selp.u32 {stage}, 0, {stage}, {wrap};", f"xor.b32 {flipped}, {parity}, 1;",
          f"selp.u32 {parity}, {flipped}, {parity}, {wrap};")

    def load(self, stage: Stage, k_block: str | int, m0: str, n0: str, pair: "PairFlags | None" = None,
             rows=None) -> None:
        """Expect the stage's bytes on its full barrier, then the three TMA copies of K block ``k_block``.

        With a cluster pair, the shared operand (``pair.operand``: A and its scales, or B and, with 1x128 B scales,
        its scales) comes once for both CTAs: rank 0 multicasts it (``pair.lead``), rank 1 issues nothing for it
        (its barrier still expects the bytes), and when the pair's tiles do not share it each CTA loads its own
        (``pair.own``). The other operand is always the CTA's own.

        ``rows``: a grouped GEMM's scheduler (:class:`gemm.kernel.tile_scheduler.TileScheduler` inside its tile walk),
        whose ``a_row``, ``sa_x``, ``sa_k_base`` and ``b_row`` place the tile in the stacked operands."""
        e = self.b.emit
        k_byte = self.b.reg("u32", "kx")
        e(f"shl.b32 {k_byte}, {k_block}, 7;" if isinstance(k_block, str) else f"mov.u32 {k_byte}, {k_block * BLOCK_K};")
        e(barriers.mbarrier_arrive_expect_tx(stage.full, self.plan.stage_bytes))
        a_row, sa_x, sa_y = m0, m0, k_block
        if rows is not None:
            a_row, sa_x, n0 = rows.a_row, rows.sa_x, rows.b_row
            if rows.sa_k_base is not None:  # masked: group g's scales are rows g*K/128.. of the (G*Kb, M_max) map
                sa_y = self.b.reg("u32", "sa_y")
                e(f"add.u32 {sa_y}, {rows.sa_k_base}, {k_block};")
        a_policy, b_policy = self.policies.get("a"), self.policies.get("b")
        copies = {"a": [(stage.a_tile, "tmap_a", k_byte, a_row, a_policy),
                        (stage.sa_tile, "tmap_sa", sa_x, sa_y, a_policy)],
                  "b": [(stage.b_tile, "tmap_b", k_byte, n0, b_policy)]}
        if stage.sb_tile is not None:  # 1x128: this K block's scales of the tile's BLOCK_N rows of B, like sa's
            copies["b"].append((stage.sb_tile, "tmap_sb", n0, k_block, b_policy))
        for operand in ("a", "b"):
            shared = pair is not None and pair.operand == operand
            e(*((f"@{pair.own} " if shared else "") + bulk_copies.tma_load_2d(tile, self.tmaps[tmap], x, y,
                                                                               stage.full, policy)
                for tile, tmap, x, y, policy in copies[operand]))
            if shared:
                e(*(f"@{pair.lead} " + bulk_copies.tma_load_2d_multicast(tile, self.tmaps[tmap], x, y, stage.full,
                                                                         pair.mask, policy)
                    for tile, tmap, x, y, policy in copies[operand]))

    def prefetch_b(self, k_block: str, n0: str) -> None:
        """Ask L2 for K block ``k_block`` of the tile's B rows (KernelConfig.l2_prefetch)."""
        k_byte = self.b.reg("u32", "kx")
        self.b.emit(f"shl.b32 {k_byte}, {k_block}, 7;", bulk_copies.tma_prefetch_2d(self.tmaps["tmap_b"], k_byte, n0))

    def wait(self, barrier: str, parity: str, what: str) -> None:
        ready = self.b.reg("pred")
        self.b.emit(barriers.mbarrier_wait_parity(barrier, parity, ready, self.b.label(what)))


class InlineProducer:
    """Stage 06's producer: thread 0 (``is_producer``) keeps ``stages - 2`` K blocks in flight ahead of its own."""

    def __init__(self, ring: Ring, is_producer: str, m0: str, n0: str):
        self.ring, self.is_producer, self.m0, self.n0 = ring, is_producer, m0, n0
        self.ahead = ring.plan.config.stages - 2

    def prologue(self) -> tuple[str, str, str]:
        """Start K blocks 0..ahead-1 (fresh stages: no waits); returns the (j, stage, parity) refill counters."""
        b, ring, kb = self.ring.b, self.ring, self.ring.plan.kb  # the inline producer: compile-time K
        skip = b.label("prologue_done")
        b.emit(f"@!{self.is_producer} bra {skip};")
        for j in range(min(self.ahead, kb)):
            ring.load(ring.stage(j), j, self.m0, self.n0)
        b.place(skip)
        j = b.reg("u32", "j")
        b.emit(f"mov.u32 {j}, {self.ahead};")
        stage, parity = ring.counters("p", self.ahead % ring.plan.config.stages,
                                      barriers.producer_wait_parity(self.ahead, ring.plan.config.stages))
        return j, stage, parity

    def refill(self, j: str, stage: str, parity: str) -> None:
        """Thread 0 refills the stage of K block j once every math warp released it (then j, stage advance)."""
        b, ring = self.ring.b, self.ring
        idle, done = b.reg("pred"), b.label("produced")
        b.emit(f"setp.ge.or.u32 {idle}, {j}, {ring.k_blocks}, !{self.is_producer};", f"@{idle} bra {done};")
        refill = ring.stage(stage)
        ring.wait(refill.empty, parity, "wait_empty")
        ring.load(refill, j, self.m0, self.n0)
        b.place(done)
        ring.advance(stage, parity)
        b.emit(f"add.u32 {j}, {j}, 1;")


class WarpgroupProducer:
    """Stage 07+'s producer warpgroup: emitted as the body of that warpgroup's branch. ``end``: in a cluster the
    idle threads go there (the kernel's final cluster barriers) instead of exiting; ``rank``: the cluster rank of a
    multicast pair; ``k_first``: the first K block of every tile (split-K: this CTA's share starts there)."""

    def __init__(self, ring: Ring, registers: tuple[int, int] | None, leader: str, end: str | None = None,
                 rank: str | None = None, k_first: str = "0"):
        self.ring, self.registers, self.leader, self.end, self.rank = ring, registers, leader, end, rank
        self.k_first = k_first

    def emit(self, scheduler) -> None:
        b, ring, kb = self.ring.b, self.ring, self.ring.k_blocks
        if self.registers:
            b.emit(w.setmaxnreg(self.registers[0], increase=False))
        # one thread issues every copy; the others leave (to the cluster barrier when there is one)
        b.emit(f"@!{self.leader} bra {self.end};" if self.end else f"@!{self.leader} {core.exit_thread()}")
        ring.create_policies()
        # a fresh empty barrier passes a parity-1 wait at once: the first round of stages needs no release
        stage, parity = ring.counters("prod", 0, 1)
        with scheduler.tiles() as (m0, n0):
            pair = scheduler.pair_flags(self.rank) if self.rank else None
            k, more = b.reg("u32", "pk"), b.reg("pred")
            top = b.label("produce")
            b.emit(f"mov.u32 {k}, {self.k_first};")
            ahead = ring.plan.config.l2_prefetch
            if ahead:
                self.prefetch_first(k, n0, ahead)
            b.place(top)
            slot = ring.stage(stage)
            ring.wait(slot.empty, parity, "wait_empty")
            ring.load(slot, k, m0, n0, pair, scheduler if scheduler.config.grouped else None)
            if ahead:  # K block k + ahead, when the tile has one, joins the L2 requests as block k leaves them
                later, inside = b.reg("u32", "pk_ahead"), b.reg("pred")
                b.emit(f"add.u32 {later}, {k}, {ahead};", f"setp.lt.u32 {inside}, {later}, {kb};")
                skip = b.label("prefetched")
                b.emit(f"@!{inside} bra {skip};")
                ring.prefetch_b(later, n0)
                b.place(skip)
            ring.advance(stage, parity)
            b.emit(f"add.u32 {k}, {k}, 1;", f"setp.lt.u32 {more}, {k}, {kb};", f"@{more} bra {top};")
        if self.rank:
            # Drain: the last `stages` loads must be released (by this CTA's and the peer's consumers) before
            # this CTA may exit, or a remote arrive could target a CTA that is gone.
            for _ in range(ring.plan.config.stages):
                ring.wait(ring.stage(stage).empty, parity, "drain_empty")
                ring.advance(stage, parity)

    def prefetch_first(self, k: str, n0: str, ahead: int) -> None:
        """The tile's first ``ahead`` K blocks of B (fewer if it has fewer), asked of L2 before the first load."""
        b, kb = self.ring.b, self.ring.k_blocks
        j, end, more = b.reg("u32", "pf"), b.reg("u32", "pf_end"), b.reg("pred")
        top = b.label("prefetch")
        b.emit(f"mov.u32 {j}, {k};", f"add.u32 {end}, {k}, {ahead};", f"min.u32 {end}, {end}, {kb};")
        b.place(top)
        self.ring.prefetch_b(j, n0)
        b.emit(f"add.u32 {j}, {j}, 1;", f"setp.lt.u32 {more}, {j}, {end};", f"@{more} bra {top};")


__all__ = ["Ring", "Stage", "PairFlags", "InlineProducer", "WarpgroupProducer"]
