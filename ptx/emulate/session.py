"""What :func:`ptx.emulate.run_stage` sees of the runs made inside it, whoever launches them.

Stages launch their kernels through their own code (lessons/04-06 ``emulate``, gemm.testing.emulated.run_gemm for the
generator stages), which ends in one of the two ``run_kernel`` functions (lockstep or scheduled). While a
:func:`capture` is open, each of those calls hands its PTX to :meth:`Session.prepare` first: the session applies
its edit (a function PTX text -> PTX text, the "break it" edits of ptx.emulate.breaks), keeps the lines that
changed, and records what ran (kernel, CTAs, instructions, warpgroup switches), so a launcher needs no
parameter for either.
"""
from __future__ import annotations

import difflib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

_ACTIVE: list["Session"] = []


@dataclass
class Session:
    edit: Callable[[str], str] | None = None
    runs: list[dict] = field(default_factory=list)  # one per run_kernel call
    changes: list[tuple[int, str, str]] = field(default_factory=list)  # (line, "-" or "+", text) of the edit

    def prepare(self, ptx: str, kernel: str, executor: str, threads: int) -> tuple[str, dict]:
        if self.edit is not None:
            edited = self.edit(ptx)
            if edited == ptx:
                raise ValueError(f"the edit {getattr(self.edit, '__name__', self.edit)} changed nothing in the PTX "
                                 f"of {kernel}")
            if not self.changes:
                self.changes = changed_lines(ptx, edited)
            ptx = edited
        record = dict(kernel=kernel, executor=executor, threads=threads, ctas=0, clusters=0, steps=0, switches=0)
        self.runs.append(record)
        return ptx, record


def changed_lines(before: str, after: str) -> list[tuple[int, str, str]]:
    """(line number, "-" or "+", text) for each line the edit removed (numbered in ``before``) or added
    (numbered in ``after``)."""
    old, new = before.splitlines(), after.splitlines()
    changes = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal":
            changes += [(i + 1, "-", old[i]) for i in range(i1, i2)] + [(j + 1, "+", new[j]) for j in range(j1, j2)]
    return changes


def prepare(ptx: str, kernel: str, executor: str, threads: int) -> tuple[str, dict | None]:
    """Called by run_kernel: the PTX to run (edited if a capture with an edit is open) and the run's record."""
    if not _ACTIVE:
        return ptx, None
    return _ACTIVE[-1].prepare(ptx, kernel, executor, threads)


@contextmanager
def capture(edit: Callable[[str], str] | None = None):
    """Record (and, with ``edit``, alter the PTX of) every emulator run inside the ``with``."""
    session = Session(edit)
    _ACTIVE.append(session)
    try:
        yield session
    finally:
        _ACTIVE.remove(session)


__all__ = ["Session", "capture", "changed_lines", "prepare"]
