"""What a warpgroup does through the async proxy (PTX ISA "Proxies"): wgmma.mma_async reading its operands from
shared memory, TMA loads and stores (cp.async.bulk.tensor, cp.reduce.async.bulk.tensor) and their bulk groups, and
fence.proxy.async, which orders the generic proxy's shared-memory writes before those reads. A mixin of
:class:`ptx.emulate.warpgroup.Warpgroup`: it uses the warpgroup's registers, addresses and CTA.

* wgmma.mma_async (m64nNk32 .f32.e4m3.e4m3, both operands by descriptor) is queued at issue; its operands are
  read from shared memory at wgmma.wait_group, where the accumulators are updated (reading them earlier is an
  error): exactly, or under ptx.emulate.matrix.accumulator_model (a model of the limited-precision accumulator,
  off unless asked for). Descriptors: start address, leading and stride byte offsets,
  layout type. With a swizzle of S = 128, 64 or 32 bytes, element (row r, K byte c) of a K-major operand sits
  at start + (r // 8) * SBO + (r % 8) * S + c, then address bits 4.. are XORed with bits 7.. (3, 2 or 1 bits);
  without one (layout type 0), at start + (r // 8) * SBO + (c // 16) * LBO + (r % 8) * 16 + c % 16. Reading an
  accumulator before the wait is an error that names the wgmma.
* Proxies (PTX ISA "Proxies", fence.proxy.async): shared memory written through the generic proxy (st.shared,
  cp.async as it lands, stmatrix, st.shared::cluster) remembers its writing thread until that thread executes
  fence.proxy.async (.shared::cta: its writes to its own CTA; unqualified or .shared::cluster: to any CTA of the
  cluster). An async-proxy read of such bytes, a wgmma's operands at issue or a TMA store's box at issue, is an
  error naming the bytes, the thread and the line that wrote them. TMA loads write through the async proxy.
  (mbarrier objects are not shared memory bytes here, so fencing mbarrier.init is not checked.)
"""
from __future__ import annotations

import numpy as np

from . import bulk_copies
from .common import E4M3, EmulationError, _vector, split_shared
from .matrix import warps as _collective_warps
from .matrix import stmatrix_targets, wgmma_accumulate

MAX_THREADS = 1024  # per CTA: a generic-proxy writer is identified as rank * MAX_THREADS + thread
CACHE_POLICY_TAG = 0x1C0DE_0000  # createpolicy's opaque value here: the tag plus the priority's index
SWIZZLE_BYTES = {1: 128, 2: 64, 3: 32}  # wgmma descriptor layout type (bits 62-63) -> swizzle span; 0: none


