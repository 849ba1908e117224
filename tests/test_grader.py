"""The autograder (lessons.grade) and its defences, on CPU, against a tiny stage-01-like exercise registered here.

The fake exercise's one hole, ``kernel(a, sa, b, sb, d)``, writes D for host operands in pure NumPy (the stage-01
promotion: per 128-wide K group, the FP32-ish partial product times both scales). Each defence is a cheat that
the grader must catch: a cached result, a partial write, a vendor GEMM (statically and at run time), a time
faster than the speed of light. The real exercises (lessons/exercises) have their own skeleton/reference tests.
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

from gemm.testing import Timing
from lessons import grade
from lessons.ladder import speed_of_light

ROOT = Path(__file__).resolve().parent.parent

FAKE_EXERCISE = '''
import numpy as np
from lessons.exercises import Exercise


class Candidate:
    def __init__(self, solution):
        self.solution = solution

    def run_cpu(self, a, sa, b, sb):
        d = np.full((a.shape[0], b.shape[0]), np.nan, dtype=np.float32)
        self.solution.kernel(a, sa, b, sb, d)
        return d

    def run_gpu(self, a, sa, b, sb, d, stream=0):  # the tests' host backend: d is a host array
        self.solution.kernel(a, sa, b, sb, d)

    def sass(self):
        return getattr(self.solution, "SASS", ["LDG.E R2, [R4.64]", "FFMA R1, R2, R3, R1", "@P0 BRA 0x70"])

    def resources(self):
        return {"registers": 40, "spill_stores": getattr(self.solution, "SPILLS", 0), "spill_loads": 0}


def _reference():
    raise NotImplementedError


EXERCISE = Exercise(
    stage=1, name="fake_promotion", objective="promote per K group", prompt="fill kernel", holes=("kernel",),
    questions=(), reference=_reference, build=Candidate, required_sass=("FFMA",), forbidden_sass=("HMMA",),
    shapes_cpu=((24, 40, 256), (33, 130, 384)), shapes_gpu=((64, 136, 256),), perf_threshold=0.3)
'''

CORRECT = '''
import numpy as np
from gemm.fp8 import GROUP, e4m3_decode


def kernel(a, sa, b, sb, d):
    af = e4m3_decode(a).astype(np.float64)
    bf = e4m3_decode(b).astype(np.float64)
    m, k = af.shape
    n = bf.shape[0]
    acc = np.zeros((m, n))
    for g in range(k // GROUP):
        ks = slice(g * GROUP, (g + 1) * GROUP)
        part = (af[:, None, ks] * bf[None, :, ks]).sum(-1)
        acc += part * np.asarray(sa)[:, g][:, None] * np.repeat(np.asarray(sb)[:, g], GROUP)[:n][None, :]
    d[...] = acc
'''

SKELETON = '''
def kernel(a, sa, b, sb, d):
    """Fill D: the promotion, per K group."""
    raise NotImplementedError("fill in kernel")
'''

CACHED = CORRECT.replace("def kernel(a, sa, b, sb, d):", '''_memo = {}


def kernel(a, sa, b, sb, d):
    key = d.shape
    if key in _memo:
        d[...] = _memo[key]
        return
    _kernel(a, sa, b, sb, d)
    _memo[key] = d.copy()


def _kernel(a, sa, b, sb, d):''')

# "skip on repeat calls with the same buffers": the first call on a D computes it (outside the timed replays, in
# a real run: the warm-up call or the capture), the timed calls do nothing.
LAZY_REPEAT = CORRECT.replace("def kernel(a, sa, b, sb, d):", '''_seen = set()


def kernel(a, sa, b, sb, d):
    if id(d) in _seen:
        return
    _seen.add(id(d))
    _kernel(a, sa, b, sb, d)


def _kernel(a, sa, b, sb, d):''')

PARTIAL = CORRECT.replace("    d[...] = acc", "    d[: m // 2] = acc[: m // 2]  # the bottom half is left unwritten")

VENDOR_AT = '''
import numpy as np
from gemm.fp8 import dequantize_per_block, dequantize_per_token


def kernel(a, sa, b, sb, d):
    d[...] = dequantize_per_token(a, sa) @ dequantize_per_block(b, sb).T
'''

# statically clean: no @, no matmul/dot/einsum name anywhere; the call is assembled at run time and its failure
# swallowed, falling back to the honest code. The run-time guard's record still fails it.
VENDOR_HIDDEN = CORRECT.replace("def kernel(a, sa, b, sb, d):", '''
from gemm.fp8 import dequantize_per_block, dequantize_per_token


def kernel(a, sa, b, sb, d):
    try:
        fast = getattr(np, "mat" + "mul")
        d[...] = fast(dequantize_per_token(a, sa), dequantize_per_block(b, sb).T)
        return
    except RuntimeError:
        pass
    _kernel(a, sa, b, sb, d)


def _kernel(a, sa, b, sb, d):''')

VENDOR_TORCH = CORRECT + '''
try:
    import torch
except ImportError:
    torch = None
'''


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "fake_exercise.py"
    path.write_text(FAKE_EXERCISE)
    return path


def _grade(tmp_path, fake, source, *, name="solution.py", **kwargs):
    solution = tmp_path / name
    solution.write_text(textwrap.dedent(source))
    kwargs.setdefault("secret", "")
    kwargs.setdefault("mode", "cpu")
    return grade.grade(1, solution, exercise_file=str(fake), **kwargs)


def _failed(report, category=None):
    return [c for c in report["checks"] if c["graded"] and not c["passed"]
            and (category is None or c["category"] == category)]


def _check(report, name):
    return next(c for c in report["checks"] if c["name"] == name)


# ------------------------------------------------------------------------------------- honest solutions

def test_a_correct_solution_passes(tmp_path, fake):
    report = _grade(tmp_path, fake, CORRECT)
    assert report["passed"], grade.summary(report)
    assert report["mode"] == "cpu" and report["exercise"] == "fake_promotion"
    correct = [c for c in report["checks"] if c["category"] == "correctness"]
    assert len(correct) == 2 * grade.DEFAULT_SEEDS  # every shape (one ragged in N) x every seed
    assert all(c["diff"] < 1e-5 for c in correct)
    assert {c["name"] for c in report["checks"] if c["category"] == "technique"} == {"uses FFMA", "avoids HMMA",
                                                                                     "no spills"}
    assert report["score"]["points"] == report["score"]["possible"] == 80  # no performance on CPU
    assert "PASSED" in grade.summary(report)


def test_the_skeleton_fails(tmp_path, fake):
    report = _grade(tmp_path, fake, SKELETON)
    assert not report["passed"]
    assert all("a hole is not filled" in c["detail"] for c in _failed(report))


def test_a_missing_hole_fails(tmp_path, fake):
    report = _grade(tmp_path, fake, "def kernal(a, sa, b, sb, d):\n    pass\n")
    assert not report["passed"]
    assert _check(report, "defines every hole")["detail"] == "missing: kernel"


def test_a_file_that_does_not_load_fails(tmp_path, fake):
    report = _grade(tmp_path, fake, "def kernel(:\n")
    assert not report["passed"] and not _check(report, "loads")["passed"]


# ------------------------------------------------------------------------------------------- defences

def test_a_cached_result_is_caught_by_fresh_inputs(tmp_path, fake):
    report = _grade(tmp_path, fake, CACHED)
    assert not report["passed"]
    failed = _failed(report, "correctness")
    # the first problem of each shape is computed honestly; every later one gets the memorised D back
    assert len(failed) == 2 * (grade.DEFAULT_SEEDS - 1), grade.summary(report)
    assert all("calc_diff" in c["detail"] and c["diff"] > 1e-3 for c in failed)


def test_a_partial_write_is_caught_by_the_nan_poison(tmp_path, fake):
    report = _grade(tmp_path, fake, PARTIAL)
    assert not report["passed"]
    failed = _failed(report, "correctness")
    assert len(failed) == 2 * grade.DEFAULT_SEEDS
    assert all("never written (NaN poison left)" in c["detail"] and c["unwritten"] > 0 for c in failed)


def test_a_vendor_gemm_is_caught_statically(tmp_path, fake):
    report = _grade(tmp_path, fake, VENDOR_AT)
    assert not report["passed"]
    static = _check(report, "no vendor GEMM (source)")
    assert not static["passed"] and "uses the @ operator" in static["detail"]
    assert all(c["passed"] for c in report["checks"] if c["category"] == "correctness")  # right answer, still fails
    assert report["score"]["points"] == 0


def test_a_hidden_vendor_gemm_is_caught_at_run_time(tmp_path, fake):
    report = _grade(tmp_path, fake, VENDOR_HIDDEN)
    assert _check(report, "no vendor GEMM (source)")["passed"]  # the scan cannot see it...
    dynamic = _check(report, "no vendor GEMM (run time)")
    assert not dynamic["passed"] and "numpy.matmul" in dynamic["detail"]  # ...the guard records it, swallowed or not
    assert not report["passed"]


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
    ("import lessons.grade\n", "imports lessons.grade"),
])
def test_the_static_scan_finds(source, finding):
    findings = grade.scan_source(source)
    assert any(finding in line for line in findings), findings


def test_the_static_scan_passes_honest_numpy():
    assert grade.scan_source(CORRECT) == []


def test_the_secret_never_reaches_the_solution_and_secret_seeds_are_not_shown(tmp_path, fake):
    spy = CORRECT + '\nimport os\nassert "FP8LADDER_GRADER_SECRET" not in os.environ, "the secret leaked"\n'
    report = _grade(tmp_path, fake, spy, secret="instructor-secret")
    assert report["passed"], grade.summary(report)
    assert report["secret_seeds"]
    assert report["seeds"] == [str(s) for s in grade.public_seeds(grade.DEFAULT_SEEDS)] + ["secret 1", "secret 2"]
    seeds = {c.get("seed") for c in report["checks"] if c["category"] == "correctness"}
    assert seeds == set(report["seeds"])
    assert "instructor-secret" not in json.dumps(report)
    assert str(grade.secret_seed("instructor-secret", grade.public_seeds(1)[0])) not in json.dumps(report)


def test_secret_seeds_are_reproducible_with_the_secret_and_differ_without_it():
    public = grade.public_seeds(3)
    assert grade.public_seeds(3) == public  # a public failure can be rerun by the student
    assert grade.secret_seed("s", public[0]) == grade.secret_seed("s", public[0])
    assert len({grade.secret_seed(secret, p) for secret in ("s", "t") for p in public}) == 6
    assert [e["secret"] for e in grade.seed_plan(2, "s")] == [False, False, True, True]
    assert [e["secret"] for e in grade.seed_plan(2, None)] == [False, False]


def test_a_forged_result_on_stdout_is_ignored(tmp_path, fake):
    forger = PARTIAL + '\nprint(\'{"checks": [], "exercise": "forged"}\')\n'
    report = _grade(tmp_path, fake, forger)
    assert not report["passed"] and report["exercise"] == "fake_promotion"


def test_a_solution_that_never_ends_is_stopped(tmp_path, fake):
    report = _grade(tmp_path, fake, "while True:\n    pass\n", timeout=5)
    assert not report["passed"]
    assert "ran past 5 s" in _check(report, "finishes in time")["detail"]


# --------------------------------------------------------------------------------------------- technique

def test_technique_checks_need_the_required_and_refuse_the_forbidden(tmp_path, fake):
    source = CORRECT + '\nSASS = ["HMMA.16816.F32 R4, R8, R12, R4", "STL [R1], R2"]\nSPILLS = 8\n'
    report = _grade(tmp_path, fake, source)
    assert not report["passed"]
    assert {c["name"] for c in _failed(report)} == {"uses FFMA", "avoids HMMA", "no spills"}
    assert not _check(report, "local memory")["graded"]


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
        grade._launch(candidate, problem, stream)

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


def _perf(fake, source, timer, tmp_path, threshold=0.3):
    exercise = grade.load_exercise(1, str(fake))
    path = tmp_path / "perf_solution.py"
    path.write_text(source)
    candidate = exercise.build(grade.load_solution(str(path)))
    checks = grade.evaluate(exercise, candidate, grade.seed_plan(1, None), mode="gpu",
                            backend=HostBackend(timer), threshold=threshold)
    return checks, [c for c in checks if c["category"] == "performance"]


@pytest.mark.parametrize("timer, why", [(_fake_timer(us=0.0), "<= 0"), (_fake_timer(us=-3.0), "<= 0"),
                                        (_fake_timer(share_of_bound=1.5), "150% of the"),
                                        (_fake_timer(us=float("nan")), "not a number")])
def test_a_time_below_the_physical_floor_is_impossible(timer, why, fake, tmp_path):
    _, (perf,) = _perf(fake, CORRECT, timer, tmp_path)
    assert perf["graded"] and not perf["passed"] and perf["impossible"]
    assert perf["detail"].startswith("impossible time") and why in perf["detail"]


def test_work_off_the_timed_stream_is_caught(fake, tmp_path):
    """GPU MODE's "extra streams" hack: the kernel runs on a stream of its own, the graph captured on the timing
    stream holds none of it and times nothing. bench_kernel counts the nodes a call adds (tests/test_harness.py)."""
    _, (perf,) = _perf(fake, CORRECT, _fake_timer(share_of_bound=0.5, nodes_per_call=0), tmp_path)
    assert perf["graded"] and not perf["passed"] and perf["impossible"]
    assert perf["detail"].startswith("untimed work")


def test_work_done_only_outside_the_replays_is_caught(fake, tmp_path):
    """The output is poisoned after capture, before the first replay: D must be what the timed replays wrote."""
    checks, (perf,) = _perf(fake, LAZY_REPEAT, _fake_timer(share_of_bound=0.5), tmp_path)
    assert all(c["passed"] for c in checks if c["category"] == "correctness")  # each fresh D is computed once
    assert not perf["passed"] and "timed output" in perf["detail"] and "never written" in perf["detail"], perf


def test_an_untimed_exercise_reports_why(fake, tmp_path):
    from dataclasses import replace
    exercise = replace(grade.load_exercise(1, str(fake)), extra={"untimed": "no GEMM here"})
    checks = grade.performance_checks(exercise, object(), grade.seed_plan(1, None), backend=None, threshold=0.5)
    assert [(c["graded"], c["detail"]) for c in checks] == [(False, "not timed: no GEMM here")]


def test_the_performance_grade_against_the_threshold(fake, tmp_path):
    _, (fast,) = _perf(fake, CORRECT, _fake_timer(share_of_bound=0.5), tmp_path)
    assert fast["passed"] and abs(fast["pct_bound"] - 50) < 1e-6, fast
    _, (slow,) = _perf(fake, CORRECT, _fake_timer(share_of_bound=0.2), tmp_path)
    assert slow["graded"] and not slow["passed"] and "< 30%" in slow["detail"]
    _, (ungraded,) = _perf(fake, CORRECT, _fake_timer(share_of_bound=0.2), tmp_path, threshold=None)
    assert not ungraded["graded"] and "not graded" in ungraded["detail"]


def test_timed_outputs_are_rechecked_on_fresh_inputs(fake, tmp_path):
    """A cached result that could stand in during timing fails the checks after it."""
    checks, (perf,) = _perf(fake, CACHED, _fake_timer(share_of_bound=0.5), tmp_path)
    assert not perf["passed"] and "timed output: calc_diff" in perf["detail"]
    assert "fresh inputs after timing: calc_diff" in perf["detail"]


# ------------------------------------------------------------------------------------------ CLI, files

def test_the_cli_grades_writes_json_and_sets_the_exit_code(tmp_path, fake):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(CORRECT)
    bad.write_text(PARTIAL)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(grade.SECRET_ENV, None)
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
    assert runs["good_json"]["seeds"] == [str(grade.public_seeds(1)[0])]


def test_gpu_without_a_hopper_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from ptx import device
    if device.is_hopper():
        pytest.skip("a Hopper GPU is present")
    from lessons.__main__ import main
    assert main(["grade", "1", str(tmp_path / "x.py"), "--gpu"]) == 2
    assert "needs a Hopper" in capsys.readouterr().err


def test_the_committed_thresholds_file(tmp_path):
    data = json.loads((ROOT / "results" / "grading.json").read_text())
    assert set(data["stages"]) == {f"{n:02d}" for n in range(11)}
    for entry in data["stages"].values():
        assert {"perf_threshold", "measured"} <= set(entry)
    thresholds = grade.read_thresholds()
    assert set(thresholds) == set(range(11))
    other = tmp_path / "grading.json"
    other.write_text(json.dumps({"stages": {"01": {"perf_threshold": 0.25}}}))
    assert grade._threshold(1, 0.5, other) == 0.25  # the file wins over the exercise's own value
    assert grade._threshold(2, 0.5, other) == 0.5


def test_the_exercises_own_checks_are_technique_checks():
    def pitch_is_odd(solution):
        """The pitch is odd."""
        return [] if solution.pitch() % 2 else [f"pitch {solution.pitch()} is even"]

    exercise = SimpleNamespace(extra={"checks": (pitch_is_odd,)})
    (good,) = grade.exercise_checks(exercise, SimpleNamespace(pitch=lambda: 129))
    (bad,) = grade.exercise_checks(exercise, SimpleNamespace(pitch=lambda: 128))
    (unfilled,) = grade.exercise_checks(exercise, SimpleNamespace(pitch=_unfilled))
    assert good["passed"] and good["detail"] == "The pitch is odd." and good["category"] == "technique"
    assert not bad["passed"] and bad["detail"] == "pitch 128 is even"
    assert not unfilled["passed"] and "a hole is not filled" in unfilled["detail"]


def test_a_candidate_that_takes_no_stream_cannot_be_timed():
    candidate = SimpleNamespace(run_gpu=lambda a, sa, b, sb, d: None)
    exercise = SimpleNamespace(shapes_gpu=((64, 136, 256),), stage=1)
    (ungraded,) = grade.performance_checks(exercise, candidate, grade.seed_plan(1, None), backend=None,
                                           threshold=None)
    assert not ungraded["graded"] and "no stream=" in ungraded["detail"]
    (failed,) = grade.performance_checks(exercise, candidate, grade.seed_plan(1, None), backend=None, threshold=0.5)
    assert failed["graded"] and not failed["passed"]


def _unfilled():
    raise NotImplementedError("fill in pitch")


def test_copying_the_stages_own_functions_is_caught():
    """Re-exporting the stage's code is not a solution: importing a stage module, or the very functions the stage
    uses for the holes, fails the integrity check (the exercises' references name them)."""
    from lessons.exercises import exercise
    from lessons.grade import copy_findings
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
    report = grade.grade(0, None, mode="cpu", seeds=1, secret="")
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
    """tools/calibrate_grader.py: 0.8 x the stage's own share at each shape, rounded down; none where the stage's own
    code failed a graded check or has no bound."""
    sys.path.insert(0, str(ROOT / "tools"))
    import calibrate_grader as calibrate
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
    assert grade.copy_findings(source, exercise(stage)), source


def test_an_honest_attribute_named_reference_is_not_a_copy():
    from lessons.exercises import exercise
    source = "class Plan:\n    def __init__(self):\n        self.reference = 0\n\n\ndef tile_coords(t, m, n, g):\n" \
             "    return Plan().reference, t\n"
    assert not grade.copy_findings(source, exercise(8))


def test_the_answer_assembled_at_run_time_is_caught_by_identity(tmp_path):
    """Statically clean (a name built from pieces), caught when the child compares the holes with the reference."""
    solution = tmp_path / "ex07_sneaky.py"
    solution.write_text("from lessons.exercises import exercise\n_answer = getattr(exercise(7), 'refer' + 'ence')()\n"
                        "register_split = _answer.register_split\nproducer_warpgroup = _answer.producer_warpgroup\n")
    report = grade.grade(7, solution, mode="cpu", seeds=1, secret="")
    own = [c for c in report["checks"] if c["name"] == "own work (run time)"]
    assert own and not own[0]["passed"] and "register_split" in own[0]["detail"], report["checks"]
    assert report["score"]["points"] == 0


def test_thresholds_files_per_shape_flat_and_malformed(tmp_path):
    path = tmp_path / "thresholds.json"
    path.write_text(json.dumps({"stages": {"04": 0.3, "08": {"perf_threshold": {"1000x2112x512": 0.16}}}}))
    assert grade.read_thresholds(path) == {4: 0.3, 8: {"1000x2112x512": 0.16}}
    assert grade.shape_threshold({"1000x2112x512": 0.16}, (1000, 2112, 512)) == 0.16
    assert grade.shape_threshold({"1000x2112x512": 0.16}, (4096, 4096, 7168)) is None  # reported, not graded
    assert grade.read_thresholds(tmp_path / "missing.json") == {}
    path.write_text(json.dumps({"stages": {"four": 0.3}}))
    with pytest.raises(ValueError, match="tools/calibrate_grader.py"):
        grade.read_thresholds(path)
    assert grade.read_thresholds(grade.GRADING_FILE)[8]["4096x4096x7168"] > 0  # the committed file reads
