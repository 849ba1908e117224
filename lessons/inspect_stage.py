"""``python -m lessons inspect STAGE``: what the compiler made of a stage, without running it.

For a PTX stage: registers, spills, shared and local memory per kernel (from nvJitLink's resource report)
and counts of the SASS opcodes that tell the story of the ladder: HMMA (mma.sync), QGMMA (wgmma on FP8),
FFMA (the promotion), UTMALDG (TMA loads), SYNCS (mbarriers), LDGSTS (cp.async), LDSM (ldmatrix). No GPU
needed: the PTX is generated for the shape and assembled for sm_90a on the CPU.
For a Numba stage: the kernels' resources once Numba has compiled them, which needs a GPU.
"""
from __future__ import annotations

import time

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


def ptx_report(module, m: int, n: int, k: int) -> dict:
    """Assemble a PTX stage for (m, n, k) and describe the cubin: resources per kernel and key opcodes."""
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble, opcode_counts
    started = time.perf_counter()
    cubin = module.cubin(m, n, k) if hasattr(module, "cubin") else compile_ptx(module.generate(m, n, k))
    assembled = time.perf_counter() - started
    instructions = disassemble(cubin)
    kernels = {name: {f: getattr(res, f, None) for f in RESOURCE_FIELDS} for name, res in cubin.resources.items()}
    dynamic = module.shared_bytes(m, n, k) if hasattr(module, "shared_bytes") else 0
    return {"kind": "ptx", "shape": [m, n, k], "arch": getattr(cubin, "arch", "sm_90a"), "kernels": kernels,
            "dynamic_shared_bytes": dynamic,
            "instructions": len(instructions), "opcodes": key_opcode_counts(opcode_counts(instructions)),
            "assemble_seconds": assembled}


def _numba_kernels(module) -> dict:
    """The module's Numba kernels (not device functions), by name."""
    kernels = {}
    for name, value in vars(module).items():
        if type(value).__name__ not in ("CUDADispatcher", "FakeCUDAKernel"):
            continue
        is_device_function = getattr(value, "targetoptions", {}).get("device") or getattr(value, "_device", False)
        if not is_device_function:
            kernels[name] = value
    return kernels


def numba_report(module) -> dict:
    """Resources of the kernels Numba has compiled so far in this process (run the stage once first)."""
    report = {"kind": "numba", "kernels": {}}
    for name, kernel in _numba_kernels(module).items():
        if not hasattr(kernel, "get_regs_per_thread"):  # the simulator compiles nothing
            report["kernels"][name] = None
            continue
        for signature, compiled in list(getattr(kernel, "overloads", {}).items()):
            report["kernels"][f"{name}{tuple(str(t) for t in signature)}"] = {
                "registers": compiled.regs_per_thread,
                "shared_bytes": compiled.shared_mem_per_block,
                "local_bytes": compiled.local_mem_per_thread,
            }
    return report


def format_ptx_report(report: dict) -> str:
    lines = []
    for name, res in report["kernels"].items():
        lines.append(f"kernel {name}")
        lines.append("  " + ", ".join(f"{f} {res[f]}" for f in RESOURCE_FIELDS if res.get(f) is not None))
        if res.get("spill_stores") or res.get("spill_loads") or res.get("local_bytes"):
            lines.append("  WARNING: spills or local memory: registers are not enough for this tiling")
    dynamic = report.get("dynamic_shared_bytes", 0)
    lines.append(f"  dynamic shared memory at launch: {dynamic} bytes ({dynamic / 1024:.1f} KiB); "
                 "shared_bytes above is the static allocation")
    shown = {op: c for op, c in report["opcodes"].items() if c}
    lines.append(f"SASS: {report['instructions']} instructions; key opcodes: "
                 + (", ".join(f"{op} {c}" for op, c in shown.items()) or "none"))
    lines.append(f"assembled for {report['arch']} in {report['assemble_seconds']:.2f} s "
                 f"(shape {'x'.join(map(str, report['shape']))})")
    return "\n".join(lines)


def _run_numba_stage_once(module) -> None:
    """Numba compiles at the first call: make one on a small problem so there is something to report."""
    import numpy as np
    from numba import cuda

    from gemm.fp8 import random_problem
    from gemm.harness import device_problem
    problem = device_problem(*random_problem(128, 128, 256, np.random.default_rng()))
    module.gemm(problem.a, problem.sa, problem.b, problem.sb, problem.d)
    cuda.synchronize()


def inspect(number: int, m: int, n: int, k: int) -> int:
    module = lessons.stage(number)
    print(f"stage {number:02d} ({lessons.STAGES[number]}): {getattr(module, 'IDEA', '?')}")
    kind = getattr(module, "KIND", None)
    if kind == "ptx" or hasattr(module, "generate"):
        try:
            report = ptx_report(module, m, n, k)
        except Exception as error:  # e.g. a shape the stage does not support: say so, no traceback
            print(f"could not assemble stage {number} for {m}x{n}x{k}: {type(error).__name__}: {error}")
            return 1
        print(format_ptx_report(report))
        return 0
    from ptx.device import has_gpu
    names = ", ".join(_numba_kernels(module)) or "none found"
    print(f"a Numba stage (kernels: {names}).")
    if not has_gpu():
        print("Numba compiles its kernels only for a real GPU (none here: the simulator runs them as Python), "
              "so registers and shared memory need a GPU. Its code is the Python in the stage's file.")
        return 0
    _run_numba_stage_once(module)
    for name, res in numba_report(module)["kernels"].items():
        print(f"kernel {name}\n  " + ", ".join(f"{f} {v}" for f, v in (res or {}).items()))
    return 0
