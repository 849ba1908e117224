"""``python -m lessons inspect STAGE``: what the compiler made of a stage, without running it. No GPU needed.

Every stage, Numba or PTX, takes the same path to machine code, and all of it runs on a CPU:

* its PTX: a PTX stage's ``generate(m, n, k)`` (the shape baked in); a Numba stage's kernel through
  ``numba.cuda.compile_ptx`` for compute capability 9.0 (NVVM only, no driver; the shape stays a run-time
  argument, so the PTX does not depend on it);
* assembled for sm_90a by :func:`ptx.compile.compile_ptx` (nvJitLink, or ptxas for ``setmaxnreg`` kernels;
  stage 10 also runs its cubin pass);
* then printed: an excerpt of the PTX (the header and the first uses of the instructions that carry the stage's
  idea), registers, spills, shared and local memory per kernel (the assembler's report), and counts of the
  SASS opcodes that tell the story of the ladder: FFMA (the products in 01-03, the promotion after), LDS/LDG,
  HMMA (mma.sync), QGMMA (wgmma on FP8), UTMALDG (TMA loads), SYNCS (mbarriers), LDGSTS (cp.async), LDSM
  (ldmatrix), USETMAXREG, STSM and UTMASTG; and the stage's speed of light from :mod:`lessons.ladder`.

The compiling and measuring is :mod:`lessons.compile_report`'s (the no-GPU ladder uses it too); this module prints.
"""
from __future__ import annotations

import textwrap

import lessons
from gemm.testing.records import three_digits
from lessons.compile_report import RESOURCE_FIELDS, numba_report, numba_stage_ptx, ptx_report
from lessons.ladder import committed_summary, speed_of_light

# The PTX instructions that carry each stage's idea: the excerpt shows the first uses of each
PTX_KEYWORDS = {
    0: ["ld.global", "cvt.rn.f16x2.e4m3x2", "cvt.rn.bf16x2.f32", "st.global"],
    1: ["ld.global", "fma.rn.f32", "st.global"],
    2: ["ld.global", "st.shared.f32", "bar.sync", "ld.shared.f32", "fma.rn.f32"],
    3: ["ld.global.u64", "st.shared.f32", "ld.shared.v4.f32", "fma.rn.f32"],
    4: ["cp.async", "ldmatrix", "mma.sync", "fma.rn.f32"],
    5: ["cp.async", "fence.proxy.async", "wgmma.mma_async", "wgmma.wait_group"],
    6: ["mbarrier.init", "cp.async.bulk.tensor", "mbarrier.try_wait", "wgmma.mma_async"],
    7: ["setmaxnreg", "cp.async.bulk.tensor", "mbarrier.try_wait", "wgmma.mma_async"],
    8: ["%nctaid", "stmatrix", "cp.async.bulk.tensor.2d.global", "cp.async.bulk.wait_group"],
    9: ["%cluster_ctarank", "barrier.cluster", ".multicast::cluster", "mapa"],
    10: ["wgmma.mma_async", "fma.rn.f32"],
}
LINE_WIDTH = 118  # excerpt lines are cut here (wgmma lines list 64 registers, Numba's entry names are mangled)


# ------------------------------------------------------------------------------------------ printing

def ptx_excerpt(text: str, keywords, per_keyword: int = 2, width: int = LINE_WIDTH) -> str:
    """The module header and entry points, then the first lines that use each keyword (with line numbers)."""
    lines = text.splitlines()
    header = (".version", ".target", ".maxntid", ".reqnctapercluster", ".visible .shared", ".extern .shared")
    picked = {i for i, line in enumerate(lines) if line.lstrip().startswith(header) or ".entry" in line}
    counts = []
    for word in keywords:
        hits = [i for i, line in enumerate(lines) if word in line]
        counts.append(f"{word} {len(hits)}")
        picked.update(hits[:per_keyword])
    out = [f"PTX: {len(lines)} lines; lines using {', '.join(counts)}"]
    previous = -1
    for i in sorted(picked):
        if i != previous + 1:
            out.append("    ...")
        line = lines[i].replace("\t", " ")
        out.append(f"{i + 1:5d}  {line if len(line) <= width - 7 else line[:width - 11] + ' ...'}")
        previous = i
    return "\n".join(out)


