"""A CPU interpreter for a PTX subset: runs a kernel's text on NumPy, no GPU.

Why: assembling a kernel proves nothing about the address arithmetic, clamps, masks, stage rotation and
promotion in the *text*; running it does. Here all threads of a CTA run in lockstep (one NumPy vector per
register); warp-collective instructions (ldmatrix, stmatrix, mma) are evaluated per warp from the PTX ISA's
definitions, written independently of ptx.vocab. cp.async copies are queued per commit group and land only at
cp.async.wait_group, so a read of a stage before its wait sees stale bytes. Every global or shared access is
bounds-checked against the buffers it may touch (an error, not a fault).

:class:`CTA` is also the instruction executor of ptx.emulate.warpgroup, which runs one instance per
warpgroup. Not modelled: timing, bank conflicts, races between threads (bar.sync is a no-op in lockstep).
"""
from __future__ import annotations

import re

import numpy as np

from . import matrix, session
from .common import (_MASK, CLUSTER_WINDOW, E4M3, EmulationError, GlobalMemory, Instruction,  # noqa: F401
                     Program, _bf16_bits, _from_bytes, _gather, _signed, _split_operands, _to_bytes, _vector,
                     grid_2d)


class CTA:
    def __init__(self, ptx: str, kernel: str, params: dict, memory: GlobalMemory, ctaid, threads: int,
                 shared_bytes: int, *, nctaid=(1, 1), program: Program | None = None, smem: np.ndarray | None = None,
                 tid_base: int = 0):
        self.memory, self.params, self.ctaid, self.nctaid, self.n = memory, params, tuple(ctaid), nctaid, threads
        self.program = program or Program(ptx, kernel)
        self.lines, self.labels = self.program.lines, self.program.labels
        self.tid = tid_base + np.arange(threads, dtype=np.int64)
        self.regs: dict[str, np.ndarray] = {}
        self.smem = np.zeros(shared_bytes, np.uint8) if smem is None else smem
        self.pending: list[list] = []  # committed cp.async groups (oldest first)
        self.open_group: list = []
        self.symbols: dict[str, int] = {}  # shared-memory symbols, by-value parameters (tensor maps)
        self.shared_symbols = self.symbols
        self.extra_specials: dict[str, int] = {}  # more special registers (a scheduled CTA's cluster ones)
        self.line = 0  # PTX line of the instruction executing (for what shared memory remembers of its writers)

    # -- operands -------------------------------------------------------------------------------------
    def value(self, token: str):
        token = token.strip()
        if token in self.regs:
            return self.regs[token]
        if token.startswith("!"):
            return ~self.value(token[1:]).astype(bool)
        if token.startswith("0f"):
            return np.full(self.n, np.uint32(int(token[2:], 16)).view(np.float32), np.float32)
        if re.fullmatch(r"-?(0[xX][0-9a-fA-F]+|\d+)U?", token):
            number = token.rstrip("U")
            number = int(number, 16 if "x" in number.lower() else 10)
            return np.full(self.n, number - (1 << 64) if number >= 1 << 63 else number, np.int64)
        specials = {"%tid.x": self.tid, "%ctaid.x": self.ctaid[0], "%ctaid.y": self.ctaid[1],
                    "%nctaid.x": self.nctaid[0], "%nctaid.y": self.nctaid[1], "%ntid.x": self.n,
                    "%laneid": self.tid % 32}
        if token in self.extra_specials:  # first: a caller's own values (a scheduled CTA's %ntid.x is not self.n)
            return np.full(self.n, self.extra_specials[token], np.int64)
        if token in specials:
            return np.broadcast_to(np.asarray(specials[token], np.int64), (self.n,)).copy()
        if token in self.symbols:
            return np.full(self.n, self.symbols[token], np.int64)
        raise EmulationError(f"unknown operand {token!r} (a register read before it was written?)")

    def address(self, token: str) -> np.ndarray:
        inner = token.strip()[1:-1]
        base, sign, offset = re.match(r"([^+-]+)([+-]?)(.*)", inner).groups()
        return self.value(base).astype(np.int64) + (int(sign + offset, 0) if offset else 0)

    def write(self, name: str, value, mask):
        if name == "_":
            return
        value = np.asarray(value)
        if name not in self.regs or mask.all():
            self.regs[name] = value.copy() if mask.all() else np.where(mask, value, np.zeros_like(value))
        else:
            self.regs[name] = np.where(mask, value, self.regs[name]).astype(value.dtype)

    # -- execution ------------------------------------------------------------------------------------
    def run(self, max_steps: int = 10_000_000):
        code, pc, self.steps = self.program.code, 0, 0
        while pc < len(code):
            ins = code[pc]
            self.steps += 1
            if self.steps > max_steps:
                raise EmulationError("too many steps")
            if ins.label:
                pc += 1
                continue
            mask = np.ones(self.n, bool)
            if ins.guard:
                mask = self.value(ins.guard).astype(bool)
                mask = ~mask if ins.negate else mask
            if ins.opcode.startswith("bra"):
                if mask.any() and not mask.all():
                    raise EmulationError(f"divergent branch at line {ins.line}: {ins.text}")
                pc = self.labels[ins.ops[0]] if mask.all() else pc + 1
                continue
            if ins.opcode in ("ret", "exit"):
                return
            self.line = ins.line
            self.execute(ins.opcode, list(ins.ops), mask)
            pc += 1

    def shuffle_index(self, ops: list[str], mask: np.ndarray) -> None:
        """shfl.sync.idx.b32 d, a, lane, 31, membermask over whole warps: each lane reads lane ``lane``'s ``a``
        (the only form the generator emits: full warp, no clamp segments, no predicate out)."""
        if "|" in ops[0] or int(self.value(ops[3])[0]) != 31 or int(self.value(ops[4])[0]) & 0xFFFFFFFF != 0xFFFFFFFF:
            raise EmulationError(f"shfl.sync.idx {', '.join(ops)}: only the full-warp form (c = 31, membermask -1) "
                                 "is modelled")
        warps = mask.reshape(-1, 32)
        if not warps[warps.any(1)].all():
            raise EmulationError("shfl.sync with lanes of its warp missing (membermask -1 names all 32)")
        source = (self.value(ops[1]).astype(np.int64) & _MASK["32"]).reshape(-1, 32)
        lanes = (self.value(ops[2]).astype(np.int64) & 31).reshape(-1, 32)
        self.write(ops[0], np.take_along_axis(source, lanes, axis=1).reshape(-1), mask)

    def execute(self, opcode: str, ops: list[str], mask: np.ndarray):
        parts = opcode.split(".")
        name = parts[0]
        v = self.value
        if name == "mov":
            self.write(ops[0], v(ops[1]), mask)
        elif parts[-1] == "pred" and name in ("and", "or", "xor", "not"):
            a = v(ops[1]).astype(bool)
            b = v(ops[2]).astype(bool) if len(ops) > 2 else None
            self.write(ops[0], {"and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b,
                                "not": lambda: ~a}[name](), mask)
        elif parts[-1] == "f32" and name in ("add", "sub", "mul", "min", "max"):
            a, b = v(ops[1]).astype(np.float64), v(ops[2]).astype(np.float64)
            self.write(ops[0], {"add": a + b, "sub": a - b, "mul": a * b, "min": np.minimum(a, b),
                                "max": np.maximum(a, b)}[name].astype(np.float32), mask)
        elif name in ("and", "or", "xor", "not", "shl", "shr", "add", "sub", "min", "max", "div", "rem", "mul",
                      "mad") and parts[1] != "wide":
            self.integer(name, parts[-1], [v(x).astype(np.int64) for x in ops[1:]], ops[0], mask)
        elif opcode in ("mul.wide.u32", "mul.wide.s32"):
            a, b = (_signed(v(x), "32") if parts[-1] == "s32" else v(x) & _MASK["32"] for x in ops[1:3])
            self.write(ops[0], a.astype(np.int64) * b.astype(np.int64), mask)
        elif opcode in ("cvt.u64.u32", "cvta.to.global.u64", "cvta.param.u64"):
            self.write(ops[0], v(ops[1]).astype(np.int64), mask)
        elif opcode == "cvt.u32.u64":
            self.write(ops[0], v(ops[1]).astype(np.int64) & _MASK["32"], mask)
        elif name == "setp":
            self.setp(parts, ops, mask)
        elif name == "selp":
            self.write(ops[0], np.where(v(ops[3]).astype(bool), v(ops[1]), v(ops[2])), mask)
        elif opcode == "shfl.sync.idx.b32":
            self.shuffle_index(ops, mask)
        elif name == "ld" and parts[1] == "param":
            self.write(ops[0], np.full(self.n, self.params[ops[1].strip("[]")], np.int64), mask)
        elif name == "ld" and parts[1] == "const":  # module-scope .const tables (Program.constants) live in memory
            self.memory_op(name, "global", parts[-1], [ops[0]], ops[1], mask)
        elif name in ("ld", "st") and parts[1] in ("global", "shared", "shared::cta"):
            vector = parts[-2] in ("v2", "v4")
            regs = _vector(ops[0 if name == "ld" else 1]) if vector else [ops[0 if name == "ld" else 1]]
            self.memory_op(name, parts[1].split("::")[0], parts[-1], regs, ops[1 if name == "ld" else 0], mask)
        elif opcode == "cp.async.cg.shared.global":
            self.cp_async(ops, mask)
        elif opcode == "cp.async.commit_group":
            self.pending.append(self.open_group)
            self.open_group = []
        elif opcode == "cp.async.wait_group":
            keep = int(ops[0])
            while len(self.pending) > keep:
                for dst, data, threads, line in self.pending.pop(0):
                    self.smem[dst[:, None] + np.arange(16)] = data
                    self.note_generic_write(dst[:, None] + np.arange(16), threads, line)
        elif opcode == "bar.sync":
            pass
        elif name == "ldmatrix":
            matrix.ldmatrix(self, ops, mask)
        elif name == "stmatrix":
            matrix.stmatrix(self, opcode, ops, mask)
        elif name == "mma":
            matrix.mma_sync(self, ops, mask)
        elif opcode == "fma.rn.f32":
            a, b, c = (v(x).astype(np.float64) for x in ops[1:])
            self.write(ops[0], (a * b + c).astype(np.float32), mask)
        elif opcode == "cvt.rn.bf16x2.f32":
            high = _bf16_bits(v(ops[1])).astype(np.int64)
            low = _bf16_bits(v(ops[2])).astype(np.int64)
            self.write(ops[0], (high << 16) | low, mask)
        elif opcode == "cvt.rn.bf16.f32":
            self.write(ops[0], _bf16_bits(v(ops[1])).astype(np.int64), mask)
        else:
            raise EmulationError(f"unsupported instruction {opcode}")

    def integer(self, name: str, ptx_type: str, args: list[np.ndarray], dest: str, mask: np.ndarray):
        width, signed = ptx_type[1:], ptx_type.startswith("s")
        if signed:
            args = [_signed(x, width) for x in args]
        elif ptx_type.startswith("u") and width != "64":
            args = [x & _MASK[width] for x in args]
        a, b = args[0], args[1] if len(args) > 1 else None
        if name in ("div", "rem"):
            if (b[mask] == 0).any():
                raise EmulationError(f"{name}.{ptx_type} by zero")
            b = np.where(b == 0, 1, b)
            quotient = np.where((a < 0) != (b < 0), -(np.abs(a) // np.abs(b)), np.abs(a) // np.abs(b))
            result = quotient if name == "div" else a - quotient * b  # C semantics: truncate toward zero
        elif name in ("mul", "mad"):
            result = a * b + (args[2] if name == "mad" else 0)  # .lo: the low half, after the mask below
        else:
            result = {"and": lambda: a & b, "or": lambda: a | b, "xor": lambda: a ^ b, "not": lambda: ~a,
                      "shl": lambda: a << np.minimum(b, int(width)), "shr": lambda: a >> np.minimum(b, 63),
                      "add": lambda: a + b, "sub": lambda: a - b, "min": lambda: np.minimum(a, b),
                      "max": lambda: np.maximum(a, b)}[name]()
        self.write(dest, result & _MASK[width] if width != "64" else result, mask)

    def setp(self, parts: list[str], ops: list[str], mask: np.ndarray):
        compare, ptx_type = parts[1], parts[-1]
        a, b = self.value(ops[1]), self.value(ops[2])
        if ptx_type[0] == "s":
            a, b = _signed(a, ptx_type[1:]), _signed(b, ptx_type[1:])
        elif ptx_type[0] in "ub" and ptx_type != "u64" and ptx_type != "b64":
            a, b = a.astype(np.int64) & _MASK[ptx_type[1:]], b.astype(np.int64) & _MASK[ptx_type[1:]]
        result = {"lt": np.less, "lo": np.less, "le": np.less_equal, "ls": np.less_equal, "gt": np.greater,
                  "hi": np.greater, "ge": np.greater_equal, "hs": np.greater_equal, "eq": np.equal,
                  "ne": np.not_equal}[compare](a, b)
        if len(parts) == 4:  # setp.cmp.boolop.type d, a, b, c
            c = self.value(ops[3]).astype(bool)
            result = {"and": result & c, "or": result | c, "xor": result ^ c}[parts[2]]
        self.write(ops[0], result, mask)

    def memory_op(self, kind: str, space: str, ptx_type: str, regs: list[str], address: str, mask: np.ndarray):
        if not mask.any():
            return
        size = int(ptx_type[1:]) // 8
        addresses = self.address(address)[mask]
        total = size * len(regs)
        if space == "global":
            data, offsets = self.memory.locate(addresses, total)
        else:
            data, offsets = self.smem, self._shared(addresses, total)
        if kind == "st":
            raw = np.concatenate([_to_bytes(self.value(r)[mask], size) for r in regs], axis=1)
            data[offsets[:, None] + np.arange(total)] = raw
            if space == "shared":
                self.note_generic_write(offsets[:, None] + np.arange(total), self.tid[mask], self.line)
            return
        raw = _gather(data, offsets, total)
        for i, name in enumerate(regs):
            loaded = np.zeros(self.n, np.float32 if ptx_type == "f32" else np.int64)
            loaded[mask] = _from_bytes(raw[:, size * i:size * (i + 1)], ptx_type)
            self.write(name, loaded, mask)

    def _shared(self, addresses: np.ndarray, size: int) -> np.ndarray:
        if addresses.size and addresses.max() >= CLUSTER_WINDOW:
            raise EmulationError(f"shared::cluster address {addresses.max():#x} (a mapa result) in a CTA-local "
                                 "shared access: use ld/st.shared::cluster")
        if addresses.size and (addresses.min() < 0 or addresses.max() + size > self.smem.size):
            raise EmulationError(f"shared access out of bounds: {addresses.min()}..{addresses.max()} "
                                 f"(+{size}) of {self.smem.size} bytes")
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
        self.open_group.append((dst, data, self.tid[mask], self.line))  # a generic-proxy write when it lands

    def note_generic_write(self, offsets: np.ndarray, threads: np.ndarray, line: int):
        """Shared bytes ``offsets`` (one row per thread of ``threads``) were written through the generic proxy
        (st.shared, cp.async, stmatrix). In lockstep nothing reads shared memory through the async proxy, so
        nothing is kept; ptx.emulate.async_proxy remembers the writers until their fence.proxy.async."""


def run_kernel(ptx: str, kernel: str, grid, threads: int, shared_bytes: int, args: dict[str, np.ndarray | int],
               shared_symbol: str = "smem"):
    """Run every CTA of ``grid`` ((x, y) or (x,)) in lockstep; array arguments are host buffers written in place.
    Inside a ptx.emulate.session.capture the PTX may be edited first and the run is recorded."""
    ptx, record = session.prepare(ptx, kernel, "lockstep", threads)
    memory = GlobalMemory()
    params = {}
    for name, value in args.items():
        param = f"{kernel}_param_{name}"
        params[param] = memory.add(name, value) if isinstance(value, np.ndarray) else int(value)
    program, nctaid = Program(ptx, kernel), grid_2d(grid)
    for y in range(nctaid[1]):
        for x in range(nctaid[0]):
            cta = CTA(ptx, kernel, params, memory, (x, y), threads, shared_bytes, nctaid=nctaid, program=program)
            cta.shared_symbols[shared_symbol] = 0
            try:
                cta.run()
            finally:
                if record is not None:
                    record.update(ctas=record["ctas"] + 1, clusters=record["clusters"] + 1,
                                  steps=record["steps"] + cta.steps)


__all__ = ["E4M3", "EmulationError", "GlobalMemory", "Instruction", "Program", "CTA", "run_kernel", "grid_2d",
           "_split_operands", "_vector", "_signed", "_gather", "_to_bytes", "_from_bytes", "_bf16_bits"]
