"""Correctness checks: a fresh random problem per shape and per seed, D poisoned with NaN, judged against float64.

Each check draws a fresh problem (:func:`gemm.fp8.random_problem`, or the exercise's own), runs the candidate
(``run_cpu`` in the simulator / PTX emulator, or ``run_gpu`` through a :class:`DeviceBackend`), and
:func:`judge_output` applies :data:`MEASURE`: every element written, ``calc_diff < DIFF_LIMIT`` and the relative
L2 error below ``REL_LIMIT``.
"""
from __future__ import annotations

import inspect
import math
import traceback
from typing import Callable

import numpy as np

from gemm.fp8 import bf16_to_float, calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from lessons.grading.plan import problem_rng, shape_text
from lessons.grading.rubric import check_result, error_text

DIFF_LIMIT = 1e-3
REL_LIMIT = 1e-2
MEASURE = (f"D is right when every element was written (NaN poison), calc_diff = 1 - 2 sum(xy) / sum(x^2 + y^2) < "
           f"{DIFF_LIMIT:g} (DeepGEMM's) and ||D - ref|| / ||ref|| < {REL_LIMIT:g}, against the float64 reference of "
           "the dequantized inputs")


class DeviceBackend:
    """The real GPU: Numba device arrays in the contract's layout (gemm.testing.problems), BF16 D poisoned with NaN."""

    def put(self, host):
        from gemm.testing.problems import device_problem
        return device_problem(*host)

    def poison(self, problem) -> None:
        from gemm.testing.problems import BF16_NAN_BITS
        problem.d.copy_to_device(np.full(problem.d.shape, BF16_NAN_BITS, dtype=np.uint16))

    def launch(self, candidate, problem, stream: int = 0) -> None:
        launch_candidate(candidate, problem, stream)

    def synchronize(self) -> None:
        from numba import cuda
        cuda.synchronize()

    def fetch(self, problem) -> np.ndarray:
        return bf16_to_float(problem.d.copy_to_host())

    def timer(self, launch: Callable[[int], None], before_replay: Callable[[], None] | None = None):
        from gemm.testing.timer import bench_kernel
        return bench_kernel(launch, before_replay=before_replay)


def takes_stream(candidate) -> bool:
    try:
        return "stream" in inspect.signature(candidate.run_gpu).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def launch_candidate(candidate, problem, stream: int) -> None:
    """``run_gpu(a, sa, b, sb, d[, stream=])``: the stream only where the candidate takes one (timing needs it)."""
    if takes_stream(candidate):
        candidate.run_gpu(problem.a, problem.sa, problem.b, problem.sb, problem.d, stream=stream)
    elif stream:
        raise TypeError("Candidate.run_gpu takes no stream= argument: it cannot be timed in a CUDA graph")
    else:
        candidate.run_gpu(problem.a, problem.sa, problem.b, problem.sb, problem.d)


def expected_output(exercise, host, rng, *, sample: bool):
    """(rows, float64 values) of the expected D: the exercise's own reference where it has one (stage 00)."""
    custom = (getattr(exercise, "extra", None) or {}).get("reference")
    if custom is not None:
        values = np.asarray(custom(*host), dtype=np.float64)
        return np.arange(values.shape[0]), values
    from gemm.testing.problems import reference_rows
    if not sample:
        return np.arange(host[0].shape[0]), reference_gemm(*host)
    ref = reference_rows(*host, rng)
    return ref.rows, ref.values


def draw_problem(exercise, shape, rng):
    custom = (getattr(exercise, "extra", None) or {}).get("problem")
    if custom is not None:
        return custom(*shape, rng)
    return random_problem(*shape, rng)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| (L2 over every element). DeepGEMM's calc_diff alone lets a uniform scale error pass
    (4% gives 1 - 2(1.04)/(1 + 1.04^2) = 7.7e-4 < 1e-3); this does not (0.04 > 1e-2), while BF16 rounding (~0.3%) does."""
    norm = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / norm if norm else float(np.linalg.norm(got - want))


def judge_output(d, rows, expected) -> dict:
    """Every element written (no NaN left from the poison; right shape), then on the reference rows calc_diff <
    DIFF_LIMIT and the relative L2 error < REL_LIMIT (MEASURE states it in every report)."""
    d = np.asarray(d, dtype=np.float64)
    shape = (len(rows), expected.shape[1])
    if d.ndim != 2 or d.shape[1] != expected.shape[1] or d.shape[0] <= int(np.max(rows, initial=0)):
        return {"correct": False, "unwritten": None, "diff": None, "rel_error": None,
                "why": f"D has shape {d.shape}, expected (M, {shape[1]})"}
    unwritten = int(np.isnan(d).sum())
    if unwritten:
        return {"correct": False, "unwritten": unwritten, "diff": None, "rel_error": None,
                "why": f"{unwritten} of {d.size} elements never written (NaN poison left)"}
    diff, rel = calc_diff(d[rows], expected), relative_error(d[rows], np.asarray(expected, np.float64))
    finite = math.isfinite(diff) and math.isfinite(rel)
    correct = finite and diff < DIFF_LIMIT and rel < REL_LIMIT
    why = (f"calc_diff {diff:.3g} {'<' if finite and diff < DIFF_LIMIT else '>='} {DIFF_LIMIT:g}, relative error "
           f"{rel:.3g} {'<' if finite and rel < REL_LIMIT else '>='} {REL_LIMIT:g}")
    return {"correct": correct, "unwritten": 0, "diff": diff if math.isfinite(diff) else None,
            "rel_error": rel if math.isfinite(rel) else None, "why": why}


def correctness_checks(exercise, candidate, plan, *, mode: str, backend=None) -> list[dict]:
    shapes = exercise.shapes_cpu if mode == "cpu" else exercise.shapes_gpu
    checks = []
    for shape in shapes:
        for entry in plan:
            name = f"correct {shape_text(shape)} seed {entry['label']}"
            rng = problem_rng(entry["seed"], shape)
            try:
                host = draw_problem(exercise, shape, rng)
                if mode == "cpu":
                    d = candidate.run_cpu(*host)
                else:
                    problem = backend.put(host)
                    backend.poison(problem)
                    backend.launch(candidate, problem, 0)
                    backend.synchronize()
                    d = backend.fetch(problem)
                rows, expected = expected_output(exercise, host, rng, sample=mode != "cpu")
                verdict = judge_output(d, rows, expected)
            except NotImplementedError as error:
                checks.append(check_result(name, "correctness", False, f"a hole is not filled: {error_text(error)}"))
                continue
            except Exception as error:  # noqa: BLE001  (the student's code: any failure is a failed check)
                checks.append(check_result(name, "correctness", False, error_text(error),
                                           traceback=traceback.format_exc()[-4000:]))
                continue
            checks.append(check_result(name, "correctness", verdict["correct"], verdict["why"], shape=list(shape),
                                       seed=entry["label"], diff=verdict["diff"], rel_error=verdict["rel_error"],
                                       unwritten=verdict["unwritten"]))
    return checks