def format_report(report: dict) -> str:
    lines = []
    for name, res in report["kernels"].items():
        lines.append(f"kernel {name if len(name) <= LINE_WIDTH - 7 else name[:LINE_WIDTH - 11] + ' ...'}")
        lines.append(_wrap(", ".join(f"{f} {res[f]}" for f in RESOURCE_FIELDS if res.get(f) is not None), "  "))
        if res.get("spill_stores") or res.get("spill_loads") or res.get("local_bytes"):
            lines.append("  WARNING: spills or local memory: registers are not enough for this tiling")
    if report["kind"] == "ptx":
        dynamic = report.get("dynamic_shared_bytes", 0)
        lines.append(f"  dynamic shared memory at launch: {dynamic} bytes ({dynamic / 1024:.1f} KiB); "
                     "shared_bytes above is the static allocation")
    shown = {op: c for op, c in report["opcodes"].items() if c}
    lines.append(_wrap(f"SASS: {report['instructions']} instructions; key opcodes: "
                       + (", ".join(f"{op} {c}" for op, c in shown.items()) or "none")))
    shape = f" (shape {'x'.join(map(str, report['shape']))})" if report["shape"] else ""
    lines.append(f"assembled for {report['arch']} in {report['assemble_seconds']:.2f} s{shape}")
    return "\n".join(lines)


def _speed_of_light_lines(number: int, m: int, n: int, k: int) -> str | None:
    bound = speed_of_light(number, m, n, k)
    if bound is None:
        return None
    return "\n".join([
        f"speed of light at {m}x{n}x{k} on an H100 SXM: {bound['bound_unit']} at {bound['unit_rate']} allows "
        f"{three_digits(bound['bound_tflops'])} TFLOP/s",
        _wrap(bound["why"], indent="  "), "measured:", textwrap.indent(committed_summary(number), "  ")])


def _wrap(text: str, indent: str = "", width: int = LINE_WIDTH) -> str:
    return "\n".join(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent or "  ")
                     for line in text.splitlines())


def inspect(number: int, m: int, n: int, k: int) -> int:
    module = lessons.stage(number)
    print(_wrap(f"stage {number:02d} ({lessons.STAGES[number]}): {getattr(module, 'IDEA', '?')}"))
    kind = getattr(module, "KIND", None)
    try:
        if hasattr(module, "generate"):
            report = ptx_report(module, m, n, k)
            if number == 0:  # the dequantization kernel: x is (M, K)
                report["shape"] = [m, k]
            print(f"PTX written by Python for this shape ({'x'.join(map(str, report['shape']))}), assembled for "
                  "sm_90a on this machine")
        elif kind == "numba":
            if not hasattr(module, "KERNEL"):
                print("a Numba stage without a KERNEL attribute: nothing to compile")
                return 0
            print("a Numba stage: its kernel through numba.cuda.compile_ptx for cc 9.0 (NVVM), assembled for sm_90a "
                  "by nvJitLink;\nno GPU needed, and the shape is a run-time argument (the PTX does not depend on it)")
            report = numba_report(module, numba_stage_ptx([number])[number])
        else:
            print(f"stage {number} is neither a PTX nor a Numba stage (KIND={kind!r}): nothing to compile")
            return 1
    except Exception as error:  # e.g. a shape the stage does not support, or no NVVM: say so, no traceback
        message = f"{type(error).__name__}: {error}".splitlines()[0]
        print(f"could not compile stage {number} for {m}x{n}x{k}: {message}")
        return 1
    print(ptx_excerpt(report["ptx"], PTX_KEYWORDS.get(number, [])))
    print(format_report(report))
    lines = _speed_of_light_lines(number, m, n, k)
    if lines:
        print(lines)
    return 0
