"""Performance checks (GPU only): TFLOP/s and the share of the stage's speed-of-light bound, on each GPU shape.

:func:`gemm.testing.bench_kernel` times the candidate; the share of the bound (:func:`lessons.ladder.speed_of_light`,
or the exercise's own) passes at the stage's threshold for that shape (:mod:`lessons.grading.plan`). A time that is
<= 0 or implies more than 100% of the bound is an "impossible time" and fails; the last timed output is checked,
then fresh inputs are generated, run and checked again.
"""
from __future__ import annotations

import math
import traceback

from gemm.testing.problems import flops
from lessons.grading.correctness import draw_problem, expected_output, judge_output, takes_stream
from lessons.grading.plan import problem_rng, shape_text, shape_threshold
from lessons.grading.rubric import check_result, error_text
from lessons.ladder import speed_of_light


def sol_bound(exercise, shape, device_name: str | None = None) -> dict | None:
    """The stage's speed-of-light bound at a shape: the exercise's own ``sol_bound_tflops`` where it has one,
    else :func:`lessons.ladder.speed_of_light` for its stage on ``device_name``'s GPU (its HBM: an H200's is
    faster than the H100's, and a kernel past the H100's bound there is not impossible)."""
    own = getattr(exercise, "sol_bound_tflops", None) or (getattr(exercise, "extra", None) or {}).get(
        "sol_bound_tflops")
    if own is not None:
        value = own(*shape)
        return None if value is None else {"bound_tflops": float(value), "bound_unit": "exercise"}
    return speed_of_light(exercise.stage, *shape, device_name)


def _device_name() -> str:
    """The GPU the judge times on (the current device): its name picks the HBM of the bound."""
    from gemm.heuristics import device_facts
    return device_facts().name


def performance_verdict(timing, bound: dict | None, shape, threshold: float | None) -> dict:
    """TFLOP/s and share of the bound of one timing; an impossible time (<= 0, or faster than the bound) fails."""
    work = flops(*shape)
    median_us, min_us = float(timing.median_us), float(timing.min_us)
    nodes = getattr(timing, "nodes_per_call", None)
    out = {"time_us": median_us, "min_us": min_us, "threshold": threshold, "nodes_per_call": nodes}
    if nodes is not None and nodes < 1:
        return {**out, "passed": False, "impossible": True,
                "why": f"untimed work: a call added {nodes:g} nodes to the CUDA graph captured on the stream it was "
                       "given; run_gpu must enqueue its kernels on that stream (work on another stream, or done on "
                       "the host, is not timed)"}
    if not (math.isfinite(median_us) and math.isfinite(min_us)) or median_us <= 0 or min_us <= 0:
        return {**out, "passed": False, "impossible": True,
                "why": f"impossible time: median {median_us:g} us, min {min_us:g} us (<= 0 or not a number)"}
    tflops = work / median_us / 1e6
    out["tflops"] = tflops
    if bound is None:
        return {**out, "passed": None, "impossible": False, "why": f"{tflops:.3g} TFLOP/s (no speed-of-light bound)"}
    best = work / min_us / 1e6
    share, best_share = tflops / bound["bound_tflops"], best / bound["bound_tflops"]
    out.update(bound_tflops=bound["bound_tflops"], bound_unit=bound["bound_unit"], pct_bound=100 * share)
    if share > 1 or best_share > 1:
        return {**out, "passed": False, "impossible": True,
                "why": f"impossible time: {100 * max(share, best_share):.0f}% of the {bound['bound_unit']} bound "
                       f"({bound['bound_tflops']:.4g} TFLOP/s); nothing runs faster than its speed of light"}
    if threshold is None:
        return {**out, "passed": None, "impossible": False,
                "why": f"{tflops:.4g} TFLOP/s = {100 * share:.1f}% of the bound (no threshold for this shape: not "
                       "graded)"}
    passed = share >= threshold
    return {**out, "passed": passed, "impossible": False,
            "why": f"{tflops:.4g} TFLOP/s = {100 * share:.1f}% of the bound "
                   f"({'>=' if passed else '<'} {100 * threshold:.0f}%)"}


def performance_checks(exercise, candidate, plan, *, backend, threshold) -> list[dict]:
    """Time each GPU shape, then check the last timed output and a run on freshly generated inputs."""
    checks = []
    untimed = (getattr(exercise, "extra", None) or {}).get("untimed")
    if untimed:
        return [check_result("performance", "performance", None, f"not timed: {untimed}", graded=False)]
    if not takes_stream(candidate):  # bench_kernel replays a CUDA graph captured on its own stream
        why = "Candidate.run_gpu takes no stream= argument: it cannot be timed (a contract gap of the exercise)"
        graded = any(shape_threshold(threshold, shape) is not None for shape in exercise.shapes_gpu)
        return [check_result("performance", "performance", False if graded else None, why)]
    for shape in exercise.shapes_gpu:
        name = f"performance {shape_text(shape)}"
        seed = plan[-1]["seed"]  # the last seed: secret when there is a secret
        try:
            rng = problem_rng(seed, shape, salt=1)
            host = draw_problem(exercise, shape, rng)
            problem = backend.put(host)
            backend.poison(problem)
            def poison_before_replay(problem=problem):  # D is then what the replays alone wrote
                backend.synchronize()  # the whole device: work a call left on any other stream is done
                backend.poison(problem)

            timing = backend.timer(lambda stream: backend.launch(candidate, problem, stream), poison_before_replay)
            backend.synchronize()
            rows, expected = expected_output(exercise, host, rng, sample=True)
            last = judge_output(backend.fetch(problem), rows, expected)  # the output of the last timed run
            rng = problem_rng(seed, shape, salt=2)  # regenerated inputs: nothing computed before may stand in
            host = draw_problem(exercise, shape, rng)
            fresh_problem = backend.put(host)
            backend.poison(fresh_problem)
            backend.launch(candidate, fresh_problem, 0)
            backend.synchronize()
            rows, expected = expected_output(exercise, host, rng, sample=True)
            fresh = judge_output(backend.fetch(fresh_problem), rows, expected)
            verdict = performance_verdict(timing, sol_bound(exercise, shape, _device_name()), shape,
                                          shape_threshold(threshold, shape))
        except Exception as error:  # noqa: BLE001
            checks.append(check_result(name, "performance", False, error_text(error),
                                       traceback=traceback.format_exc()[-4000:]))
            continue
        passed, why = verdict.pop("passed"), verdict.pop("why")
        if not (last["correct"] and fresh["correct"]):
            passed = False
            why += f"; timed output: {last['why']}; fresh inputs after timing: {fresh['why']}"
        samples = [float(v) for v in (getattr(timing, "samples_us", None) or [])]
        checks.append(check_result(name, "performance", passed, why, shape=list(shape), samples_us=samples, **verdict))
    return checks
