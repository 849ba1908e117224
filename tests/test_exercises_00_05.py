"""Course exercises 00-05 on the CPU: each skeleton fails, the stage's own code (the exercise's reference) passes on
fresh random problems (ragged shapes, NaN-poisoned outputs, calc_diff against the float64 reference) with its
technique checks, and a deliberately wrong solution is caught. Numba stages run in the CUDA simulator (conftest.py),
PTX stages in the PTX emulator."""
import importlib
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

import lessons
from gemm.fp8 import calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from lessons.exercises import Exercise

MODULES = {0: "ex00_dequant_pair", 1: "ex01_promotion", 2: "ex02_tile_pitch", 3: "ex03_micro_tile",
           4: "ex04_ldmatrix_swizzle", 5: "ex05_descriptor"}
STAGES = sorted(MODULES)


def _module(stage):
    return importlib.import_module(f"lessons.exercises.{MODULES[stage]}")


def _exercise(stage) -> Exercise:
    return _module(stage).EXERCISE


def _load(path):
    spec = importlib.util.spec_from_file_location(f"skeleton_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fresh_shape(stage, rng):
    """A small ragged shape, fresh per run: M and N off every tile edge, one or two K groups."""
    m = int(rng.integers(1, 40 if stage in (1, 2, 3) else 140))
    n = int(rng.integers(1, 24)) if stage in (1, 2) else int(rng.integers(1, 140))
    return m, n, 128 * int(rng.integers(1, 3))


def _result(exercise, candidate, shape, rng):
    """(correct, detail) as the grader judges it: every element written and calc_diff < 1e-3."""
    host = random_problem(*shape, rng)
    d = np.asarray(candidate.run_cpu(*host), np.float64)
    custom = exercise.extra.get("reference")
    expected = custom(*host) if custom else reference_gemm(*host)
    assert d.shape == expected.shape
    unwritten = int(np.isnan(d).sum())
    diff = calc_diff(np.nan_to_num(d), expected)
    return unwritten == 0 and diff < 1e-3, f"{shape}: {unwritten} unwritten, diff {diff:.3g}"


def _caught(exercise, solution, shape, rng):
    """A wrong solution is caught: build or run raises, or the result is wrong, or an extra check fails."""
    failures = [msg for check in exercise.extra.get("checks", ()) for msg in check(solution)]
    try:
        correct, detail = _result(exercise, exercise.build(solution), shape, rng)
    except Exception as error:  # noqa: BLE001
        return f"raised {type(error).__name__}"
    return None if correct and not failures else (detail if not correct else "; ".join(failures))


# ------------------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("stage", STAGES)
def test_contract_and_skeleton(stage):
    exercise = _exercise(stage)
    assert exercise.stage == stage and exercise.objective and exercise.prompt and exercise.holes
    assert len(exercise.questions) >= 2 and all("check" in check.lower() for _, check in exercise.questions)
    assert exercise.shapes_cpu and exercise.shapes_gpu and exercise.perf_threshold is None
    assert exercise.skeleton.exists(), exercise.skeleton
    source = exercise.skeleton.read_text()
    objective = exercise.objective.split(":")[0][:40].lower()
    assert objective in " ".join(source.split()).lower()  # the objective in its docstring
    assert "Predict" in source and "Check with" in source
    skeleton = _load(exercise.skeleton)
    reference = exercise.reference()
    for hole in exercise.holes:
        assert callable(getattr(skeleton, hole)) and getattr(skeleton, hole).__doc__, hole
        assert callable(getattr(reference, hole)), hole
    with pytest.raises(NotImplementedError):
        exercise.build(skeleton)


# --------------------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("stage", STAGES)
def test_reference_passes_on_fresh_ragged_problems(stage, rng):
    exercise = _exercise(stage)
    candidate = exercise.build(exercise.reference())
    shapes = [_fresh_shape(stage, rng)] + ([] if stage in (1, 2, 3) else list(exercise.shapes_cpu[:1]))
    for shape in shapes:
        correct, detail = _result(exercise, candidate, shape, rng)
        assert correct, detail
    for check in exercise.extra.get("checks", ()):
        assert check(exercise.reference()) == []


@pytest.mark.parametrize("stage", [0, 1, 4, 5])
def test_reference_technique(stage):
    """The SASS of the reference candidate has the required opcodes and none of the forbidden ones."""
    exercise = _exercise(stage)
    instructions = exercise.build(exercise.reference()).sass()
    if instructions is None:
        pytest.skip("no NVVM on this machine")
    opcodes = {i.opcode for i in instructions}
    for prefix in exercise.required_sass:
        assert any(op.startswith(prefix) for op in opcodes), prefix
    for prefix in exercise.forbidden_sass:
        assert not any(op.startswith(prefix) for op in opcodes), prefix
    for check in exercise.extra.get("sass_checks", ()):
        assert check(instructions) == []


@pytest.mark.slow
def test_stage03_reference_has_wide_shared_loads():
    exercise = _exercise(3)
    instructions = exercise.build(exercise.reference()).sass()
    if instructions is None:
        pytest.skip("no NVVM on this machine")
    assert exercise.extra["sass_checks"][0](instructions) == []
    assert not any(i.opcode.startswith(exercise.forbidden_sass) for i in instructions)


@pytest.mark.parametrize("stage", [0, 5])
def test_reference_hole_reproduces_the_stage_ptx(stage):
    """The stage's own hole function, plugged in, gives the stage's PTX byte for byte."""
    exercise = _exercise(stage)
    candidate = exercise.build(exercise.reference())
    stage_module = lessons.stage(stage)
    shapes = [(4096, 7168), (7, 144)] if stage == 0 else [(4096, 4096, 7168), (200, 130, 384)]
    for shape in shapes:
        assert candidate.generate(*shape) == stage_module.generate(*shape)


def test_exercise_04_writes_its_own_ldmatrix_addresses():
    """Exercise 04's PTX computes the ldmatrix addresses from the hole functions (Traced), not the stage's text;
    that the two agree is test_reference_passes_on_fresh_ragged_problems[4]."""
    stage = lessons.stage(4)
    candidate = _exercise(4).build(_exercise(4).reference())
    ptx = candidate.generate(130, 9, 128)
    assert ptx != stage.generate(130, 9, 128) and "ldmatrix" in ptx  # the exercise path, not the default text


# ------------------------------------------------------------------------------------------- wrong ones
def _wrong_pair(kb, pair, scale):
    """Stage 00 with the bf16 halves swapped: the first element lands in the high half."""
    from ptx.vocab import core
    halves, low, high = kb.reg("b32"), kb.reg("b16"), kb.reg("b16")
    first, second, out = kb.reg("f32"), kb.reg("f32"), kb.reg("b32")
    kb.emit(core.cvt_e4m3x2_to_f16x2(halves, pair), core.unpack_b32(low, high, halves),
            core.cvt_f16_to_f32(first, low), core.cvt_f16_to_f32(second, high),
            f"mul.rn.f32 {first}, {first}, {scale};", f"mul.rn.f32 {second}, {second}, {scale};",
            core.cvt_f32x2_to_bf16x2(out, first, second))
    return out


def _a_without_swizzle(warp_m, lane, m_tile, k_step):
    row = warp_m * 64 + (lane & 15)
    return row * 128 + (((lane >> 4) + 2 * k_step) << 4) + m_tile * 16 * 128


def _b_without_swizzle(warp_n, lane, n_pair, k_step):
    row = warp_n * 32 + ((lane >> 4) & 1) * 8 + (lane & 7)
    return row * 128 + ((((lane >> 3) & 1) + 2 * k_step) << 4) + n_pair * 16 * 128


def _descriptor_without_swizzle_mode(start_address, leading_byte_offset, stride_byte_offset, swizzle=128):
    return (start_address >> 4) | (leading_byte_offset >> 4) << 16 | (stride_byte_offset >> 4) << 32


WRONG = {
    0: SimpleNamespace(dequantize_pair=_wrong_pair),
    1: SimpleNamespace(promote=lambda total, partial, sa_value, sb_value: total + partial * sa_value),  # no sb
    2: SimpleNamespace(b_tile_pitch=lambda: 127),  # rows overlap
    3: SimpleNamespace(micro_offset=lambda i, thread: np.uint64(thread * 4 + i)),  # not a bijection
    4: SimpleNamespace(a_fragment_offset=_a_without_swizzle, b_fragment_offset=_b_without_swizzle),
    5: SimpleNamespace(descriptor_bits=_descriptor_without_swizzle_mode),
}


@pytest.mark.parametrize("stage", STAGES)
def test_wrong_solution_is_caught(stage, rng):
    exercise = _exercise(stage)
    shape = (5, 130, 128) if stage == 3 else _fresh_shape(stage, rng)
    if stage in (4, 5):
        shape = (max(shape[0], 17), max(shape[1], 17), shape[2])  # enough rows that a misread shows
    assert _caught(exercise, WRONG[stage], shape, rng) is not None


def test_unpadded_pitch_is_correct_but_fails_the_bank_check(rng):
    """Pitch 128 is a correct kernel (not "wrong"), but the technique check names the 32-way conflict."""
    exercise = _exercise(2)
    unpadded = SimpleNamespace(b_tile_pitch=lambda: 128)
    correct, detail = _result(exercise, exercise.build(unpadded), (9, 7, 128), rng)
    assert correct, detail
    assert any("32-way" in msg for msg in exercise.extra["checks"][0](unpadded))
