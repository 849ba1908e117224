"""``python -m lessons diff A B``: what changed between two PTX stages, in the config, the PTX and the SASS.

For generator stages (07+) the config difference *is* the stage's one change; the PTX diff shows what the
emitters wrote for it, and the SASS opcode table what ptxas made of it (e.g. USETMAXREG appearing at 07, UTMASTG
and STSM at 08). Stage 06 is compared through its hand-written module. No GPU needed.
"""
from __future__ import annotations

import dataclasses
import difflib

import lessons
from lessons.compile_report import KEY_OPCODES, key_opcode_counts


def config_of(number: int, m: int, n: int, k: int):
    module = lessons.stage(number)
    return module.config(m, n, k) if hasattr(module, "config") else None


def config_changes(a: int, b: int, m: int, n: int, k: int) -> list[tuple[str, object, object]]:
    """[(field, value in A, value in B)] for the fields that differ (stage 06: its generator equivalent)."""
    from lessons.generated import stage06_config
    before = config_of(a, m, n, k) or (stage06_config(m, n, k) if a == 6 else None)
    after = config_of(b, m, n, k) or (stage06_config(m, n, k) if b == 6 else None)
    if before is None or after is None:
        return []
    return [(f.name, getattr(before, f.name), getattr(after, f.name)) for f in dataclasses.fields(before)
            if getattr(before, f.name) != getattr(after, f.name)]


def _normalised(ptx: str) -> list[str]:
    """PTX lines without declarations, comments and register numbers, so the diff shows instructions."""
    import re
    lines = []
    for line in ptx.splitlines():
        text = line.split("//")[0].strip()
        if not text or text.startswith(".reg"):
            continue
        lines.append(re.sub(r"(%[a-z_]+)_\d+", r"\1", re.sub(r"(\$[a-z_]+)_\d+", r"\1", text)))
    return lines


def ptx_diff(a: int, b: int, m: int, n: int, k: int, context: int = 1) -> list[str]:
    before = _normalised(lessons.stage(a).generate(m, n, k))
    after = _normalised(lessons.stage(b).generate(m, n, k))
    return list(difflib.unified_diff(before, after, f"stage {a:02d}", f"stage {b:02d}", n=context, lineterm=""))


def stage_cubin(number: int, m: int, n: int, k: int):
    """What runs: the assembled PTX, after the stage's cubin passes when it has any (stage 10)."""
    from ptx.compile import compile_ptx
    module = lessons.stage(number)
    return module.cubin(m, n, k) if hasattr(module, "cubin") else compile_ptx(module.generate(m, n, k))


def opcode_table(a: int, b: int, m: int, n: int, k: int) -> list[tuple[str, int, int]]:
    """Key SASS opcode counts of both stages, plus the promotion FFMAs that yield (stage 10's bit)."""
    from ptx.passes import count_yielding_ffma
    from ptx.sass import disassemble, opcode_counts
    listings = [disassemble(stage_cubin(s, m, n, k)) for s in (a, b)]
    counts = [key_opcode_counts(opcode_counts(listing)) for listing in listings]
    rows = [(op, counts[0][op], counts[1][op]) for op in KEY_OPCODES if counts[0][op] or counts[1][op]]
    return rows + [("FFMA yield", *(count_yielding_ffma(listing)[0] for listing in listings))]


def diff(a: int, b: int, m: int, n: int, k: int, *, max_lines: int = 160) -> int:
    for number in (a, b):
        if number not in lessons.available_stages() or not hasattr(lessons.stage(number), "generate"):
            print(f"stage {number} is not a PTX stage; PTX stages are "
                  f"{[s for s in lessons.available_stages() if hasattr(lessons.stage(s), 'generate')]}")
            return 2
    print(f"stage {a:02d} -> {b:02d} at M={m} N={n} K={k}\n")
    changes = config_changes(a, b, m, n, k)
    if changes:
        print("config (gemm.kernel.KernelConfig):")
        for name, before, after in changes:
            print(f"  {name}: {before!r} -> {after!r}")
        print()
    lines = ptx_diff(a, b, m, n, k)
    added = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
    removed = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
    print(f"PTX: +{added} -{removed} instruction lines (register and label numbers ignored)")
    for line in lines[:max_lines]:
        print("  " + line)
    if len(lines) > max_lines:
        print(f"  ... {len(lines) - max_lines} more diff lines")
    print("\nSASS opcodes (key families):")
    print(f"  {'opcode':<12}{'stage %02d' % a:>10}{'stage %02d' % b:>10}")
    for op, before, after in opcode_table(a, b, m, n, k):
        mark = "  <-" if before != after else ""
        print(f"  {op:<12}{before:>10}{after:>10}{mark}")
    return 0


__all__ = ["diff", "config_changes", "ptx_diff", "opcode_table"]
