"""``python -m lessons grade N solution.py``: the course's autograder (see docs/course.md, the instructor guide).

The student's file never runs in the grading process. The parent (:func:`grade`) starts a child
(``python -m lessons.grade --child``), hands it the plan on stdin (the seeds to use, already derived, and a nonce
that frames its answer) and reads the answer back; the child installs the vendor-GEMM guards, loads the solution
by path, checks that it defines every hole, builds the candidate with ``exercise(N).build(solution)`` and runs the
checks (:func:`evaluate`). The parent adds the static scan of the file and writes the report.

The checks, each ``{"name", "category", "graded", "passed", "detail", ...}``:

* integrity: the file loads and defines every hole; no vendor GEMM, statically (:func:`scan_source`: ``@``,
  matmul/dot/einsum/_scaled_mm/cublas, imports of torch/cupy, eval/exec) and dynamically (numpy's and torch's
  matmul entry points replaced, in the child, by functions that record and raise when the student's file is on
  the stack: a ``try/except`` in the solution cannot hide the record);
* correctness: a fresh random problem (:func:`gemm.fp8.random_problem`) per shape and per seed, D poisoned with
  NaN (every element must be written), ``calc_diff < 1e-3`` against the float64 reference. Public seeds are
  printed and reproducible; secret ones are ``hash(FP8LADDER_GRADER_SECRET, public seed)``, derived in the parent
  (the secret never reaches the child's environment) and shown as "secret";
* technique: the candidate's SASS has the exercise's required opcode prefixes and none of its forbidden ones; no
  spills (``Candidate.resources()``, optional: a ``ptx.compile.Resources`` or ``{"registers", "spill_stores",
  "spill_loads"}``);
* performance (GPU only): :func:`gemm.testing.bench_kernel` on each GPU shape, TFLOP/s and the share of the stage's
  speed-of-light bound (:func:`lessons.ladder.speed_of_light`); a time that is <= 0 or implies more than 100% of
  the bound is an "impossible time" and fails; the last timed output is checked, then fresh inputs are generated,
  run and checked again. Passes at >= the stage's threshold for that shape (results/grading.json: a share per
  GPU shape, ``{"4096x4096x7168": 0.49, ...}``, or one share for every shape; else the exercise's
  ``perf_threshold``; None, or a shape the file does not name: reported, not graded).

The exit code is 0 only when every graded check passes.
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
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


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


def _code_of(function):
    function = getattr(function, "py_func", function)  # a Numba dispatcher: its Python function
    return getattr(function, "__code__", None)


def same_as_reference(exercise, solution) -> list[str]:
    """Holes the solution filled with the stage's own function (the very object, or its code), however it got it."""
    try:
        reference = exercise.reference()
    except Exception:  # noqa: BLE001  (an exercise without a reference)
        return []
    same = []
    for hole in exercise.holes:
        mine, theirs = getattr(solution, hole, None), getattr(reference, hole, None)
        if mine is None or theirs is None:
            continue
        if mine is theirs or (_code_of(mine) is not None and _code_of(mine) is _code_of(theirs)):
            same.append(hole)
    return same


# ------------------------------------------------------------------------------------- dynamic guards

