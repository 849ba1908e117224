"""CPU emulation of the PTX stages 05 and 06 generate: tests/ptx_emulator.py plus warpgroup MMA, TMA and
mbarriers, each modelled from the PTX ISA's text independently of ptx.vocab (so a wrong descriptor, swizzle,
fragment, byte count or barrier parity in the generator shows up as a wrong answer or a deadlock).

Models (PTX ISA 8.5):
* wgmma.mma_async (m64nNk32 .f32.e4m3.e4m3, both operands by descriptor): decode the descriptor's start
  address, stride byte offset and swizzle mode; element (row r, K byte c) of a K-major 128B-swizzled operand
  sits at address  start + (r // 8) * SBO + (r % 8) * 128 + c, with address bits 4-6 XORed with bits 7-9.
  Results land in the accumulators only at wgmma.wait_group (reading them earlier sees stale values).
* cp.async.bulk.tensor.2d: copy the box at (x, y) from the tensor the map describes, zero outside it,
  into shared memory (128B swizzle: the same address XOR), then complete_tx(box bytes) on the mbarrier.
* mbarrier: pending arrivals and transaction bytes per phase; try_wait.parity(P) is true once the phase
  with parity P has completed, i.e. when the current phase's parity differs from P.
* Divergence: a forward branch taken by some threads parks them until the target label (if-then); an
  unsatisfiable wait (the only threads running are waiting) is reported as a deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ptx_emulator import CTA, E4M3, EmulationError, GlobalMemory, _split_operands, _vector


@dataclass
class FakeTensorMap:
    data: np.ndarray  # the tensor's bytes (any shape; viewed flat)
    dtype: np.dtype
    shape: tuple[int, int]  # rows, cols (elements)
    row_stride_bytes: int
    box: tuple[int, int]  # rows, cols
    swizzle: int


@dataclass
class Barrier:
    count: int
    pending: int
    tx: int = 0
    phase: int = 0  # completed phases

    def arrive(self, times: int = 1):
        self.pending -= times
        self._maybe_complete()

    def complete_tx(self, nbytes: int):
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending < 0:
            raise EmulationError("more arrivals than the barrier's count in one phase")
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count


def _swizzle_128(addresses: np.ndarray) -> np.ndarray:
    return addresses ^ (((addresses >> 7) & 7) << 4)


class WarpgroupCTA(CTA):
    def __init__(self, *args, symbols: dict[str, int], tensor_maps: dict[int, FakeTensorMap], **kwargs):
        super().__init__(*args, **kwargs)
        self.symbols = symbols
        self.tensor_maps = tensor_maps
        self.barriers: dict[int, Barrier] = {}
        self.in_flight: dict[str, np.ndarray] = {}  # accumulators written by wgmmas not yet waited for
        self.spins = 0

    def value(self, token: str):
        token = token.strip()
        if token in self.symbols:
            return np.full(self.n, self.symbols[token], np.int64)
        if token.startswith("!"):
            return ~super().value(token[1:]).astype(bool)
        return super().value(token)

    # -- control flow with parked threads ------------------------------------------------------------
    def run(self, max_steps: int = 20_000_000):
        pc, steps, active, parked = 0, 0, np.ones(self.n, bool), []
        while pc < len(self.lines):
            line = self.lines[pc]
            steps += 1
            if steps > max_steps:
                raise EmulationError("too many steps")
            if line.endswith(":"):
                for entry in [e for e in parked if e[0] == pc]:
                    active |= entry[1]
                    parked.remove(entry)
                pc += 1
                continue
            mask = active.copy()
            if line.startswith("@"):
                guard, line = line.split(None, 1)
                predicate = self.regs[guard.lstrip("@!")].astype(bool)
                mask &= ~predicate if guard.startswith("@!") else predicate
            opcode, _, rest = line.rstrip(";").partition(" ")
            operands = _split_operands(rest)
            if opcode.startswith("bra"):
                target = self.labels[operands[0]]
                staying = active & ~mask
                if not mask.any():
                    pc += 1
                elif not staying.any():
                    if any(pc < e[0] <= target for e in parked):
                        raise EmulationError(f"branch at {line!r} jumps over threads parked at a label")
                    pc = target
                elif target > pc:
                    parked.append((target, mask.copy()))
                    active = staying
                    pc += 1
                else:
                    raise EmulationError(f"divergent backward branch at {line!r}")
                continue
            if opcode == "ret":
                if parked:
                    raise EmulationError("ret with parked threads")
                return
            self.execute(opcode, operands, mask)
            pc += 1
        if parked:
            raise EmulationError("kernel ended with parked threads")

    # -- instructions ------------------------------------------------------------------------------------
    def execute(self, opcode: str, ops: list[str], mask: np.ndarray):
        parts = opcode.split(".")
        v = self.value
        if opcode in ("mul.lo.u32", "mad.lo.u32"):
            result = (v(ops[1]).astype(np.int64) & 0xFFFFFFFF) * (v(ops[2]).astype(np.int64) & 0xFFFFFFFF)
            if parts[0] == "mad":
                result = result + v(ops[3]).astype(np.int64)
            self.write(ops[0], result & 0xFFFFFFFF, mask)
        elif opcode == "or.b64":
            self.write(ops[0], (v(ops[1]).astype(np.uint64) | v(ops[2]).astype(np.uint64)).astype(np.int64), mask)
        elif opcode == "add.s64":  # 64-bit adds: descriptors and addresses (no overflow in range)
            self.write(ops[0], v(ops[1]).astype(np.int64) + v(ops[2]).astype(np.int64), mask)
        elif opcode == "setp.ge.or.u32":
            self.write(ops[0], (v(ops[1]) >= v(ops[2])) | v(ops[3]).astype(bool), mask)
        elif opcode == "cvta.param.u64":
            self.write(ops[0], v(ops[1]), mask)
        elif opcode in ("bar.sync", "bar.warp.sync") or parts[0] == "wgmma" and parts[1] == "fence":
            if not mask.all():
                raise EmulationError(f"{opcode} executed by only some threads")
        elif parts[0] in ("fence", "prefetch"):
            pass
        elif opcode == "wgmma.commit_group.sync.aligned":
            pass
        elif opcode == "wgmma.wait_group.sync.aligned":
            if int(ops[0]) != 0:
                raise EmulationError("only wait_group 0 is modelled")
            for name, value in self.in_flight.items():
                self.regs[name] = value
            self.in_flight = {}
        elif parts[0] == "wgmma":
            self.wgmma(opcode, ops, mask)
        elif parts[0] == "mbarrier":
            self.mbarrier(opcode, ops, mask)
        elif parts[0] == "cp" and parts[2] == "bulk":
            self.tma_load(ops, mask)
        elif parts[0] == "ld" and parts[1] == "shared" and parts[-1] != "f32":
            self.ld_shared(parts, ops, mask)
        elif parts[0] == "st" and parts[1] == "shared":
            size = int(parts[-1][1:]) // 8
            addresses = self._shared(self.address(ops[0])[mask], size)
            values = v(ops[1])[mask].astype(np.uint64)
            for byte in range(size):
                self.smem[addresses + byte] = ((values >> np.uint64(8 * byte)) & np.uint64(0xFF)).astype(np.uint8)
        elif opcode == "st.global.v4.b32":
            if mask.any():
                data, offsets = self.memory.locate(self.address(ops[0])[mask], 16)
                for w, name in enumerate(_vector(ops[1])):
                    values = v(name)[mask].astype(np.uint64)
                    for byte in range(4):
                        data[offsets + 4 * w + byte] = ((values >> np.uint64(8 * byte)) & np.uint64(0xFF)).astype(np.uint8)
        else:
            if any(name in self.in_flight for name in ops):
                raise EmulationError(f"{opcode} reads an accumulator before wgmma.wait_group")
            super().execute(opcode, ops, mask)

    def ld_shared(self, parts, ops, mask):
        size = int(parts[-1][1:]) // 8
        names = _vector(ops[0]) if parts[2].startswith("v") else [ops[0]]
        base = self._shared(self.address(ops[1]), size * len(names))
        for i, name in enumerate(names):
            word = np.zeros(self.n, np.int64)
            for byte in range(size):
                word |= self.smem[base + size * i + byte].astype(np.int64) << (8 * byte)
            self.write(name, word, mask)

    # -- wgmma -------------------------------------------------------------------------------------------
    def _operand(self, desc: int, rows: int) -> np.ndarray:
        start = (desc & 0x3FFF) << 4
        stride = ((desc >> 32) & 0x3FFF) << 4
        if desc >> 62 != 1:
            raise EmulationError(f"descriptor {desc:#x}: only the 128B swizzle is modelled")
        r = np.arange(rows)[:, None]
        c = np.arange(32)[None, :]
        addresses = _swizzle_128(start + (r // 8) * stride + (r % 8) * 128 + c)
        return self.smem[self._shared(addresses.reshape(-1), 1)].reshape(rows, 32).view(E4M3).astype(np.float64)

    def wgmma(self, opcode, ops, mask):
        if not mask.all():
            raise EmulationError("wgmma under a partial mask")
        shape = opcode.split(".")[4]
        n = int(shape[shape.index("n") + 1:shape.index("k")])
        acc = _vector(ops[0])
        if len(acc) != n // 2:
            raise EmulationError(f"{shape}: expected {n // 2} accumulators, got {len(acc)}")
        lane = np.arange(32)
        for wg in range(self.n // 128):
            threads = slice(128 * wg, 128 * wg + 128)
            descs = [self.value(x)[threads].astype(np.uint64) for x in ops[1:3]]
            scale_d = self.value(ops[3])[threads].astype(bool)
            if any(len(set(d.tolist())) != 1 for d in descs) or len(set(scale_d.tolist())) != 1:
                raise EmulationError("wgmma operands differ within a warpgroup")
            a = self._operand(int(descs[0][0]), 64)
            b = self._operand(int(descs[1][0]), n)
            d = a @ b.T
            for w in range(4):
                ids = 128 * wg + 32 * w + lane
                for i, name in enumerate(acc):  # ISA "Register Fragments" of wgmma D
                    row = 16 * w + lane // 4 + 8 * ((i // 2) % 2)
                    col = 8 * (i // 4) + 2 * (lane % 4) + i % 2
                    current = self.in_flight.get(name, self.regs.get(name))
                    value = d[row, col] + (current[ids].astype(np.float64) if scale_d[0] else 0.0)
                    out = self.in_flight.setdefault(name, np.zeros(self.n, np.float32))
                    out[ids] = value.astype(np.float32)

    # -- mbarrier and TMA ----------------------------------------------------------------------------------
    def mbarrier(self, opcode, ops, mask):
        if not mask.any():
            return
        kind = opcode.split(".")[1]
        address_op = ops[0] if kind == "init" else ops[1]
        addresses = set(self.address(address_op)[mask].tolist())
        if len(addresses) != 1:
            raise EmulationError(f"{opcode}: threads use different barriers")
        address = addresses.pop()
        if address % 8:
            raise EmulationError(f"mbarrier at {address} is not 8-byte aligned")
        if kind == "init":
            count = int(ops[1])
            self.barriers[address] = Barrier(count, count)
            return
        barrier = self.barriers.get(address)
        if barrier is None:
            raise EmulationError(f"{opcode} on an uninitialised barrier at {address}")
        if kind == "arrive":
            if "expect_tx" in opcode:
                barrier.tx += int(mask.sum()) * int(self.value(ops[2])[0])
            barrier.arrive(int(mask.sum()))
        elif kind == "try_wait":
            parity = self.value(ops[2])[mask]
            ready = (barrier.phase % 2) != parity
            if not ready.any():
                self.spins += 1
                if self.spins > 3:
                    raise EmulationError(f"deadlock: waiting for parity {parity[0]} on barrier {address} "
                                         f"({barrier})")
            else:
                self.spins = 0
            result = np.zeros(self.n, bool)
            result[mask] = ready
            self.write(ops[0], result, mask)
        else:
            raise EmulationError(f"unsupported {opcode}")

    def tma_load(self, ops, mask):
        threads = np.flatnonzero(mask)
        for t in threads:
            dst = int(self.address(ops[0])[t])
            inner = ops[1].strip()[1:-1]
            tmap_reg, coords = inner.split(",", 1)
            x, y = (int(self.value(c)[t]) for c in _vector(coords.strip()))
            tmap = self.tensor_maps[int(self.value(tmap_reg)[t])]
            barrier = self.barriers[int(self.address(ops[2])[t])]
            rows, cols = tmap.box
            item = tmap.dtype.itemsize
            if dst % (1024 if tmap.swizzle else 128):
                raise EmulationError(f"TMA destination {dst} is misaligned for swizzle {tmap.swizzle}")
            box = np.zeros((rows, cols * item), np.uint8)
            flat = tmap.data.reshape(-1).view(np.uint8)
            for r in range(rows):
                if 0 <= y + r < tmap.shape[0]:
                    valid = max(0, min(cols, tmap.shape[1] - x))
                    start = (y + r) * tmap.row_stride_bytes + x * item
                    box[r, :valid * item] = flat[start:start + valid * item]
            addresses = dst + np.arange(rows * cols * item)
            if tmap.swizzle == 128:
                if cols * item != 128:
                    raise EmulationError("the model covers 128-byte rows with the 128B swizzle only")
                addresses = _swizzle_128(addresses)
            elif tmap.swizzle:
                raise EmulationError("only swizzle 0 and 128 are modelled")
            self.smem[self._shared(addresses, 1)] = box.reshape(-1)
            barrier.complete_tx(box.size)


def run_kernel(ptx: str, kernel: str, grid, threads: int, shared_bytes: int, args: dict):
    """Run every CTA; ndarray arguments are device buffers (written in place), FakeTensorMap arguments are
    by-value tensor maps, ints are scalars."""
    memory = GlobalMemory()
    params, symbols, tensor_maps = {}, {}, {}
    for name, value in args.items():
        param = f"{kernel}_param_{name}"
        if isinstance(value, FakeTensorMap):
            handle = 0x7000_0000 + len(tensor_maps) * 0x100
            symbols[param], tensor_maps[handle] = handle, value
        elif isinstance(value, np.ndarray):
            params[param] = memory.add(name, value)
        else:
            params[param] = int(value)
    for y in range(grid[1]):
        for x in range(grid[0]):
            cta = WarpgroupCTA(ptx, kernel, params, memory, (x, y), threads, shared_bytes,
                               symbols={**symbols, "smem": 0}, tensor_maps=tensor_maps)
            cta.run()
            for address, barrier in cta.barriers.items():
                if barrier.tx != 0 or barrier.pending != barrier.count:
                    raise EmulationError(f"barrier {address} left mid-phase: {barrier}")
