"""One warpgroup (128 consecutive threads) of a CTA: its own pc, registers and divergence state, plus the
sm_90 instructions (mbarrier, named barriers, clusters, setmaxnreg; wgmma and TMA through
ptx.emulate.async_proxy), each modelled from the PTX ISA 8.5 text independently of ptx.vocab, so a wrong
descriptor, swizzle, fragment, byte count or parity in a generator shows up as a wrong answer or a deadlock.
ptx.emulate.warpgroup_scheduling runs the warpgroups of a CTA cooperatively.

* Divergence: a forward branch taken by some threads parks them at its label until the others get there
  (or exit); a backward branch must be taken by every active thread (threads that exited or are parked at a
  later label do not count, so an elected thread may loop alone).
* Blocking: an mbarrier.try_wait that is not ready, or a bar.sync whose barrier has not gathered its threads,
  blocks the warpgroup (``self.wait``) and hands control back to the scheduler; after an mbarrier.arrive or
  bar.arrive the warpgroup yields (``preempt``; not after an arrive.expect_tx whose bytes are still due), so
  a consumer that releases a stage too early sees the producer's next bytes. Under a seeded schedule a warp's
  mbarrier.test_wait may see a completed phase late, each warp on its own (``_seen_by_warps``), as warps polling
  at different times do: a warpgroup collective chosen from that poll is caught executed by part of the group.
* Clusters (the CTA's ``cluster``, ptx.emulate.warpgroup_scheduling): special registers %cluster_ctarank,
  %cluster_nctarank, %clusterid, %nclusterid, %cluster_ctaid, %cluster_nctaid; mapa.shared::cluster.u32 gives
  CLUSTER_WINDOW | rank << 24 | offset (ptx.emulate.common), which mbarrier.arrive / expect_tx
  .shared::cluster and ld/st.shared::cluster follow into the peer's shared memory (a .shared::cta operand
  must be CTA-local); a remote arrive yields like a local one. TMA loads with .multicast::cluster write the box
  at the same offset in every CTA of the 16-bit mask and complete_tx on the barrier at the same offset in each.
  barrier.cluster.arrive / wait: see ptx.emulate.barriers.ClusterBarrier; arrive yields like bar.arrive.
  st.async (.shared::cluster, complete_tx on a barrier of the same CTA) writes and completes its bytes at issue;
  a message to a barrier not yet initialised is an error, and so is a wait that sees a phase completed by another
  CTA's messages without acquiring at cluster scope.
"""
from __future__ import annotations

import numpy as np

from .async_proxy import AsyncProxy
from .barriers import Barrier, ClusterWait, MbarrierWait, NamedWait
from .common import EmulationError, _from_bytes, _to_bytes, _vector, cluster_address, split_shared
from .lockstep import CTA


