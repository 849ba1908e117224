"""What the emulator's modules share: the parsed program, global memory, errors and bit-level helpers."""
from __future__ import annotations

import re
from dataclasses import dataclass

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
_MASK = {"8": 0xFF, "16": 0xFFFF, "32": 0xFFFFFFFF, "64": 0xFFFFFFFFFFFFFFFF}


class EmulationError(AssertionError):
    pass


class GlobalMemory:
    """Named host buffers at fake device addresses (1 GiB apart); every access is bounds-checked."""

    def __init__(self):
        self.buffers: list[tuple[int, np.ndarray, str]] = []

    def add(self, name: str, array: np.ndarray) -> int:
        if not array.flags.c_contiguous:
            raise EmulationError(f"{name}: pass a C-contiguous array (it is written in place)")
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


# -- the program, parsed once --------------------------------------------------------------------------
@dataclass(frozen=True)
class Instruction:
    text: str
    line: int  # 1-based line in the PTX text, for error messages
    label: str | None = None  # a label line carries nothing else
    guard: str | None = None
    negate: bool = False
    opcode: str = ""
    ops: tuple[str, ...] = ()
    names: frozenset = frozenset()  # registers it mentions (the in-flight accumulator check)


class Program:
    def __init__(self, ptx: str, kernel: str):
        entry = re.search(rf"\.entry\s+{re.escape(kernel)}\s*\(", ptx)
        if entry is None:
            raise EmulationError(f"no .entry {kernel} in the PTX")
        body_at = ptx.index("{", entry.end())
        depth, end = 0, body_at
        for end in range(body_at, len(ptx)):  # vector operands' braces are balanced, so counting finds the end
            depth += {"{": 1, "}": -1}.get(ptx[end], 0)
            if depth == 0:
                break
        self.code: list[Instruction] = []
        for number, raw in enumerate(ptx[body_at + 1:end].splitlines(), ptx.count("\n", 0, body_at) + 1):
            for statement in raw.split("//")[0].split(";"):
                statement = statement.strip()
                while label := re.match(r"([$\w.]+):(?!:)\s*(.*)", statement):
                    self.code.append(Instruction(label.group(1) + ":", number, label=label.group(1)))
                    statement = label.group(2)
                if statement and statement[0] not in ".{}":
                    self.code.append(_parse(statement, number))
        self.labels = {ins.label: i for i, ins in enumerate(self.code) if ins.label}
        self.lines = [ins.text for ins in self.code]
        self.constants = _const_tables(ptx)


def _const_tables(ptx: str) -> dict[str, np.ndarray]:
    """Module-scope ``.const .align A .u32 name[N] = {v0, v1, ...};`` arrays, by name (what ``mov.u64 r, name``
    addresses and ``ld.const`` reads; the runners place them in global memory, read-only by convention)."""
    tables = {}
    for name, count, values in re.findall(r"^\.const\s+(?:\.align\s+\d+\s+)?\.[us]32\s+(\w+)\[(\d+)\]\s*=\s*"
                                          r"\{([^}]*)\}\s*;", ptx, re.MULTILINE):
        data = np.array([int(v, 0) for v in values.split(",")], np.int64).astype(np.uint32)
        if data.size != int(count):
            raise EmulationError(f".const {name}[{count}] has {data.size} initial values")
        tables[name] = data
    return tables


def _parse(statement: str, number: int) -> Instruction:
    guard, negate, text = None, False, statement
    if statement.startswith("@"):
        guard, statement = statement.split(None, 1)
        negate, guard = guard.startswith("@!"), guard.lstrip("@!")
    opcode, _, rest = statement.partition(" ")
    return Instruction(text + ";", number, None, guard, negate, opcode, tuple(_split_operands(rest)),
                       frozenset(re.findall(r"%\w+", rest)))


def _gather(data: np.ndarray, offsets: np.ndarray, size: int) -> np.ndarray:
    return data[offsets[:, None] + np.arange(size)]


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
    if width == "64":
        return np.asarray(x, np.int64)
    x = np.asarray(x, np.int64) & _MASK[width]
    return np.where(x >= 1 << (int(width) - 1), x - (1 << int(width)), x)


def _to_bytes(values, size: int) -> np.ndarray:
    """(k,) register values -> (k, size) little-endian bytes; f32 registers are stored by their bits."""
    values = np.asarray(values)
    if values.dtype.kind == "f":
        values = values.astype(np.float32).view(np.uint32)
    return values.astype(np.int64).astype("<u8").view(np.uint8).reshape(-1, 8)[:, :size]


def _from_bytes(raw: np.ndarray, ptx_type: str) -> np.ndarray:
    if ptx_type == "f32":
        return raw.copy().view(np.float32)[:, 0]
    padded = np.zeros((raw.shape[0], 8), np.uint8)
    padded[:, :raw.shape[1]] = raw
    value = padded.view("<i8")[:, 0]
    return _signed(value, ptx_type[1:]) if ptx_type[0] == "s" else value


def _bf16_bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


# -- shared::cluster addresses ----------------------------------------------------------------------------
# A CTA-local shared address (``mov.u32 r, smem`` plus arithmetic) is a byte offset below 16 MiB and names the
# executing CTA's shared memory. ``mapa.shared::cluster`` returns CLUSTER_WINDOW | rank << 24 | offset, an
# address that names CTA ``rank``'s shared memory (even the executing CTA's own), so instructions with a
# .shared::cluster operand can tell whose memory it is; arithmetic on it stays inside the window.
CLUSTER_WINDOW = 0x4000_0000
CLUSTER_RANKS = 16  # rank bits 24-27: the largest (non-portable) cluster has 16 CTAs


def cluster_address(rank, offset):
    return CLUSTER_WINDOW | (rank << 24) | offset


def split_shared(address: int) -> tuple[int | None, int]:
    """(rank, offset) of a shared::cluster address; (None, address) for a CTA-local one."""
    if 0 <= address < 1 << 24:
        return None, address
    if address & ~0x0FFF_FFFF == CLUSTER_WINDOW:
        return (address >> 24) & 0xF, address & 0xFF_FFFF
    raise EmulationError(f"shared address {address:#x} is neither CTA-local (below 16 MiB) nor a mapa result "
                         f"({CLUSTER_WINDOW:#x} | rank << 24 | offset)")


def grid_2d(grid) -> tuple[int, int]:
    grid = tuple(grid)
    return (grid + (1, 1))[:2]
