"""The autograder (lessons.grading) and its defences, on CPU, against a tiny stage-01-like exercise registered here.

The fake exercise's one hole is DeepGEMM's promotion, ``promote(total, partial, sa_value, sb_value)``, an expression
hole: the sandboxed oracle traces the student's function and the judge rebuilds it, then computes D in NumPy per
128-wide K group (the candidate, trusted exercise code). The candidate's misbehaviours (a cached result, a partial
write, work only outside the timed replays) are chosen by the test through the exercise file: they stand for a
kernel that misbehaves, which the judge's checks must catch. Attempts by a student's *file* are in
tests/test_grader_attacks.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gemm.testing.timer import Timing
import lessons
from lessons import results_store
from lessons.grading import correctness, grader, judge, performance, plan, rubric, source_scan, technique
from lessons.ladder import speed_of_light

ROOT = Path(__file__).resolve().parent.parent

FAKE_EXERCISE = '''
import numpy as np
from gemm.fp8 import GROUP, e4m3_decode
from lessons.exercises import Exercise

BEHAVIOUR = "{behaviour}"  # honest | cached | partial | lazy: how the candidate (a stand-in kernel) behaves
SASS = {sass!r}
SPILLS = {spills}


class Candidate:
    def __init__(self, solution):
        self.solution = solution
        self._memo, self._seen = {{}}, set()

    def _compute(self, a, sa, b, sb, d):
        af, bf = e4m3_decode(a).astype(np.float64), e4m3_decode(b).astype(np.float64)
        m, k = af.shape
        n = bf.shape[0]
        total = np.zeros((m, n))
        for g in range(k // GROUP):
            ks = slice(g * GROUP, (g + 1) * GROUP)
            partial = (af[:, None, ks] * bf[None, :, ks]).sum(-1)
            sb_row = np.repeat(np.asarray(sb)[:, g], GROUP)[:n][None, :]
            total = self.solution.promote(total, partial, np.asarray(sa)[:, g][:, None], sb_row)
        if BEHAVIOUR == "cached":
            total = self._memo.setdefault(d.shape, total)
        if BEHAVIOUR == "partial":
            d[: m // 2] = total[: m // 2]
        else:
            d[...] = total

    def run_cpu(self, a, sa, b, sb):
        d = np.full((a.shape[0], b.shape[0]), np.nan, dtype=np.float32)
        self._compute(a, sa, b, sb, d)
        return d

    def run_gpu(self, a, sa, b, sb, d, stream=0):  # the tests' host backend: d is a host array
        if BEHAVIOUR == "lazy" and id(d) in self._seen:
            return
        self._seen.add(id(d))
        self._compute(a, sa, b, sb, d)

    def sass(self):
        return SASS

    def resources(self):
        return {{"registers": 40, "spill_stores": SPILLS, "spill_loads": 0}}


def _reference():
    from types import SimpleNamespace
    def promote(total, partial, sa_value, sb_value):
        return total + partial * (sa_value * sb_value)
    return SimpleNamespace(promote=promote)


EXERCISE = Exercise(
    stage=1, name="fake_promotion", objective="promote per K group", prompt="fill promote", holes=("promote",),
    questions=(), reference=_reference, build=Candidate, required_sass=("FFMA",), forbidden_sass=("HMMA",),
    shapes_cpu=((24, 40, 512), (33, 130, 640)), shapes_gpu=((64, 136, 256),), perf_threshold=0.3,
    hole_kinds={{"promote": ("expression", ("total", "partial", "sa_value", "sb_value"))}})
'''
HONEST_SASS = ["LDG.E R2, [R4.64]", "FFMA R1, R2, R3, R1", "@P0 BRA 0x70"]

CORRECT = '''
def promote(total, partial, sa_value, sb_value):
    """Apply the group's two scales once, to the FP32 partial."""
    scale = sa_value * sb_value
    return total + partial * scale
'''

SKELETON = '''
def promote(total, partial, sa_value, sb_value):
    """Fill in the promotion."""
    raise NotImplementedError("fill in promote")
