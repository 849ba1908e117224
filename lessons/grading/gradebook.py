"""A whole class at once: ``python -m lessons grade N --class DIR [--jobs 4] [--out grades/]``.

Every ``*.py`` file in DIR (or every ``*.py`` inside each sub-folder of DIR, one folder a student, as Gradescope
and most LMS exports lay them out) is one submission, graded by :func:`lessons.grading.grader.grade` in its own judge and
sandboxed oracle, ``jobs`` at a time. The results, under ``out`` (default ``DIR/grades``):

* ``gradebook.csv``: one row a submission: student, file, score, possible, passed, each category's passed/graded,
  the solution's SHA-256, the grader's version, the time it was graded;
* ``<student>/results.json``: the Gradescope autograder format (``score``, ``max_score``, ``tests`` with
  ``name``/``score``/``max_score``/``status``/``output``, ``output``), with the full report beside it
  (``<student>/report.json``);
* ``junit.xml``: one test suite a submission, one test case a check (CI dashboards and LMS plug-ins read it).
"""
from __future__ import annotations

import csv
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from xml.etree import ElementTree

from lessons.grading.grader import grade
from lessons.grading.rubric import CATEGORIES, WEIGHTS, printable


def submissions(folder: Path) -> dict[str, Path]:
    """student -> solution file: ``DIR/<student>.py``, or ``DIR/<student>/<one>.py`` (the first, sorted)."""
    found = {}
    for path in sorted(Path(folder).iterdir()):
        if path.is_file() and path.suffix == ".py":
            found[path.stem] = path
        elif path.is_dir() and path.name not in ("grades", "__pycache__"):
            files = sorted(path.glob("*.py"))
            if files:
                found[path.name] = files[0]
    return found


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name) or "student"


def _cell(text: str) -> str:
    """A name from the file system as a spreadsheet cell: printable, and never a formula (a cell starting with
    = + - @, a tab or a carriage return is run by Excel and LibreOffice; the leading ' shows it as text)."""
    text = printable(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def gradescope(report: dict) -> dict:
    """The report in Gradescope's results.json form: points per category spread over its graded checks."""
    tests = []
    counts = report["score"]["categories"]
    integrity_ok = counts["integrity"]["passed"] == counts["integrity"]["graded"]
    for check in report["checks"]:
        graded = counts.get(check["category"], {}).get("graded") or 0
        weight = WEIGHTS.get(check["category"], 0)
        worth = weight / graded if check["graded"] and graded else 0.0
        earned = worth if check["passed"] and integrity_ok else 0.0
        tests.append({"name": f"{check['category']}: {check['name']}", "score": round(earned, 2),
                      "max_score": round(worth, 2), "status": "passed" if check["passed"] else "failed",
                      "output": check["detail"]})
    return {"score": report["score"]["points"], "max_score": report["score"]["possible"], "tests": tests,
            "output": ("PASSED" if report["passed"] else "FAILED") + f" ({report['score']['points']:g} / "
                      f"{report['score']['possible']}); {report.get('measure', '')}",
            "extra_data": {key: report.get(key) for key in ("solution_sha256", "grader_version", "graded_at",
                                                            "public_seeds", "stage", "mode")}}


def junit(reports: dict[str, dict]) -> str:
    suites = ElementTree.Element("testsuites", name="python -m lessons grade")
    for student, report in reports.items():
        checks = report["checks"]
        name = printable(student)  # a file name's control characters are not XML 1.0 either
        suite = ElementTree.SubElement(suites, "testsuite", name=name, tests=str(len(checks)),
                                       failures=str(sum(1 for c in checks if c["graded"] and not c["passed"])),
                                       skipped=str(sum(1 for c in checks if not c["graded"])))
        for check in checks:
            case = ElementTree.SubElement(suite, "testcase", classname=f"{name}.{check['category']}",
                                          name=check["name"])
            detail = printable(str(check["detail"]))  # a control character from a solution is not XML 1.0
            if not check["graded"]:
                ElementTree.SubElement(case, "skipped", message=detail[:500])
            elif not check["passed"]:
                ElementTree.SubElement(case, "failure", message=detail[:500]).text = detail
    return ElementTree.tostring(suites, encoding="unicode")


def grade_class(stage: int, folder: Path, *, out: Path | None = None, jobs: int = 4, **options) -> dict[str, dict]:
    """Grade every submission in ``folder`` (see the module docstring); returns student -> report."""
    found = submissions(folder)
    if not found:
        raise ValueError(f"no submissions in {folder}: expected DIR/<student>.py or DIR/<student>/<file>.py")
    out = Path(out) if out is not None else Path(folder) / "grades"
    out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # each grade() runs its own processes
        futures = {student: pool.submit(grade, stage, path, **options) for student, path in found.items()}
        reports = {student: future.result() for student, future in futures.items()}
    with open(out / "gradebook.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "file", "score", "possible", "passed"] + [f"{c}_passed/graded" for c in CATEGORIES]
                        + ["solution_sha256", "grader_version", "graded_at"])
        for student, report in reports.items():
            counts = report["score"]["categories"]
            writer.writerow([_cell(student), _cell(found[student].name), report["score"]["points"],
                             report["score"]["possible"],
                             report["passed"]] + [f"{counts[c]['passed']}/{counts[c]['graded']}" for c in CATEGORIES]
                            + [report.get("solution_sha256", ""), report.get("grader_version", ""),
                               report.get("graded_at", "")])
    for student, report in reports.items():
        folder_of = out / _safe(student)
        folder_of.mkdir(exist_ok=True)
        (folder_of / "results.json").write_text(json.dumps(gradescope(report), indent=1) + "\n")
        (folder_of / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "junit.xml").write_text(junit(reports) + "\n")
    return reports


__all__ = ["grade_class", "submissions", "gradescope", "junit"]
