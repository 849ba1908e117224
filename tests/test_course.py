"""The course's promise, every exercise at once (CPU): the stage's own code passes the grader's checks, the
skeleton a student starts from fails the real grader (its own process, the CLI's path), and copying the stage's
code is refused."""
import pytest

from lessons.exercises import exercises
from lessons.grade import copy_findings, evaluate, exercise_checks, grade, seed_plan

EXERCISES = exercises()


def test_every_stage_has_an_exercise():
    import lessons
    assert sorted(EXERCISES) == sorted(lessons.STAGES)


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
def test_the_skeleton_fails_the_grader(stage):
    exercise = EXERCISES[stage]
    report = grade(stage, exercise.skeleton, mode="cpu", seeds=1, secret="")
    assert report["score"]["points"] == 0 and not report["passed"], report["checks"]
    assert not copy_findings(exercise.skeleton.read_text(), exercise), "a skeleton must not import the answer"
