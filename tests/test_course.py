"""The course's promise, every exercise at once (CPU): the stage's own code passes the grader's checks, the
skeleton a student starts from fails the real grader (its own process, the CLI's path), and copying the stage's
code is refused."""
import pytest

from lessons.exercises import exercises
from lessons.grading.grader import grade
from lessons.grading.judge import evaluate
from lessons.grading.plan import seed_plan
from lessons.grading.source_scan import copy_findings
from lessons.grading.technique import exercise_checks

EXERCISES = exercises()


def test_every_stage_has_an_exercise():
    import lessons
    assert sorted(EXERCISES) == sorted(lessons.STAGES)


@pytest.mark.parametrize("stage", sorted(EXERCISES))
def test_every_graded_shape_is_one_the_stages_kernel_takes(stage):
    """K a multiple of 128 (one scale group) at every graded shape: exercise 17's ragged GPU shape had K = 4160,
    which the stage's kernel refuses, so an honest solution failed two correctness checks and a performance one on
    the GPU (found grading it there; the GPU suite runs only a stage's first shape)."""
    exercise = EXERCISES[stage]
    assert all(k % 128 == 0 for _, _, k in exercise.shapes_cpu + exercise.shapes_gpu), exercise.shapes_gpu


@pytest.mark.parametrize("stage", sorted(EXERCISES))
def test_the_stages_own_code_passes_the_graders_checks(stage):
    exercise = EXERCISES[stage]
    reference = exercise.reference()
    checks = exercise_checks(exercise, reference)
    checks += evaluate(exercise, exercise.build(reference), seed_plan(1, "course-test"), mode="cpu")
    failed = [f"{c['name']}: {c['detail']}" for c in checks if c["graded"] and not c["passed"]]
    assert not failed, failed
    assert any(c["category"] == "correctness" and c["passed"] for c in checks)


@pytest.mark.parametrize("stage", sorted(EXERCISES))
def test_the_skeleton_states_the_exercises_prompt(stage):
    """The student's file carries the prompt the grader, the notebook and the guide use, word for word."""
    import ast
    exercise = EXERCISES[stage]
    words = lambda text: " ".join(text.split())  # noqa: E731
    assert words(exercise.prompt) in words(ast.get_docstring(ast.parse(exercise.skeleton.read_text())))


@pytest.mark.parametrize("stage", sorted(EXERCISES))
def test_the_skeleton_fails_the_grader(stage):
    exercise = EXERCISES[stage]
    report = grade(stage, exercise.skeleton, mode="cpu", seeds=1, secret="")
    assert report["score"]["points"] == 0 and not report["passed"], report["checks"]
    assert not copy_findings(exercise.skeleton.read_text(), exercise), "a skeleton must not import the answer"


# ------------------------------------------------------------------------------------------------- GPU

def _gpu_checks(exercise, solution, *, perf: bool = False, threshold=None, every_shape: bool = False):
    """The grader's GPU path in this process: correctness at the first GPU shape, or all of them (and timing with
    ``perf``, graded against ``threshold``)."""
    import dataclasses

    from lessons.grading.correctness import DeviceBackend, correctness_checks
    from lessons.grading.performance import performance_checks
    from lessons.grading.technique import technique_checks
    first = exercise if every_shape else dataclasses.replace(exercise, shapes_gpu=exercise.shapes_gpu[:1])
    candidate, plan, backend = first.build(solution), seed_plan(1, "course-gpu"), DeviceBackend()
    checks = technique_checks(first, candidate) + correctness_checks(first, candidate, plan, mode="gpu",
                                                                     backend=backend)
    if perf:
        checks += performance_checks(first, candidate, plan, backend=backend, threshold=threshold)
    return checks


@pytest.mark.gpu
@pytest.mark.parametrize("stage", sorted(EXERCISES))
def test_the_stages_own_code_passes_on_the_gpu(stage):
    """run_gpu with the stage's own functions in the holes: every element written, calc_diff < 1e-3, a ragged
    shape (1000 x 2112 x 512); timed in a CUDA graph where the stage is timed, at a possible share of its bound."""
    exercise = EXERCISES[stage]
    checks = _gpu_checks(exercise, exercise.reference(), perf=True)
    failed = [f"{c['name']}: {c['detail']}" for c in checks if c["graded"] and not c["passed"]]
    assert not failed, failed
    perf = [c for c in checks if c["category"] == "performance"]
    if stage > 0:
        assert perf and all(0 < c["pct_bound"] <= 100 for c in perf), perf
        assert not any(c.get("impossible") for c in perf), perf


@pytest.mark.gpu
def test_07_producer_first_runs_on_the_gpu():
    """The layout the generator never chooses by itself: the producer is warpgroup 0, math threads index from
    %tid.x - 128, and the split moves registers the other way round (24 / 240)."""
    from types import SimpleNamespace
    first = SimpleNamespace(register_split=lambda wgs: (24, 240), producer_warpgroup=lambda wgs: 0)
    checks = _gpu_checks(EXERCISES[7], first)
    failed = [f"{c['name']}: {c['detail']}" for c in checks if c["graded"] and not c["passed"]]
    assert not failed, failed


@pytest.mark.gpu
def test_the_cli_grades_the_reference_on_the_gpu(tmp_path):
    """The whole path an instructor runs: child process, GPU correctness and timing, JSON report."""
    report = grade(8, None, mode="gpu", seeds=1, secret="")
    assert report["passed"], [c for c in report["checks"] if c["graded"] and not c["passed"]]
    perf = [c for c in report["checks"] if c["category"] == "performance"]
    assert len(perf) == len(EXERCISES[8].shapes_gpu) and all(c["tflops"] > 0 for c in perf)


def _slow_solutions():
    from types import SimpleNamespace
    return {2: SimpleNamespace(b_tile_pitch=lambda: 128),  # no padding: a warp's b_tile reads conflict 32-way
            7: SimpleNamespace(register_split=lambda wgs: (40, 104), producer_warpgroup=lambda wgs: wgs)}  # spills


@pytest.mark.gpu
@pytest.mark.parametrize("stage", [2, 7])
def test_a_correct_but_slow_solution_fails_the_performance_grade(stage):
    """The committed thresholds (results/grading.json) at work: D is right, the time is not."""
    from lessons.grading.plan import read_thresholds
    checks = _gpu_checks(EXERCISES[stage], _slow_solutions()[stage], perf=True, threshold=read_thresholds()[stage],
                         every_shape=True)
    correct = [c for c in checks if c["category"] == "correctness"]
    assert correct and all(c["passed"] for c in correct), correct
    perf = [c for c in checks if c["category"] == "performance"]
    assert any(c["graded"] and not c["passed"] and not c.get("impossible") for c in perf), perf
