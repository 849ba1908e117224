"""Course exercises: one per stage, each a skeleton with holes exactly where the stage's idea lives.

An exercise is a module ``lessons/exercises/exNN_<name>.py`` that defines ``EXERCISE = Exercise(...)``; the
student's starting point is ``lessons/exercises/skeletons/exNN_<name>.py``, a Python file that defines every
function named in ``Exercise.holes`` with a body that raises ``NotImplementedError`` (and the prompt in its
docstring). A *solution* is such a file with the holes filled. ``python -m lessons grade N solution.py`` loads it
in a separate process and grades it (:mod:`lessons.grading`).

How a hole reaches the kernel: ``Exercise.build(solution)`` returns a :class:`Candidate` whose kernel is the
stage's own kernel with the student's functions plugged in at the holes (a kernel factory for Numba stages, the
PTX generator's layout/encoding function for PTX stages). ``Exercise.reference()`` returns the stage's own
functions for the same holes, so "the stage's own code passes the grader" is a test, as is "the skeleton fails".

The contract every exercise module follows:

* ``holes``: the function names a solution defines; ``reference()`` returns an object with those attributes;
* ``build(solution) -> Candidate``;
* ``Candidate.run_cpu(a, sa, b, sb) -> np.ndarray``: D as float32 for host operands in the gemm.fp8 contract (NaN
  where the kernel wrote nothing), through the Numba simulator or the PTX emulator, at small shapes;
* ``Candidate.run_gpu(a, sa, b, sb, d)``: launch on device arrays (``gemm.testing.problems.device_problem``), asynchronous;
* ``Candidate.sass() -> list | None``: the kernel's SASS instructions (``ptx.sass.disassemble`` of its cubin) for
  the technique checks, or None where there is none to check on this machine;
* ``required_sass`` / ``forbidden_sass``: opcode prefixes that must / must not appear (e.g. "QGMMA", "UTMALDG");
* ``shapes_cpu`` / ``shapes_gpu``: the graded shapes (ragged ones included);
* ``sol_bound_tflops(m, n, k)``: the stage's speed-of-light bound (``lessons.ladder``) for the performance grade,
  ``perf_threshold``: the share of it that passes (set from measured runs, recorded in results/grading.json);
* ``hole_kinds`` / ``answer_sites``: how the grader gets each hole's behaviour out of the sandbox as data, and what
  it strips from the sandbox's copy of the project (:mod:`lessons.grading`).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

SKELETONS = Path(__file__).resolve().parent / "skeletons"


class Candidate(Protocol):
    def run_cpu(self, a, sa, b, sb) -> np.ndarray: ...

    def run_gpu(self, a, sa, b, sb, d) -> None: ...

    def sass(self) -> list | None: ...


@dataclass(frozen=True)
class Exercise:
    stage: int
    name: str
    objective: str  # one sentence: what the student can do after it
    prompt: str  # what to fill in and where to look (the skeleton's docstring repeats it)
    holes: tuple[str, ...]
    questions: tuple[tuple[str, str], ...]  # ("predict ...", "check with ...": the inspector or the emulator)
    reference: Callable[[], object]
    build: Callable[[object], Candidate]
    required_sass: tuple[str, ...] = ()
    forbidden_sass: tuple[str, ...] = ()
    shapes_cpu: tuple[tuple[int, int, int], ...] = ((70, 200, 256),)
    shapes_gpu: tuple[tuple[int, int, int], ...] = ((1000, 2112, 512), (4096, 4096, 7168))
    perf_threshold: float | None = None  # share of the speed-of-light bound that passes (GPU); None: not graded
    extra: dict = field(default_factory=dict)
    # How each hole crosses the grader's trust boundary (lessons.grading.sandbox): "value" (the default: numbers in,
    # numbers out, asked call by call), ("expression", argument names) (traced into arithmetic once), "emitter"
    # (PTX lines recorded), "sass_run" (a run of SASS instructions in, a choice of them out).
    hole_kinds: dict = field(default_factory=dict)
    # Where the project keeps this exercise's answer besides its stage module: repository-relative file -> names
    # stripped from the grading sandbox's copy (None: the whole module).
    answer_sites: dict = field(default_factory=dict)
    # The kernel a student starts from, for the technique checks' "the scaffold's, not the student's" comparison,
    # where the stub build (the holes' simplest answers) is refused by the build itself (lessons.grading.technique)
    scaffold: Callable[[], Candidate] | None = None

    @property
    def skeleton(self) -> Path:
        return SKELETONS / f"ex{self.stage:02d}_{self.name}.py"


def failures(check, solution) -> list[str]:
    """An exercise's own technique check (``extra["checks"]``) from a function that raises AssertionError at the
    first rule the solution breaks: that message, or nothing."""
    try:
        check(solution)
    except AssertionError as error:
        return [str(error)]
    return []


def exercises() -> dict[int, Exercise]:
    """Every exercise in this checkout, by stage number."""
    found = {}
    for info in pkgutil.iter_modules([str(Path(__file__).resolve().parent)]):
        if info.name.startswith("ex") and info.name[2:4].isdigit():
            module = importlib.import_module(f"lessons.exercises.{info.name}")
            found[module.EXERCISE.stage] = module.EXERCISE
    return dict(sorted(found.items()))


def exercise(stage: int) -> Exercise:
    found = exercises()
    if stage not in found:
        raise ValueError(f"no exercise for stage {stage}; exercises exist for stages {sorted(found)}")
    return found[stage]


__all__ = ["Exercise", "Candidate", "failures", "exercises", "exercise", "SKELETONS"]
