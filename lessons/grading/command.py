"""``python -m lessons grade``: its arguments and what it prints (lessons/__main__.py routes the command here).

One solution: :func:`lessons.grading.grader.grade`, its summary, optionally the JSON report. A class
(``--class DIR``): :func:`lessons.grading.gradebook.grade_class`, one line per student.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lessons.grading.grader import grade, summary
from lessons.grading.gradebook import grade_class
from lessons.grading.plan import DEFAULT_SEEDS, DEFAULT_TIMEOUT_S, SECRET_ENV
from lessons.grading.rubric import json_default, printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The grade command's arguments after the stage (lessons/__main__.py parses stage numbers for every command)."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("solution", type=Path, nargs="?", help="the student's file (the skeleton with its holes "
                       "filled)")
    which.add_argument("--reference", action="store_true", help="grade the stage's own code instead (instructors: "
                       "the run thresholds are set from, python -m lessons calibrate)")
    which.add_argument("--class", dest="class_dir", type=Path, default=None, metavar="DIR",
                       help="grade every submission in DIR (DIR/<student>.py or DIR/<student>/<file>.py) into a CSV "
                            "gradebook, Gradescope results.json files and JUnit XML (docs/course.md)")
    parser.add_argument("--jobs", type=int, default=4, help="submissions graded at once with --class (default 4)")
    parser.add_argument("--out", type=Path, default=None, help="where --class writes (default DIR/grades)")
    parser.add_argument("--allow-copies", action="store_true", help="report holes that are the stage's own code "
                        "(names and formatting aside) without failing them")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gpu", action="store_true", help="the real kernel on a Hopper GPU, timed (default there)")
    where.add_argument("--cpu", action="store_true", help="the simulator / PTX emulator at small shapes (default "
                       "without a Hopper GPU)")
    parser.add_argument("--json", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help=f"public seeds per shape (default "
                        f"{DEFAULT_SEEDS}); as many secret ones are added when {SECRET_ENV} is set")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds the solution's process "
                        f"may run (default {DEFAULT_TIMEOUT_S})")
    parser.add_argument("--thresholds", type=Path, default=None, help="per-stage performance thresholds (default "
                        "results/grading.json)")
    parser.add_argument("--exercise-file", default=None, help=argparse.SUPPRESS)  # EXERCISE from a file: tests, drafts


def main(args) -> int:
    """``python -m lessons grade``: the parsed arguments -> exit code."""
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
        out = args.out or args.class_dir / "grades"
        reports = grade_class(args.stage, args.class_dir, out=out, jobs=args.jobs, **options)
        for student, report in reports.items():
            print(class_line(student, report))
        print(f"gradebook: {out / 'gradebook.csv'} (and results.json per student, junit.xml)")
        return 0
    report = grade(args.stage, None if getattr(args, "reference", False) else args.solution, **options)
    print(summary(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1, default=json_default) + "\n")
        print(f"report: {args.json}")
    return 0 if report["passed"] else 1


def class_line(student: str, report: dict) -> str:
    """One student's line of ``--class``: the name as the file system gave it, control characters escaped (a file
    named ``mallory 80 / 80 PASSED<ESC>[8m.py`` must not print a fake verdict and hide the real one)."""
    name = printable(student)[:64]
    return (f"{name:<24} {report['score']['points']:>5g} / {report['score']['possible']:<3} "
            f"{'PASSED' if report['passed'] else 'FAILED'}")
