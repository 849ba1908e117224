"""``python -m lessons grade N solution.py``: the course's autograder (see docs/course.md, the instructor guide).

The student's file never runs in the judge's process. The parent (:func:`grade`) scans the source (vendor GEMM,
imports of the stage's code, holes that are the stage's own code: :mod:`lessons.grading.copies`) and starts the
judge (``python -m lessons.grade --child``: trusted code only), handing it the plan on stdin (the seeds, already
derived, and a nonce that frames its answer). The judge starts the sandboxed oracle
(:class:`lessons.grading.sandbox.Oracle`), which loads the solution and answers only questions about its holes, as
data; the judge builds the candidate with ``exercise(N).build(oracle.solution())`` and runs every check itself
(:func:`evaluate`). Technique is judged on the SASS the judge assembled, against the stub build's
(:func:`stub_candidate`).

The checks, each ``{"name", "category", "graded", "passed", "detail", ...}``:

* integrity: the file loads in the sandbox and defines every hole; no vendor GEMM in its source
  (:func:`scan_source`: ``@``, matmul/dot/einsum/_scaled_mm/cublas, imports of torch/cupy, eval/exec); no copy;
  every expected check ran;
* correctness: a fresh random problem (:func:`gemm.fp8.random_problem`) per shape and per seed, D poisoned with
  NaN (every element must be written), ``calc_diff < 1e-3`` against the float64 reference. Public seeds are
  printed and reproducible; secret ones are ``hash(FP8LADDER_GRADER_SECRET, public seed)``, derived in the parent
  (the secret never reaches the judge's or the oracle's environment) and shown as "secret"; D must pass MEASURE;
* technique: the candidate's SASS has the exercise's required opcode prefixes and none of its forbidden ones; no
  spills (``Candidate.resources()``, optional: a ``ptx.compile.Resources`` or ``{"registers", "spill_stores",
  "spill_loads"}``);
* performance (GPU only): :func:`gemm.testing.timer.bench_kernel` on each GPU shape, TFLOP/s and the share of the stage's
  speed-of-light bound (:func:`lessons.ladder.speed_of_light`); a time that is <= 0 or implies more than 100% of
  the bound is an "impossible time" and fails; the last timed output is checked, then fresh inputs are generated,
  run and checked again. Passes at >= the stage's threshold for that shape (results/grading.json: a share per
  GPU shape, ``{"4096x4096x7168": 0.49, ...}``, or one share for every shape; else the exercise's
  ``perf_threshold``; None, or a shape the file does not name: reported, not graded).

The exit code is 0 only when the report is PASSED: every graded check passed, every expected one ran, and the
score reaches PASS_MARK of the possible points.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import json
import math
import os
import secrets
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SECRET_ENV = "FP8LADDER_GRADER_SECRET"
GRADING_FILE = ROOT / "results" / "grading.json"
DIFF_LIMIT = 1e-3
REL_LIMIT = 1e-2
MEASURE = (f"D is right when every element was written (NaN poison), calc_diff = 1 - 2 sum(xy) / sum(x^2 + y^2) < "
           f"{DIFF_LIMIT:g} (DeepGEMM's) and ||D - ref|| / ||ref|| < {REL_LIMIT:g}, against the float64 reference of "
           "the dequantized inputs")
PASS_MARK = 0.6  # share of the possible points a PASSED needs (besides every graded check passing)
GRADER_VERSION = "2"  # the judge/oracle design (lessons.grading); recorded in every report
DEFAULT_SEEDS = 2
DEFAULT_TIMEOUT_S = 900
PUBLIC_SEED_BASE = 20250
CATEGORIES = ("integrity", "correctness", "technique", "performance")
WEIGHTS = {"correctness": 50, "technique": 30, "performance": 20}  # the rubric (docs/course.md); integrity gates

# What a solution may not call or import (the vendor-GEMM and tampering defences; docs/course.md lists them).
FORBIDDEN_CALLS = frozenset({"matmul", "dot", "vdot", "einsum", "tensordot", "inner", "multi_dot", "_scaled_mm",
                             "mm", "bmm", "addmm", "baddbmm", "linear", "reference_gemm", "fp8_gemm_nt",
                             "fp8_gemm", "gemm_fp8_fp8_bf16_nt"})
FORBIDDEN_MODULES = frozenset({"torch", "cupy", "jax", "tensorflow", "ctypes", "cffi", "subprocess", "importlib",
                               "builtins", "gc", "lessons.grade", "scipy.linalg"})
FORBIDDEN_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "globals", "vars"})
FORBIDDEN_INTROSPECTION = frozenset({"__wrapped__", "__closure__", "__globals__", "__code__", "__builtins__",
                                     "__subclasses__", "__self__", "_getframe", "f_back", "f_globals", "f_locals",
                                     "meta_path", "modules"})


def _check(name: str, category: str, passed: bool | None, detail: str = "", *, graded: bool = True, **extra) -> dict:
    return {"name": name, "category": category, "graded": graded and passed is not None, "passed": passed,
            "detail": detail, **extra}


def _error_text(error: BaseException) -> str:
    """The whole message (a report that cuts an error mid-sentence hides what to fix)."""
    return f"{type(error).__name__}: {error}".strip()


# ------------------------------------------------------------------------------------------------ seeds

def public_seeds(count: int) -> list[int]:
    return [PUBLIC_SEED_BASE + i for i in range(count)]


def secret_seed(secret: str, public: int) -> int:
    """hash(secret, public seed): reproducible by the instructor, unpredictable without the secret."""
    digest = hashlib.sha256(f"fp8ladder-grader\0{secret}\0{public}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def seed_plan(count: int, secret: str | None) -> list[dict]:
    """The seeds of one grading run: ``count`` public ones and, with a secret, as many derived from it."""
    plan = [{"label": str(seed), "seed": seed, "secret": False} for seed in public_seeds(count)]
    if secret:
        plan += [{"label": f"secret {i + 1}", "seed": secret_seed(secret, seed), "secret": True}
                 for i, seed in enumerate(public_seeds(count))]
    return plan


def problem_rng(seed: int, shape, salt: int = 0) -> np.random.Generator:
    """One generator per (seed, shape): every check draws a fresh problem."""
    return np.random.default_rng([seed, *shape, salt])


# ------------------------------------------------------------------------------------------ static scan

def scan_source(source: str, filename: str = "<solution>") -> list[str]:
    """Vendor-GEMM and tampering findings in a solution's source, one line each ("line 12: uses @")."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as error:
        return [f"line {error.lineno}: syntax error: {error.msg}"]
    found = set()

    def flag(node, what):
        found.add((getattr(node, "lineno", 0), what))

    def forbidden_module(name: str) -> bool:
        return any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN_MODULES) or "cublas" in name.lower()

    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            flag(node, "uses the @ operator (a vendor matmul)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if forbidden_module(alias.name):
                    flag(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if forbidden_module(module):
                flag(node, f"imports from {module}")
            for alias in node.names:
                if alias.name in FORBIDDEN_CALLS or forbidden_module(f"{module}.{alias.name}".strip(".")) \
                        or "cublas" in alias.name.lower():
                    flag(node, f"imports {alias.name} from {module or '.'}")
        elif isinstance(node, ast.Attribute) and (node.attr in FORBIDDEN_CALLS or "cublas" in node.attr.lower()):
            flag(node, f"uses .{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_INTROSPECTION:
            flag(node, f"uses .{node.attr} (reaching into the grader)")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_BUILTINS:
            flag(node, f"uses {node.id} (code the scan cannot read)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value in FORBIDDEN_CALLS or "cublas" in node.value.lower() or node.value in FORBIDDEN_MODULES):
            flag(node, f"names {node.value!r} in a string")
    return [f"line {line}: {what}" for line, what in sorted(found)]


ANSWER_NAMES = frozenset({"reference", "reference_solution", "EXERCISE"})  # where an exercise keeps the answer


PACKAGE_NAMES = frozenset({"Exercise", "Candidate", "exercise", "exercises", "SKELETONS"})  # lessons.exercises API


def copy_findings(source: str, exercise) -> list[str]:
    """Ways a solution takes the answer instead of writing it, read from its source: importing a stage module (any
    ``lessons`` module but the ``lessons.exercises`` package's own names), an exercise module, an exercise's
    ``reference`` / ``EXERCISE``, or the functions the stage itself uses for the holes (their names, from
    ``exercise.reference()``, and the holes' names read off another module). :func:`same_as_reference` catches at
    run time what a source scan cannot (``getattr(exercise(4), "refer" + "ence")``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # scan_source reports it
    answers = set()
    try:
        reference = exercise.reference()
        for hole in exercise.holes:
            function = getattr(reference, hole, None)
            name = getattr(function, "__name__", None)
            if name and name != hole:  # a hole may share its name with the stage's function: the import is the tell
                answers.add(name)
            if getattr(function, "__module__", None):
                answers.add(f"{function.__module__}:{name or hole}")
    except Exception:  # noqa: BLE001  (an exercise without a reference: only the module rule applies)
        pass
    holes = set(getattr(exercise, "holes", ()))
    found = set()
    from_lessons = False
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            modules = [module]
            if module == "lessons.exercises":  # `from lessons.exercises import ex04_...` imports a module
                modules += [f"{module}.{alias.name}" for alias in node.names if alias.name not in PACKAGE_NAMES]
            for alias in node.names:
                if f"{module}:{alias.name}" in answers or alias.name in answers:
                    found.add((node.lineno, f"imports the stage's own {alias.name} from {module}"))
                if module.startswith("lessons") and alias.name in ANSWER_NAMES:
                    found.add((node.lineno, f"imports {alias.name} from {module} (the stage's own answer)"))
        for module in modules:
            if module == "lessons" or module.startswith("lessons."):
                from_lessons = True
            if module.startswith("lessons.exercises."):
                found.add((node.lineno, f"imports {module} (an exercise module: it wires the stage's own answer)"))
            elif (module == "lessons" or module.startswith("lessons.")) and module != "lessons.exercises":
                found.add((node.lineno, f"imports {module} (the stages' own code)"))
        if isinstance(node, ast.Attribute) and (node.attr in answers or node.attr in holes):
            found.add((node.lineno, f"uses .{node.attr} (the stage's own function)"))
    if from_lessons:  # an exercise's answer, read off what the solution imported from lessons
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ANSWER_NAMES:
                found.add((node.lineno, f"uses .{node.attr} (the stage's own answer)"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


# ------------------------------------------------------------------------------------------- backends

class DeviceBackend:
    """The real GPU: Numba device arrays in the contract's layout (gemm.testing.problems), BF16 D poisoned with NaN."""

    def put(self, host):
        from gemm.testing.problems import device_problem
        return device_problem(*host)

    def poison(self, problem) -> None:
        from gemm.testing.problems import BF16_NAN_BITS
        problem.d.copy_to_device(np.full(problem.d.shape, BF16_NAN_BITS, dtype=np.uint16))

    def launch(self, candidate, problem, stream: int = 0) -> None:
        _launch(candidate, problem, stream)

    def synchronize(self) -> None:
        from numba import cuda
        cuda.synchronize()

    def fetch(self, problem) -> np.ndarray:
        from gemm.fp8 import bf16_to_float
        return bf16_to_float(problem.d.copy_to_host())

    def timer(self, launch: Callable[[int], None], before_replay: Callable[[], None] | None = None):
        from gemm.testing.timer import bench_kernel
        return bench_kernel(launch, before_replay=before_replay)


def _takes_stream(candidate) -> bool:
    try:
        return "stream" in inspect.signature(candidate.run_gpu).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def _launch(candidate, problem, stream: int) -> None:
    """``run_gpu(a, sa, b, sb, d[, stream=])``: the stream only where the candidate takes one (timing needs it)."""
    if _takes_stream(candidate):
        candidate.run_gpu(problem.a, problem.sa, problem.b, problem.sb, problem.d, stream=stream)
    elif stream:
        raise TypeError("Candidate.run_gpu takes no stream= argument: it cannot be timed in a CUDA graph")
    else:
        candidate.run_gpu(problem.a, problem.sa, problem.b, problem.sb, problem.d)


# ------------------------------------------------------------------------------------------- evaluate

def _reference(exercise, host, rng, *, sample: bool):
    """(rows, float64 values) of the expected D: the exercise's own reference where it has one (stage 00)."""
    custom = (getattr(exercise, "extra", None) or {}).get("reference")
    if custom is not None:
        values = np.asarray(custom(*host), dtype=np.float64)
        return np.arange(values.shape[0]), values
    from gemm.testing.problems import reference_rows
    from gemm.testing.problems import reference_gemm
    if not sample:
        return np.arange(host[0].shape[0]), reference_gemm(*host)
    ref = reference_rows(*host, rng)
    return ref.rows, ref.values


def _problem(exercise, shape, rng):
    custom = (getattr(exercise, "extra", None) or {}).get("problem")
    if custom is not None:
        return custom(*shape, rng)
    from gemm.testing.problems import random_problem
    return random_problem(*shape, rng)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| (L2 over every element). DeepGEMM's calc_diff alone lets a uniform scale error pass
    (4% gives 1 - 2(1.04)/(1 + 1.04^2) = 7.7e-4 < 1e-3); this does not (0.04 > 1e-2), while BF16 rounding (~0.3%) does."""
    norm = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / norm if norm else float(np.linalg.norm(got - want))


def judge(d, rows, expected) -> dict:
    """Every element written (no NaN left from the poison; right shape), then on the reference rows calc_diff <
    DIFF_LIMIT and the relative L2 error < REL_LIMIT (MEASURE states it in every report)."""
    from gemm.fp8 import calc_diff
    d = np.asarray(d, dtype=np.float64)
    shape = (len(rows), expected.shape[1])
    if d.ndim != 2 or d.shape[1] != expected.shape[1] or d.shape[0] <= int(np.max(rows, initial=0)):
        return {"correct": False, "unwritten": None, "diff": None, "rel_error": None,
                "why": f"D has shape {d.shape}, expected (M, {shape[1]})"}
    unwritten = int(np.isnan(d).sum())
    if unwritten:
        return {"correct": False, "unwritten": unwritten, "diff": None, "rel_error": None,
                "why": f"{unwritten} of {d.size} elements never written (NaN poison left)"}
    diff, rel = calc_diff(d[rows], expected), relative_error(d[rows], np.asarray(expected, np.float64))
    finite = math.isfinite(diff) and math.isfinite(rel)
    correct = finite and diff < DIFF_LIMIT and rel < REL_LIMIT
    why = (f"calc_diff {diff:.3g} {'<' if finite and diff < DIFF_LIMIT else '>='} {DIFF_LIMIT:g}, relative error "
           f"{rel:.3g} {'<' if finite and rel < REL_LIMIT else '>='} {REL_LIMIT:g}")
    return {"correct": correct, "unwritten": 0, "diff": diff if math.isfinite(diff) else None,
            "rel_error": rel if math.isfinite(rel) else None, "why": why}


def _shape_text(shape) -> str:
    return "x".join(str(v) for v in shape)


def correctness_checks(exercise, candidate, plan, *, mode: str, backend=None) -> list[dict]:
    shapes = exercise.shapes_cpu if mode == "cpu" else exercise.shapes_gpu
    checks = []
    for shape in shapes:
        for entry in plan:
            name = f"correct {_shape_text(shape)} seed {entry['label']}"
            rng = problem_rng(entry["seed"], shape)
            try:
                host = _problem(exercise, shape, rng)
                if mode == "cpu":
                    d = candidate.run_cpu(*host)
                else:
                    problem = backend.put(host)
                    backend.poison(problem)
                    backend.launch(candidate, problem, 0)
                    backend.synchronize()
                    d = backend.fetch(problem)
                rows, expected = _reference(exercise, host, rng, sample=mode != "cpu")
                verdict = judge(d, rows, expected)
            except NotImplementedError as error:
                checks.append(_check(name, "correctness", False, f"a hole is not filled: {_error_text(error)}"))
                continue
            except Exception as error:  # noqa: BLE001  (the student's code: any failure is a failed check)
                checks.append(_check(name, "correctness", False, _error_text(error),
                                     traceback=traceback.format_exc()[-4000:]))
                continue
            checks.append(_check(name, "correctness", verdict["correct"], verdict["why"], shape=list(shape),
                                 seed=entry["label"], diff=verdict["diff"], rel_error=verdict["rel_error"],
                                 unwritten=verdict["unwritten"]))
    return checks


def _opcodes(instructions) -> list[str]:
    """Each instruction's opcode with its modifiers ("LDS.128", "HMMA.16816.F32"), so a required prefix may name
    a width or a variant as well as a family."""
    out = []
    for instruction in instructions:
        text = getattr(instruction, "text", None) or str(instruction)
        words = text.replace(";", " ").split()
        words = words[1:] if words and words[0].startswith("@") else words
        out.append(words[0] if words else (getattr(instruction, "opcode", None) or ""))
    return out


def _missing_toolchain(error: BaseException) -> bool:
    return isinstance(error, FileNotFoundError) and any(tool in str(error) for tool in ("ptxas", "nvdisasm", "nvvm",
                                                                                       "NVVM"))


def stub_solution(exercise):
    """The holes filled with the simplest answers of the right type (the first argument for an expression, zeros
    shaped like the stage's own answer, no flips): the kernel a student gets for writing nothing that matters.
    None where no such stub exists (an emitter hole)."""
    from types import SimpleNamespace
    from lessons.grading.traced import function_from_tree
    reference = exercise.reference()
    kinds = getattr(exercise, "hole_kinds", {}) or {}
    holes, trees = {}, {}
    for hole in exercise.holes:
        kind = kinds.get(hole, "value")
        if isinstance(kind, tuple):
            trees[hole] = ["arg", 0]
            holes[hole] = function_from_tree(trees[hole], list(kind[1]), hole)
        elif kind == "sass_run":
            holes[hole] = lambda run: []
        elif kind == "emitter":
            return None
        else:
            own = getattr(reference, hole)
            holes[hole] = lambda *args, own=own: _zero_like(own(*args))
    stub = SimpleNamespace(**holes)
    stub.as_data = lambda: {"trees": trees, "values": {}, "kinds": {h: list(k) if isinstance(k, tuple) else k
                                                                   for h, k in kinds.items()}}
    return stub


def _zero_like(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_zero_like(v) for v in value)
    return type(value)(0) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def stub_candidate(exercise):
    """The stub solution's candidate (None where there is none, or it does not build)."""
    try:
        stub = stub_solution(exercise)
        return None if stub is None else exercise.build(stub)
    except Exception:  # noqa: BLE001 - a stub the generator refuses: every technique check counts
        return None


def _opcode_counts(candidate) -> dict[str, int] | None:
    try:
        instructions = candidate.sass() if candidate is not None else None
    except Exception:  # noqa: BLE001
        return None
    if instructions is None:
        return None
    counts: dict[str, int] = {}
    for opcode in _opcodes(instructions):
        counts[opcode] = counts.get(opcode, 0) + 1
    return counts


def _count(counts: dict[str, int], prefix: str) -> int:
    return sum(n for op, n in counts.items() if op.startswith(prefix))


def technique_checks(exercise, candidate, stub=None) -> list[dict]:
    """Required / forbidden SASS opcode prefixes and spills, on the machine code the judge assembled itself. With a
    ``stub`` candidate (:func:`stub_candidate`), an instruction the stub's kernel has just as often is the
    scaffold's, not the student's: it is shown, not graded. A missing assembler or disassembler: not graded."""
    checks = []
    required, forbidden = tuple(exercise.required_sass), tuple(exercise.forbidden_sass)
    sass_fn = getattr(candidate, "sass", None)
    try:
        instructions = sass_fn() if sass_fn is not None else None
    except NotImplementedError as error:
        checks.append(_check("sass", "technique", False, f"a hole is not filled: {_error_text(error)}"))
        instructions = None
    except Exception as error:  # noqa: BLE001
        if _missing_toolchain(error):
            checks.append(_check("sass", "technique", None, f"not graded: the toolchain is missing here "
                                 f"({_error_text(error)})", graded=False))
        else:
            checks.append(_check("sass", "technique", False, f"building the SASS failed: {_error_text(error)}"))
        instructions = None
    else:
        if instructions is None and (required or forbidden):
            checks.append(_check("sass", "technique", None, "not graded: no SASS on this machine", graded=False))
    if instructions is not None:
        opcodes = set(_opcodes(instructions))
        mine = {}
        for opcode in _opcodes(instructions):
            mine[opcode] = mine.get(opcode, 0) + 1
        scaffold = _opcode_counts(stub) if stub is not None and (required or forbidden) else None
        for prefix in required:
            hits = sorted(op for op in opcodes if op.startswith(prefix))
            found = f"found {', '.join(hits)}" if hits else f"no {prefix}* instruction in the SASS"
            if scaffold is not None and hits and _count(scaffold, prefix) == _count(mine, prefix):
                checks.append(_check(f"uses {prefix}", "technique", True, f"{found} (the scaffold's: the stub build "
                                     "has as many; not graded)", graded=False))
            else:
                checks.append(_check(f"uses {prefix}", "technique", bool(hits), found))
        for prefix in forbidden:
            hits = sorted(op for op in opcodes if op.startswith(prefix))
            if scaffold is not None and _count(mine, prefix) <= _count(scaffold, prefix):
                checks.append(_check(f"avoids {prefix}", "technique", None, (f"found {', '.join(hits)}, as the "
                                     "scaffold has" if hits else f"no {prefix}*, nor in the scaffold") +
                                     " (not the student's doing: not graded)", graded=False))
            else:
                checks.append(_check(f"avoids {prefix}", "technique", not hits,
                                     f"found {', '.join(hits)}" if hits else f"no {prefix}*"))
        for check in (getattr(exercise, "extra", None) or {}).get("sass_checks", ()):
            name = getattr(check, "__name__", "sass check").replace("_", " ")
            try:
                failures = list(check(instructions))
            except Exception as error:  # noqa: BLE001
                failures = [_error_text(error)]
            checks.append(_check(name, "technique", not failures, "; ".join(map(str, failures)) or "ok"))
        local = sorted({op.split(".")[0] for op in opcodes} & {"LDL", "STL"})
        if local:
            checks.append(_check("local memory", "technique", None, f"SASS has {', '.join(local)} (local memory: "
                                 "spills or a local array)", graded=False))
    resources_fn = getattr(candidate, "resources", None)
    if resources_fn is not None:
        try:
            resources = resources_fn() or {}
            if dataclasses.is_dataclass(resources):  # ptx.compile.Resources, ptxas's report of the kernel
                resources = dataclasses.asdict(resources)
        except Exception as error:  # noqa: BLE001
            if _missing_toolchain(error):
                checks.append(_check("no spills", "technique", None, f"not graded: the toolchain is missing here "
                                     f"({_error_text(error)})", graded=False))
            else:
                checks.append(_check("no spills", "technique", False, f"resources() failed: {_error_text(error)}"))
        else:
            if resources:
                spills = resources.get("spills")
                if spills is None:
                    spills = (resources.get("spill_stores") or 0) + (resources.get("spill_loads") or 0)
                checks.append(_check("no spills", "technique", spills == 0, f"{spills} bytes spilled, "
                                     f"{resources.get('registers', '?')} registers", resources=resources))
    return checks


def exercise_checks(exercise, solution) -> list[dict]:
    """The exercise's own technique checks (``extra["checks"]``: solution -> list of failures, empty when right)."""
    checks = []
    for check in (getattr(exercise, "extra", None) or {}).get("checks", ()):
        name = getattr(check, "__name__", "exercise check").replace("_", " ")
        what = ((check.__doc__ or "").strip().splitlines() or [""])[0]
        try:
            failures = list(check(solution))
        except NotImplementedError as error:
            failures = [f"a hole is not filled: {_error_text(error)}"]
        except Exception as error:  # noqa: BLE001
            failures = [_error_text(error)]
        checks.append(_check(name, "technique", not failures, "; ".join(map(str, failures)) or what))
    return checks


def sol_bound(exercise, shape) -> dict | None:
    """The stage's speed-of-light bound at a shape: the exercise's own ``sol_bound_tflops`` where it has one,
    else :func:`lessons.ladder.speed_of_light` for its stage."""
    own = getattr(exercise, "sol_bound_tflops", None) or (getattr(exercise, "extra", None) or {}).get(
        "sol_bound_tflops")
    if own is not None:
        value = own(*shape)
        return None if value is None else {"bound_tflops": float(value), "bound_unit": "exercise"}
    from lessons.ladder import speed_of_light
    return speed_of_light(exercise.stage, *shape)


def performance_verdict(timing, bound: dict | None, shape, threshold: float | None) -> dict:
    """TFLOP/s and share of the bound of one timing; an impossible time (<= 0, or faster than the bound) fails."""
    from gemm.testing.problems import flops
    work = flops(*shape)
    median_us, min_us = float(timing.median_us), float(timing.min_us)
    nodes = getattr(timing, "nodes_per_call", None)
    out = {"time_us": median_us, "min_us": min_us, "threshold": threshold, "nodes_per_call": nodes}
    if nodes is not None and nodes < 1:
        return {**out, "passed": False, "impossible": True,
                "why": f"untimed work: a call added {nodes:g} nodes to the CUDA graph captured on the stream it was "
                       "given; run_gpu must enqueue its kernels on that stream (work on another stream, or done on "
                       "the host, is not timed)"}
    if not (math.isfinite(median_us) and math.isfinite(min_us)) or median_us <= 0 or min_us <= 0:
        return {**out, "passed": False, "impossible": True,
                "why": f"impossible time: median {median_us:g} us, min {min_us:g} us (<= 0 or not a number)"}
    tflops = work / median_us / 1e6
    out["tflops"] = tflops
    if bound is None:
        return {**out, "passed": None, "impossible": False, "why": f"{tflops:.3g} TFLOP/s (no speed-of-light bound)"}
    best = work / min_us / 1e6
    share, best_share = tflops / bound["bound_tflops"], best / bound["bound_tflops"]
    out.update(bound_tflops=bound["bound_tflops"], bound_unit=bound["bound_unit"], pct_bound=100 * share)
    if share > 1 or best_share > 1:
        return {**out, "passed": False, "impossible": True,
                "why": f"impossible time: {100 * max(share, best_share):.0f}% of the {bound['bound_unit']} bound "
                       f"({bound['bound_tflops']:.4g} TFLOP/s); nothing runs faster than its speed of light"}
    if threshold is None:
        return {**out, "passed": None, "impossible": False,
                "why": f"{tflops:.4g} TFLOP/s = {100 * share:.1f}% of the bound (no threshold for this shape: not "
                       "graded)"}
    passed = share >= threshold
    return {**out, "passed": passed, "impossible": False,
            "why": f"{tflops:.4g} TFLOP/s = {100 * share:.1f}% of the bound "
                   f"({'>=' if passed else '<'} {100 * threshold:.0f}%)"}


def shape_threshold(threshold, shape) -> float | None:
    """The share that passes at ``shape``: one for every shape, or per shape (``{"MxNxK": share}``)."""
    return threshold.get(_shape_text(shape)) if isinstance(threshold, dict) else threshold


def performance_checks(exercise, candidate, plan, *, backend, threshold) -> list[dict]:
    """Time each GPU shape, then check the last timed output and a run on freshly generated inputs."""
    checks = []
    untimed = (getattr(exercise, "extra", None) or {}).get("untimed")
    if untimed:
        return [_check("performance", "performance", None, f"not timed: {untimed}", graded=False)]
    if not _takes_stream(candidate):  # bench_kernel replays a CUDA graph captured on its own stream
        why = "Candidate.run_gpu takes no stream= argument: it cannot be timed (a contract gap of the exercise)"
        graded = any(shape_threshold(threshold, shape) is not None for shape in exercise.shapes_gpu)
        return [_check("performance", "performance", False if graded else None, why)]
    for shape in exercise.shapes_gpu:
        name = f"performance {_shape_text(shape)}"
        seed = plan[-1]["seed"]  # the last seed: secret when there is a secret
        try:
            rng = problem_rng(seed, shape, salt=1)
            host = _problem(exercise, shape, rng)
            problem = backend.put(host)
            backend.poison(problem)
            def poison_before_replay(problem=problem):  # D is then what the replays alone wrote
                backend.synchronize()  # the whole device: work a call left on any other stream is done
                backend.poison(problem)

            timing = backend.timer(lambda stream: backend.launch(candidate, problem, stream), poison_before_replay)
            backend.synchronize()
            rows, expected = _reference(exercise, host, rng, sample=True)
            last = judge(backend.fetch(problem), rows, expected)  # the output of the last timed run
            rng = problem_rng(seed, shape, salt=2)  # regenerated inputs: nothing computed before may stand in
            host = _problem(exercise, shape, rng)
            fresh_problem = backend.put(host)
            backend.poison(fresh_problem)
            backend.launch(candidate, fresh_problem, 0)
            backend.synchronize()
            rows, expected = _reference(exercise, host, rng, sample=True)
            fresh = judge(backend.fetch(fresh_problem), rows, expected)
            verdict = performance_verdict(timing, sol_bound(exercise, shape), shape, shape_threshold(threshold, shape))
        except Exception as error:  # noqa: BLE001
            checks.append(_check(name, "performance", False, _error_text(error),
                                 traceback=traceback.format_exc()[-4000:]))
            continue
        passed, why = verdict.pop("passed"), verdict.pop("why")
        if not (last["correct"] and fresh["correct"]):
            passed = False
            why += f"; timed output: {last['why']}; fresh inputs after timing: {fresh['why']}"
        samples = [float(v) for v in (getattr(timing, "samples_us", None) or [])]
        checks.append(_check(name, "performance", passed, why, shape=list(shape), samples_us=samples, **verdict))
    return checks


def evaluate(exercise, candidate, plan, *, mode: str, backend=None, threshold: float | None = None,
             stub=None) -> list[dict]:
    """Every runtime check of one built candidate (the judge's work; tests call it with a host backend)."""
    checks = technique_checks(exercise, candidate, stub)
    if mode == "gpu":
        backend = backend or DeviceBackend()
    checks += correctness_checks(exercise, candidate, plan, mode=mode, backend=backend)
    if mode == "gpu":
        checks += performance_checks(exercise, candidate, plan, backend=backend, threshold=threshold)
    return checks


# ------------------------------------------------------------------------------------------- the child

def load_exercise(stage: int, exercise_file: str | None = None):
    """``lessons.exercises.exercise(stage)``, or (tests, instructors trying one out) ``EXERCISE`` from a file."""
    if exercise_file:
        import importlib.util
        spec = importlib.util.spec_from_file_location("grader_exercise", exercise_file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.EXERCISE
    from lessons.exercises import exercise
    return exercise(stage)


def run_child(plan: dict) -> dict:
    """Grade one solution in this (judge) process, which never imports the student's file: a sandboxed oracle
    (:class:`lessons.grading.sandbox.Oracle`) answers for its holes with data, and everything else happens here:
    the kernel is built from that data by the stage's own generator, then checked, run and timed."""
    checks = []
    try:
        exercise = load_exercise(plan["stage"], plan.get("exercise_file"))
    except Exception as error:  # noqa: BLE001  (the grader's side: say so)
        return {"error": f"cannot load the exercise for stage {plan['stage']}: {_error_text(error)}", "checks": []}
    info = {"exercise": exercise.name, "stage": exercise.stage}
    if plan.get("reference"):
        return {**info, "checks": _grade_solution(exercise, exercise.reference(), plan)}
    from lessons.grading.sandbox import HoleError, Oracle
    _preload(exercise, plan["mode"])  # what the judge runs is in memory before any student code starts
    deadline = time.time() + float(plan.get("timeout", DEFAULT_TIMEOUT_S)) - 5
    oracle = Oracle(plan["solution"], exercise, deadline=deadline, temp_root=plan.get("temp_root"))
    try:
        try:
            defined = oracle.defined_holes()
        except HoleError as error:
            checks.append(_check("loads", "integrity", False, error.message, traceback=error.trace))
            return {**info, "checks": checks}
        checks.append(_check("loads", "integrity", True, "the file loads in the grading sandbox"))
        missing = [hole for hole, present in defined.items() if not present]
        checks.append(_check("defines every hole", "integrity", not missing,
                             f"missing: {', '.join(missing)}" if missing else ", ".join(exercise.holes)))
        if not missing:
            checks += _grade_solution(exercise, oracle.solution(), plan)
    finally:
        oracle.close()
    info["oracle_questions"] = oracle.questions
    return {**info, "checks": checks}


def _preload(exercise, mode: str) -> None:
    """Import every module the judge will run before the oracle exists: a file changed on disk while a solution
    runs (the sandbox refuses that; this is the second layer) cannot become the judge's code."""
    import importlib
    import lessons
    for name in ("gemm.testing.emulated", "gemm.testing.problems", "gemm.testing.timer", "gemm.kernel.launch", "ptx.sass",
                 "ptx.compile", "ptx.passes", "ptx.emulate", "ptx.runtime", "ptx.tensor_maps", "lessons.ladder",
                 "lessons.exercises.holed", "lessons.grading.traced", "lessons.numba_fp8"):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this machine cannot import is one the judge will not use
            pass
    try:
        lessons.stage(exercise.stage)
    except Exception:  # noqa: BLE001 - the build reports it
        pass


def source_digest() -> str:
    """SHA-256 over every source file of ptx/, gemm/ and lessons/ (paths and contents): the code a grading run
    trusts. The parent compares it before and after each run."""
    digest = hashlib.sha256()
    for package in ("ptx", "gemm", "lessons"):
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _grade_solution(exercise, solution, plan: dict) -> list[dict]:
    """Build the candidate from ``solution`` (the oracle's namespace, or the stage's own code) and run every check."""
    from lessons.grading.sandbox import HoleError
    checks = []
    try:
        candidate = exercise.build(solution)
    except NotImplementedError as error:
        return [_check("builds", "integrity", False, f"a hole is not filled: {_error_text(error)}")]
    except HoleError as error:
        return [_check("builds", "integrity", False, str(error), traceback=error.trace)]
    except Exception as error:  # noqa: BLE001
        return [_check("builds", "integrity", False, _error_text(error), traceback=traceback.format_exc()[-4000:])]
    checks += exercise_checks(exercise, solution)
    checks += evaluate(exercise, candidate, plan["seeds"], mode=plan["mode"], threshold=plan.get("threshold"),
                       stub=None if plan.get("reference") else stub_candidate(exercise))
    return checks


def _child_main() -> int:
    result_fd = os.dup(1)  # the answer goes here; anything else printed goes to stderr
    os.dup2(2, 1)
    plan = json.loads(sys.stdin.readline())
    nonce = plan.pop("nonce")
    if plan["mode"] == "cpu":
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    try:
        result = run_child(plan)
    except BaseException as error:  # noqa: BLE001
        result = {"error": f"the grader failed: {_error_text(error)}", "checks": [],
                  "traceback": traceback.format_exc()[-4000:]}
    with os.fdopen(result_fd, "w") as out:
        out.write(nonce + json.dumps(result, default=_plain) + nonce + "\n")
    return 0


def _plain(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


# ------------------------------------------------------------------------------------------ the parent

def read_thresholds(path: Path = GRADING_FILE) -> dict[int, float | dict | None]:
    try:
        stages = json.loads(Path(path).read_text())["stages"]
        return {int(stage): entry.get("perf_threshold") if isinstance(entry, dict) else entry
                for stage, entry in stages.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        if Path(path).exists():
            raise ValueError(f"thresholds file {path}: expected {{\"stages\": {{\"NN\": {{\"perf_threshold\": "
                             f"share or {{\"MxNxK\": share}}}}}}}} (tools/calibrate_grader.py writes it): "
                             f"{_error_text(error)}") from error
        return {}


def _threshold(stage: int, exercise_threshold, thresholds_file) -> float | None:
    recorded = read_thresholds(thresholds_file if thresholds_file else GRADING_FILE).get(stage)
    return recorded if recorded is not None else exercise_threshold


def _exercise_threshold(stage: int, exercise_file) -> float | None:
    try:
        return load_exercise(stage, exercise_file).perf_threshold
    except Exception:  # noqa: BLE001  (reported by the child)
        return None


def grade(stage: int, solution: Path | str | None, *, mode: str = "auto", seeds: int = DEFAULT_SEEDS,
          secret: str | None = None, timeout: float = DEFAULT_TIMEOUT_S, exercise_file: str | None = None,
          thresholds_file: Path | None = None, allow_copies: bool = False) -> dict:
    """Grade ``solution`` for ``stage``; the report (see the module docstring). The judge runs in a child process of
    trusted code only; the solution runs in its sandboxed oracle, a child of that one.

    ``solution=None`` grades the stage's own code (``exercise.reference()``, the instructor's calibration run:
    ``python -m lessons grade N --reference``); the source scans then have no file to read. ``allow_copies``: a hole
    that is the stage's own code is reported, not failed (an instructor's choice)."""
    started = time.time()
    reference = solution is None
    solution = None if reference else Path(solution).resolve()
    secret = os.environ.get(SECRET_ENV) if secret is None else secret
    if mode == "auto":
        from ptx.device import is_hopper
        mode = "gpu" if is_hopper() else "cpu"
    plan_seeds = seed_plan(seeds, secret or None)
    report = {"stage": stage, "solution": f"stage {stage:02d}'s own code" if reference else str(solution),
              "reference": reference, "mode": mode, "seeds": [entry["label"] for entry in plan_seeds],
              "public_seeds": [entry["seed"] for entry in plan_seeds if not entry["secret"]],
              "secret_seeds": bool(secret), "diff_limit": DIFF_LIMIT, "rel_limit": REL_LIMIT, "measure": MEASURE,
              "grader_version": grader_version(), "graded_at": utc_timestamp(), "pass_mark": PASS_MARK,
              "checks": []}
    if not reference:
        if not solution.is_file():
            report["checks"].append(_check("loads", "integrity", False, f"no file {solution}"))
            return _finish(report, started)
        report["solution_sha256"] = hashlib.sha256(solution.read_bytes()).hexdigest()
        source = solution.read_text(errors="replace")
        findings = scan_source(source, str(solution))
        report["checks"].append(_check("no vendor GEMM (source)", "integrity", not findings,
                                       "; ".join(findings) if findings else "no matmul/@/einsum/dot/_scaled_mm/"
                                                                           "cublas, no torch/cupy import"))
        try:
            exercise = load_exercise(stage, exercise_file)
            copied = copy_findings(source, exercise)
            from lessons.grading.copies import copied_holes
            same = copied_holes(source, exercise)
        except Exception:  # noqa: BLE001  (an exercise that does not load: the judge reports it)
            copied, same = [], []
        report["checks"].append(_check("own work (no copy of the stage's code)", "integrity", not copied,
                                       "; ".join(copied) if copied else "no stage module or stage function "
                                                                        "imported"))
        why = (f"{', '.join(same)}: the stage's own code with other names or formatting" if same else
               "no function is the stage's own code (names and formatting aside)")
        report["checks"].append(_check("own work (not a copy)", "integrity", not same,
                                       why + ("; allowed by the instructor (--allow-copies)" if same and allow_copies
                                              else ""), graded=not (same and allow_copies), copied=same))
    threshold = _threshold(stage, _exercise_threshold(stage, exercise_file), thresholds_file)
    report["perf_threshold"] = threshold
    nonce = secrets.token_hex(16)
    plan = {"nonce": nonce, "stage": stage, "solution": None if reference else str(solution),
            "reference": reference, "mode": mode, "seeds": plan_seeds, "threshold": threshold,
            "exercise_file": str(exercise_file) if exercise_file else None, "timeout": timeout}
    env = {key: value for key, value in os.environ.items() if key != SECRET_ENV}  # the child never sees it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if mode == "cpu":
        env.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    import tempfile
    plan["temp_root"] = tempfile.mkdtemp(prefix="fp8grade-run-")  # the oracle's files: removed here, whatever happens
    before = source_digest()
    try:
        done = subprocess.run([sys.executable, "-m", "lessons.grade", "--child"], input=json.dumps(plan) + "\n",
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        report["checks"].append(_check("finishes in time", "integrity", False,
                                       f"the solution's process ran past {timeout:g} s and was stopped"))
        return _finish(report, started)
    finally:
        from lessons.grading.sandbox import remove_tree
        remove_tree(plan["temp_root"])
        if source_digest() != before:  # the sandbox failed: say so loudly, and never PASS this run
            report["checks"].append(_check("the grader's code is unchanged", "integrity", False,
                                           "a source file of ptx/, gemm/ or lessons/ changed while this solution was "
                                           "graded: restore the checkout (git status) before grading anything else"))
    stdout = done.stdout
    blocks = stdout.split(nonce)
    result = None
    if done.returncode == 0 and len(blocks) == 3:  # exactly one framed answer, from a judge that ended well
        try:
            result = json.loads(blocks[1])
        except (ValueError, RecursionError):
            result = None
    if not isinstance(result, dict):
        tail = (done.stderr or "").strip()[-1500:]
        why = (f"no result (exit {done.returncode})" if len(blocks) < 3 else
               f"{(len(blocks) - 1) // 2} framed answers (exit {done.returncode}): the judge's channel was tampered "
               "with" if len(blocks) != 3 else f"an unreadable or failed answer (exit {done.returncode})")
        report["checks"].append(_check("child process", "integrity", False, why
                                       + (f": {tail.splitlines()[-1]}" if tail else ""), stderr=tail))
        return _finish(report, started)
    if result.get("error"):
        report["checks"].append(_check("child process", "integrity", False, result["error"]))
    report.update({key: result[key] for key in ("exercise", "oracle_questions") if key in result})
    report["checks"] += result.get("checks", [])
    try:
        report["expected_checks"] = expected_checks(load_exercise(stage, exercise_file), len(plan_seeds), mode)
    except Exception:  # noqa: BLE001 - the judge already reported an exercise that does not load
        pass
    for check in report["checks"]:  # the secret seeds' values never reach the report
        if check.get("seed") not in (None, *report["seeds"]):
            check["seed"] = "secret"
    return _finish(report, started)


def score(checks: list[dict]) -> dict:
    """The rubric: each category's share of its graded checks passed x its weight; any integrity failure: 0;
    technique and performance score only when at least one correctness check passed (a kernel that computes
    nothing right earns nothing for its instructions)."""
    by_category = {}
    for category in CATEGORIES:
        graded = [c for c in checks if c["category"] == category and c["graded"]]
        by_category[category] = {"passed": sum(bool(c["passed"]) for c in graded), "graded": len(graded)}
    integrity_ok = by_category["integrity"]["passed"] == by_category["integrity"]["graded"]
    works = by_category["correctness"]["passed"] > 0  # technique and speed count for a kernel that computes D
    points, possible = 0.0, 0
    for category, weight in WEIGHTS.items():
        counts = by_category[category]
        if counts["graded"] or category != "performance":  # performance counts only where it is graded
            possible += weight
            if counts["graded"] and (works or category == "correctness"):
                points += weight * counts["passed"] / counts["graded"]
    return {"categories": by_category, "points": round(points, 1) if integrity_ok else 0.0, "possible": possible}


def expected_checks(exercise, seeds: int, mode: str) -> dict[str, int]:
    """How many checks of each category a complete grading run has: PASSED needs all of them to have run."""
    shapes = exercise.shapes_cpu if mode == "cpu" else exercise.shapes_gpu
    return {"correctness": len(shapes) * seeds}


def _finish(report: dict, started: float) -> dict:
    """The verdict: PASSED needs every graded check passed, every expected check run, and the pass mark."""
    graded = [c for c in report["checks"] if c["graded"]]
    report["score"] = score(report["checks"])
    ran = {category: sum(1 for c in report["checks"] if c["category"] == category) for category in CATEGORIES}
    missing = {category: count - ran[category] for category, count in report.get("expected_checks", {}).items()
               if ran[category] < count}
    if missing and not any(c["category"] == "integrity" and c["graded"] and not c["passed"] for c in report["checks"]):
        report["checks"].append(_check("every check ran", "integrity", False, "checks that did not run: " + ", ".join(
            f"{count} {category}" for category, count in missing.items())))
        graded = [c for c in report["checks"] if c["graded"]]
        report["score"] = score(report["checks"])
    points, possible = report["score"]["points"], report["score"]["possible"]
    report["passed"] = (bool(graded) and all(c["passed"] for c in graded) and possible > 0
                        and points >= PASS_MARK * possible)
    report["elapsed_s"] = round(time.time() - started, 2)
    return report


def grader_version() -> str:
    """GRADER_VERSION and the hash of the grader's own files (what an instructor can re-run against)."""
    digest = hashlib.sha256()
    for path in sorted([ROOT / "lessons" / "grade.py", *(ROOT / "lessons" / "grading").glob("*.py")]):
        digest.update(path.read_bytes())
    return f"{GRADER_VERSION}+{digest.hexdigest()[:12]}"


def utc_timestamp() -> str:
    import datetime
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def summary(report: dict) -> str:
    """The readable summary: one line per check, then the verdict."""
    title = f"stage {report['stage']:02d}" + (f" ({report['exercise']})" if report.get("exercise") else "")
    lines = [f"grading {title}: {report['solution']}",
             f"  mode {report['mode']}, seeds {', '.join(report['seeds'])}"
             + ("" if report["secret_seeds"] else f"  (no {SECRET_ENV}: public seeds only)")]
    for check in report["checks"]:
        mark = "PASS" if check["passed"] else ("FAIL" if check["passed"] is False else "----")
        if check["passed"] is not None and not check["graded"]:
            mark = mark.lower()
        lines.append(f"  [{mark}] {check['category']:<11} {check['name']}: {check['detail']}")
    s = report["score"]
    lines.append(f"  score {s['points']:g} / {s['possible']}   "
                 + "  ".join(f"{k} {v['passed']}/{v['graded']}" for k, v in s["categories"].items()))
    if report.get("measure"):
        lines.append(f"  correctness: {report['measure']}")
    lines.append("PASSED" if report["passed"] else "FAILED")
    return "\n".join(lines)


def main(args) -> int:
    """``python -m lessons grade``: the parsed arguments (lessons/__main__.py) -> exit code."""
    mode = "gpu" if args.gpu else "cpu" if args.cpu else "auto"
    if mode == "gpu":
        from ptx.device import is_hopper
        if not is_hopper():
            print("python -m lessons grade: --gpu needs a Hopper (sm_90) GPU; none found (use --cpu)",
                  file=sys.stderr)
            return 2
    options = dict(mode=mode, seeds=args.seeds, timeout=args.timeout, thresholds_file=args.thresholds,
                   exercise_file=getattr(args, "exercise_file", None),
                   allow_copies=getattr(args, "allow_copies", False))
    if getattr(args, "class_dir", None) is not None:
        from lessons.grading.gradebook import grade_class
        out = args.out or args.class_dir / "grades"
        reports = grade_class(args.stage, args.class_dir, out=out, jobs=args.jobs, **options)
        for student, report in reports.items():
            print(f"{student:<24} {report['score']['points']:>5g} / {report['score']['possible']:<3} "
                  f"{'PASSED' if report['passed'] else 'FAILED'}")
        print(f"gradebook: {out / 'gradebook.csv'} (and results.json per student, junit.xml)")
        return 0
    report = grade(args.stage, None if getattr(args, "reference", False) else args.solution, **options)
    print(summary(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=_plain) + "\n")
        print(f"report: {args.json}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        sys.exit(_child_main())
    sys.exit("lessons.grade is run by `python -m lessons grade N solution.py`")
