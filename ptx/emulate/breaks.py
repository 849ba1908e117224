"""Small, explicit edits of a generated kernel's PTX text, each one bug the emulator should catch.

Each function takes the PTX text and returns it with one thing broken; ``ptx.emulate.run_stage(..., edit=f)``
runs the broken text and its report prints the lines that changed, so a student sees exactly what was done.
A function raises ValueError where its pattern is absent (the kernel has no such thing to break).

* :func:`flip_parity`: the producer's first wait on a fresh "empty" mbarrier asks for parity 0, not 1.
  Reported: a deadlock, each warpgroup's line and the mbarrier phase it waits for.
* :func:`drop_proxy_fence`: the last fence.proxy.async is gone (stage 05: cp.async tiles read by wgmma; 08-10:
  the stmatrix D tile read by the TMA store). Reported: missing fence.proxy.async, the async-proxy read, the
  bytes and the line that wrote them.
* :func:`read_accumulators_early`: wgmma.wait_group moved below the first instruction that reads an accumulator.
  Reported: an accumulator touched before wgmma.wait_group, and the line of the wgmma still in flight.
* :func:`unswizzle_copies`: the XOR that swizzles a thread copy's 16-byte chunk is gone (stages 04, 05).
  No error: the result is wrong.
* :func:`descriptor_swizzle_64b`: the wgmma descriptors say 64B swizzle where the tiles were written with the
  128B one (stages 05+). No error: the result is wrong.
* :func:`wait_for_fewer_copies`: cp.async.wait_group N becomes N + 1, so a stage is read before its copies land
  (the emulator lands them at the wait). No error: the result is wrong.
"""
from __future__ import annotations

import re

_PARITY_WAIT = re.compile(r"mbarrier\.try_wait\.parity[.\w:]*\s+[^,]+,\s*\[[^\]]+\],\s*(%\w+)\s*;")
_LINE = re.compile(r"^.*$", re.M)


def flip_parity(ptx: str) -> str:
    """The first parity register that starts at 1, started at 0 instead. Only a producer's parity starts at 1:
    its first wait on each fresh "empty" barrier must pass at once (a fresh barrier counts the phase before
    its first, of parity 1, as complete). Waiting for parity 0 instead waits for a release that never comes."""
    registers = set(_PARITY_WAIT.findall(ptx))
    for match in re.finditer(r"^(\s*mov\.[ub]32\s+(%\w+),\s*)1;", ptx, re.M):
        if match.group(2) in registers:
            return ptx[:match.start()] + match.group(1) + "0;" + ptx[match.end():]
    raise ValueError("no mbarrier.try_wait.parity whose parity register starts at 1")


def drop_proxy_fence(ptx: str) -> str:
    """Delete the last fence.proxy.async: in stage 05 the one between the cp.async copies landing and wgmma
    reading them, in stages 08-10 the one between stmatrix writing the D tile and the TMA store reading it. (In
    stages 06 and 07 the last one follows mbarrier.init, which the emulator does not check: nothing to report.)"""
    fences = list(re.finditer(r"^\s*fence\.proxy\.async[.\w:]*\s*;[^\n]*\n", ptx, re.M))
    if not fences:
        raise ValueError("no fence.proxy.async in the PTX")
    last = fences[-1]
    return ptx[:last.start()] + ptx[last.end():]


def read_accumulators_early(ptx: str) -> str:
    """Move the first wgmma.wait_group below the first instruction after it that reads an accumulator of the
    wgmma.mma_async just before it: that instruction then reads a register the tensor core is still writing."""
    wait = re.search(r"^\s*wgmma\.wait_group[^\n]*\n", ptx, re.M)
    if wait is None:
        raise ValueError("no wgmma.wait_group in the PTX")
    issued = list(re.finditer(r"wgmma\.mma_async[.\w]*\s*\{([^}]*)\}", ptx[:wait.start()]))
    if not issued:
        raise ValueError("no wgmma.mma_async before the first wgmma.wait_group")
    accumulators = {name.strip() for name in issued[-1].group(1).split(",")}
    for line in _LINE.finditer(ptx, wait.end()):
        code = line.group(0).split("//")[0]
        if "wgmma" not in code and accumulators & set(re.findall(r"%\w+", code)):
            at = line.end() + 1
            return ptx[:wait.start()] + ptx[wait.end():at] + wait.group(0) + ptx[at:]
    raise ValueError("nothing reads the accumulators after the first wgmma.wait_group")


def unswizzle_copies(ptx: str) -> str:
    """Delete the XOR that swizzles a thread's 16-byte chunk (``xor.b32 c, c, row % 8`` before ``c * 16``): the
    cp.async copies then land in plain row-major order while the readers (ldmatrix addresses in stage 04,
    the wgmma descriptors' 128B swizzle in stage 05) still expect the swizzled layout."""
    match = re.search(r"^\s*xor\.b32\s+(%\w+),\s*\1,\s*%\w+;[^\n]*\n(?=\s*shl\.b32\s+\1,\s*\1,\s*4;)", ptx, re.M)
    if match is None:
        raise ValueError("no chunk swizzle (xor.b32 c, c, r; shl.b32 c, c, 4) in the PTX")
    return ptx[:match.start()] + ptx[match.end():]


def descriptor_swizzle_64b(ptx: str) -> str:
    """Every wgmma descriptor constant that says 128B swizzle (layout type 1 in bits 62-63) says 64B (type 2)
    instead. The TMA boxes (or thread copies) still write 128B-swizzled tiles, so wgmma reads wrong bytes."""
    def swap(match):
        value = int(match.group(2), 0)
        return f"{match.group(1)}{(value & ~(3 << 62)) | (2 << 62):#x};"
    edited, count = re.subn(r"(or\.b64\s+%\w+,\s*%\w+,\s*)(\d+|0x[0-9a-fA-F]+);",
                            lambda m: swap(m) if int(m.group(2), 0) >> 62 == 1 else m.group(0), ptx)
    if edited == ptx:
        raise ValueError("no wgmma descriptor constant with the 128B swizzle (or.b64 d, d, 1 << 62 | ...)")
    return edited


def wait_for_fewer_copies(ptx: str) -> str:
    """The first cp.async.wait_group N waits for N + 1 instead: one more group of copies may still be in flight
    when the threads read the stage, which is exactly the group holding the block they are about to use."""
    match = re.search(r"(cp\.async\.wait_group\s+)(\d+);", ptx)
    if match is None:
        raise ValueError("no cp.async.wait_group in the PTX")
    return ptx[:match.start()] + f"{match.group(1)}{int(match.group(2)) + 1};" + ptx[match.end():]


ALL = {"wrong parity": flip_parity, "missing fence.proxy.async": drop_proxy_fence,
       "accumulators read before wgmma.wait_group": read_accumulators_early,
       "unswizzled copies": unswizzle_copies, "64B descriptor swizzle": descriptor_swizzle_64b,
       "copies waited for too early": wait_for_fewer_copies}

__all__ = ["flip_parity", "drop_proxy_fence", "read_accumulators_early", "unswizzle_copies",
           "descriptor_swizzle_64b", "wait_for_fewer_copies", "ALL"]
