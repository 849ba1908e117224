"""A tiny CPU interpreter for the PTX subset stage 04 generates: runs a kernel's text on NumPy, no GPU.

Why: the CPU suite can assemble the kernel, but only running it shows that the address arithmetic, clamps,
masks, stage rotation and promotion in the *text* are right. All threads of a CTA run in lockstep (one
NumPy vector per register); warp-collective instructions (ldmatrix, mma) are evaluated per warp from the
PTX ISA's definitions, written here independently of ptx.vocab.mma. cp.async copies are queued per commit
group and land only at cp.async.wait_group, so a read of a stage before its wait sees stale bytes. Every
global or shared access is bounds-checked against the buffers it may touch (an error, not a fault).

Not modeled: timing, bank conflicts, memory races between threads (bar.sync is a no-op in lockstep).
"""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
_MASK = {"32": 0xFFFFFFFF, "64": 0xFFFFFFFFFFFFFFFF}


class EmulationError(AssertionError):
    pass


class GlobalMemory:
    """Named host buffers at fake device addresses (1 GiB apart); every access is bounds-checked."""

    def __init__(self):
        self.buffers: list[tuple[int, np.ndarray, str]] = []

    def add(self, name: str, array: np.ndarray) -> int:
        base = (len(self.buffers) + 1) << 30
        self.buffers.append((base, array.reshape(-1).view(np.uint8), name))
        return base

    def locate(self, addresses: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
        for base, data, name in self.buffers:
            if addresses.min() >= base and addresses.max() < base + (1 << 30):
                offsets = addresses - base
                if offsets.min() < 0 or offsets.max() + size > data.size:
                    bad = int(offsets.max())
                    raise EmulationError(f"out-of-bounds access to {name}: byte {bad} of {data.size}")
                return data, offsets
        raise EmulationError(f"address range {addresses.min():#x}..{addresses.max():#x} is in no buffer")


def _gather(data: np.ndarray, offsets: np.ndarray, size: int) -> np.ndarray:
    return data[offsets[:, None] + np.arange(size)]


class CTA:
    def __init__(self, ptx: str, kernel: str, params: dict, memory: GlobalMemory, ctaid, threads: int,
                 shared_bytes: int):
        self.memory, self.params, self.ctaid, self.n = memory, params, ctaid, threads
        self.regs: dict[str, np.ndarray] = {}
        self.smem = np.zeros(shared_bytes, np.uint8)
        self.pending: list[list] = []  # committed cp.async groups (oldest first)
        self.open_group: list = []
        body = ptx[ptx.index(f".entry {kernel}"):]
        body = body[body.index("{") + 1:]
        self.lines = [line.split("//")[0].strip() for line in body.splitlines()]
        self.lines = [line for line in self.lines if line and not line.startswith(".") and line != "}"]
        self.labels = {line[:-1]: i for i, line in enumerate(self.lines) if line.endswith(":")}
        self.shared_symbols: dict[str, int] = {}

    # -- operands -------------------------------------------------------------------------------------
    def value(self, token: str):
        token = token.strip()
        if token in self.regs:
            return self.regs[token]
        if token.startswith("0f"):
            return np.full(self.n, np.uint32(int(token[2:], 16)).view(np.float32), np.float32)
        if re.fullmatch(r"-?\d+", token):
            return np.full(self.n, int(token), np.int64)
        specials = {"%tid.x": np.arange(self.n, dtype=np.int64), "%ctaid.x": self.ctaid[0], "%ctaid.y": self.ctaid[1]}
        if token in specials:
            return np.broadcast_to(np.asarray(specials[token], np.int64), (self.n,)).copy()
        if token in self.shared_symbols:
            return np.full(self.n, self.shared_symbols[token], np.int64)
        raise EmulationError(f"unknown operand {token!r}")

    def address(self, token: str) -> np.ndarray:
        inner = token.strip()[1:-1]
        base, _, offset = inner.partition("+")
        return self.value(base).astype(np.int64) + (int(offset) if offset else 0)

    def write(self, name: str, value, mask):
        value = np.asarray(value)
        if name not in self.regs or mask.all():
            self.regs[name] = value.copy() if mask.all() else np.where(mask, value, np.zeros_like(value))
        else:
            self.regs[name] = np.where(mask, value, self.regs[name]).astype(value.dtype)

    # -- execution ------------------------------------------------------------------------------------
    def run(self, max_steps: int = 10_000_000):
        pc, steps = 0, 0
        while pc < len(self.lines):
            line = self.lines[pc]
            steps += 1
            if steps > max_steps:
                raise EmulationError("too many steps")
            if line.endswith(":"):
                pc += 1
                continue
            mask = np.ones(self.n, bool)
            if line.startswith("@"):
                guard, line = line.split(None, 1)
                negate = guard.startswith("@!")
                mask = self.regs[guard.lstrip("@!")].astype(bool)
                mask = ~mask if negate else mask
            opcode, _, rest = line.rstrip(";").partition(" ")
            operands = _split_operands(rest)
            if opcode == "bra":
                if mask.any() and not mask.all():
                    raise EmulationError(f"divergent branch at {line!r}")
                pc = self.labels[operands[0]] if mask.all() else pc + 1
                continue
            if opcode == "ret":
                return
            self.execute(opcode, operands, mask)
            pc += 1

    def execute(self, opcode: str, ops: list[str], mask: np.ndarray):
        parts = opcode.split(".")
        name = parts[0]
        v = self.value
        if name == "mov":
            self.write(ops[0], v(ops[1]), mask)
        elif name in ("and", "xor", "shl", "shr", "add", "sub", "min", "max") and parts[1] != "pred":
            a, b = v(ops[1]).astype(np.int64), v(ops[2]).astype(np.int64)
            width = parts[-1][1:]
            signed = parts[-1].startswith("s")
            if signed:
                a, b = _signed(a, width), _signed(b, width)
            result = {"and": lambda: a & b, "xor": lambda: a ^ b, "shl": lambda: a << b, "shr": lambda: a >> b,
                      "add": lambda: a + b, "sub": lambda: a - b, "min": lambda: np.minimum(a, b),
                      "max": lambda: np.maximum(a, b)}[name]()
            self.write(ops[0], result & _MASK[width] if width == "32" else result, mask)
        elif opcode == "and.pred":
            self.write(ops[0], v(ops[1]).astype(bool) & v(ops[2]).astype(bool), mask)
        elif opcode == "mul.wide.u32":
            self.write(ops[0], (v(ops[1]) & _MASK["32"]) * (v(ops[2]) & _MASK["32"]), mask)
        elif opcode in ("cvt.u64.u32", "cvta.to.global.u64"):
            self.write(ops[0], v(ops[1]).astype(np.int64), mask)
        elif name == "setp":
            a, b = v(ops[1]), v(ops[2])
            if parts[2].startswith("s"):
                a, b = _signed(a, parts[2][1:]), _signed(b, parts[2][1:])
            self.write(ops[0], {"lt": a < b, "eq": a == b, "ge": a >= b, "ne": a != b}[parts[1]], mask)
        elif name == "selp":
            self.write(ops[0], np.where(v(ops[3]).astype(bool), v(ops[1]), v(ops[2])), mask)
        elif name == "ld" and parts[1] == "param":
            self.write(ops[0], np.full(self.n, self.params[ops[1].strip("[]")], np.int64), mask)
        elif name == "ld" and parts[1] == "global":
            data, offsets = self.memory.locate(self.address(ops[1])[mask], 4)
            loaded = np.zeros(self.n, np.float32)
            loaded[mask] = _gather(data, offsets, 4).copy().view(np.float32)[:, 0]
            self.write(ops[0], loaded, mask)
        elif name == "ld" and parts[1] == "shared":
            offsets = self._shared(self.address(ops[1])[mask], 4)
            loaded = np.zeros(self.n, np.float32)
            loaded[mask] = _gather(self.smem, offsets, 4).copy().view(np.float32)[:, 0]
            self.write(ops[0], loaded, mask)
        elif opcode == "cp.async.cg.shared.global":
            self.cp_async(ops, mask)
        elif opcode == "cp.async.commit_group":
            self.pending.append(self.open_group)
            self.open_group = []
        elif opcode == "cp.async.wait_group":
            keep = int(ops[0])
            while len(self.pending) > keep:
                for dst, data in self.pending.pop(0):
                    self.smem[dst[:, None] + np.arange(16)] = data
        elif opcode == "bar.sync":
            pass
        elif name == "ldmatrix":
            self.ldmatrix(ops, mask)
        elif name == "mma":
            self.mma(ops, mask)
        elif opcode == "fma.rn.f32":
            a, b, c = (v(x).astype(np.float64) for x in ops[1:])
            self.write(ops[0], (a * b + c).astype(np.float32), mask)
        elif opcode == "mul.f32":
            self.write(ops[0], (v(ops[1]).astype(np.float64) * v(ops[2])).astype(np.float32), mask)
        elif opcode == "cvt.rn.bf16x2.f32":
            high = _bf16_bits(v(ops[1])).astype(np.int64)
            low = _bf16_bits(v(ops[2])).astype(np.int64)
            self.write(ops[0], (high << 16) | low, mask)
        elif opcode == "cvt.rn.bf16.f32":
            self.write(ops[0], _bf16_bits(v(ops[1])).astype(np.int64), mask)
        elif name == "st" and parts[1] == "global":
            size = int(parts[2][1:]) // 8
            if mask.any():
                data, offsets = self.memory.locate(self.address(ops[0])[mask], size)
                values = v(ops[1])[mask].astype(np.uint64)
                for byte in range(size):
                    data[offsets + byte] = ((values >> np.uint64(8 * byte)) & np.uint64(0xFF)).astype(np.uint8)
        else:
            raise EmulationError(f"unsupported instruction {opcode}")

    def _shared(self, addresses: np.ndarray, size: int) -> np.ndarray:
        if addresses.size and (addresses.min() < 0 or addresses.max() + size > self.smem.size):
            raise EmulationError(f"shared access out of bounds: {addresses.min()}..{addresses.max()}")
        return addresses

    def cp_async(self, ops, mask):
        if not mask.any():
            return
        dst = self._shared(self.address(ops[0])[mask], 16)
        src_size = self.value(ops[3])[mask] if len(ops) > 3 else np.full(mask.sum(), 16)
        sources = self.address(ops[1])[mask]
        data = np.zeros((mask.sum(), 16), np.uint8)
        reading = src_size > 0
        if reading.any():
            buffer, offsets = self.memory.locate(sources[reading], 16)
            # only src_size bytes are read; bounds-check exactly those
            for row, (offset, size) in zip(np.flatnonzero(reading), zip(offsets, src_size[reading])):
                if offset + size > buffer.size:
                    raise EmulationError("cp.async reads past the end of a buffer")
                data[row, :size] = buffer[offset:offset + size]
        self.open_group.append((dst, data))

    def ldmatrix(self, ops, mask):  # PTX ISA "ldmatrix", .m8n8 .x4 .b16
        if not mask.all():
            raise EmulationError("ldmatrix under a partial predicate")
        dests = _vector(ops[0])
        addresses = self._shared(self.address(ops[1]), 16)
        results = [np.zeros(self.n, np.int64) for _ in dests]
        for warp in range(self.n // 32):
            lanes = np.arange(32) + 32 * warp
            for j in range(len(dests)):
                # lane L receives row L//4 of matrix j, bytes 4*(L%4)..+3; row r's address came from lane 8j+r
                rows = addresses[32 * warp + 8 * j + np.arange(32) // 4]
                starts = rows + 4 * (np.arange(32) % 4)
                words = _gather(self.smem, starts, 4).copy().view(np.uint32)[:, 0]
                results[j][lanes] = words
        for name, value in zip(dests, results):
            self.write(name, value, mask)

    def mma(self, ops, mask):  # PTX ISA "Matrix Fragments for mma.m16n8k32", 8-bit A/B, f32 C/D
        if not mask.all():
            raise EmulationError("mma under a partial predicate")
        d, a, b, c = (_vector(x) for x in ops)
        a_regs = np.stack([self.value(x) for x in a], 1).astype(np.uint32)  # (threads, 4)
        b_regs = np.stack([self.value(x) for x in b], 1).astype(np.uint32)
        c_vals = np.stack([self.value(x) for x in c], 1).astype(np.float64)
        out = np.zeros((self.n, 4), np.float32)
        lane = np.arange(32)
        group, tig = lane >> 2, lane % 4
        for warp in range(self.n // 32):
            sl = slice(32 * warp, 32 * warp + 32)
            a_bytes = a_regs[sl].copy().view(np.uint8).reshape(32, 16)  # element i = byte i (low to high)
            b_bytes = b_regs[sl].copy().view(np.uint8).reshape(32, 8)
            A, B, C = np.zeros((16, 32)), np.zeros((32, 8)), np.zeros((16, 8))
            for i in range(16):
                row = np.where((i < 4) | ((8 <= i) & (i < 12)), group, group + 8)
                col = tig * 4 + (i & 3) + (16 if i >= 8 else 0)
                A[row, col] = a_bytes[:, i].view(E4M3).astype(np.float64)
            for i in range(8):
                row = tig * 4 + (i & 3) + (16 if i >= 4 else 0)
                B[row, group] = b_bytes[:, i].view(E4M3).astype(np.float64)
            for i in range(4):
                C[np.where(i < 2, group, group + 8), tig * 2 + (i & 1)] = c_vals[sl, i]
            D = A @ B + C
            for i in range(4):
                out[sl, i] = D[np.where(i < 2, group, group + 8), tig * 2 + (i & 1)]
        for i, name in enumerate(d):
            self.write(name, out[:, i], mask)


def _split_operands(text: str) -> list[str]:
    operands, depth, current = [], 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            operands.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        operands.append(current.strip())
    return operands


def _vector(token: str) -> list[str]:
    return [x.strip() for x in token.strip("{}").split(",")]


def _signed(x, width):
    x = np.asarray(x, np.int64) & _MASK[width]
    return np.where(x >= 1 << (int(width) - 1), x - (1 << int(width)), x)


def _bf16_bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def run_kernel(ptx: str, kernel: str, grid, threads: int, shared_bytes: int, args: dict[str, np.ndarray | int],
               shared_symbol: str = "smem"):
    """Run every CTA of ``grid`` (x, y); array arguments are host buffers written in place."""
    memory = GlobalMemory()
    params = {}
    for name, value in args.items():
        param = f"{kernel}_param_{name}"
        params[param] = memory.add(name, value) if isinstance(value, np.ndarray) else int(value)
    for y in range(grid[1]):
        for x in range(grid[0]):
            cta = CTA(ptx, kernel, params, memory, (x, y), threads, shared_bytes)
            cta.shared_symbols[shared_symbol] = 0
            cta.run()