'''

VENDOR_AT = CORRECT + '''

def _unused(x, w):
    return x @ w.T
'''

VENDOR_TORCH = CORRECT + '''
try:
    import torch
except ImportError:
    torch = None
'''


def write_exercise(folder: Path, behaviour: str = "honest", sass=None, spills: int = 0) -> Path:
    path = folder / f"fake_exercise_{behaviour}.py"
    path.write_text(FAKE_EXERCISE.format(behaviour=behaviour, sass=HONEST_SASS if sass is None else sass,
                                         spills=spills))
    return path


@pytest.fixture
def fake(tmp_path):
    return write_exercise(tmp_path)


def _grade(tmp_path, fake, source, *, name="solution.py", **kwargs):
    solution = tmp_path / name
    solution.write_text(textwrap.dedent(source))
    kwargs.setdefault("secret", "")
    kwargs.setdefault("mode", "cpu")
    return grader.grade(1, solution, exercise_file=str(fake), **kwargs)


def _failed(report, category=None):
    return [c for c in report["checks"] if c["graded"] and not c["passed"]
            and (category is None or c["category"] == category)]


def _check(report, name):
    return next(c for c in report["checks"] if c["name"] == name)


# ------------------------------------------------------------------------------------- honest solutions

def test_a_correct_solution_passes(tmp_path, fake):
    report = _grade(tmp_path, fake, CORRECT)
    assert report["passed"], grader.summary(report)
    assert report["mode"] == "cpu" and report["exercise"] == "fake_promotion"
    correct = [c for c in report["checks"] if c["category"] == "correctness"]
    assert len(correct) == 2 * plan.DEFAULT_SEEDS  # every shape (one ragged in N) x every seed
    assert all(c["diff"] < 1e-5 and c["rel_error"] < 1e-5 for c in correct)
    assert {c["name"] for c in report["checks"] if c["category"] == "technique"} == {"uses FFMA", "avoids HMMA",
                                                                                     "no spills"}
    assert report["score"]["points"] == report["score"]["possible"] == 80  # no performance on CPU
    assert report["oracle_questions"] >= 2 and "PASSED" in grader.summary(report)
    assert len(report["solution_sha256"]) == 64 and report["grader_version"].startswith(rubric.GRADER_VERSION)
    assert report["public_seeds"] == plan.public_seeds(plan.DEFAULT_SEEDS) and report["graded_at"]
    assert "calc_diff" in report["measure"] and "||D - ref||" in report["measure"]


def test_the_skeleton_fails(tmp_path, fake):
    report = _grade(tmp_path, fake, SKELETON)
    assert not report["passed"]
    assert all("a hole is not filled" in c["detail"] for c in _failed(report)), grader.summary(report)


def test_a_missing_hole_fails(tmp_path, fake):
    report = _grade(tmp_path, fake, "def promot(total, partial, sa_value, sb_value):\n    return total\n")
    assert not report["passed"]
    assert _check(report, "defines every hole")["detail"] == "missing: promote"


def test_a_file_that_does_not_load_fails(tmp_path, fake):
    report = _grade(tmp_path, fake, "def promote(:\n")
    assert not report["passed"] and not _check(report, "loads")["passed"]
    assert "SyntaxError" in _check(report, "loads")["detail"]


def test_a_uniform_scale_error_fails_and_the_report_says_by_which_measure(tmp_path, fake):
    """4% too large everywhere: calc_diff alone (7.7e-4) would pass it; the relative error (0.04) does not."""
    report = _grade(tmp_path, fake, CORRECT.replace("partial * scale", "partial * scale * 1.04"))
    failed = _failed(report, "correctness")
    assert not report["passed"] and len(failed) == 2 * plan.DEFAULT_SEEDS
    assert all(c["diff"] < 1e-3 and 0.03 < c["rel_error"] < 0.05 for c in failed)
    assert all("relative error" in c["detail"] for c in failed)


def test_an_error_is_reported_whole(tmp_path, fake):
    long = "x" * 700 + " the end of a long message"
    report = _grade(tmp_path, fake, f"def promote(total, partial, sa_value, sb_value):\n    raise ValueError({long!r})\n")
    assert any("the end of a long message" in c["detail"] for c in report["checks"]), grader.summary(report)


def test_passed_needs_the_pass_mark_and_every_expected_check(tmp_path):
    """A report whose graded checks all passed but whose correctness checks never ran is not PASSED."""
    report = {"checks": [rubric.check_result("loads", "integrity", True)], "expected_checks": {"correctness": 4}}
    report = rubric.finish_report(report, 0.0)
    assert not report["passed"]
    assert "4 correctness" in _check(report, "every check ran")["detail"]
    thin = {"checks": [rubric.check_result("loads", "integrity", True), rubric.check_result("x", "technique", True)]}
    assert not rubric.finish_report(thin, 0.0)["passed"], "30 of 80 points is below the pass mark"


# ------------------------------------------------------------------------------------------- defences

def test_a_cached_result_is_caught_by_fresh_inputs(tmp_path):
    report = _grade(tmp_path, write_exercise(tmp_path, "cached"), CORRECT)
    assert not report["passed"]
    failed = _failed(report, "correctness")
    # the first problem of each shape is computed honestly; every later one gets the memorised D back
    assert len(failed) == 2 * (plan.DEFAULT_SEEDS - 1), grader.summary(report)
    assert all("calc_diff" in c["detail"] and c["diff"] > 1e-3 for c in failed)


def test_a_partial_write_is_caught_by_the_nan_poison(tmp_path):
    report = _grade(tmp_path, write_exercise(tmp_path, "partial"), CORRECT)
    assert not report["passed"]
    failed = _failed(report, "correctness")
    assert len(failed) == 2 * plan.DEFAULT_SEEDS
    assert all("never written (NaN poison left)" in c["detail"] and c["unwritten"] > 0 for c in failed)


def test_a_vendor_gemm_is_caught_statically(tmp_path, fake):
    report = _grade(tmp_path, fake, VENDOR_AT)
    assert not report["passed"]
    static = _check(report, "no vendor GEMM (source)")
    assert not static["passed"] and "uses the @ operator" in static["detail"]
    assert all(c["passed"] for c in report["checks"] if c["category"] == "correctness")  # right answer, still fails
    assert report["score"]["points"] == 0


def test_a_matmul_inside_a_hole_cannot_make_d(tmp_path, fake):
    """The oracle traces the hole on symbols: a host matmul reached any way (here ``__matmul__``) is not arithmetic
    it can record, and D is the judge's to compute anyway."""
    source = "def promote(total, partial, sa_value, sb_value):\n    return total.__matmul__(partial)\n"
    report = _grade(tmp_path, fake, source)
    assert not report["passed"]
    assert any("__matmul__" in c["detail"] or "only arithmetic" in c["detail"] for c in _failed(report)), \
        grader.summary(report)


def test_importing_torch_is_caught(tmp_path, fake):
    report = _grade(tmp_path, fake, VENDOR_TORCH)
    assert not report["passed"]
    assert "imports torch" in _check(report, "no vendor GEMM (source)")["detail"]


@pytest.mark.parametrize("source, finding", [
    ("import numpy as np\nx = np.einsum('ij,kj->ik', a, b)\n", "uses .einsum"),
    ("from numpy import dot\n", "imports dot from numpy"),
    ("import torch\ntorch._scaled_mm(a, b)\n", "uses ._scaled_mm"),
    ("import cupy\n", "imports cupy"),
    ("from cuda.bindings import cublas\n", "imports cublas"),
    ("y = x.dot(w)\n", "uses .dot"),
    ("x @= w\n", "uses the @ operator"),
    ("f = eval('n' + 'p.mat' + 'mul')\n", "uses eval"),
    ("import numpy as np\nf = np.matmul.__closure__\n", "uses .__closure__"),
    ("from gemm.fp8 import reference_gemm\n", "imports reference_gemm"),
    ("import lessons.grading.judge\n", "imports lessons.grading.judge"),
])
def test_the_static_scan_finds(source, finding):
    assert any(finding in line for line in source_scan.scan_source(source)), source_scan.scan_source(source)


def test_the_static_scan_passes_honest_numpy():
    assert source_scan.scan_source("import numpy as np\ny = np.zeros(4) + np.float32(2) * 3\n") == []


def test_the_secret_never_reaches_the_solution_and_secret_seeds_are_not_shown(tmp_path, fake):
    """The solution is right only if it cannot see the secret (its environment is scrubbed)."""
    source = CORRECT.replace("    return total + partial * scale",
                             "    import os\n    leak = 1000.0 if any('SECRET' in k for k in os.environ) else 0.0\n"
                             "    return total + partial * scale + leak")
    report = _grade(tmp_path, fake, source, secret="the instructor's secret")
    assert report["passed"], grader.summary(report)
    seeds = {c["seed"] for c in report["checks"] if "seed" in c}
    assert {"secret 1", "secret 2"} <= seeds and not any("instructor" in json.dumps(c) for c in report["checks"])
    hidden = [str(e["seed"]) for e in plan.seed_plan(2, "the instructor's secret") if e["secret"]]
    assert not any(value in json.dumps(report) for value in hidden), "a secret seed's value reached the report"


def test_secret_seeds_are_reproducible_with_the_secret_and_differ_without_it():
    a, b = plan.seed_plan(2, "s1"), plan.seed_plan(2, "s1")
    assert a == b and [e for e in a if e["secret"]] != [e for e in plan.seed_plan(2, "s2") if e["secret"]]
    assert not [e for e in plan.seed_plan(2, None) if e["secret"]]


def test_a_forged_answer_on_stdout_is_ignored(tmp_path, fake):
    forger = SKELETON + '\nprint(\'{"id": 1, "ok": {"promote": true}}\')\nprint(\'{"checks": []}\')\n'
    report = _grade(tmp_path, fake, forger)
    assert not report["passed"] and report["exercise"] == "fake_promotion"


def test_a_solution_that_never_ends_is_stopped(tmp_path, fake):
    report = _grade(tmp_path, fake, "while True:\n    pass\n", timeout=20)
    assert not report["passed"]
    assert any("no answer in" in c["detail"] or "ran past" in c["detail"] for c in _failed(report)), \
        grader.summary(report)


# --------------------------------------------------------------------------------------------- technique

def test_technique_checks_need_the_required_and_refuse_the_forbidden(tmp_path):
    exercise = write_exercise(tmp_path, sass=["HMMA.16816.F32 R4, R8, R12, R4", "STL [R1], R2"], spills=8)
    report = _grade(tmp_path, exercise, CORRECT)
    assert not report["passed"]
    assert {c["name"] for c in _failed(report)} >= {"uses FFMA", "no spills"}
    assert not _check(report, "local memory")["graded"]


def test_technique_points_only_for_what_the_students_code_causes():
    """An opcode the stub build (holes that do nothing) has just as often is the scaffold's: shown, not graded."""
    exercise = SimpleNamespace(required_sass=("FFMA", "LDG"), forbidden_sass=(), extra={})
    candidate = SimpleNamespace(sass=lambda: ["LDG.E R2, [R4.64]", "FFMA R1, R2, R3, R1", "FFMA R1, R2, R3, R1"])
    stub = SimpleNamespace(sass=lambda: ["LDG.E R2, [R4.64]", "FFMA R1, R2, R3, R1"])
    checks = {c["name"]: c for c in technique.technique_checks(exercise, candidate, stub)}
    assert checks["uses FFMA"]["graded"] and checks["uses FFMA"]["passed"]
    assert not checks["uses LDG"]["graded"] and "scaffold" in checks["uses LDG"]["detail"]


def test_a_missing_toolchain_is_not_graded():
    def no_disassembler():
        raise FileNotFoundError("nvdisasm not found: install the nvidia-cuda-nvdisasm wheel")
    exercise = SimpleNamespace(required_sass=("FFMA",), forbidden_sass=(), extra={})
    (check,) = technique.technique_checks(exercise, SimpleNamespace(sass=no_disassembler))
    assert not check["graded"] and check["detail"].startswith("not graded: the toolchain is missing")


# ------------------------------------------------------------------------------ performance (fake timer)

class HostBackend:
    """The GPU path's steps on host arrays, with an injected timer: the performance grade without a GPU."""

    def __init__(self, timer):
        self.timer = timer

    def put(self, host):
        a, sa, b, sb = host
        return SimpleNamespace(a=a, sa=sa, b=b, sb=sb, d=np.empty((a.shape[0], b.shape[0]), np.float32))

    def poison(self, problem):
        problem.d[...] = np.nan

    def launch(self, candidate, problem, stream):
        correctness.launch_candidate(candidate, problem, stream)

    def synchronize(self):
        pass

    def fetch(self, problem):
        return problem.d.copy()


def _fake_timer(share_of_bound=None, us=None, nodes_per_call=1):
    shape = (64, 136, 256)

    def timer(launch, before_replay=None):
        launch(7)  # bench_kernel's first call, then the capture of 3 (flush; call) pairs
        for _ in range(3):
            launch(7)
        if before_replay is not None:
            before_replay()
        for _ in range(3):
            launch(7)  # the replays: the captured calls run again, on the timing stream
        seconds = (speed_of_light(1, *shape)["bound_us"] / share_of_bound * 1e-6) if us is None else us * 1e-6
        return Timing(seconds * 1e6, seconds * 1e6, [seconds * 1e6] * 3, 3, nodes_per_call=nodes_per_call)
    return timer


def _perf(fake, timer, tmp_path, threshold=0.3):
    """The judge's performance path on the fake exercise's candidate, built from the honest promote (trusted code:
    these tests are about the judge's checks, not about the sandbox)."""
    exercise = plan.load_exercise(1, str(fake))
    candidate = exercise.build(exercise.reference())
    checks = judge.evaluate(exercise, candidate, plan.seed_plan(1, None), mode="gpu",
                            backend=HostBackend(timer), threshold=threshold)
    return checks, [c for c in checks if c["category"] == "performance"]


@pytest.mark.parametrize("timer, why", [(_fake_timer(us=0.0), "<= 0"), (_fake_timer(us=-3.0), "<= 0"),
                                        (_fake_timer(share_of_bound=1.5), "150% of the"),
                                        (_fake_timer(us=float("nan")), "not a number")])
def test_a_time_below_the_physical_floor_is_impossible(timer, why, fake, tmp_path):
    _, (perf,) = _perf(fake, timer, tmp_path)
    assert perf["graded"] and not perf["passed"] and perf["impossible"]
    assert perf["detail"].startswith("impossible time") and why in perf["detail"]


def test_work_off_the_timed_stream_is_caught(fake, tmp_path):
    """GPU MODE's "extra streams" hack: the kernel runs on a stream of its own, the graph captured on the timing
    stream holds none of it and times nothing. bench_kernel counts the nodes a call adds (tests/test_harness.py)."""
    _, (perf,) = _perf(fake, _fake_timer(share_of_bound=0.5, nodes_per_call=0), tmp_path)
    assert perf["graded"] and not perf["passed"] and perf["impossible"]
    assert perf["detail"].startswith("untimed work")


def test_work_done_only_outside_the_replays_is_caught(tmp_path):
    """The output is poisoned after capture, before the first replay: D must be what the timed replays wrote."""
    checks, (perf,) = _perf(write_exercise(tmp_path, "lazy"), _fake_timer(share_of_bound=0.5), tmp_path)
    assert all(c["passed"] for c in checks if c["category"] == "correctness")  # each fresh D is computed once
    assert not perf["passed"] and "timed output" in perf["detail"] and "never written" in perf["detail"], perf


def test_an_untimed_exercise_reports_why(fake, tmp_path):
    from dataclasses import replace
    exercise = replace(plan.load_exercise(1, str(fake)), extra={"untimed": "no GEMM here"})
    checks = performance.performance_checks(exercise, object(), plan.seed_plan(1, None), backend=None, threshold=0.5)
    assert [(c["graded"], c["detail"]) for c in checks] == [(False, "not timed: no GEMM here")]


def test_the_performance_grade_against_the_threshold(fake, tmp_path):
    _, (fast,) = _perf(fake, _fake_timer(share_of_bound=0.5), tmp_path)
    assert fast["passed"] and abs(fast["pct_bound"] - 50) < 1e-6, fast
    _, (slow,) = _perf(fake, _fake_timer(share_of_bound=0.2), tmp_path)
    assert slow["graded"] and not slow["passed"] and "< 30%" in slow["detail"]
    _, (ungraded,) = _perf(fake, _fake_timer(share_of_bound=0.2), tmp_path, threshold=None)
    assert not ungraded["graded"] and "not graded" in ungraded["detail"]


def test_timed_outputs_are_rechecked_on_fresh_inputs(tmp_path):
    """A cached result that could stand in during timing fails the checks after it."""
    checks, (perf,) = _perf(write_exercise(tmp_path, "cached"), _fake_timer(share_of_bound=0.5), tmp_path)
    assert not perf["passed"] and "timed output: calc_diff" in perf["detail"]
    assert "fresh inputs after timing: calc_diff" in perf["detail"]


# ------------------------------------------------------------------------------------------ CLI, files

def test_the_cli_grades_writes_json_and_sets_the_exit_code(tmp_path, fake):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(CORRECT)
    bad.write_text(CORRECT.replace("partial * scale", "partial * scale * 1.04"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(plan.SECRET_ENV, None)
    runs = {}
    for path in (good, bad):
        report = tmp_path / f"{path.stem}.json"
        runs[path.stem] = subprocess.run(
            [sys.executable, "-m", "lessons", "grade", "1", str(path), "--cpu", "--json", str(report), "--seeds", "1",
             "--exercise-file", str(fake)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        runs[path.stem + "_json"] = json.loads(report.read_text())
    assert runs["good"].returncode == 0, runs["good"].stdout + runs["good"].stderr
    assert runs["bad"].returncode == 1 and "FAILED" in runs["bad"].stdout
    assert runs["good_json"]["passed"] and not runs["bad_json"]["passed"]
    assert runs["good_json"]["seeds"] == [str(plan.public_seeds(1)[0])]


def test_gpu_without_a_hopper_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from ptx import device
    if device.is_hopper():
        pytest.skip("a Hopper GPU is present")
    from lessons.__main__ import main
    assert main(["grade", "1", str(tmp_path / "x.py"), "--gpu"]) == 2
    assert "needs a Hopper" in capsys.readouterr().err


def test_the_committed_thresholds_file(tmp_path):
    data = json.loads((ROOT / "results" / "grading.json").read_text())
    assert set(data["stages"]) == {f"{n:02d}" for n in lessons.STAGES}
    for entry in data["stages"].values():
        assert {"perf_threshold", "measured"} <= set(entry)
    thresholds = plan.read_thresholds()
    assert set(thresholds) == set(lessons.STAGES)
    other = tmp_path / "grading.json"
    other.write_text(json.dumps({"stages": {"01": {"perf_threshold": 0.25}}}))
    assert plan.stage_threshold(1, 0.5, other) == 0.25  # the file wins over the exercise's own value
    assert plan.stage_threshold(2, 0.5, other) == 0.5


def test_the_exercises_own_checks_are_technique_checks():
    def pitch_is_odd(solution):
        """The pitch is odd."""
        return [] if solution.pitch() % 2 else [f"pitch {solution.pitch()} is even"]

    exercise = SimpleNamespace(extra={"checks": (pitch_is_odd,)})
    (good,) = technique.exercise_checks(exercise, SimpleNamespace(pitch=lambda: 129))
    (bad,) = technique.exercise_checks(exercise, SimpleNamespace(pitch=lambda: 128))
    (unfilled,) = technique.exercise_checks(exercise, SimpleNamespace(pitch=_unfilled))
    assert good["passed"] and good["detail"] == "The pitch is odd." and good["category"] == "technique"
    assert not bad["passed"] and bad["detail"] == "pitch 128 is even"
    assert not unfilled["passed"] and "a hole is not filled" in unfilled["detail"]


def test_a_candidate_that_takes_no_stream_cannot_be_timed():
    candidate = SimpleNamespace(run_gpu=lambda a, sa, b, sb, d: None)
    exercise = SimpleNamespace(shapes_gpu=((64, 136, 256),), stage=1)
    (ungraded,) = performance.performance_checks(exercise, candidate, plan.seed_plan(1, None), backend=None,
                                           threshold=None)
    assert not ungraded["graded"] and "no stream=" in ungraded["detail"]
    (failed,) = performance.performance_checks(exercise, candidate, plan.seed_plan(1, None), backend=None,
                                               threshold=0.5)
    assert failed["graded"] and not failed["passed"]


def _unfilled():
    raise NotImplementedError("fill in pitch")


def test_copying_the_stages_own_functions_is_caught():
    """Re-exporting the stage's code is not a solution: importing a stage module, or the very functions the stage
    uses for the holes, fails the integrity check (the exercises' references name them)."""
    from lessons.exercises import exercise
    from lessons.grading.source_scan import copy_findings
    ex04 = exercise(4)
    assert copy_findings("import lessons\nstage = lessons.stage(4)\n", ex04)
    assert copy_findings("from lessons import stage\n", ex04)
    ex08 = exercise(8)
    reference = ex08.reference()
    function = getattr(reference, ex08.holes[0])
    source = f"from {function.__module__} import {function.__name__} as {ex08.holes[0]}\n"
    assert copy_findings(source, ex08), source
    assert not copy_findings("import numpy as np\nfrom lessons.exercises import exercise\n", ex08)
    # the answers an exercise keeps for its own tests are answers too (exercise 07's are lambdas: no name to match)
    ex07 = exercise(7)
    for source in ("from lessons.exercises.ex07_warp_roles import reference\n",
                   "import lessons.exercises.ex07_warp_roles as ex\n",
                   "from lessons.exercises import exercise\nregister_split = exercise(7).reference().register_split\n",
                   "from lessons.exercises import exercise\nanswer = exercise(7).EXERCISE\n"):
        assert copy_findings(source, ex07), source


def test_the_reference_run_grades_the_stages_own_code():
    """``python -m lessons grade N --reference``: the instructor's calibration run, no file to scan."""
    report = grader.grade(0, None, mode="cpu", seeds=1, secret="")
    assert report["passed"] and report["reference"] and report["solution"] == "stage 00's own code"
    assert not [c for c in report["checks"] if c["name"].startswith(("no vendor GEMM (source)", "own work"))]


def test_the_cli_takes_a_file_or_the_reference_flag():
    from lessons.__main__ import _parser
    assert _parser().parse_args(["grade", "4", "--reference"]).reference
    assert _parser().parse_args(["grade", "4", "mine.py"]).solution == Path("mine.py")
    for argv in (["grade", "4"], ["grade", "4", "mine.py", "--reference"]):
        with pytest.raises(SystemExit):
            _parser().parse_args(argv)


def test_thresholds_follow_the_rule_from_a_reference_report():
    """python -m lessons calibrate: 0.8 x the stage's own share at each shape, rounded down; none where the stage's
    own code failed a graded check or has no bound."""
    from lessons.grading import calibrate
    perf = lambda shape, pct: {"category": "performance", "graded": False, "passed": None,  # noqa: E731
                               "name": f"performance {shape}", "shape": shape, "pct_bound": pct}
    report = {"stage": 8, "device": {"name": "NVIDIA H100 80GB HBM3", "sm_clock_mhz": 1755}, "date": "d",
              "checks": [perf([1000, 2112, 512], 31.26), perf([4096, 4096, 7168], 61.9)]}
    threshold, measured = calibrate.threshold_from(report)
    assert threshold == {"1000x2112x512": 0.25, "4096x4096x7168": 0.49}
    assert measured["pct_bound"] == {"1000x2112x512": 31.26, "4096x4096x7168": 61.9}
    report["checks"].append({"category": "correctness", "graded": True, "passed": False, "name": "correct x"})
    assert calibrate.threshold_from(report)[0] is None
    assert calibrate.threshold_from({"stage": 0, "checks": []})[0] is None


@pytest.mark.parametrize("source", [
    "from lessons.exercises import ex04_ldmatrix_swizzle as e\na_fragment_offset = e._stage(4).a_fragment_offset\n",
    "from ptx.vocab import wgmma\ndescriptor_bits = wgmma.descriptor_bits\n",
])
def test_the_answer_read_off_a_module_is_caught_statically(source):
    from lessons.exercises import exercise
    stage = 5 if "wgmma" in source else 4
    assert source_scan.copy_findings(source, exercise(stage)), source


def test_an_honest_attribute_named_reference_is_not_a_copy():
    from lessons.exercises import exercise
    source = "class Plan:\n    def __init__(self):\n        self.reference = 0\n\n\ndef tile_coords(t, m, n, g):\n" \
             "    return Plan().reference, t\n"
    assert not source_scan.copy_findings(source, exercise(8))


def test_thresholds_files_per_shape_flat_and_malformed(tmp_path):
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps({"stages": {"04": 0.3, "08": {"perf_threshold": {"1000x2112x512": 0.16}}}}))
    assert plan.read_thresholds(path) == {4: 0.3, 8: {"1000x2112x512": 0.16}}
    assert plan.shape_threshold({"1000x2112x512": 0.16}, (1000, 2112, 512)) == 0.16
    assert plan.shape_threshold({"1000x2112x512": 0.16}, (4096, 4096, 7168)) is None  # reported, not graded
    assert plan.read_thresholds(tmp_path / "missing.json") == {}
    path.write_text(json.dumps({"stages": {"four": 0.3}}))
    with pytest.raises(ValueError, match="python -m lessons calibrate"):
        plan.read_thresholds(path)
    assert plan.read_thresholds(results_store.find(plan.THRESHOLDS_FILE))[8]["4096x4096x7168"] > 0  # committed


def test_a_class_of_ten_is_graded_in_one_command(tmp_path, fake):
    """``python -m lessons grade N --class DIR``: one sandboxed grading per submission, in parallel; a CSV gradebook,
    a Gradescope results.json per student and JUnit XML."""
    import csv
    from xml.etree import ElementTree
    folder = tmp_path / "class"
    folder.mkdir()
    honest = {f"student{i:02d}": CORRECT for i in range(6)}
    wrong = {"student06": SKELETON, "student07": CORRECT.replace("* scale", "* scale * 1.04"),
             "student08": VENDOR_TORCH}
    for student, source in {**honest, **wrong}.items():
        (folder / f"{student}.py").write_text(source)
    (folder / "student09").mkdir()  # the folder-per-student layout of LMS exports
    (folder / "student09" / "submission.py").write_text(CORRECT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(plan.SECRET_ENV, None)
    done = subprocess.run([sys.executable, "-m", "lessons", "grade", "1", "--class", str(folder), "--cpu",
                           "--seeds", "1", "--jobs", "4", "--exercise-file", str(fake)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["student"]: row for row in csv.DictReader(open(folder / "grades" / "gradebook.csv"))}
    assert len(rows) == 10
    assert {s for s, row in rows.items() if row["passed"] == "True"} == {*honest, "student09"}
    assert all(len(row["solution_sha256"]) == 64 and row["grader_version"] for row in rows.values())
    results = json.loads((folder / "grades" / "student00" / "results.json").read_text())
    assert results["score"] == results["max_score"] == 80 and results["tests"]
    assert sum(t["max_score"] for t in results["tests"]) == pytest.approx(80)
    assert json.loads((folder / "grades" / "student06" / "results.json").read_text())["score"] == 0
    suites = ElementTree.parse(folder / "grades" / "junit.xml").getroot()
    assert len(suites) == 10 and int(next(s for s in suites if s.get("name") == "student06").get("failures")) > 0
