"""cubin -> SASS listing (nvdisasm from the nvidia-cuda-nvdisasm wheel) and in-place patching of one instruction.

Each Hopper instruction is 16 bytes. ``nvdisasm -hex`` prints it as two 64-bit words in comments; the first
is the low half (the word stored first, little-endian, in the ELF ``.text.<kernel>`` section), so
``encoding = low | high << 64`` and ``encoding.to_bytes(16, "little")`` is exactly the 16 bytes in the
cubin. Later stages count QGMMA/FFMA here and patch bits (e.g. the yield/reuse flags DeepGEMM's FFMA
interleaving flips) with :func:`patch_instruction`.
"""
from __future__ import annotations

import collections
import functools
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    function: str
    offset: int  # bytes from the start of the function's .text section
    text: str  # e.g. "@!P0 IADD3 R4, P1, R2, 0x30, RZ" (predicate included, no trailing ';')
    opcode: str  # the base mnemonic, e.g. "IADD3" (no predicate, no .modifiers)
    encoding: int  # 128 bits; to_bytes(16, "little") gives the bytes in the cubin

    @property
    def modifiers(self) -> list[str]:
        """The mnemonic's .suffixes, e.g. ["64x128x32", "F32", "E4M3", "E4M3"] for a QGMMA."""
        words = self.text.split()
        mnemonic = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        return mnemonic.split(".")[1:]


@functools.lru_cache(maxsize=None)
def nvdisasm_path() -> str:
    """nvdisasm from the nvidia-cuda-nvdisasm wheel (nvidia/cu13/bin), else from PATH."""
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    for root in roots:
        for sub in ("nvidia/cu13/bin", "nvidia/cuda_nvdisasm/bin", "nvidia/cu12/bin"):
            candidate = Path(root) / sub / "nvdisasm"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    found = shutil.which("nvdisasm")
    if found:
        return found
    raise FileNotFoundError("nvdisasm not found: install the nvidia-cuda-nvdisasm wheel (pip install "
                            "nvidia-cuda-nvdisasm) or put CUDA's bin directory on PATH")


def _image(cubin) -> bytes:
    return cubin.image if hasattr(cubin, "image") else bytes(cubin)


