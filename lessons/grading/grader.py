"""``python -m lessons grade N solution.py``: the course's autograder (see docs/course.md, the instructor guide).

The student's file never runs in the judge's process. The parent (:func:`grade`, this module) scans the source
(:mod:`lessons.grading.source_scan`, :mod:`lessons.grading.copies`) and starts the judge
(:mod:`lessons.grading.judge`: trusted code only), handing it the plan on stdin (:mod:`lessons.grading.plan`: the
seeds, already derived, and a nonce that frames its answer). The judge starts the sandboxed oracle, which answers
only questions about the solution's holes, as data, and runs every check itself:

* integrity: the file loads in the sandbox and defines every hole; no vendor GEMM in its source; no copy; every
  expected check ran;
* correctness (:mod:`lessons.grading.correctness`): a fresh random problem per shape and per seed, D poisoned with
  NaN, against the float64 reference; D must pass MEASURE;
* technique (:mod:`lessons.grading.technique`): the SASS the judge assembled, against the stub build's;
* performance (:mod:`lessons.grading.performance`, GPU only): the share of the stage's speed-of-light bound,
  against the stage's threshold (results/grading.json).

The exit code is 0 only when the report is PASSED (:mod:`lessons.grading.rubric`).
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lessons.grading.copies import copied_holes
from lessons.grading.correctness import DIFF_LIMIT, MEASURE, REL_LIMIT
from lessons.grading.plan import (DEFAULT_SEEDS, DEFAULT_TIMEOUT_S, SECRET_ENV, exercise_threshold, load_exercise,
                                  seed_plan, stage_threshold, thresholds_path)
from lessons.grading.rubric import (PASS_MARK, check_result, expected_checks, finish_report, grader_version,
                                    printable, utc_timestamp)
from lessons.grading.sandbox import remove_tree
from lessons.grading.source_scan import copy_findings, encoding_findings, scan_source

ROOT = Path(__file__).resolve().parents[2]


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
            report["checks"].append(check_result("loads", "integrity", False, f"no file {solution}"))
            return finish_report(report, started)
        report["solution_sha256"] = hashlib.sha256(solution.read_bytes()).hexdigest()
        source = solution.read_text(errors="replace")
        findings = encoding_findings(solution.read_bytes()) + scan_source(source, str(solution))
        report["checks"].append(check_result("no vendor GEMM (source)", "integrity", not findings,
                                             "; ".join(findings) if findings else "no matmul/@/einsum/dot/_scaled_mm/"
                                                                                 "cublas, no torch/cupy import"))
        try:
            exercise = load_exercise(stage, exercise_file)
        except Exception:  # noqa: BLE001  (an exercise that does not load: the judge reports it)
            exercise = None
        copied, same, unreadable = [], [], None
        if exercise is not None:
            try:  # a file the checks cannot take apart (nesting past the recursion limit) fails them, never passes
                copied = copy_findings(source, exercise)
            except (RecursionError, MemoryError, ValueError, SyntaxError) as error:
                copied = [f"the file could not be scanned ({type(error).__name__})"]
            try:
                same = copied_holes(source, exercise)
            except (RecursionError, MemoryError, ValueError, SyntaxError) as error:
                unreadable = f"the file could not be compared with the stage's code ({type(error).__name__})"
        report["checks"].append(check_result("own work (no copy of the stage's code)", "integrity", not copied,
                                             "; ".join(copied) if copied else "no stage module or stage function "
                                                                              "imported"))
        why = unreadable or (f"{', '.join(same)}: the stage's own code with other names or formatting" if same else
                             "no function is the stage's own code (names and formatting aside)")
        same = same or (["(not comparable)"] if unreadable else [])
        allowed = bool(same) and allow_copies
        report["checks"].append(check_result("own work (not a copy)", "integrity", not same,
                                             why + ("; allowed by the instructor (--allow-copies)" if allowed else ""),
                                             graded=not allowed, copied=same))
    threshold = stage_threshold(stage, exercise_threshold(stage, exercise_file), thresholds_file)
    report["perf_threshold"] = threshold
    used = thresholds_path(thresholds_file)
    report["thresholds_file"] = str(used) if used is not None and used.is_file() else None
    nonce = secrets.token_hex(16)
    plan = {"nonce": nonce, "stage": stage, "solution": None if reference else str(solution),
            "reference": reference, "mode": mode, "seeds": plan_seeds, "threshold": threshold,
            "exercise_file": str(exercise_file) if exercise_file else None, "timeout": timeout}
    env = {key: value for key, value in os.environ.items() if key != SECRET_ENV}  # the child never sees it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if mode == "cpu":
        env.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    plan["temp_root"] = tempfile.mkdtemp(prefix="fp8grade-run-")  # the oracle's files: removed here, whatever happens
    before = source_digest()
    try:
        done = subprocess.run([sys.executable, "-m", "lessons.grading.judge", "--child"], input=json.dumps(plan) + "\n",
                              capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        report["checks"].append(check_result("finishes in time", "integrity", False,
                                             f"the solution's process ran past {timeout:g} s and was stopped"))
        return finish_report(report, started)
    finally:
        remove_tree(plan["temp_root"])
        if source_digest() != before:  # the sandbox failed: say so loudly, and never PASS this run
            report["checks"].append(check_result(
                "the grader's code is unchanged", "integrity", False, "a source file of ptx/, gemm/ or lessons/ "
                "changed while this solution was graded: restore the checkout (git status) before grading anything "
                "else"))
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
        report["checks"].append(check_result("child process", "integrity", False, why
                                             + (f": {tail.splitlines()[-1]}" if tail else ""), stderr=tail))
        return finish_report(report, started)
    if result.get("error"):
        report["checks"].append(check_result("child process", "integrity", False, result["error"]))
    report.update({key: result[key] for key in ("exercise", "oracle_questions", "sandbox") if key in result})
    report["checks"] += result.get("checks", [])
    try:
        report["expected_checks"] = expected_checks(load_exercise(stage, exercise_file), len(plan_seeds), mode)
    except Exception:  # noqa: BLE001 - the judge already reported an exercise that does not load
        pass
    for check in report["checks"]:  # the secret seeds' values never reach the report
        if check.get("seed") not in (None, *report["seeds"]):
            check["seed"] = "secret"
    return finish_report(report, started)


def source_digest() -> str:
    """SHA-256 over every source file of ptx/, gemm/ and lessons/ (paths and contents): the code a grading run
    trusts. The parent compares it before and after each run."""
    digest = hashlib.sha256()
    for package in ("ptx", "gemm", "lessons"):
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def summary(report: dict) -> str:
    """The readable summary: one line per check, then the verdict."""
    title = f"stage {report['stage']:02d}" + (f" ({report['exercise']})" if report.get("exercise") else "")
    lines = [f"grading {title}: {printable(str(report['solution']))}",
             f"  mode {report['mode']}, seeds {', '.join(report['seeds'])}"
             + ("" if report["secret_seeds"] else f"  (no {SECRET_ENV}: public seeds only)")]
    if report.get("sandbox"):
        lines.append(f"  sandbox: {printable(str(report['sandbox']))}")
    for check in report["checks"]:
        mark = "PASS" if check["passed"] else ("FAIL" if check["passed"] is False else "----")
        if check["passed"] is not None and not check["graded"]:
            mark = mark.lower()
        detail = printable(str(check["detail"]))  # a solution's message cannot add lines or terminal controls
        lines.append(f"  [{mark}] {check['category']:<11} {check['name']}: {detail}")
    s = report["score"]
    lines.append(f"  score {s['points']:g} / {s['possible']}   "
                 + "  ".join(f"{k} {v['passed']}/{v['graded']}" for k, v in s["categories"].items()))
    if report.get("measure"):
        lines.append(f"  correctness: {report['measure']}")
    lines.append("PASSED" if report["passed"] else "FAILED")
    return "\n".join(lines)
