"""The judge: ``python -m lessons.grading.judge --child``, trusted code only, started by the parent
(:func:`lessons.grading.grader.grade`) with the plan on stdin (the seeds, already derived, and a nonce that frames
its answer on stdout).

It never imports the student's file: it starts the sandboxed oracle (:class:`lessons.grading.sandbox.Oracle`),
which loads the solution and answers only questions about its holes, as data; the judge builds the candidate with
``exercise(N).build(oracle.solution())`` and runs every check itself (:func:`evaluate`).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback

import lessons
from lessons.grading.correctness import DeviceBackend, correctness_checks
from lessons.grading.performance import performance_checks
from lessons.grading.plan import DEFAULT_TIMEOUT_S, load_exercise
from lessons.grading.rubric import check_result, error_text, json_default
from lessons.grading.sandbox import HoleError, Oracle
from lessons.grading.technique import exercise_checks, stub_candidate, technique_checks


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


def run_judge(plan: dict) -> dict:
    """Grade one solution in this (judge) process, which never imports the student's file: a sandboxed oracle
    (:class:`lessons.grading.sandbox.Oracle`) answers for its holes with data, and everything else happens here:
    the kernel is built from that data by the stage's own generator, then checked, run and timed."""
    checks = []
    try:
        exercise = load_exercise(plan["stage"], plan.get("exercise_file"))
    except Exception as error:  # noqa: BLE001  (the grader's side: say so)
        return {"error": f"cannot load the exercise for stage {plan['stage']}: {error_text(error)}", "checks": []}
    info = {"exercise": exercise.name, "stage": exercise.stage}
    if plan.get("reference"):
        return {**info, "checks": grade_solution(exercise, exercise.reference(), plan)}
    preload(exercise, plan["mode"])  # what the judge runs is in memory before any student code starts
    deadline = time.time() + float(plan.get("timeout", DEFAULT_TIMEOUT_S)) - 5
    oracle = Oracle(plan["solution"], exercise, deadline=deadline, temp_root=plan.get("temp_root"))
    try:
        try:
            defined = oracle.defined_holes()
        except HoleError as error:
            checks.append(check_result("loads", "integrity", False, error.message, traceback=error.trace))
            return {**info, "sandbox": oracle.sandbox, "checks": checks}
        checks.append(check_result("loads", "integrity", True, "the file loads in the grading sandbox"))
        missing = [hole for hole, present in defined.items() if not present]
        checks.append(check_result("defines every hole", "integrity", not missing,
                                   f"missing: {', '.join(missing)}" if missing else ", ".join(exercise.holes)))
        if not missing:
            checks += grade_solution(exercise, oracle.solution(), plan)
    finally:
        oracle.close()
    info["oracle_questions"] = oracle.questions
    info["sandbox"] = oracle.sandbox
    return {**info, "checks": checks}


def preload(exercise, mode: str) -> None:
    """Import every module the judge will run before the oracle exists: a file changed on disk while a solution
    runs (the sandbox refuses that; this is the second layer) cannot become the judge's code."""
    for name in ("gemm.testing.emulated", "gemm.testing.problems", "gemm.testing.timer", "gemm.kernel.launch",
                 "ptx.sass", "ptx.compile", "ptx.passes", "ptx.emulate", "ptx.runtime", "ptx.tensor_maps", "lessons.ladder",
                 "lessons.exercises.holed", "lessons.grading.traced", "lessons.numba_fp8"):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this machine cannot import is one the judge will not use
            pass
    try:
        lessons.stage(exercise.stage)
    except Exception:  # noqa: BLE001 - the build reports it
        pass


def grade_solution(exercise, solution, plan: dict) -> list[dict]:
    """Build the candidate from ``solution`` (the oracle's namespace, or the stage's own code) and run every check."""
    checks = []
    try:
        candidate = exercise.build(solution)
    except NotImplementedError as error:
        return [check_result("builds", "integrity", False, f"a hole is not filled: {error_text(error)}")]
    except HoleError as error:
        return [check_result("builds", "integrity", False, str(error), traceback=error.trace)]
    except Exception as error:  # noqa: BLE001
        return [check_result("builds", "integrity", False, error_text(error), traceback=traceback.format_exc()[-4000:])]
    checks += exercise_checks(exercise, solution)
    checks += evaluate(exercise, candidate, plan["seeds"], mode=plan["mode"], threshold=plan.get("threshold"),
                       stub=None if plan.get("reference") else stub_candidate(exercise))
    return checks


def main() -> int:
    result_fd = os.dup(1)  # the answer goes here; anything else printed goes to stderr
    os.dup2(2, 1)
    plan = json.loads(sys.stdin.readline())
    nonce = plan.pop("nonce")
    if plan["mode"] == "cpu":
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    try:
        result = run_judge(plan)
    except BaseException as error:  # noqa: BLE001
        result = {"error": f"the grader failed: {error_text(error)}", "checks": [],
                  "traceback": traceback.format_exc()[-4000:]}
    with os.fdopen(result_fd, "w") as out:
        out.write(nonce + json.dumps(result, default=json_default) + nonce + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--child"]:
        sys.exit("lessons.grading.judge is started by `python -m lessons grade N solution.py`")
    sys.exit(main())
