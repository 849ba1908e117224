"""What one grading run is given: the seeds, the exercise and the performance thresholds.

Public seeds are printed and reproducible; secret ones are ``hash(FP8LADDER_GRADER_SECRET, public seed)``, derived
in the parent (the secret never reaches the judge's or the oracle's environment) and shown as "secret". Every check
draws a fresh problem from its own generator (:func:`problem_rng`).

The performance thresholds (results/grading.json, found by :mod:`lessons.results_store`) are a share of the stage's
speed-of-light bound per GPU shape (``{"4096x4096x7168": 0.49, ...}``) or one share for every shape; a stage the file
does not name falls back to the exercise's own ``perf_threshold``; None, or a shape the file does not name:
reported, not graded.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np

from lessons import results_store
from lessons.exercises import exercise
from lessons.grading.rubric import error_text

SECRET_ENV = "FP8LADDER_GRADER_SECRET"
DEFAULT_SEEDS = 2
DEFAULT_TIMEOUT_S = 900
PUBLIC_SEED_BASE = 20250
THRESHOLDS_FILE = "grading.json"  # one of the results (lessons.results_store); python -m lessons calibrate writes it


def public_seeds(count: int) -> list[int]:
    return [PUBLIC_SEED_BASE + i for i in range(count)]


def secret_seed(secret: str, public: int) -> int:
    """hash(secret, public seed): reproducible by the instructor, unpredictable without the secret."""
    digest = hashlib.sha256(f"fp8ladder-grader\0{secret}\0{public}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def seed_plan(count: int, secret: str | None) -> list[dict]:
    """The seeds of one grading run: ``count`` public ones and, with a secret, as many derived from it."""
    plan = [{"label": str(seed), "seed": seed, "secret": False} for seed in public_seeds(count)]
    if secret:
        plan += [{"label": f"secret {i + 1}", "seed": secret_seed(secret, seed), "secret": True}
                 for i, seed in enumerate(public_seeds(count))]
    return plan


def problem_rng(seed: int, shape, salt: int = 0) -> np.random.Generator:
    """One generator per (seed, shape): every check draws a fresh problem."""
    return np.random.default_rng([seed, *shape, salt])


def shape_text(shape) -> str:
    return "x".join(str(v) for v in shape)


def load_exercise(stage: int, exercise_file: str | None = None):
    """``lessons.exercises.exercise(stage)``, or (tests, instructors trying one out) ``EXERCISE`` from a file."""
    if exercise_file:
        spec = importlib.util.spec_from_file_location("grader_exercise", exercise_file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.EXERCISE
    return exercise(stage)


def thresholds_path(thresholds_file: Path | None = None) -> Path | None:
    """The thresholds file a run reads: ``thresholds_file``, else results/grading.json (a calibration measured into
    an installed package's user directory, else the committed one); None when there is none."""
    return Path(thresholds_file) if thresholds_file else results_store.find(THRESHOLDS_FILE)


def read_thresholds(path: Path | None = None) -> dict[int, float | dict | None]:
    """stage -> its ``perf_threshold`` in the thresholds file (:func:`thresholds_path`); {} when there is none."""
    path = thresholds_path(path)
    if path is None:
        return {}
    try:
        stages = json.loads(Path(path).read_text())["stages"]
        return {int(stage): entry.get("perf_threshold") if isinstance(entry, dict) else entry
                for stage, entry in stages.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        if Path(path).exists():
            raise ValueError(f"thresholds file {path}: expected {{\"stages\": {{\"NN\": {{\"perf_threshold\": "
                             f"share or {{\"MxNxK\": share}}}}}}}} (python -m lessons calibrate writes it): "
                             f"{error_text(error)}") from error
        return {}


def stage_threshold(stage: int, exercise_share, thresholds_file) -> float | None:
    """The thresholds file's entry for ``stage`` (``thresholds_file``, else results/grading.json), else the
    exercise's own ``perf_threshold`` (``exercise_share``)."""
    recorded = read_thresholds(thresholds_file).get(stage)
    return recorded if recorded is not None else exercise_share


def exercise_threshold(stage: int, exercise_file) -> float | None:
    try:
        return load_exercise(stage, exercise_file).perf_threshold
    except Exception:  # noqa: BLE001  (reported by the child)
        return None


def shape_threshold(threshold, shape) -> float | None:
    """The share that passes at ``shape``: one for every shape, or per shape (``{"MxNxK": share}``)."""
    return threshold.get(shape_text(shape)) if isinstance(threshold, dict) else threshold
