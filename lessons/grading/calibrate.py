"""``python -m lessons calibrate``: set the grader's performance thresholds (results/grading.json) from a measured
run of each stage's own code.

    python -m lessons calibrate                   # on a Hopper GPU: grade every stage's own code
    python -m lessons calibrate --stages 4-10     # some of them
    python -m lessons calibrate --from-reports    # no GPU: recompute grading.json from the reports

A GPU run grades each stage's own code (``python -m lessons grade N --reference --gpu``) with no thresholds, so
performance is reported, not graded, and writes the report to ``results/grading/NN_reference.json``. Then, for
every stage with a speed-of-light bound and every GPU shape of its exercise, the threshold is the stage's own
share of its bound at that shape times :data:`RULE`, rounded down to a whole percent (per shape: a small problem
reaches a fifth of the bound where a large one reaches half, and one share for both would let a kernel three
times too slow pass at the large one). A correct solution that builds the same kernel passes with room for
run-to-run noise (this H100 throttles between 1.4 and 1.7 GHz); one that is correct but slow fails (a register
split that spills, shared reads that conflict). A stage whose own code failed any graded check gets no threshold:
its report says why.

Reports and grading.json are read and written through :mod:`lessons.results_store`: the checkout's results/, or in
an installed package the user results folder (the committed reports are read where none was measured there).
"""
from __future__ import annotations

import argparse
import json
import math

import lessons
from lessons import results_store
from lessons.exercises import exercises
from lessons.grading.grader import grade, summary
from lessons.grading.plan import THRESHOLDS_FILE
from lessons.grading.rubric import json_default

REPORTS = "grading"  # the reference reports' folder among the results
RULE = 0.8
RULE_TEXT = f"{RULE:g} x the stage's own share of its bound at each GPU shape, rounded down to 1%"
ABOUT = ("Per-stage performance thresholds for `python -m lessons grade` (docs/course.md). perf_threshold is the "
         "share (0-1) of the stage's speed-of-light bound (lessons.ladder.speed_of_light) that passes, per shape of "
         "the exercise's shapes_gpu (\"MxNxK\": share) or one for all; null: performance is reported, not graded. "
         "measured: the GPU run of the "
         "stage's own code the threshold was set from. Written by python -m lessons calibrate.")


def report_name(stage: int) -> str:
    """The reference report's name among the results (``grading/04_reference.json``)."""
    return f"{REPORTS}/{stage:02d}_reference.json"


def run_references(stages, seeds: int, timeout: float) -> None:
    from gemm.testing.records import device_info, utc_now
    reports = results_store.write_dir() / REPORTS
    reports.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        # no thresholds file: the reference is measured, not graded against an older calibration
        print(f"=== stage {stage:02d}", flush=True)
        report = grade(stage, None, mode="gpu", seeds=seeds, secret="", thresholds_file=reports / "none.json",
                       timeout=timeout)
        report.update(device=device_info(), date=utc_now())
        (results_store.write_dir() / report_name(stage)).write_text(json.dumps(report, indent=1,
                                                                              default=json_default) + "\n")
        print(summary(report), flush=True)


def threshold_from(report: dict) -> tuple[dict | None, dict]:
    """({shape: threshold}, the ``measured`` entry) from one reference report."""
    shares = {"x".join(map(str, c["shape"])): round(c["pct_bound"], 2) for c in report["checks"]
              if c["category"] == "performance" and c.get("pct_bound") is not None}
    failed = [c["name"] for c in report["checks"] if c["graded"] and not c["passed"]]
    device = report.get("device") or {}
    measured = {"report": f"results/{report_name(report['stage'])}", "device": device.get("name"),
                "sm_clock_mhz_after_run": device.get("sm_clock_mhz"), "date": report.get("date"),
                "pct_bound": shares, "rule": RULE_TEXT}
    if failed:
        return None, {**measured, "note": f"the stage's own code failed {', '.join(failed)}: no threshold"}
    if not shares:
        untimed = [c["detail"] for c in report["checks"] if c["category"] == "performance"]
        return None, {**measured, "note": untimed[0] if untimed else "no speed-of-light bound: not graded"}
    return {shape: math.floor(RULE * pct) / 100 for shape, pct in shares.items()}, measured


def write_grading(stages) -> dict:
    """grading.json with the thresholds of ``stages`` set from their reports (the other stages' entries kept)."""
    current = results_store.find(THRESHOLDS_FILE)
    grading = json.loads(current.read_text()) if current is not None else {}
    entries = grading.get("stages", {})
    for stage in sorted(exercises()):
        report = results_store.find(report_name(stage))
        if stage not in stages:
            continue
        if report is None:  # a stage not measured yet: graded on everything but speed, and saying so
            entries.setdefault(f"{stage:02d}", {"perf_threshold": None, "measured": {
                "report": None, "rule": RULE_TEXT,
                "note": f"not calibrated: no GPU run of the stage's own code yet (python -m lessons calibrate "
                        f"--stages {stage}, on an H100: the shares are of the H100's rates, so another GPU's run "
                        "would set a bar an H100 could not, or could too easily, reach)"}})
            continue
        threshold, measured = threshold_from(json.loads(report.read_text()))
        entries[f"{stage:02d}"] = {"perf_threshold": threshold, "measured": measured}
    out = {"about": ABOUT, "diff_limit": grading.get("diff_limit", 1e-3), "stages": dict(sorted(entries.items()))}
    target = results_store.write_dir() / THRESHOLDS_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(out, indent=1) + "\n")
    return out


def stage_list(text: str) -> list[int]:
    """"4-10", "1,3" or a mix -> stage numbers; anything else is a usage error naming the stages."""
    numbers = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, _, last = part.partition("-")
            numbers += list(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected stages like "4-10" or "1,3", got {text!r}') from None
    unknown = sorted(set(numbers) - set(lessons.STAGES))
    if unknown or not numbers:
        raise argparse.ArgumentTypeError(f"no stage {unknown or text!r}: stages are {min(lessons.STAGES)}-"
                                         f"{max(lessons.STAGES)}")
    return numbers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stages", type=stage_list, default=sorted(lessons.STAGES),
                        help='e.g. "4-10" (default: every stage)')
    parser.add_argument("--seeds", type=int, default=1, help="public seeds per GPU shape (default 1)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per stage (default 300)")
    parser.add_argument("--from-reports", action="store_true", help="no GPU: recompute grading.json from the "
                        "reports in results/grading/")


def run(args) -> int:
    """``python -m lessons calibrate``: the parsed arguments -> exit code."""
    if not args.from_reports:
        from ptx.device import is_hopper
        if not is_hopper():
            print("python -m lessons calibrate: measuring needs a Hopper (sm_90) GPU; none found (--from-reports "
                  "recomputes the thresholds from the committed reports)")
            return 2
        run_references(args.stages, args.seeds, args.timeout)
    grading = write_grading(args.stages)
    for stage, entry in grading["stages"].items():
        shares = (entry.get("measured") or {}).get("pct_bound") or {}
        print(f"stage {stage}: thresholds {entry['perf_threshold']}  own share "
              + ", ".join(f"{shape} {pct:.1f}%" for shape, pct in shares.items()))
    print(f"wrote {results_store.shown(results_store.write_dir() / THRESHOLDS_FILE)}")
    return 0