class AsyncProxy:
    # -- proxies: generic-proxy writes, fence.proxy.async, async-proxy reads ------------------------------
    def note_generic_write(self, offsets: np.ndarray, threads: np.ndarray, line: int, cta=None):
        cta = self.cta if cta is None else cta
        writers = self.cta.rank * MAX_THREADS + np.asarray(threads, np.int32)
        cta.generic_writer[offsets] = writers.reshape(-1, *([1] * (offsets.ndim - 1)))
        cta.generic_line[offsets] = line

    def _note_stmatrix(self, opcode, ops, mask):
        """The bytes an stmatrix just wrote (matrix.stmatrix_targets: lane L of a warp writes two 16-bit halves of
        matrix j, plain or .trans, at row addresses lanes 8j.. supplied)."""
        addresses, lane = self.address(ops[0]), np.arange(32)
        for warp in _collective_warps(mask, "stmatrix"):
            for j in range(len(_vector(ops[1]))):
                rows = addresses[32 * warp + 8 * j:32 * warp + 8 * j + 8]
                for start, _ in stmatrix_targets(rows, ".trans" in opcode):
                    self.note_generic_write(start[:, None] + np.arange(2), self.tid[32 * warp + lane], self.line)

    def proxy_fence(self, space: str, mask):
        """fence.proxy.async{.space}: the executing threads' generic-proxy writes to shared memory become
        visible to the async proxy (.shared::cta: in their own CTA; none or .shared::cluster: in any CTA of the
        cluster; .global: no shared memory)."""
        if space == "global" or not mask.any():
            return
        cluster = self.cta.cluster
        fenced = np.zeros(MAX_THREADS * cluster.size, bool)
        fenced[self.cta.rank * MAX_THREADS + self.tid[mask]] = True
        for cta in [self.cta] if space == "shared::cta" else cluster.ctas:
            dirty = np.flatnonzero(cta.generic_writer >= 0)
            if dirty.size:
                cta.generic_writer[dirty[fenced[cta.generic_writer[dirty]]]] = -1

    def check_async_read(self, cta, addresses: np.ndarray, what: str):
        """An async-proxy read of shared ``addresses`` of ``cta``: none may hold an unfenced generic write."""
        addresses = np.asarray(addresses).reshape(-1)
        writers = cta.generic_writer[addresses]
        unfenced = np.flatnonzero(writers >= 0)
        if not unfenced.size:
            return
        first, writer = int(addresses[unfenced[0]]), int(writers[unfenced[0]])
        line = int(cta.generic_line[first])
        text = next((ins.text for ins in self.program.code if ins.line == line and not ins.label), "")
        rank = f"CTA rank {writer // MAX_THREADS} " if cta.cluster.size > 1 else ""
        raise EmulationError(
            f"missing fence.proxy.async: {what} (the async proxy) reads {unfenced.size} bytes of shared memory "
            f"that the generic proxy wrote and no fence.proxy.async has ordered since; the first, offset {first}, "
            f"was written by {rank}thread {writer % MAX_THREADS} at line {line}: {text} The writing threads must "
            "execute fence.proxy.async.shared::cta after their writes (then meet at a barrier) before the async "
            "proxy reads them, or it may read stale bytes")


    # -- L2 cache policies (createpolicy, .L2::cache_hint) ----------------------------------------------
    def create_policy(self, parts, ops, mask):
        """createpolicy.fractional.L2::evict_*.b64 d, fraction: there is no L2 here, so the policy is only a tag
        that the hinted loads check they were given (its priority in the low bits)."""
        priorities = ("L2::evict_normal", "L2::evict_first", "L2::evict_last", "L2::evict_unchanged")
        if parts[1] != "fractional" or parts[2] not in priorities or parts[3:] != ["b64"]:
            raise EmulationError(f"{'.'.join(parts)} is not modelled (createpolicy.fractional.L2::evict_*.b64)")
        fraction = float(ops[1]) if len(ops) > 1 else 1.0
        if not 0.0 < fraction <= 1.0:
            raise EmulationError(f"createpolicy fraction {ops[1]} is outside (0, 1]")
        self.write(ops[0], np.full(self.n, CACHE_POLICY_TAG + priorities.index(parts[2]), np.int64), mask)

    def _without_policy(self, parts, ops, mask):
        """A .L2::cache_hint copy's operands without its last one, the policy, which must come from createpolicy."""
        if "L2::cache_hint" not in parts:
            return ops
        if len(ops) < 4 or (self.value(ops[-1])[mask] & ~0xF != CACHE_POLICY_TAG).any():
            raise EmulationError(f"{'.'.join(parts)}: the last operand must be a cache policy made by createpolicy, "
                                 f"got {ops[-1]!r}")
        return ops[:-1]

    # -- TMA ----------------------------------------------------------------------------------------------
    def bulk(self, parts, ops, mask, reduce: str | None = None):
        threads = np.flatnonzero(mask)
        ops = self._without_policy(parts, ops, mask)
        if parts[3] == "commit_group":
            for t in threads:
                self.cta.bulk.commit(int(self.tid[t]))
        elif parts[3] == "wait_group":  # .read or not: reading shared memory and writing global happen together
            for t in threads:
                self.cta.bulk.wait(int(self.tid[t]), int(ops[0]), self.smem)
        elif parts[3:6] == ["prefetch", "tensor", "2d"]:  # into L2 only: only its operands to check
            for t in threads:
                self._box(ops[0], t)
        elif parts[3:5] == ["tensor", "2d"] and parts[5].startswith("shared"):
            for t in threads:
                tmap, x, y = self._box(ops[1], t)
                dst, mbar = int(self.address(ops[0])[t]), int(self.address(ops[2])[t])
                for cta, dst, mbar in self._load_targets(parts, ops, t, dst, mbar):
                    barrier = cta.barriers.get(mbar)
                    if barrier is None:
                        raise EmulationError(f"TMA load completes on an uninitialised barrier at {mbar} of CTA "
                                             f"rank {cta.rank}")
                    barrier.complete_tx(bulk_copies.load(cta.smem, tmap, x, y, dst))
                    cta.generic_writer[bulk_copies.box_addresses(tmap, dst)] = -1  # written by the async proxy
        elif parts[3:6] == ["tensor", "2d", "global"] and "bulk_group" in parts:
            for t in threads:
                tmap, x, y = self._box(ops[0], t)
                store = bulk_copies.PendingStore(tmap, x, y, int(self.address(ops[1])[t]), reduce)
                box = bulk_copies.box_addresses(tmap, store.smem_address)  # alignment errors at issue, where they belong
                self.check_async_read(self.cta, box[bulk_copies._window(tmap, x, y)[0]], "a TMA store")
                self.cta.bulk.issue(int(self.tid[t]), store)
        else:
            raise EmulationError(f"{'.'.join(parts)} is not modelled")

    def _load_targets(self, parts, ops, t: int, dst: int, mbar: int):
        """[(CTA, dst offset, barrier offset)] a TMA load writes to. Multicast (PTX ISA "cp.async.bulk.tensor",
        .multicast::cluster): every CTA whose rank bit is set in the 16-bit mask gets the box at the same offset
        and complete_tx on the barrier at the same offset. Otherwise one CTA, the one ``dst`` names (a CTA-local
        address: this one), whose barrier ``mbar`` must be."""
        cluster, what = self.cta.cluster, "TMA load"
        if "multicast::cluster" not in parts:
            (cta, dst), (bar_cta, mbar) = (cluster.target(a, self.cta, what) for a in (dst, mbar))
            if cta is not bar_cta:
                raise EmulationError(f"TMA load into CTA rank {cta.rank} completes on CTA rank {bar_cta.rank}'s "
                                     "barrier: they must be the same CTA")
            return [(cta, dst, mbar)]
        if len(ops) < 4:
            raise EmulationError("a .multicast::cluster TMA load needs the CTA mask operand")
        ranks = int(self.value(ops[3])[t]) & 0xFFFF
        if ranks == 0 or ranks >> cluster.size:
            raise EmulationError(f"multicast mask {ranks:#x} for a cluster of {cluster.size} CTAs")
        dst, mbar = (split_shared(a)[1] for a in (dst, mbar))  # offsets, applied in every destination CTA
        return [(cluster.peer(rank, self.cta, f"TMA multicast (mask {ranks:#x})", dst), dst, mbar)
                for rank in range(cluster.size) if ranks >> rank & 1]

    def _box(self, operand: str, t: int):
        tmap_reg, coords = operand.strip()[1:-1].split(",", 1)
        handle = int(self.value(tmap_reg)[t])
        if handle not in self.cta.tensor_maps:
            raise EmulationError(f"{tmap_reg} does not hold a tensor map parameter's address")
        x, y = (int(self.value(c)[t]) for c in _vector(coords.strip()))
        return self.cta.tensor_maps[handle], x, y

    # -- wgmma --------------------------------------------------------------------------------------------
    def wgmma(self, parts, ops, mask):
        if not mask.all() or self.n != 128:
            raise EmulationError(f"{'.'.join(parts)} executed by only part of the warpgroup")
        if parts[1] == "fence":
            return
        if parts[1] == "commit_group":
            self.wgmma_groups.append(self.wgmma_open)
            self.wgmma_open = []
            return
        if parts[1] == "wait_group":
            while len(self.wgmma_groups) > int(ops[0]):
                for issued in self.wgmma_groups.pop(0):
                    self._multiply(*issued[:6])  # the last item: the line that issued it
            self.in_flight = {name: op[6] for group in self.wgmma_groups + [self.wgmma_open] for op in group
                              for name in op[0]}
            return
        if parts[1] != "mma_async" or parts[5:8] != ["f32", "e4m3", "e4m3"]:
            raise EmulationError(f"{'.'.join(parts)}: only mma_async .f32.e4m3.e4m3 is modelled")
        shape = parts[4]
        n = int(shape[shape.index("n") + 1:shape.index("k")])
        acc = _vector(ops[0])
        if shape != f"m64n{n}k32" or len(acc) != n // 2:
            raise EmulationError(f"{shape}: expected m64nNk32 with {n // 2} accumulators, got {len(acc)}")
        descs = [self._uniform(x, mask, "a wgmma descriptor") & 0xFFFFFFFFFFFFFFFF for x in ops[1:3]]
        scale_d = bool(self._uniform(ops[3], mask, "scale-d"))
        sign = np.prod([self._uniform(x, mask, "imm-scale") for x in ops[4:6]]) if len(ops) > 4 else 1
        for desc, rows, name in ((descs[0], 64, "A"), (descs[1], n, "B")):  # the async proxy reads them
            self.check_async_read(self.cta, self._operand_addresses(desc, rows), f"wgmma.mma_async's {name} operand")
        self.wgmma_open.append((acc, descs[0], descs[1], scale_d, n, sign, self.line))
        self.in_flight.update(dict.fromkeys(acc, self.line))

    def _operand_addresses(self, desc: int, rows: int) -> np.ndarray:
        """(rows, 32) shared addresses of a K-major operand's bytes, laid out as its descriptor says."""
        start = (desc & 0x3FFF) << 4
        leading = ((desc >> 16) & 0x3FFF) << 4
        stride = ((desc >> 32) & 0x3FFF) << 4
        r = np.arange(rows)[:, None]
        c = np.arange(32)[None, :]
        if desc >> 62 == 0:  # no swizzle: 8-row x 16-byte core matrices, LBO apart along K, SBO along rows
            addresses = start + (r // 8) * stride + (c // 16) * leading + (r % 8) * 16 + c % 16
        else:
            span = SWIZZLE_BYTES[desc >> 62]
            linear = start + (r // 8) * stride + (r % 8) * span + c
            addresses = linear ^ (((linear >> 7) & (span // 16 - 1)) << 4)
        return self._shared(addresses.reshape(-1), 1).reshape(rows, 32)

    def _operand(self, desc: int, rows: int) -> np.ndarray:
        return self.smem[self._operand_addresses(desc, rows)].view(E4M3).astype(np.float64)

    def _multiply(self, acc, a_desc, b_desc, scale_d, n, sign):
        for name in acc:
            if scale_d and name not in self.regs:
                raise EmulationError(f"wgmma accumulates into {name}, which was never written")
        current = np.stack([self.regs[name].astype(np.float64) for name in acc], 1) if scale_d else None
        rows, cols = _accumulator_layout(n)  # (128 threads, n / 2); the arithmetic (exact or modelled): matrix
        d = wgmma_accumulate(self._operand(a_desc, 64), self._operand(b_desc, n), sign, rows, cols, current)
        for name, value in zip(acc, d.T.copy()):  # (n / 2, 128): one contiguous row per register
            self.regs[name] = value


def _accumulator_layout(n: int):
    """PTX ISA "Register Fragments" of wgmma D (m64nN, f32): (row, col) of accumulator i of each thread."""
    tid = np.arange(128)[:, None]
    warp, lane, i = tid // 32, tid % 32, np.arange(n // 2)[None, :]
    return 16 * warp + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


__all__ = ["AsyncProxy"]