class Warpgroup(AsyncProxy, CTA):
    def __init__(self, cta, index: int, threads: int):
        super().__init__("", "", cta.params, cta.memory, cta.ctaid, threads, 0, nctaid=cta.nctaid,
                         program=cta.program, smem=cta.smem, tid_base=128 * index)
        self.cta, self.index, self.slot = cta, index, index  # slot: place in the cluster's scheduling pool
        self.extra_specials = cta.specials
        self.symbols = self.shared_symbols = cta.symbols
        self.exited = cta.exited[128 * index:128 * index + threads]  # a view: exits are seen CTA-wide
        self.pc, self.active, self.parked = 0, np.ones(threads, bool), []  # parked: [(label pc, mask)]
        self.done, self.wait, self.yield_now = False, None, False
        self.wgmma_open, self.wgmma_groups, self.in_flight = [], [], {}  # in_flight: accumulator -> wgmma line
        self.synced = False  # a bar.sync / cluster wait passed: what any warp saw before it, every warp now sees

    # -- control flow ---------------------------------------------------------------------------------------
    def advance(self):
        """Run until the warpgroup blocks (``self.wait``), yields or finishes (``self.done``)."""
        if self.synced:  # resumed past a barrier it waited at
            self._see_everything()
        code = self.program.code
        while True:
            if not self.active.any():
                if not self.parked:
                    return self.finish()
                self.pc = min(target for target, _ in self.parked)  # the others went away: resume the earliest
            if self.pc >= len(code):
                self.exit_threads(self.active)
                continue
            ins = code[self.pc]
            self.cta.step()
            if ins.label:
                for entry in [e for e in self.parked if e[0] == self.pc]:
                    self.active = self.active | entry[1]
                    self.parked.remove(entry)
                self.pc += 1
                continue
            mask = self.active
            if ins.guard:
                predicate = self.value(ins.guard).astype(bool)
                mask = mask & (~predicate if ins.negate else predicate)
            if ins.opcode.startswith("bra"):
                self.branch(ins, mask)
                continue
            if ins.opcode in ("exit", "ret"):
                self.exit_threads(mask)
                self.pc += 1
                continue
            touched = self.in_flight.keys() & ins.names if self.in_flight else ()
            if touched and not ins.opcode.startswith("wgmma"):
                name = min(touched)
                raise EmulationError(f"line {ins.line}: {ins.text} touches an accumulator before wgmma.wait_group: "
                                     f"{name} belongs to the wgmma.mma_async at line {self.in_flight[name]}, still "
                                     "in flight (its value is undefined until a wgmma.wait_group retires its group)")
            self.line = ins.line
            try:
                self.execute(ins.opcode, list(ins.ops), mask)
            except EmulationError as error:
                if str(error).startswith("line "):
                    raise
                raise EmulationError(f"line {ins.line}: {ins.text}: {error}") from None
            if self.wait is not None:
                self.pc += self.wait.after
                return
            self.pc += 1
            if self.yield_now:
                self.yield_now = False
                return

    def branch(self, ins, mask):
        target = self.labels[ins.ops[0]]
        staying = self.active & ~mask
        if not mask.any():
            self.pc += 1
        elif target > self.pc and (staying.any() or any(self.pc < t < target for t, _ in self.parked)):
            self.parked.append((target, mask))  # threads parked in between run first, then meet these
            self.active = staying
            self.pc += 1
        elif not staying.any():
            self.pc = target
        else:
            raise EmulationError(f"line {ins.line}: divergent backward branch {ins.text} ({mask.sum()} threads "
                                 f"loop, {staying.sum()} fall through)")

    def exit_threads(self, mask):
        self.active = self.active & ~mask
        self.exited |= mask

    def finish(self):
        if self.in_flight:
            raise EmulationError(f"warpgroup {self.index} exits with wgmma results never waited for")
        self.done = True

    def where(self) -> str:
        code, pc = self.program.code, self.pc - (self.wait.after if self.wait else 0)  # a bar.sync already passed
        at = f"line {code[pc].line}: {code[pc].text}" if pc < len(code) else "the end"
        parked = f", {sum(m.sum() for _, m in self.parked)} parked at " + \
            ", ".join(code[t].label for t, _ in self.parked) if self.parked else ""
        cta = f"CTA rank {self.cta.rank} " if self.cta.cluster.size > 1 else ""
        return f"{cta}warpgroup {self.index} at {at} ({self.active.sum()} threads active{parked})"

    # -- instructions -----------------------------------------------------------------------------------
    def execute(self, opcode: str, ops: list[str], mask: np.ndarray):
        parts = opcode.split(".")
        head = parts[0]
        if head == "wgmma":
            self.wgmma(parts, ops, mask)
        elif head == "mbarrier":
            self.mbarrier(opcode, parts[1], ops, mask)
        elif head == "barrier" and parts[1] == "cluster":
            self.cluster_barrier(parts, mask)
        elif head == "mapa":
            self.mapa(parts, ops, mask)
        elif head == "st" and parts[1] == "async":
            self.st_async(parts, ops, mask)
        elif head in ("ld", "st") and parts[1] == "shared::cluster":
            vector = parts[-2] in ("v2", "v4")
            regs = _vector(ops[0 if head == "ld" else 1]) if vector else [ops[0 if head == "ld" else 1]]
            self.cluster_memory(head, parts[-1], regs, ops[1 if head == "ld" else 0], mask)
        elif head in ("bar", "barrier"):
            self.bar([p for p in parts[1:] if p not in ("cta", "aligned")], ops, mask)
        elif head == "setmaxnreg":
            if not mask.all() or self.n != 128:
                raise EmulationError(f"{opcode} must be executed by all 128 threads of the warpgroup together")
        elif head == "cp" and parts[2] == "bulk":
            self.bulk(parts, ops, mask)
        elif opcode.startswith("fence.proxy.async"):
            self.proxy_fence(parts[3] if len(parts) > 3 else "", mask)
        elif head == "stmatrix":
            super().execute(opcode, ops, mask)
            self._note_stmatrix(opcode, ops, mask)
        elif head == "cp" and parts[1:4] == ["reduce", "async", "bulk"]:  # the reduce-add TMA store
            self.bulk([parts[0], *parts[2:]], ops, mask, reduce=parts[parts.index("global") + 2])
        elif head == "createpolicy":
            self.create_policy(parts, ops, mask)
        elif head in ("fence", "prefetch"):
            pass
        elif head == "griddepcontrol":  # one grid at a time here: the previous one is always complete
            pass
        elif head == "elect":  # elect.sync d|p, membermask: the lowest active lane of each warp is the leader
            dest, pred = ops[0].split("|")
            leader = np.zeros(self.n, bool)
            for warp in np.flatnonzero(mask.reshape(-1, 32).any(1)):
                leader[32 * warp + np.argmax(mask[32 * warp:32 * warp + 32])] = True
            self.write(pred.strip(), leader, mask)
            self.write(dest.strip(), np.where(leader, self.tid % 32, 0), mask)
        else:
            super().execute(opcode, ops, mask)

    def _uniform(self, token: str, mask, what: str) -> int:
        values = set(self.value(token)[mask].tolist())
        if len(values) != 1:
            raise EmulationError(f"{what} differs between the threads executing it: {sorted(values)[:4]}")
        return int(values.pop())

    def bar(self, kind: list[str], ops, mask):
        if kind == ["warp", "sync"]:
            warps = mask.reshape(-1, 32)
            if not warps[warps.any(1)].all():
                raise EmulationError("bar.warp.sync with lanes of a warp missing")
            return
        if kind not in (["sync"], ["arrive"]):
            raise EmulationError(f"bar.{'.'.join(kind)} is not modelled")
        if not mask.any():
            return
        warps, live = mask.reshape(-1, 32), (mask | self.exited).reshape(-1, 32)
        involved = warps.any(1)
        if not live[involved].all():
            raise EmulationError(f"bar.{kind[0]} executed by only some of a warp's live threads (it is .aligned)")
        barrier_id = self._uniform(ops[0], mask, "the barrier id")
        count = self._uniform(ops[1], mask, "the thread count") if len(ops) > 1 else None
        if count is None and kind == ["arrive"]:
            raise EmulationError("bar.arrive needs a thread count")
        arrivals = 32 * int(involved.sum()) if count is not None else int(mask.sum())
        generation = self.cta.named.arrive(barrier_id, count, arrivals)
        if kind == ["arrive"]:
            self.yield_now = self.cta.preempt
        elif self.cta.named.barriers[barrier_id].generation == generation:
            self.wait = NamedWait(self.cta.named, barrier_id, generation)
            self.synced = True
        else:
            self._see_everything()

    def cluster_barrier(self, parts, mask):
        """barrier.cluster.arrive{.release,.relaxed}{.aligned} / barrier.cluster.wait{.acquire}{.aligned}."""
        kind, qualifiers = parts[2], set(parts[3:]) - {"aligned"}
        if kind not in ("arrive", "wait") or not qualifiers <= ({"release", "relaxed"} if kind == "arrive"
                                                                 else {"acquire"}):
            raise EmulationError(f"{'.'.join(parts)} is not modelled")
        if not mask.any():
            return
        if "aligned" in parts:
            warps, live = mask.reshape(-1, 32), (mask | self.exited).reshape(-1, 32)
            if not live[warps.any(1)].all():
                raise EmulationError(f"{'.'.join(parts)} executed by only some of a warp's live threads")
        threads, barrier = 128 * self.index + np.flatnonzero(mask), self.cta.cluster.barrier
        if kind == "arrive":
            barrier.arrive(self.cta.rank, threads)
            self.yield_now = self.cta.preempt
            return
        generation = barrier.wait(self.cta.rank, threads)
        if barrier.poll() <= generation:
            self.wait = ClusterWait(barrier, generation)
            self.synced = True
        else:
            self._see_everything()

    def mapa(self, parts, ops, mask):
        """mapa.shared::cluster.u32 d, a, rank: the address of the same shared variable in CTA ``rank``
        (CLUSTER_WINDOW | rank << 24 | offset; ``a`` CTA-local or itself a mapa result)."""
        if parts[1:] != ["shared::cluster", "u32"]:
            raise EmulationError(f"{'.'.join(parts)}: only mapa.shared::cluster.u32 is modelled")
        if not mask.any():
            return
        size = self.cta.cluster.size
        ranks = self.value(ops[2]).astype(np.int64) & 0xFFFFFFFF
        if (ranks[mask] >= size).any():
            raise EmulationError(f"mapa to CTA rank {int(ranks[mask].max())} of a cluster of {size}")
        offsets = np.array([split_shared(int(a))[1] if m else 0
                            for a, m in zip(self.value(ops[1]).astype(np.int64) & 0xFFFFFFFF, mask)], np.int64)
        if (offsets[mask] >= self.smem.size).any():
            raise EmulationError(f"mapa of shared offset {int(offsets[mask].max())}, past the {self.smem.size} "
                                 "bytes of shared memory")
        self.write(ops[0], cluster_address(ranks, offsets), mask)

    def cluster_memory(self, kind: str, ptx_type: str, regs: list[str], address: str, mask):
        """ld/st.shared::cluster (distributed shared memory): each thread's address may name any CTA of the
        cluster (a CTA-local address: this one); done at once, like ld/st.shared."""
        if not mask.any():
            return
        size = int(ptx_type[1:]) // 8
        total, threads = size * len(regs), np.flatnonzero(mask)
        targets = [self.cta.cluster.target(int(a), self.cta, f"{kind}.shared::cluster")
                   for a in self.address(address)[threads]]
        offsets = np.array([offset for _, offset in targets], np.int64)
        if offsets.max() + total > self.smem.size:
            raise EmulationError(f"shared::cluster access out of bounds: offset {offsets.max()} (+{total}) of "
                                 f"{self.smem.size} bytes")
        spans = offsets[:, None] + np.arange(total)
        if kind == "st":
            raw = np.concatenate([_to_bytes(self.value(r)[mask], size) for r in regs], axis=1)
            for row, (cta, _) in enumerate(targets):
                cta.smem[spans[row]] = raw[row]
                self.note_generic_write(spans[row][None, :], self.tid[threads[row:row + 1]], self.line, cta)
            return
        raw = np.stack([cta.smem[spans[row]] for row, (cta, _) in enumerate(targets)])
        for i, name in enumerate(regs):
            loaded = np.zeros(self.n, np.float32 if ptx_type == "f32" else np.int64)
            loaded[mask] = _from_bytes(raw[:, size * i:size * (i + 1)], ptx_type)
            self.write(name, loaded, mask)

    def st_async(self, parts, ops, mask):
        """st.async{.weak}.shared::cluster.mbarrier::complete_tx::bytes{.v2,.v4}.{b32,b64} [a], b, [mbar] (PTX ISA
        8.1, sm_90): each thread's value into the shared memory its address names (a mapa result: any CTA of the
        cluster), and complete_tx of its bytes on the barrier its mbar names, which must be in that same CTA. Done
        at issue, like the TMA copies: the barrier's phase is what orders the reader after it."""
        qualifiers = [p for p in parts[2:-1] if p != "weak"]
        vector = qualifiers[-1] if qualifiers and qualifiers[-1] in ("v2", "v4") else None
        if qualifiers[:2] != ["shared::cluster", "mbarrier::complete_tx::bytes"] or parts[-1] not in ("b32", "b64") \
                or len(qualifiers) != 2 + (vector is not None) or (vector == "v4" and parts[-1] != "b32"):
            raise EmulationError(f"{'.'.join(parts)}: only st.async.shared::cluster.mbarrier::complete_tx::bytes"
                                 "{.v2,.v4}.{b32,b64} (v4 with b32) is modelled")
        if not mask.any():
            return
        regs = _vector(ops[1]) if vector else [ops[1]]
        size, threads = int(parts[-1][1:]) // 8, np.flatnonzero(mask)
        total = size * len(regs)
        places = [self.cta.cluster.target(int(a), self.cta, "st.async") for a in self.address(ops[0])[threads]]
        bars = [self.cta.cluster.target(int(a), self.cta, "st.async's mbarrier") for a in self.address(ops[2])[threads]]
        raw = np.concatenate([_to_bytes(self.value(r)[mask], size) for r in regs], axis=1)
        for row, ((cta, offset), (bar_cta, bar_offset)) in enumerate(zip(places, bars)):
            if offset % total or offset + total > self.smem.size:
                raise EmulationError(f"st.async to shared offset {offset}: not {total}-byte aligned or past the "
                                     f"{self.smem.size} bytes")
            if bar_cta is not cta:
                raise EmulationError(f"st.async writes CTA rank {cta.rank}'s shared memory but completes on CTA rank "
                                     f"{bar_cta.rank}'s barrier: both must be the same CTA's")
            barrier = cta.barriers.get(bar_offset)
            if barrier is None:
                raise EmulationError(f"st.async completes on an uninitialised barrier at {bar_offset} of CTA rank "
                                     f"{cta.rank}")
            cta.smem[offset:offset + total] = raw[row]
            barrier.remote_data_pending |= cta is not self.cta
            barrier.complete_tx(total)

    # -- mbarrier -----------------------------------------------------------------------------------------
    def mbarrier(self, opcode, kind, ops, mask):
        if not mask.any():
            return
        operands = ops if kind in ("init", "expect_tx") else ops[1:]  # [address], then count / bytes / parity
        per_thread = self.address(operands[0])
        addresses = set(per_thread[mask].tolist())
        if len(addresses) != 1 and kind in ("arrive", "expect_tx"):
            # arrivals are per thread: lanes of one instruction may name different barriers (a warp's lane l
            # releasing a stage in CTA l of the cluster), so each group of threads arrives on its own one
            for address in sorted(addresses):
                self.mbarrier(opcode, kind, ops, mask & (per_thread == address))
            return
        if len(addresses) != 1:
            raise EmulationError(f"threads use different barriers: {sorted(addresses)[:4]}")
        # .shared::cluster (arrive, expect_tx) may name a peer CTA's barrier through a mapa address
        cta, address = self.cta.cluster.target(addresses.pop(), self.cta, opcode, "shared::cluster" in opcode)
        if address % 8:
            raise EmulationError(f"mbarrier at {address} is not 8-byte aligned")
        if cta is not self.cta and kind not in ("arrive", "expect_tx"):
            raise EmulationError(f"{opcode} on CTA rank {cta.rank}'s barrier: only arrive and expect_tx may name "
                                 "a peer's")
        if kind == "init":
            count = self._uniform(operands[1], mask, "the arrival count")
            self.cta.barriers[address] = Barrier(count, count)
            return
        barrier = cta.barriers.get(address)
        if barrier is None:
            peer = f" of CTA rank {cta.rank}" if cta is not self.cta else ""
            raise EmulationError(f"{opcode} on an uninitialised barrier at {address}{peer}")
        threads = int(mask.sum())
        if kind == "expect_tx" or "expect_tx" in opcode:
            barrier.tx += threads * self._uniform(operands[1], mask, "the byte count")
        if kind == "arrive":
            times = 1 if "expect_tx" in opcode or len(operands) < 2 else self._uniform(operands[1], mask, "the count")
            barrier.arrive(threads * times)
            # An arrive.expect_tx whose bytes are still due cannot complete its phase, so nobody could see it:
            # running on to issue those copies is what exposes a consumer that released a stage too early.
            self.yield_now = self.cta.preempt and not ("expect_tx" in opcode and barrier.tx > 0)
        elif kind in ("try_wait", "test_wait"):
            parity = self.value(operands[1])[mask] & 1
            ready = barrier.phase % 2 != parity
            if ready.any() and barrier.remote_data_phase == barrier.phase and ".cluster" not in opcode:
                raise EmulationError(f"{opcode}: the phase it waits for completed with st.async bytes from another "
                                     "CTA, whose complete_tx releases at cluster scope; this wait acquires at CTA "
                                     "scope (the default), so the bytes are not ordered before its reads: use "
                                     ".acquire.cluster")
            if not ready.any() and kind == "try_wait":  # a later try_wait will succeed: block instead of spinning
                self.wait = MbarrierWait(barrier, address, int(parity[0]))
                return
            result = np.zeros(self.n, bool)
            result[mask] = ready
            self.write(ops[0], self._seen_by_warps(result, mask, address, barrier, late=kind == "test_wait"), mask)
        elif kind != "expect_tx":
            raise EmulationError(f"unsupported {opcode}")


    def _seen_by_warps(self, result, mask, address: int, barrier: Barrier, late: bool):
        """What each warp's wait reports of a completed phase. Warps of one warpgroup poll at different times on the
        GPU, so under a seeded schedule a non-blocking ``test_wait`` may report a phase incomplete to a warp that
        has not yet seen it complete (it tested earlier), each warp by its own coin; once a warp has seen it, or
        passed a barrier after another warp saw it (:meth:`_see_everything`), it keeps seeing it. So a choice made
        from the poll may differ between the warps of a warpgroup, and a collective made to depend on it (wgmma)
        shows up here executed by part of one. Reporting a completed phase complete is always sound; only the lag
        needs these records, which live on the barrier (a re-initialised one starts without them)."""
        rng = self.cta.rng
        for warp in np.unique(np.flatnonzero(mask) // 32):
            lanes = mask & (np.arange(self.n) // 32 == warp)
            if not result[lanes].any():
                continue
            key = (self.index, int(warp))
            if late and rng is not None and barrier.seen.get(key, 0) < barrier.phase and rng.random() < 0.5:
                result[lanes] = False
            else:
                barrier.seen[key] = max(barrier.seen.get(key, 0), barrier.phase)
        return result

    def _see_everything(self):
        """Past a bar.sync or a cluster wait, every warp of this warpgroup sees every phase completed by now: that
        includes whatever any warp saw before the barrier (seeing more than that is sound: those phases did
        complete)."""
        self.synced = False
        warps = range((self.n + 31) // 32)
        for barrier in self.cta.barriers.values():
            for warp in warps:
                barrier.seen[(self.index, warp)] = barrier.phase


__all__ = ["Warpgroup"]