@dataclass
class Guard:
    """Vendor-GEMM entry points replaced by functions that record and raise when ``solution`` is on the stack."""
    solution: str
    calls: list = field(default_factory=list)
    _paths: dict = field(default_factory=dict)

    def _from_solution(self) -> bool:
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            if name not in self._paths:
                self._paths[name] = os.path.realpath(name) == self.solution
            if self._paths[name]:
                return True
            frame = frame.f_back
        return False

    def wrap(self, name: str, original):
        guard = self

        def guarded(*args, **kwargs):
            if guard._from_solution():
                guard.calls.append(name)
                raise RuntimeError(f"the grader forbids {name} in a solution (a vendor GEMM)")
            return original(*args, **kwargs)

        guarded.__name__ = getattr(original, "__name__", name)
        guarded.__doc__ = getattr(original, "__doc__", None)
        return guarded

    def install(self) -> None:
        for name in ("matmul", "dot", "vdot", "einsum", "tensordot", "inner"):
            original = getattr(np, name)
            wrapped = self.wrap(f"numpy.{name}", original)
            for module in [m for m in list(sys.modules.values()) if m is not None
                           and getattr(m, "__name__", "").startswith("numpy")]:
                try:
                    if getattr(module, name, None) is original:
                        setattr(module, name, wrapped)
                except Exception:  # noqa: BLE001  (a module that refuses attributes keeps its own)
                    pass
        linalg = np.linalg
        linalg.multi_dot = self.wrap("numpy.linalg.multi_dot", linalg.multi_dot)
        self._install_torch()
        sys.meta_path.insert(0, _ImportGuard(self))

    def _install_torch(self) -> None:
        import importlib.util
        if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
            return
        try:
            import torch
        except Exception:  # noqa: BLE001
            return
        for owner, names in ((torch, ("matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "tensordot", "dot",
                                      "_scaled_mm", "inner")),
                             (torch.nn.functional, ("linear",)),
                             (torch.Tensor, ("matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "dot"))):
            for name in names:
                if hasattr(owner, name):
                    try:
                        setattr(owner, name, self.wrap(f"torch.{name}", getattr(owner, name)))
                    except (AttributeError, TypeError):
                        pass


class _ImportGuard:
    """Refuses torch, cupy and cuBLAS bindings to the student's file (recorded like a vendor call)."""

    def __init__(self, guard: Guard):
        self.guard = guard

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if (top in ("torch", "cupy", "jax", "tensorflow") or "cublas" in name.lower()) and self.guard._from_solution():
            self.guard.calls.append(f"import {name}")
            raise ImportError(f"the grader forbids importing {name} in a solution")
        return None


# ------------------------------------------------------------------------------------------- backends

class DeviceBackend:
    """The real GPU: Numba device arrays in the contract's layout (gemm.harness), BF16 D poisoned with NaN."""

    def put(self, host):
        from gemm.harness import device_problem
        return device_problem(*host)

    def poison(self, problem) -> None:
        from gemm.bench import BF16_NAN_BITS
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
        from gemm.testing import bench_kernel
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
    from gemm.bench import reference_rows
    from gemm.fp8 import reference_gemm
    if not sample:
        return np.arange(host[0].shape[0]), reference_gemm(*host)
    ref = reference_rows(*host, rng)
    return ref.rows, ref.values


def _problem(exercise, shape, rng):
    custom = (getattr(exercise, "extra", None) or {}).get("problem")
    if custom is not None:
        return custom(*shape, rng)
    from gemm.fp8 import random_problem
    return random_problem(*shape, rng)


def judge(d, rows, expected) -> dict:
    """Every element written (no NaN left from the poison; right shape) and calc_diff on the reference rows."""
    from gemm.fp8 import calc_diff
    d = np.asarray(d, dtype=np.float64)
    shape = (len(rows), expected.shape[1])
    if d.ndim != 2 or d.shape[1] != expected.shape[1] or d.shape[0] <= int(np.max(rows, initial=0)):
        return {"correct": False, "unwritten": None, "diff": None, "why": f"D has shape {d.shape}, expected "
                                                                            f"(M, {shape[1]})"}
    unwritten = int(np.isnan(d).sum())
    diff = calc_diff(d[rows], expected) if unwritten == 0 else float("nan")
    correct = unwritten == 0 and math.isfinite(diff) and diff < DIFF_LIMIT
    why = (f"{unwritten} of {d.size} elements never written (NaN poison left)" if unwritten else
           f"calc_diff {diff:.3g} {'<' if correct else '>='} {DIFF_LIMIT:g}")
    return {"correct": correct, "unwritten": unwritten, "diff": diff if math.isfinite(diff) else None, "why": why}


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
                                     traceback=traceback.format_exc()[-2000:]))
                continue
            checks.append(_check(name, "correctness", verdict["correct"], verdict["why"], shape=list(shape),
                                 seed=entry["label"], diff=verdict["diff"], unwritten=verdict["unwritten"]))
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


def technique_checks(exercise, candidate) -> list[dict]:
    """Required / forbidden SASS opcode prefixes and spills, where the candidate can show its machine code."""
    checks = []
    required, forbidden = tuple(exercise.required_sass), tuple(exercise.forbidden_sass)
    sass_fn = getattr(candidate, "sass", None)
    try:
        instructions = sass_fn() if sass_fn is not None else None
    except NotImplementedError as error:
        checks.append(_check("sass", "technique", False, f"a hole is not filled: {_error_text(error)}"))
        instructions = None
    except Exception as error:  # noqa: BLE001
        checks.append(_check("sass", "technique", False, f"building the SASS failed: {_error_text(error)}"))
        instructions = None
    else:
        if instructions is None and (required or forbidden):
            checks.append(_check("sass", "technique", None, "no SASS on this machine: technique not checked",
                                 graded=False))
    if instructions is not None:
        opcodes = set(_opcodes(instructions))
        for prefix in required:
            hits = sorted(op for op in opcodes if op.startswith(prefix))
            checks.append(_check(f"uses {prefix}", "technique", bool(hits),
                                 f"found {', '.join(hits)}" if hits else f"no {prefix}* instruction in the SASS"))
        for prefix in forbidden:
            hits = sorted(op for op in opcodes if op.startswith(prefix))
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
    from gemm.fp8 import flops
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
                                 traceback=traceback.format_exc()[-2000:]))
            continue
        passed, why = verdict.pop("passed"), verdict.pop("why")
        if not (last["correct"] and fresh["correct"]):
            passed = False
            why += f"; timed output: {last['why']}; fresh inputs after timing: {fresh['why']}"
        samples = [float(v) for v in (getattr(timing, "samples_us", None) or [])]
        checks.append(_check(name, "performance", passed, why, shape=list(shape), samples_us=samples, **verdict))
    return checks


