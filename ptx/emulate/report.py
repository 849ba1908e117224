""":func:`run_stage`: one ladder stage's generated PTX, run on the CPU at a small shape, with a report.

    out, report = run_stage(lessons.stage(6), a, sa, b, sb)                       # the kernel as generated
    out, report = run_stage(lessons.stage(6), a, sa, b, sb, edit=breaks.flip_parity)  # one line broken
    print(report)  # what ran, the lines the edit changed, and how it ended (completed, deadlock, ...)

``stage`` is a stage module (``lessons.stage(n)``), used by duck typing so that ptx never imports lessons: one
with an ``emulate(a, sa, b, sb, seed=None)`` function (the hand-written PTX stages 04-06), or whose ``STAGE``
has one (the generator stages 07+: ``lessons.generated.GeneratedStage.emulate``, through gemm.testing.emulated.run_gemm,
which takes ``sm_count`` too), is run through it. Either way the launch
ends in ptx.emulate's run_kernel, which a ptx.emulate.session.capture edits and records. An EmulationError
(deadlock, missing fence, accumulator read too early, out-of-bounds access, ...) does not propagate: it is the
report's ``error`` and ``out`` is None. Comparing ``out`` with the float64 reference is the caller's business
(gemm.fp8.reference_gemm, calc_diff), as is the shape: these are CPU runs, keep M, N, K to a few hundred.
"""
from __future__ import annotations

import inspect
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .common import EmulationError
from .session import capture

VERDICTS = (  # (substring of the error, verdict), first match wins
    ("deadlock in", "deadlock"),
    ("missing fence.proxy.async", "missing fence.proxy.async"),
    ("accumulator before wgmma.wait_group", "accumulator read before wgmma.wait_group"),
)


@dataclass
class Report:
    what: str  # "lessons.06_tma_pipeline at M=.. N=.. K=.."
    runs: list[dict] = field(default_factory=list)  # one per kernel launch (ptx.emulate.session)
    seconds: float = 0.0
    error: str | None = None  # the EmulationError's message
    changes: list[tuple[int, str, str]] = field(default_factory=list)  # the edit: (line, "-"/"+", text)
    edit: str | None = None  # the edit function's name

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def verdict(self) -> str:
        if self.error is None:
            return "completed"
        return next((verdict for key, verdict in VERDICTS if key in self.error), "emulation error")

    def __str__(self) -> str:
        lines = [f"{self.what} on the CPU emulator"]
        if self.edit:
            lines.append(f"PTX edited by {self.edit}:")
            lines += [f"  line {number:4d} {sign} {text.strip()}" for number, sign, text in self.changes]
        for run in self.runs:
            executor = "in lockstep" if run["executor"] == "lockstep" else "as cooperatively scheduled warpgroups"
            cluster = f" in clusters of {run['cluster']}" if run.get("cluster", 1) > 1 else ""
            ctas = f"{run['ctas']} CTA" + ("s" if run["ctas"] != 1 else "")
            lines.append(f"ran {run['kernel']}: {ctas} of {run['threads']} threads{cluster} "
                         f"{executor}, {run['steps']:,} instructions"
                         + (f", {run['switches']:,} warpgroup switches" if run["switches"] else ""))
        lines.append(f"result: {self.verdict.upper()} after {self.seconds:.2f} s")
        if self.error:
            error = _shorten_vectors(self.error)
            if self.verdict == "deadlock":  # one line per blocked warpgroup
                head, waits = error.split(": ", 1)
                lines.append(f"  {head}:")
                lines += [f"    {wait}" for wait in re.split(r"; (?=(?:CTA rank \d+ )?warpgroup \d+ at )", waits)]
            else:
                lines.append(f"  {error}")
        return "\n".join(lines)


def _shorten_vectors(text: str) -> str:
    """{%acc_16, %acc_17, ..., %acc_79} (a wgmma's 64 accumulators) -> {%acc_16, ... 62 more ..., %acc_79}."""
    def shorten(match):
        names = [x.strip() for x in match.group(1).split(",")]
        return match.group(0) if len(names) <= 4 else f"{{{names[0]}, ... {len(names) - 2} more ..., {names[-1]}}}"
    return re.sub(r"\{([^{}]*)\}", shorten, text)


def run_stage(stage, a, sa, b, sb, *, edit: Callable[[str], str] | None = None, seed: int | None = None,
              sm_count: int = 3) -> tuple[np.ndarray | None, Report]:
    """Run ``stage``'s kernel for these operands (host arrays in the gemm.fp8 contract) on the emulator.
    ``edit``: a function PTX -> PTX applied before the run (ptx.emulate.breaks); ``seed``: pick the next
    warpgroup at random (reproducibly) instead of round-robin; ``sm_count``: SMs a persistent generator kernel
    is launched for (its grid). Returns (D as float32, NaN where never written; None after an error) and a
    :class:`Report`."""
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    emulate = getattr(stage, "emulate", None) or getattr(getattr(stage, "STAGE", None), "emulate", None)
    if not callable(emulate):
        raise TypeError(f"{stage!r} has no emulate(a, sa, b, sb, seed) (nor a STAGE with one)")
    extra = {"sm_count": sm_count} if "sm_count" in inspect.signature(emulate).parameters else {}

    def launch():
        return emulate(a, sa, b, sb, seed=seed, **extra)
    report = Report(f"{getattr(stage, '__name__', stage)} at M={m} N={n} K={k}",
                    edit=getattr(edit, "__name__", repr(edit)) if edit is not None else None)
    start = time.perf_counter()
    with capture(edit) as session:
        try:
            out = launch()
        except EmulationError as error:
            out, report.error = None, str(error)
    report.seconds, report.runs, report.changes = time.perf_counter() - start, session.runs, session.changes
    return out, report


__all__ = ["Report", "run_stage", "VERDICTS"]
