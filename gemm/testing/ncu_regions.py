"""Where a kernel's warps spend their time, by region of its SASS: Nsight Compute's per-instruction warp-state
samples (its source page, exported as CSV) summed over runs of consecutive instructions that execute equally
often. In a persistent GEMM those runs are the kernel's phases: the K block (executed tiles x K blocks times), the
tile's start and its epilogue (tiles times), the producer's loads, the prologue (once).

    ncu --set full --import-source no -k regex:fp8_gemm -c 1 -o R python -m gemm.testing.sanitize --once M N K
    ncu -i R.ncu-rep --page source --csv --print-source sass > R.csv
    python -m gemm profile-regions R.csv [more.csv.gz ...]

``docs/benchmarks.md`` quotes these tables for the committed listings ``results/ncu_src_*.csv.gz``.
"""
from __future__ import annotations

import csv
import gzip
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


@dataclass
class Region:
    first: int  # index of its first instruction in the listing
    last: int
    executed: int  # times each of its instructions ran (summed over warps)
    samples: float = 0.0
    opcodes: Counter = field(default_factory=Counter)
    stalls: Counter = field(default_factory=Counter)


def read_listing(path: str | Path) -> list[dict[str, str]]:
    """The rows of an ncu source-page CSV (plain or gzip), one per SASS instruction."""
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror})") from None
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), None)
    if start is None:
        raise ValueError(f"{path}: no ncu source table (a header row starting with \"Address\"): export it with "
                         "`ncu -i REPORT --page source --csv --print-source sass`")
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def regions(rows: list[dict[str, str]]) -> list[Region]:
    """Consecutive instructions with the same execution count, with their samples, opcodes and stall reasons."""
    if not rows or SAMPLES not in rows[0] or EXECUTED not in rows[0]:
        raise ValueError(f"the listing needs the columns {SAMPLES!r} and {EXECUTED!r} (ncu --set full)")
    stall_columns = [name for name in rows[0] if name.startswith("stall_") and "(Not" not in name]
    found: list[Region] = []
    for index, row in enumerate(rows):
        executed = int(float(row[EXECUTED] or 0))
        if not found or found[-1].executed != executed:
            found.append(Region(index, index, executed))
        region = found[-1]
        region.last = index
        region.samples += float(row[SAMPLES] or 0)
        words = row["Source"].split()
        if words:
            region.opcodes[words[1] if words[0].startswith("@") and len(words) > 1 else words[0]] += 1
        for name in stall_columns:
            region.stalls[name.removeprefix("stall_")] += float(row[name] or 0)
    return found


def table(path: str | Path, threshold: float = 0.2) -> str:
    """The regions holding at least ``threshold`` % of the samples, as text."""
    found = regions(read_listing(path))
    total = sum(region.samples for region in found) or 1.0
    lines = [f"{path}: {int(total)} samples, {sum(r.last - r.first + 1 for r in found)} instructions",
             f"{'instructions':>13}  {'executed':>9}  {'samples':>7}  opcodes (most frequent) | stalls (largest)"]
    for region in found:
        share = 100 * region.samples / total
        if share < threshold:
            continue
        opcodes = ", ".join(f"{name} {count}" for name, count in region.opcodes.most_common(4))
        stalls = ", ".join(f"{name} {100 * value / total:.1f}%" for name, value in region.stalls.most_common(2)
                           if value)
        lines.append(f"{region.first:>6}-{region.last:<6}  {region.executed:>9}  {share:6.1f}%  {opcodes} | {stalls}")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("listings", nargs="+", help="ncu source-page CSV files (.csv or .csv.gz)")
    parser.add_argument("--threshold", type=float, default=0.2, help="hide regions under this %% of samples")


def run(args) -> int:
    for path in args.listings:
        print(table(path, args.threshold))
    return 0


__all__ = ["Region", "read_listing", "regions", "table"]
