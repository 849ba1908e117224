"""A stage compiled for sm_90a and described, without running it: resources per kernel and key SASS opcodes.

The data behind ``python -m lessons inspect`` (:mod:`lessons.inspect_stage` prints it) and the no-GPU ladder
(:mod:`lessons.ladder` tables it). A PTX stage's ``generate(m, n, k)`` is assembled by
:func:`ptx.compile.compile_ptx` (or its own ``cubin``); a Numba stage's kernel goes through
``numba.cuda.compile_ptx`` for compute capability 9.0 (NVVM only, no driver) first.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import lessons

KEY_OPCODES = [
    "QGMMA", "HGMMA", "HMMA", "WARPGROUP", "FFMA", "FMUL", "FADD", "F2FP", "UTMALDG", "UTMASTG", "UBLKCP",
    "SYNCS", "LDGSTS", "LDGDEPBAR", "DEPBAR", "LDSM", "STSM", "LDS", "STS", "LDG", "STG", "BAR", "USETMAXREG",
]
RESOURCE_FIELDS = ["registers", "spill_stores", "spill_loads", "stack_frame", "shared_bytes", "local_bytes",
                   "barriers"]

def key_opcode_counts(counts) -> dict[str, int]:
    """Group a Counter of opcodes by family: "SYNCS.EXCH.64" and "SYNCS" both count as SYNCS."""
    grouped = {key: 0 for key in KEY_OPCODES}
    for opcode, count in counts.items():
        family = opcode.split(".")[0]
        if family in grouped:
            grouped[family] += count
    return grouped


def _cubin_report(cubin, ptx: str, *, kind: str, shape, dynamic_shared: int, seconds: float,
                  names: dict[str, str] | None = None, static_shared: int = 0) -> dict:
    from ptx.sass import disassemble, opcode_counts
    instructions = disassemble(cubin)
    kernels = {}
    for name, res in cubin.resources.items():
        fields = {f: getattr(res, f, None) for f in RESOURCE_FIELDS}
        fields["shared_bytes"] = max(fields["shared_bytes"] or 0, static_shared)
        kernels[(names or {}).get(name, name)] = fields
    return {"kind": kind, "shape": list(shape), "arch": getattr(cubin, "arch", "sm_90a"), "kernels": kernels,
            "dynamic_shared_bytes": dynamic_shared, "ptx": ptx, "instructions": len(instructions),
            "opcodes": key_opcode_counts(opcode_counts(instructions)), "assemble_seconds": seconds}


def ptx_report(module, m: int, n: int, k: int) -> dict:
    """Assemble a PTX stage for (m, n, k) and describe the cubin: resources per kernel and key opcodes."""
    from ptx.compile import compile_ptx
    started = time.perf_counter()
    ptx = module.generate(m, n, k)
    cubin = module.cubin(m, n, k) if hasattr(module, "cubin") else compile_ptx(ptx)
    dynamic = module.shared_bytes(m, n, k) if hasattr(module, "shared_bytes") else 0
    return _cubin_report(cubin, ptx, kind="ptx", shape=(m, n, k), dynamic_shared=dynamic,
                         seconds=time.perf_counter() - started)


# ------------------------------------------------------------------------------------------ Numba stages

_CHILD = """
import json, sys
import lessons
from lessons.numba_fp8 import kernel_ptx
out = {}
for number in json.loads(sys.argv[1]):
    stage = lessons.stage(number)
    out[number] = kernel_ptx(stage.KERNEL, stage.OPERAND_DTYPE)
print(json.dumps(out))
"""


def numba_stage_ptx(numbers: list[int]) -> dict[int, str]:
    """PTX of Numba stages' kernels for compute capability 9.0 (NVVM; no GPU, no driver).

    In this process when Numba's CUDA simulator is off; when it is on (it compiles nothing: the ladder without a
    GPU, the tests), in one child process without it.
    """
    from numba import config
    if not numbers:
        return {}
    if not config.ENABLE_CUDASIM:
        from lessons.numba_fp8 import kernel_ptx
        return {n: kernel_ptx(lessons.stage(n).KERNEL, lessons.stage(n).OPERAND_DTYPE) for n in numbers}
    root = str(Path(lessons.__file__).resolve().parent.parent)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(numbers)], cwd=root, env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"numba.cuda.compile_ptx failed: {last}")
    return {int(key): text for key, text in json.loads(result.stdout.strip().splitlines()[-1]).items()}


def _static_shared(ptx: str) -> int:
    """Bytes of the module-level ``.shared`` arrays a PTX module declares (how Numba emits cuda.shared.array;
    ptxas's per-kernel report leaves them out)."""
    return sum(int(size) for size in re.findall(r"^\s*\.visible\s+\.shared\s+.*?\[(\d+)\]", ptx, re.MULTILINE))


def _python_name(mangled: str) -> str:
    """``_ZN7lessons9_01_naive12naive_kernelB2v1...`` -> ``naive_kernel`` (the last name of the mangled path)."""
    if not mangled.startswith("_ZN"):
        return mangled
    text, parts = mangled[3:], []
    while (match := re.match(r"\d+", text)):
        size, start = int(match.group()), match.end()
        parts.append(text[start:start + size])
        text = text[start + size:]
    return parts[-1] if parts else mangled


def numba_report(module, ptx: str) -> dict:
    """Assemble a Numba stage's PTX (from :func:`numba_stage_ptx`) and describe the cubin like a PTX stage's."""
    from ptx.compile import compile_ptx
    started = time.perf_counter()
    cubin = compile_ptx(ptx, assembler="nvjitlink")  # Numba's PTX never moves registers (setmaxnreg)
    names = {name: _python_name(name) for name in cubin.resources}
    return _cubin_report(cubin, ptx, kind="numba", shape=(), dynamic_shared=0, names=names,
                         static_shared=_static_shared(ptx), seconds=time.perf_counter() - started)