def _run_nvdisasm(image: bytes) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(image)
        done = subprocess.run([nvdisasm_path(), "-hex", "-c", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvdisasm failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


_SECTION = re.compile(r"^\s*\.section\s+\.text\.([\w$.]+),")
_FIRST = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")
_SECOND = re.compile(r"^\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$")


def parse_listing(listing: str) -> list[Instruction]:
    """Parse ``nvdisasm -hex -c`` output into instructions (all functions, in listing order)."""
    instructions = []
    function = None
    pending = None  # (offset, text, low word) waiting for the high word on the next line
    for line in listing.splitlines():
        section = _SECTION.match(line)
        if section:
            function = section.group(1)
            continue
        first = _FIRST.match(line)
        if first:
            offset, text, low = first.groups()
            pending = (int(offset, 16), text.rstrip(" ;"), int(low, 16))
            continue
        second = _SECOND.match(line)
        if second and pending is not None:
            offset, text, low = pending
            parts = text.split()
            mnemonic = parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]
            encoding = low | int(second.group(1), 16) << 64
            instructions.append(Instruction(function, offset, text, mnemonic.split(".")[0], encoding))
            pending = None
    return instructions


def disassemble(cubin, function: str | None = None) -> list[Instruction]:
    """SASS of ``cubin`` (a Cubin or raw bytes); only ``function``'s instructions when it is given."""
    instructions = parse_listing(_run_nvdisasm(_image(cubin)))
    if function is not None:
        instructions = [i for i in instructions if i.function == function]
        if not instructions:
            raise KeyError(f"no function {function!r} in the cubin")
    return instructions


_LABEL = re.compile(r"^\s*(\.L\w+):\s*$")
_TARGET = re.compile(r"`\((\.L\w+)\)")


def _label_offsets(listing: str) -> dict[tuple[str, str], int]:
    """{(function, label): offset of the instruction after the label} from an ``nvdisasm`` listing."""
    offsets, function, waiting = {}, None, []
    for line in listing.splitlines():
        section, label, first = _SECTION.match(line), _LABEL.match(line), _FIRST.match(line)
        if section:
            function = section.group(1)
        elif label:
            waiting.append(label.group(1))
        elif first:
            offsets.update({(function, name): int(first.group(1), 16) for name in waiting})
            waiting = []
    return offsets


def loops(cubin, function: str | None = None) -> list[tuple[int, int]]:
    """(first, last) instruction offsets of every backward branch's loop (the branch's target label, the branch),
    innermost first: a loop's length in instructions is (last - first) / 16 + 1."""
    listing = _run_nvdisasm(_image(cubin))
    labels, found = _label_offsets(listing), []
    for instruction in parse_listing(listing):
        target = _TARGET.search(instruction.text)
        if instruction.opcode != "BRA" or not target or function not in (None, instruction.function):
            continue
        first = labels.get((instruction.function, target.group(1)))
        if first is not None and first <= instruction.offset:
            found.append((first, instruction.offset))
    return sorted(found, key=lambda loop: loop[1] - loop[0])


def span(instructions, opcode: str) -> list[Instruction]:
    """The instructions from the first ``opcode`` to the last, both included (empty when there is none): for
    "QGMMA", a GEMM kernel's K block, the stretch the math warps repeat."""
    at = [index for index, instruction in enumerate(instructions) if instruction.opcode == opcode]
    return list(instructions[at[0]:at[-1] + 1]) if at else []


def opcode_counts(instructions) -> collections.Counter:
    """Counter of base opcodes, e.g. {"FFMA": 512, "QGMMA": 32, "EXIT": 1}."""
    return collections.Counter(i.opcode for i in instructions)


# -- ELF64: find a section, overwrite 16 bytes -------------------------------------------------------
def _sections(image: bytes) -> dict[str, tuple[int, int]]:
    """{section name: (file offset, size)} from the ELF64 little-endian section headers."""
    if image[:4] != b"\x7fELF" or image[4] != 2 or image[5] != 1:
        raise ValueError("not a little-endian ELF64 cubin")
    (shoff,) = struct.unpack_from("<Q", image, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", image, 0x3A)
    headers = []
    for index in range(shnum):
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", image, shoff + index * shentsize)
        headers.append((name, offset, size))
    strings_offset = headers[shstrndx][1]
    result = {}
    for name, offset, size in headers:
        end = image.index(b"\0", strings_offset + name)
        result[image[strings_offset + name:end].decode()] = (offset, size)
    return result


def patch_instruction(cubin, function: str, offset: int, new_encoding: int) -> bytes:
    """A copy of the cubin image with the 16-byte instruction at ``offset`` of ``function`` replaced."""
    return patch_instructions(cubin, {(function, offset): new_encoding})


def patch_instructions(cubin, patches: dict[tuple[str, int], int]) -> bytes:
    """A copy of the cubin image with every ``{(function, offset): new_encoding}`` instruction replaced (one copy
    of the image for the whole batch). Offsets must name 16-byte instructions inside the function's .text."""
    image = bytearray(_image(cubin))
    sections = _sections(bytes(image))
    for (function, offset), new_encoding in patches.items():
        name = f".text.{function}"
        if name not in sections:
            raise KeyError(f"no section {name} in the cubin (functions: "
                           f"{sorted(s[6:] for s in sections if s.startswith('.text.'))})")
        start, size = sections[name]
        if offset % 16 or not 0 <= offset <= size - 16:
            raise ValueError(f"offset {offset:#x} is not an instruction of {function} (size {size:#x}, 16-byte steps)")
        if not 0 <= new_encoding < 1 << 128:
            raise ValueError("new_encoding must fit in 128 bits")
        image[start + offset:start + offset + 16] = new_encoding.to_bytes(16, "little")
    return bytes(image)


def read_instruction(cubin, function: str, offset: int) -> int:
    """The 128-bit encoding stored at ``offset`` of ``function`` (straight from the ELF bytes)."""
    image = _image(cubin)
    start, _ = _sections(image)[f".text.{function}"]
    return int.from_bytes(image[start + offset:start + offset + 16], "little")


__all__ = ["Instruction", "disassemble", "span", "opcode_counts", "patch_instruction", "patch_instructions",
           "read_instruction", "parse_listing", "nvdisasm_path"]
