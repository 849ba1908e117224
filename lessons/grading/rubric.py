"""The rubric and the verdict: each check's record, the score, and PASSED or FAILED.

A check is ``{"name", "category", "graded", "passed", "detail", ...}`` (:func:`check_result`), in one of
:data:`CATEGORIES`. Integrity gates everything (any integrity failure scores 0); the others weigh in by
:data:`WEIGHTS` (docs/course.md). A report is PASSED only when every graded check passed, every expected one ran,
and the score reaches :data:`PASS_MARK` of the possible points (:func:`finish_report`).
"""
from __future__ import annotations

import datetime
import hashlib
import time
from pathlib import Path

import numpy as np

GRADING_DIR = Path(__file__).resolve().parent  # grader_version hashes its files
CATEGORIES = ("integrity", "correctness", "technique", "performance")
WEIGHTS = {"correctness": 50, "technique": 30, "performance": 20}  # the rubric (docs/course.md); integrity gates
PASS_MARK = 0.6  # share of the possible points a PASSED needs (besides every graded check passing)
GRADER_VERSION = "2"  # the judge/oracle design (lessons.grading); recorded in every report


DETAIL_LIMIT = 4000  # characters of one check's detail in a report


def check_result(name: str, category: str, passed: bool | None, detail: str = "", *, graded: bool = True,
                 **extra) -> dict:
    """One check's record; ``passed=None`` (not run, or nothing to grade) is never graded. A detail longer than
    :data:`DETAIL_LIMIT` (a solution's answer repeated in a message can be megabytes) is cut, and says so."""
    if len(detail) > DETAIL_LIMIT:
        detail = f"{detail[:DETAIL_LIMIT]} ... [{len(detail) - DETAIL_LIMIT} more characters cut]"
    return {"name": name, "category": category, "graded": graded and passed is not None, "passed": passed,
            "detail": detail, **extra}


def error_text(error: BaseException) -> str:
    """The whole message (a report that cuts an error mid-sentence hides what to fix)."""
    return f"{type(error).__name__}: {error}".strip()


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


def finish_report(report: dict, started: float) -> dict:
    """The verdict: PASSED needs every graded check passed, every expected check run, and the pass mark."""
    graded = [c for c in report["checks"] if c["graded"]]
    report["score"] = score(report["checks"])
    ran = {category: sum(1 for c in report["checks"] if c["category"] == category) for category in CATEGORIES}
    missing = {category: count - ran[category] for category, count in report.get("expected_checks", {}).items()
               if ran[category] < count}
    if missing and not any(c["category"] == "integrity" and c["graded"] and not c["passed"] for c in report["checks"]):
        not_run = ", ".join(f"{count} {category}" for category, count in missing.items())
        report["checks"].append(check_result("every check ran", "integrity", False,
                                             f"checks that did not run: {not_run}"))
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
    for path in sorted(GRADING_DIR.glob("*.py")):
        digest.update(path.read_bytes())
    return f"{GRADER_VERSION}+{digest.hexdigest()[:12]}"


def utc_timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def printable(text: str) -> str:
    """``text`` with every character that is not printable escaped (newlines, carriage returns, ESC and the rest):
    a message raised by a solution must not start a new line, rewrite the one it is on, or hide or recolour the
    summary with terminal escape sequences to fake a PASS."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