def evaluate(exercise, candidate, plan, *, mode: str, backend=None, threshold: float | None = None) -> list[dict]:
    """Every runtime check of one built candidate (the child's work; tests call it with a host backend)."""
    checks = technique_checks(exercise, candidate)
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


def load_solution(path: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location("student_solution", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as Python")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_child(plan: dict) -> dict:
    """Grade one solution in this (child) process: guards, load, holes, build, checks."""
    solution_path = os.path.realpath(plan["solution"]) if plan.get("solution") else "<the stage's own code>"
    guard = Guard(solution_path)
    guard.install()
    checks = []
    try:
        exercise = load_exercise(plan["stage"], plan.get("exercise_file"))
    except Exception as error:  # noqa: BLE001  (the grader's side: say so)
        return {"error": f"cannot load the exercise for stage {plan['stage']}: {_error_text(error)}", "checks": []}
    info = {"exercise": exercise.name, "stage": exercise.stage}
    try:
        solution = exercise.reference() if plan.get("reference") else load_solution(solution_path)
    except Exception as error:  # noqa: BLE001
        checks.append(_check("loads", "integrity", False, _error_text(error),
                             traceback=traceback.format_exc()[-2000:]))
    else:
        missing = [hole for hole in exercise.holes if not callable(getattr(solution, hole, None))]
        checks.append(_check("defines every hole", "integrity", not missing,
                             f"missing: {', '.join(missing)}" if missing else ", ".join(exercise.holes)))
        if not missing:
            try:
                candidate = exercise.build(solution)
            except NotImplementedError as error:
                checks.append(_check("builds", "integrity", False, f"a hole is not filled: {_error_text(error)}"))
            except Exception as error:  # noqa: BLE001
                checks.append(_check("builds", "integrity", False, _error_text(error),
                                     traceback=traceback.format_exc()[-2000:]))
            else:
                if not plan.get("reference"):
                    copied = same_as_reference(exercise, solution)
                    checks.append(_check("own work (run time)", "integrity", not copied,
                                         f"{', '.join(copied)}: the stage's own function, not yours" if copied
                                         else "no hole is the stage's own function"))
                checks += exercise_checks(exercise, solution)
                checks += evaluate(exercise, candidate, plan["seeds"], mode=plan["mode"],
                                   threshold=plan.get("threshold"))
    calls = sorted(set(guard.calls))
    checks.append(_check("no vendor GEMM (run time)", "integrity", not calls,
                         f"called {', '.join(calls)}" if calls else "no matmul/dot/einsum/torch/cuBLAS call from the "
                                                                    "solution"))
    return {**info, "checks": checks}


def _child_main() -> int:
    result_fd = os.dup(1)  # the answer goes here; the student's prints go to stderr
    os.dup2(2, 1)
    plan = json.loads(sys.stdin.readline())
    nonce = plan.pop("nonce")
    if plan["mode"] == "cpu":
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    try:
        result = run_child(plan)
    except BaseException as error:  # noqa: BLE001  (SystemExit from a solution included)
        result = {"error": f"the grader's child failed: {_error_text(error)}", "checks": [],
                  "traceback": traceback.format_exc()[-2000:]}
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
          thresholds_file: Path | None = None) -> dict:
    """Grade ``solution`` for ``stage`` in a child process; the report (see the module docstring).

    ``solution=None`` grades the stage's own code (``exercise.reference()``, the instructor's calibration run:
    ``python -m lessons grade N --reference``); the source scans then have no file to read."""
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
              "secret_seeds": bool(secret), "diff_limit": DIFF_LIMIT, "checks": []}
    if not reference:
        if not solution.is_file():
            report["checks"].append(_check("loads", "integrity", False, f"no file {solution}"))
            return _finish(report, started)
        source = solution.read_text(errors="replace")
        findings = scan_source(source, str(solution))
        report["checks"].append(_check("no vendor GEMM (source)", "integrity", not findings,
                                       "; ".join(findings) if findings else "no matmul/@/einsum/dot/_scaled_mm/"
                                                                           "cublas, no torch/cupy import"))
        try:
            copied = copy_findings(source, load_exercise(stage, exercise_file))
        except Exception:  # noqa: BLE001  (an exercise that does not load: the child reports it)
            copied = []
        report["checks"].append(_check("own work (no copy of the stage's code)", "integrity", not copied,
                                       "; ".join(copied) if copied else "no stage module or stage function "
                                                                        "imported"))
    threshold = _threshold(stage, _exercise_threshold(stage, exercise_file), thresholds_file)
    report["perf_threshold"] = threshold
    nonce = secrets.token_hex(16)
    plan = {"nonce": nonce, "stage": stage, "solution": None if reference else str(solution),
            "reference": reference, "mode": mode, "seeds": plan_seeds, "threshold": threshold,
            "exercise_file": str(exercise_file) if exercise_file else None}
    env = {key: value for key, value in os.environ.items() if key != SECRET_ENV}  # the child never sees it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if mode == "cpu":
        env.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    try:
        done = subprocess.run([sys.executable, "-m", "lessons.grade", "--child"], input=json.dumps(plan) + "\n",
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        report["checks"].append(_check("finishes in time", "integrity", False,
                                       f"the solution's process ran past {timeout:g} s and was stopped"))
        return _finish(report, started)
    stdout = done.stdout
    start, end = stdout.find(nonce), stdout.rfind(nonce)
    if start < 0 or end <= start:
        tail = (done.stderr or "").strip()[-1500:]
        report["checks"].append(_check("child process", "integrity", False, f"no result (exit {done.returncode})"
                                       + (f": {tail.splitlines()[-1]}" if tail else ""), stderr=tail))
        return _finish(report, started)
    result = json.loads(stdout[start + len(nonce):end])
    if result.get("error"):
        report["checks"].append(_check("child process", "integrity", False, result["error"]))
    report.update({key: result[key] for key in ("exercise",) if key in result})
    report["checks"] += result.get("checks", [])
    for check in report["checks"]:  # the secret seeds' values never reach the report
        if check.get("seed") not in (None, *report["seeds"]):
            check["seed"] = "secret"
    return _finish(report, started)


def score(checks: list[dict]) -> dict:
    """The rubric: each category's share of its graded checks passed x its weight; any integrity failure: 0."""
    by_category = {}
    for category in CATEGORIES:
        graded = [c for c in checks if c["category"] == category and c["graded"]]
        by_category[category] = {"passed": sum(bool(c["passed"]) for c in graded), "graded": len(graded)}
    integrity_ok = by_category["integrity"]["passed"] == by_category["integrity"]["graded"]
    points, possible = 0.0, 0
    for category, weight in WEIGHTS.items():
        counts = by_category[category]
        if counts["graded"] or category != "performance":  # performance counts only where it is graded
            possible += weight
            points += weight * counts["passed"] / counts["graded"] if counts["graded"] else 0.0
    return {"categories": by_category, "points": round(points, 1) if integrity_ok else 0.0, "possible": possible}


def _finish(report: dict, started: float) -> dict:
    graded = [c for c in report["checks"] if c["graded"]]
    report["passed"] = bool(graded) and all(c["passed"] for c in graded)
    report["score"] = score(report["checks"])
    report["elapsed_s"] = round(time.time() - started, 2)
    return report


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
    report = grade(args.stage, None if getattr(args, "reference", False) else args.solution, mode=mode, seeds=args.seeds, timeout=args.timeout,
                   thresholds_file=args.thresholds, exercise_file=getattr(args, "exercise_file", None))
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
