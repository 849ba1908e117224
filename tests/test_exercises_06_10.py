"""Exercises 06-16 and 18-20 (lessons/exercises): on the CPU, the skeleton fails, the stage's own functions pass (emulator
correctness on fresh random shapes, ragged ones included, every element written; the SASS technique check on a
cubin assembled here), and a deliberately wrong solution is caught. Plus: the seams change nothing by default."""
import dataclasses
import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from gemm.fp8 import calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from lessons.exercises import exercise
from lessons.exercises import ex20_pair_tiles as ex20
from ptx.emulate import EmulationError

STAGES = (6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20)


def load(path):
    spec = importlib.util.spec_from_file_location(f"solution_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_correct(candidate, m, n, k, rng):
    problem = random_problem(m, n, k, rng)
    d = candidate.run_cpu(*problem)
    assert d.dtype == np.float32 and d.shape == (m, n)
    assert not np.isnan(d).any(), f"{int(np.isnan(d).sum())} elements unwritten"
    assert calc_diff(d, reference_gemm(*problem)) < 1e-3


@pytest.mark.parametrize("stage", STAGES)
def test_exercise_contract(stage):
    ex = exercise(stage)
    assert ex.stage == stage and ex.skeleton.exists() and ex.questions and ex.objective and ex.prompt
    skeleton, reference = load(ex.skeleton), ex.reference()
    for name in ex.holes:
        assert callable(getattr(skeleton, name)) and callable(getattr(reference, name))
    assert all(k % 128 == 0 for _, _, k in ex.shapes_cpu + ex.shapes_gpu)


@pytest.mark.parametrize("stage", STAGES)
def test_skeleton_fails(stage, rng):
    ex = exercise(stage)
    candidate = ex.build(load(ex.skeleton))
    with pytest.raises(NotImplementedError):
        candidate.run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


@pytest.mark.parametrize("stage", STAGES)
def test_reference_passes(stage, rng):
    ex = exercise(stage)
    candidate = ex.build(ex.reference())
    for m, n, k in ex.shapes_cpu:  # fresh random operands at the graded (ragged) shapes
        check_correct(candidate, m, n, k, rng)
    from lessons.grading.technique import technique_checks  # the grader's own reading of the SASS
    failed = [check for check in technique_checks(ex, candidate) if not check["passed"]]
    assert not failed, failed


# -- deliberately wrong solutions -------------------------------------------------------------------------------
def test_06_a_flipped_producer_parity_deadlocks(rng):
    ex = exercise(6)
    right = ex.reference()
    wrong = SimpleNamespace(pipeline_slot=right.pipeline_slot,
                            producer_wait_parity=lambda i, stages: (i // stages) % 2)  # no "^ 1"
    with pytest.raises(EmulationError, match="deadlock"):
        ex.build(wrong).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


def test_06_bookkeeping_that_ignores_the_wrap_is_caught(rng):
    ex = exercise(6)
    wrong = SimpleNamespace(pipeline_slot=lambda i, stages: (i % stages, 0),  # never flips
                            producer_wait_parity=ex.reference().producer_wait_parity)
    with pytest.raises(AssertionError, match="pipeline_slot"):
        ex.build(wrong).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


def test_07_a_split_over_the_register_file_is_refused(rng):
    ex = exercise(7)
    wrong = SimpleNamespace(register_split=lambda wgs: (232, 232), producer_warpgroup=lambda wgs: wgs)
    with pytest.raises(ValueError, match="65536"):
        ex.build(wrong).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))
    middle = SimpleNamespace(register_split=lambda wgs: (40, 232), producer_warpgroup=lambda wgs: 1)
    with pytest.raises(ValueError, match="producer_warpgroup"):
        ex.build(middle).run_cpu(*random_problem(130, 136, 384, rng))  # two math warpgroups: 1 is in the middle


def test_07_a_split_that_starves_the_math_warpgroups_fails_the_spill_check():
    """The emulator has no register file, so D comes out right; ptxas compiles the math path for the registers
    setmaxnreg gives it, and 104 cannot hold a 64 x 128 accumulator: the no-spills check fails (on the CPU)."""
    from lessons.grading.technique import technique_checks
    ex = exercise(7)
    starved = SimpleNamespace(register_split=lambda wgs: (40, 104), producer_warpgroup=lambda wgs: wgs)
    checks = {c["name"]: c for c in technique_checks(ex, ex.build(starved))}
    assert checks["no spills"]["passed"] is False, checks["no spills"]
    assert checks["uses USETMAXREG"]["passed"]
    assert {c["name"]: c for c in technique_checks(ex, ex.build(ex.reference()))}["no spills"]["passed"]


def test_07_producer_first_is_also_correct(rng):
    """The other valid layout: the producer is warpgroup 0 and math threads index from %tid.x - 128."""
    ex = exercise(7)
    first = SimpleNamespace(register_split=lambda wgs: (24, 240), producer_warpgroup=lambda wgs: 0)
    candidate = ex.build(first)
    check_correct(candidate, 130, 136, 384, rng)  # 128-row blocks: two math warpgroups
    check_correct(candidate, 60, 72, 384, rng)  # one
    assert any(i.opcode == "USETMAXREG" for i in candidate.sass())


def test_08_a_raster_that_repeats_a_tile_leaves_output_unwritten(rng):
    from gemm.testing.emulated import run_gemm
    from gemm.kernel.seams import Seams
    from gemm.kernel.tile_scheduler import tile_coords
    ex = exercise(8)

    def repeats(tile, m_blocks, n_blocks, group):  # the last tile computes the first one again
        return tile_coords(0 if tile == m_blocks * n_blocks - 1 else tile, m_blocks, n_blocks, group)

    problem = random_problem(*ex.shapes_cpu[0], rng)
    d = ex.build(SimpleNamespace(tile_coords=repeats)).run_cpu(*problem)  # a correctness failure: D unwritten
    assert np.isnan(d).any()
    m, n, k = ex.shapes_cpu[0]  # the same hole through the kernel alone: a NaN block where no tile wrote
    config = exercise(8).build(ex.reference()).cpu_config_of(m, n, k)
    d = run_gemm(config, *problem, sm_count=3, seams=Seams(tile_coords=repeats, rows=m))
    assert np.isnan(d).any()
    # a bijection in another order computes D right: the order is the technique check, not a correctness one
    row_major = SimpleNamespace(tile_coords=lambda t, mb, nb, group: divmod(t, nb))
    d = ex.build(row_major).run_cpu(*problem)
    assert not np.isnan(d).any()
    from lessons.grading.technique import exercise_checks
    (order,) = exercise_checks(ex, row_major)
    assert order["category"] == "technique" and not order["passed"] and "raster order" in order["detail"]


def test_09_too_many_arrivals_deadlock(rng):
    ex = exercise(9)
    wrong = SimpleNamespace(empty_arrivals=lambda multicast, warps: 2 * multicast * warps)
    with pytest.raises(EmulationError, match="deadlock"):
        ex.build(wrong).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


def test_10_other_rules_are_caught():
    from ptx.passes import choose_flips
    ex = exercise(10)
    every_other = SimpleNamespace(select_flips=lambda run: choose_flips(run, "every_other"))
    with pytest.raises(AssertionError, match="your rule flips"):
        ex.build(every_other).sass()
    outside = SimpleNamespace(select_flips=lambda run: [dataclasses.replace(run[0], offset=run[0].offset - 16)])
    with pytest.raises(ValueError, match="outside the run"):
        ex.build(outside).sass()


def test_11_waves_64_rows_apart_leave_a_slab_uncomputed(rng):
    """Offset 64 * wave: warpgroup 0's second wave redoes warpgroup 1's first (rows 64-127 twice) and rows 192-255
    are never computed. The TMA store still copies the whole shared D tile out, so those rows of D hold what the
    tile held there (not NaN): rows 0-191 come out right, rows 192.. wrong, and the grader's correctness fails."""
    import lessons
    ex = exercise(11)
    m, n, k = ex.shapes_cpu[0]
    assert m > 192 and lessons.stage(11).config(m, n, k).block_m == 256  # the last wave's slab has rows of D
    wrong = SimpleNamespace(wave_offset=lambda wave, warpgroups: 64 * wave)
    problem = random_problem(m, n, k, rng)
    d, want = ex.build(wrong).run_cpu(*problem), reference_gemm(*problem)
    assert calc_diff(d[:192], want[:192]) < 1e-3  # the rows some wave computed
    # every row of the uncomputed slab is wrong (NaN, zeros or another tile's values), whatever its magnitude; the
    # whole-D calc_diff is not asserted: a seed whose slab rows are all small can keep it under the bar
    rows = slice(192, min(m, 256))
    error = np.abs(np.nan_to_num(d[rows], nan=np.inf) - want[rows]).max(axis=1) / np.abs(want[rows]).max(axis=1)
    assert (error > 0.5).all(), "an uncomputed slab went unnoticed"
    from lessons.grading.technique import exercise_checks
    (rule,) = exercise_checks(ex, wrong)
    assert rule["category"] == "technique" and not rule["passed"]
    assert "wave_offset(1, warpgroups=2) = 64" in rule["detail"] and "128" in rule["detail"], rule["detail"]


def test_11_offsets_no_tile_holds_are_refused(rng):
    ex = exercise(11)
    for bad in (lambda wave, wgs: 32 * wave, lambda wave, wgs: 256 * wave, lambda wave, wgs: -128 * wave,
                lambda wave, wgs: 128.0 * wave):
        with pytest.raises(ValueError, match="wave_offset"):
            ex.build(SimpleNamespace(wave_offset=bad)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


class _Sneaky(int):
    """An int whose arithmetic and text are its own: what a seam's answer must not be allowed to carry into PTX."""
    def __mul__(self, other):
        return "0; trap"

    def __str__(self):
        return "0; trap"

    __format__ = lambda self, spec: "0; trap"  # noqa: E731


def test_seam_answers_must_be_plain_ints():
    from gemm.kernel import generate
    from gemm.kernel.seams import Seams
    import lessons
    config = lessons.stage(11).config(250, 136, 384)
    with pytest.raises(ValueError, match="wave_offset"):
        generate(config, 136, 384, Seams(wave_offset=lambda wave, wgs: _Sneaky(128 * wave)))
    sneaky_pair = lambda t, m_blocks, n_blocks, group: (_Sneaky(t // n_blocks), t % n_blocks)  # noqa: E731
    with pytest.raises(ValueError, match="tile_coords"):
        generate(lessons.stage(8).config(250, 136, 384), 136, 384, Seams(tile_coords=sneaky_pair, rows=250))
    with pytest.raises(ValueError, match="empty_arrivals"):
        generate(config, 136, 384, Seams(empty_arrivals=lambda multicast, warps: _Sneaky(multicast * warps)))


def test_11_tile_rows_is_the_kernels_default():
    """tile_rows (what the figure draws) and MathWarpgroups.wave_row (what the kernel emits) agree, and the 64-row
    slices tile the block exactly once."""
    from gemm.kernel.math_warpgroups import MathWarpgroups, tile_rows
    from ptx.builder import KernelBuilder
    assert tile_rows(256) == [(0, 0, 0), (1, 0, 64), (0, 1, 128), (1, 1, 192)]
    for block_m in (64, 128, 256):
        kb = KernelBuilder("k", [("u64", "out")])
        math = MathWarpgroups(kb, block_m, 128, kb.reg("u32", "tid"))
        rows = tile_rows(block_m)
        assert sorted(first for _, _, first in rows) == list(range(0, block_m, 64))
        for group, wave, first in rows:
            assert first == 64 * group + math.wave_row(wave)
            assert math.wave_row(wave) == exercise(11).reference().wave_offset(wave, math.warpgroups)


def test_12_overlapping_shares_count_a_block_twice(rng):
    """Rank 1 starting one block early: every element of D counts that K block twice, so D is written everywhere
    and wrong everywhere; the balance check names the overlap too."""
    ex = exercise(12)
    m, n, k = ex.shapes_cpu[0]
    assert lessons_stage(12).config(m, n, k).split_k == 2 and k // 128 == 7  # shares of 3 and 4 blocks
    wrong = SimpleNamespace(k_share=lambda rank, split, blocks: (max(rank * blocks // split - 1, 0),
                                                                 (rank + 1) * blocks // split))
    problem = random_problem(m, n, k, rng)
    d = ex.build(wrong).run_cpu(*problem)
    assert not np.isnan(d).any() and calc_diff(d, reference_gemm(*problem)) > 1e-3
    from lessons.grading.technique import exercise_checks
    (rule,) = exercise_checks(ex, wrong)
    assert not rule["passed"] and "in rank order" in rule["detail"], rule["detail"]


def test_12_lopsided_shares_are_right_but_not_the_technique(rng):
    """Rank 0 takes all but the last block: D is right (the correctness checks pass) and the cluster waits on
    rank 0 for nearly the whole K loop: the technique check fails, naming the lengths."""
    ex = exercise(12)
    lopsided = SimpleNamespace(k_share=lambda rank, split, blocks: (0, blocks - split + 1) if rank == 0
                               else (blocks - split + rank, blocks - split + rank + 1))
    for shape in ex.shapes_cpu:
        check_correct(ex.build(lopsided), *shape, rng)
    from lessons.grading.technique import exercise_checks
    (rule,) = exercise_checks(ex, lopsided)
    assert not rule["passed"] and "lengths [3, 1]" in rule["detail"], rule["detail"]


def test_12_a_rule_right_only_where_small_cases_are_checked_is_caught():
    """A red-team find: shares right for small splits and K block counts, overlapping beyond (wrong D at any K of
    70 blocks or more). The balance check draws large cases at random each time, so no table of them passes."""
    ex = exercise(12)

    def k_share(rank, split, blocks):
        if blocks < 70:
            return rank * blocks // split, (rank + 1) * blocks // split
        return (0, blocks) if rank == 0 else (blocks - 1, blocks)
    from lessons.grading.technique import exercise_checks
    for _ in range(3):
        (rule,) = exercise_checks(ex, SimpleNamespace(k_share=k_share))
        assert not rule["passed"] and "in rank order" in rule["detail"], rule["detail"]


def test_12_shares_no_kernel_can_run_are_refused(rng):
    """An empty share (the K loop runs its body at least once), one past the tile's K blocks (TMA would be asked
    for them) or not a pair of ints: a clear error naming the seam, before anything runs."""
    ex = exercise(12)
    for bad in (lambda rank, split, blocks: (rank, rank),  # empty
                lambda rank, split, blocks: (rank * blocks // split, (rank + 1) * blocks // split + 1),  # past Kb
                lambda rank, split, blocks: (rank * blocks / split, (rank + 1) * blocks / split),  # floats
                lambda rank, split, blocks: [rank * blocks // split, (rank + 1) * blocks // split]):  # a list
        with pytest.raises(ValueError, match="k_share"):
            ex.build(SimpleNamespace(k_share=bad)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


def test_12_k_share_is_what_the_kernel_computes(rng):
    """config.k_share (what the figure draws and the exercise's reference) and the generator's own PTX arithmetic
    agree: the kernel with the table in place of its arithmetic computes the same D bit for bit, and the default
    kernel is the arithmetic one (no table)."""
    from gemm.kernel import generate
    from gemm.kernel.config import k_share
    from gemm.kernel.seams import NO_SEAMS, Seams
    from gemm.testing.emulated import run_gemm
    m, n, k = 5, 72, 896
    config = lessons_stage(12).config(m, n, k).replace(stages=2)
    assert config.split_k == 2
    assert "k_share_table" not in generate(config, n, k) and "k_share_table" in generate(config, n, k,
                                                                                         Seams(k_share=k_share))
    problem = random_problem(m, n, k, rng)
    own, tabled = (run_gemm(config, *problem, sm_count=4, seams=seams) for seams in (NO_SEAMS, Seams(k_share=k_share)))
    assert np.array_equal(own, tabled)
    for split in (2, 4, 8):
        for blocks in range(split, 40):
            shares = [k_share(rank, split, blocks) for rank in range(split)]
            assert [first for first, _ in shares[1:]] == [end for _, end in shares[:-1]]
            assert shares[0][0] == 0 and shares[-1][1] == blocks
            assert {end - first for first, end in shares} <= {blocks // split, -(-blocks // split)}


def lessons_stage(number):
    import lessons
    return lessons.stage(number)


# -- the seams change nothing by default --------------------------------------------------------------------
def test_seams_are_byte_identical_by_default():
    """Seams are an argument, part of the cache key: the generator's own answers give its own PTX, a table gives
    another kernel, and the default is never served a kernel built with someone's function."""
    import lessons
    from gemm.kernel import generate
    from gemm.kernel.seams import NO_SEAMS, Seams
    from gemm.kernel.tile_scheduler import tile_coords
    m, n, k = 1000, 2112, 512
    for stage in (7, 8, 9):
        config = lessons.stage(stage).config(m, n, k)
        default = generate(config, n, k)
        own = Seams(empty_arrivals=lambda multicast, warps: multicast * warps, producer_warpgroup=lambda wgs: wgs)
        assert generate(config, n, k, own) == default
        assert generate(config, n, k, Seams(tile_coords=tile_coords, rows=m)) != default  # a table instead
        assert generate(config, n, k) == default == generate(config, n, k, NO_SEAMS)
    config = lessons.stage(11).config(m, n, k)  # 256-row tiles: the wave offsets are a seam too
    default = generate(config, n, k)
    assert generate(config, n, k, Seams(wave_offset=lambda wave, warpgroups: 64 * warpgroups * wave)) == default
    assert generate(config, n, k, Seams(wave_offset=lambda wave, warpgroups: 64 * wave)) != default
    assert generate(config, n, k) == default == generate(config, n, k, NO_SEAMS)
    six = lessons.stage(6)
    plan = six.Plan(4096, 4096, 7168)
    own = (lambda i, s: (i % s, i // s % 2), lambda i, s: i // s % 2 ^ 1)
    assert six.generate_for(plan, own) == six.generate(4096, 4096, 7168)


def test_the_generator_imports_nothing_of_the_course():
    import ast
    from pathlib import Path
    for path in sorted((Path(__file__).resolve().parent.parent / "gemm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(name.split(".")[0] == "lessons" for name in names), f"{path} imports {names}"


def test_09_too_few_arrivals_are_caught(rng):
    """One arrival short: the phase completes before the last warp of the pair has released the stage, and that
    warp's arrive lands in a phase that is already full; the emulator stops there ("more arrivals than the
    barrier's count in one phase"). Were it to run on, the early refill would show as a wrong result."""
    from gemm.fp8 import calc_diff
    from gemm.testing.problems import reference_gemm
    ex = exercise(9)
    wrong = SimpleNamespace(empty_arrivals=lambda multicast, warps: multicast * warps - 1)
    problem = random_problem(*ex.shapes_cpu[0], rng)
    try:
        d = ex.build(wrong).run_cpu(*problem)
    except EmulationError as error:
        assert "more arrivals than the barrier's count" in str(error)
        return
    assert np.isnan(d).any() or calc_diff(d, reference_gemm(*problem)) > 1e-3, \
        "a stage released one arrival early went unnoticed"


def test_08_the_students_raster_is_one_uniform_constant_load_per_tile():
    """The seam keeps the student's tile map as a .const table (ld.const, a uniform ULDC from bank 3 in SASS), not
    a compare-and-select per tile of the grid: that chain cost 15% at 4096 x 4096 x 7168 on the H100."""
    ex = exercise(8)
    candidate = ex.build(ex.reference())
    texts = [i.text for i in candidate.sass()]
    assert any(t.startswith("ULDC") and "c[0x3]" in t for t in texts), "no uniform constant-bank load"
    m, n, k = candidate.sass_shape
    tiles = -(-m // 128) * -(-n // 128)
    assert sum(t.split()[0].startswith("ISETP") for t in texts) < tiles, "a compare per tile is back"


def test_const_tables_are_declared_once_and_emulated():
    from ptx.builder import KernelBuilder, module
    from ptx.emulate.common import Program
    kb = KernelBuilder("k", [("u64", "out")])
    assert kb.const_table("t", [1, 2, 3]) == kb.const_table("t", [1, 2, 3]) == "t"
    with pytest.raises(ValueError, match="twice"):
        kb.const_table("t", [4])
    kb.emit("ret;")
    program = Program(module([kb]), "k")
    assert program.constants["t"].tolist() == [1, 2, 3]


def test_13_broadcasting_a_lane_s_own_value_is_wrong(rng):
    """A lane's own fragment row (or its lane index) broadcast from lane 0: every lane reads lane 0's scales and
    stores to its rows, so D is wrong (or the run stops: a release meant for lane 0 comes from every lane)."""
    ex = exercise(13)
    problem = random_problem(*ex.shapes_cpu[0], rng)
    for wrong in (("fragment_row", "warpgroup_offset"), ("lane",)):
        try:
            d = ex.build(SimpleNamespace(warp_uniform=lambda values, w=wrong: w)).run_cpu(*problem)
        except EmulationError:
            continue
        assert calc_diff(np.nan_to_num(d, nan=1e30), reference_gemm(*problem)) > 1e-3, wrong


def test_13_no_broadcast_is_right_but_not_the_technique(rng):
    """Nothing broadcast (stage 12's kernel): D is right, and the technique check counts the R2UR left in the K loop;
    the warp index broadcast besides the offset is harmless (it is warp-uniform) and passes. The stub the grader
    builds for "nothing written" broadcasts nothing, so SHFL is the student's doing, graded."""
    from lessons.grading.technique import stub_candidate, technique_checks
    ex = exercise(13)
    nothing = SimpleNamespace(warp_uniform=lambda values: ())
    check_correct(ex.build(nothing), *ex.shapes_cpu[0], rng)
    stub = stub_candidate(ex)
    checks = {c["name"]: c for c in technique_checks(ex, ex.build(nothing), stub)}
    assert not checks["uniform descriptors"]["passed"] and "R2UR" in checks["uniform descriptors"]["detail"]
    assert checks["uses SHFL"]["graded"] and not checks["uses SHFL"]["passed"]
    harmless = SimpleNamespace(warp_uniform=lambda values: ("warp", "warpgroup_offset"))
    checks = {c["name"]: c for c in technique_checks(ex, ex.build(harmless), stub)}
    assert checks["uniform descriptors"]["passed"] and checks["uses SHFL"]["passed"], checks


def test_13_names_no_kernel_has_are_refused(rng):
    """Unknown names, repeats, or not a sequence of strings: a clear error naming the seam, before anything runs."""
    ex = exercise(13)
    for bad in (lambda values: ("tid",), lambda values: ("warp", "warp"), lambda values: "warpgroup_offset",
                lambda values: (1,)):
        with pytest.raises(ValueError, match="warp_uniform"):
            ex.build(SimpleNamespace(warp_uniform=bad)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


@pytest.mark.parametrize("wrong", [lambda stage, parity, stages: (stage, parity),  # the stage just released
                                   lambda stage, parity, stages: ((stage + 1) % stages, parity)])  # never flips
def test_14_a_test_of_the_wrong_phase_skips_a_wait_it_needed(rng, wrong):
    """Naming the released stage (always complete) or forgetting the flip on the wrap: the test vouches for a stage
    the producer may not have filled. Whether the run shows it depends on the schedule (how far ahead the producer
    is); under the emulator's first three schedules some run ends with a wrong D or a deadlock, and the rule check,
    which does not depend on luck, names the first wrong answer."""
    from gemm.kernel.seams import Seams
    from gemm.testing.emulated import run_gemm
    from lessons.grading.technique import exercise_checks
    m, n, k = 300, 256, 1024
    config = lessons_stage(14).config(m, n, k).replace(stages=2)
    problem = random_problem(m, n, k, rng)
    caught = []
    for seed in range(3):
        try:
            d = run_gemm(config, *problem, sm_count=2, seams=Seams(next_full=wrong), seed=seed)
            caught.append(calc_diff(np.nan_to_num(d, nan=1e30), reference_gemm(*problem)) > 1e-3)
        except EmulationError as error:
            caught.append("deadlock" in str(error))
    assert any(caught)
    (rule,) = exercise_checks(exercise(14), SimpleNamespace(next_full=wrong))
    assert not rule["passed"] and "the next K block waits on slot" in rule["detail"], rule["detail"]


def test_14_answers_naming_no_barrier_are_refused(rng):
    """A slot outside the ring, a parity of 2, not a pair of ints: a clear error naming the seam, before any run."""
    ex = exercise(14)
    for bad in (lambda stage, parity, stages: (stages, parity), lambda stage, parity, stages: (0, 2),
                lambda stage, parity, stages: [(stage + 1) % stages, parity], lambda stage, parity, stages: 1):
        with pytest.raises(ValueError, match="next_full"):
            ex.build(SimpleNamespace(next_full=bad)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


@pytest.mark.parametrize("wrong", [lambda register, lane: 8 * (register // 4) + 2 * (lane % 4) + (register // 2) % 2,
                                   lambda register, lane: 8 * (register // 4) + lane % 8])  # row pairs; lane // 4 lost
def test_15_another_tokens_scale_is_a_wrong_d_and_the_rule_names_it(rng, wrong):
    """Scaling a token's partial sums by another token's scales: D is wrong at every graded tile width wherever
    neighbouring tokens' scales differ (here by construction: random_problem's row magnitudes may repeat, and two
    tokens of one magnitude have scales within ~10%, a D the diff may pass); the rule check, which does not depend
    on the data, names the first wrong (register, lane)."""
    from gemm.fp8 import per_block_cast_to_fp8, per_token_cast_to_fp8, sa_to_mn_major
    from lessons.grading.technique import exercise_checks
    ex = exercise(15)
    for m, n, k in ex.shapes_cpu:
        tokens = rng.standard_normal((m, k), dtype=np.float32) * np.exp2(np.arange(m) % 4 - 2)[:, None]
        a, sa = per_token_cast_to_fp8(tokens.astype(np.float32))
        b, sb = per_block_cast_to_fp8(rng.standard_normal((n, k), dtype=np.float32))
        problem = (a, sa_to_mn_major(sa), b, sb)
        d = ex.build(SimpleNamespace(token_column=wrong)).run_cpu(*problem)
        assert not np.isnan(d).any() and calc_diff(d, reference_gemm(*problem)) > 1e-3  # the grader's limit
    (rule,) = exercise_checks(ex, SimpleNamespace(token_column=wrong))
    assert not rule["passed"] and "that accumulator holds token" in rule["detail"], rule["detail"]


def test_15_answers_naming_no_token_are_refused(rng):
    """A column past the tile's tokens, a negative one, a float, a numpy integer: a clear error naming the seam,
    before any run; and the seam is refused on a tile that is not swapped."""
    from gemm.kernel.seams import Seams
    from gemm.testing.emulated import run_gemm
    ex = exercise(15)
    for bad in (lambda register, lane: 8 * (register // 4) + 2 * (lane % 4) + register % 2 + 8,
                lambda register, lane: -1, lambda register, lane: 0.0, lambda register, lane: np.int64(0)):
        with pytest.raises(ValueError, match="token_column"):
            ex.build(SimpleNamespace(token_column=bad)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))
    m, n, k = 64, 136, 256  # stage 15 swaps only where M <= 32
    with pytest.raises(ValueError, match="token_column seam .* not swapped"):
        run_gemm(lessons_stage(15).config(m, n, k), *random_problem(m, n, k, rng),
                 seams=Seams(token_column=ex.reference().token_column))


@pytest.mark.parametrize("wrong", ["times the split", "rows floored", "halved by the pair"])
def test_16_a_wrong_count_is_named_by_the_rule_and_changes_the_hint(wrong):
    """D does not depend on the count (only B's L2 priority does), so the rule check is what grades it: each wrong
    count is named with its config, and where it says more than one row the stage's kernel loses the hint."""
    import math
    ex = exercise(16)
    count = {"times the split": lambda m, n, k, bm, bn, split, pair: math.ceil(m / bm) * split,
             "rows floored": lambda m, n, k, bm, bn, split, pair: max(m // bm, 1),
             "halved by the pair": lambda m, n, k, bm, bn, split, pair: math.ceil(m / bm / pair)}[wrong]
    problems = ex.extra["checks"][0](SimpleNamespace(b_reads=count))
    assert len(problems) == 1 and "that walk loads each byte of B" in problems[0], problems
    assert ex.extra["checks"][0](ex.reference()) == []
    if wrong == "times the split":  # the stage's own (split) decode shape: the build refuses to take it
        with pytest.raises(ValueError, match="load each byte of B 1 time: its B loads would take the wrong L2"):
            ex.build(SimpleNamespace(b_reads=count)).config_of(*lessons_stage(16).SHAPE)
        assert ex.build(ex.reference()).config_of(*lessons_stage(16).SHAPE).b_eviction == "first"


def test_16_a_count_right_for_the_rule_check_only_is_refused_by_the_build(rng):
    """The red team's pass: right where the rule check asks (N = 4096, K = 7168, its public cases), 1 elsewhere.
    D is right whatever the count, so the build itself compares each count it uses with the kernel's own."""
    ex = exercise(16)

    def rule_check_only(m, n, k, block_m, block_n, split_k, multicast):
        return -(-m // block_m) if (n, k) == (4096, 7168) else 1
    solution = SimpleNamespace(b_reads=rule_check_only)
    assert ex.extra["checks"][0](solution) == []
    with pytest.raises(ValueError, match="graded kernel's tiles load each byte of B 2 times"):
        ex.build(solution).run_cpu(*random_problem(300, 136, 256, rng))


def test_16_answers_that_are_no_count_are_refused(rng):
    """Zero, a negative count, a float, a numpy integer, a string: a clear error naming the hole, before a kernel is
    built."""
    ex = exercise(16)
    for bad in (lambda *a: 0, lambda *a: -1, lambda *a: 1.0, lambda *a: np.int64(1), lambda *a: "1"):
        with pytest.raises(ValueError, match="b_reads"):
            ex.build(SimpleNamespace(b_reads=bad)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


@pytest.mark.parametrize("wrong", ["one peer", "rank 0 counted", "in floats"])
def test_18_a_wrong_inbox_count_is_named_by_the_rule_and_refused_by_the_build(wrong, rng):
    """A wrong count would deadlock the kernel or let rank 0 read its inbox early, so no graded kernel is built from
    one: the rule check names it, and the build refuses it at the stage's split over three on the CPU."""
    ex = exercise(18)
    count = {"one peer": lambda split, rows, columns: rows * columns * 4,
             "rank 0 counted": lambda split, rows, columns: split * rows * columns * 4,
             "in floats": lambda split, rows, columns: (split - 1) * rows * columns}[wrong]
    problems = ex.extra["checks"][0](SimpleNamespace(inbox_bytes=count))
    assert len(problems) == 1 and "rank 0's peers send" in problems[0], problems
    assert ex.extra["checks"][0](ex.reference()) == []
    with pytest.raises(ValueError, match="but the graded kernel's peers send"):
        ex.build(SimpleNamespace(inbox_bytes=count)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


def test_18_the_count_is_what_the_kernel_expects():
    """The reference's count is the bytes the generated kernel's rank 0 arrives with (its expect_tx on the inbox
    barrier), for the stage's split and the CPU's split over three."""
    import re

    from gemm.kernel import generate
    from lessons.exercises.ex18_inbox_bytes import _cpu_config
    ex = exercise(18)
    m, n, k = lessons_stage(18).SHAPE
    for config in (lessons_stage(18).config(m, n, k), _cpu_config(lessons_stage(18).config(m, n, k))):
        arrive = [line for line in generate(config, n, k).splitlines() if "expect_tx" in line and "[%inbox_bar" in line]
        assert len(arrive) == 1, arrive
        announced = int(re.search(r", (\d+);", arrive[0]).group(1))
        assert announced == ex.reference().inbox_bytes(config.split_k, config.block_m, config.block_n), config


def test_18_answers_that_are_no_count_are_refused(rng):
    """Zero, a negative count, a float, a numpy integer, a string, a bool: a clear error naming the hole, before a
    kernel is built by ``build`` (the grader's oracle converts a correct numpy integer to an int first)."""
    ex = exercise(18)
    for bad in (lambda *a: 0, lambda *a: -1, lambda *a: 8192.0, lambda *a: np.int64(8192), lambda *a: "8192",
                lambda *a: True):
        with pytest.raises(ValueError, match="inbox_bytes"):
            ex.build(SimpleNamespace(inbox_bytes=bad)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


@pytest.mark.parametrize("wrong", ["even shares", "lead unbounded", "peers round up"])
def test_19_wrong_shares_are_named_by_the_rule_and_refused_by_the_build(wrong, rng):
    """A wrong share would leave K blocks out, count them twice or read past K, so no graded kernel is built from
    one: the rule check names it, and the build refuses it at the stage's split over three on the CPU."""
    from gemm.kernel.config import k_share
    ex = exercise(19)

    def unbounded(rank, split, blocks, lead):  # rank 0 takes its lead even where a peer is left nothing
        first_end = blocks // split + lead
        rest = blocks - first_end
        return (0, first_end) if rank == 0 else (first_end + (rank - 1) * rest // (split - 1),
                                                 first_end + rank * rest // (split - 1))

    def rounded_up(rank, split, blocks, lead):  # the peers' shares rounded up, not down
        first_end = min(blocks // split + lead, blocks - split + 1)
        rest = blocks - first_end
        return (0, first_end) if rank == 0 else (first_end + -(-(rank - 1) * rest // (split - 1)),
                                                 first_end + -(-rank * rest // (split - 1)))
    share = {"even shares": lambda rank, split, blocks, lead: k_share(rank, split, blocks),
             "lead unbounded": unbounded, "peers round up": rounded_up}[wrong]
    problems = ex.extra["checks"][0](SimpleNamespace(lead_share=share))
    assert len(problems) == 1 and "that rank computes K blocks" in problems[0], problems
    assert ex.extra["checks"][0](ex.reference()) == []
    if wrong != "lead unbounded":  # the graded shapes leave every peer a block: only the rule check sees that one
        with pytest.raises(ValueError, match="but the graded kernel's rank"):
            ex.build(SimpleNamespace(lead_share=share)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


def test_19_the_shares_are_what_the_kernel_computes():
    """The reference's shares are the ones the generated kernel's PTX computes for each rank (its k_first and k_end,
    evaluated with u32 arithmetic as the PTX does), for the stage's split and the CPU's split over three."""
    from lessons.exercises.ex19_lead_shares import _cpu_config
    ex = exercise(19)
    m, n, k = lessons_stage(19).SHAPE
    for config in (lessons_stage(19).config(m, n, k), _cpu_config(lessons_stage(19).config(m, n, k))):
        assert config.split_k_lead == 2, config.describe()
        blocks = -(-k // 128)
        shares = [ex.reference().lead_share(rank, config.split_k, blocks, 2) for rank in range(config.split_k)]
        assert shares[0] == (0, blocks // config.split_k + 2) and shares[-1][1] == blocks
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))


def test_19_answers_that_are_no_share_are_refused(rng):
    """None, a list, floats, numpy integers, a triple: a clear error naming the hole, before a kernel is built."""
    ex = exercise(19)
    for bad in (lambda *a: None, lambda *a: [0, 5], lambda *a: (0.0, 5.0), lambda *a: (np.int64(0), np.int64(5)),
                lambda *a: (0, 5, 1)):
        with pytest.raises(ValueError, match="lead_share"):
            ex.build(SimpleNamespace(lead_share=bad)).run_cpu(*random_problem(*ex.shapes_cpu[0], rng))


@pytest.mark.parametrize("wrong", ["no width bound", "no fit check", "one-wave tiles", "rows up to 64"])
def test_20_wrong_rules_are_named_by_the_rule_check_and_refused_by_the_build(wrong, rng):
    """Any tiles compute D right, so no graded kernel is built from tiles that are not the rule's: the rule check
    names the first case a wrong rule gets wrong, and the build refuses it where it differs at a graded shape."""
    ex = exercise(20)
    right = ex.reference().pair_tiles

    def no_width_bound(m, n, sms, one_wave, half_wave):
        return right(m, n, sms, (one_wave[0], 8), half_wave)

    def no_fit_check(m, n, sms, one_wave, half_wave):
        inside = 32 < m <= 128 and sms >= 2 and one_wave[1] <= 32
        return tuple(half_wave) if inside else None

    def one_wave_tiles(m, n, sms, one_wave, half_wave):
        return None if right(m, n, sms, one_wave, half_wave) is None else tuple(one_wave)

    def rows_up_to_64(m, n, sms, one_wave, half_wave):
        return right(m, n, sms, one_wave, half_wave) if m <= 64 else None
    rule = {"no width bound": no_width_bound, "no fit check": no_fit_check, "one-wave tiles": one_wave_tiles,
            "rows up to 64": rows_up_to_64}[wrong]
    problems = ex.extra["checks"][0](SimpleNamespace(pair_tiles=rule))
    assert len(problems) == 1 and "the rule gives" in problems[0], problems
    assert ex.extra["checks"][0](ex.reference()) == []
    refused_at = [shape for shape in ex.shapes_cpu
                  if rule(shape[0], shape[1], ex20.CPU_SMS, *ex20.model_answers(*shape, ex20.CPU_SMS))
                  != right(shape[0], shape[1], ex20.CPU_SMS, *ex20.model_answers(*shape, ex20.CPU_SMS))]
    for shape in refused_at:
        with pytest.raises(ValueError, match="but the graded kernel takes"):
            ex.build(SimpleNamespace(pair_tiles=rule)).run_cpu(*random_problem(*shape, rng))
    if wrong in ("one-wave tiles", "rows up to 64"):  # the CPU shapes tell these apart from the rule
        assert refused_at


def test_20_the_stage_is_productions_config_but_for_what_it_leaves_out():
    """Where stage 20 narrows, its config is production's (tiles, split, push, lead, walk, ring, B's L2 hint) but for
    the three things the docstring says production adds: two K blocks in flight, PDL, and no FFMA pass. Exercise
    20's CPU build uses the same ``paired``."""
    from gemm.heuristics import H100, choose_config
    narrowed = 0
    for m in (33, 48, 64, 65, 100, 128):
        for n in (576, 1024, 2112, 4096, 7168):
            for k in (4096, 7168):
                tiles = lessons_stage(20).narrowed(m, n, k)
                production = choose_config(m, n, k, H100)
                if tiles is None:
                    assert lessons_stage(20).config(m, n, k) == lessons_stage(19).config(m, n, k)
                    continue
                narrowed += 1
                ours = lessons_stage(20).config(m, n, k)
                assert ours.replace(accumulators=production.accumulators, pdl=production.pdl,
                                    post_passes=production.post_passes) == production, (m, n, k)
    assert narrowed > 20
    assert lessons_stage(20).narrowed(16, 2112, 7168) is None  # swapped: stage 19's
    assert lessons_stage(20).config(4096, 4096, 7168) == lessons_stage(19).config(4096, 4096, 7168)


def test_20_answers_that_are_no_tiles_are_refused(rng):
    """A list, floats, numpy integers, a triple, a string: a clear error naming the hole, before a kernel is built."""
    ex = exercise(20)
    for bad in (lambda *a: [128, 56], lambda *a: (128.0, 56.0), lambda *a: (np.int64(128), np.int64(56)),
                lambda *a: (128, 56, 2), lambda *a: "128x56"):
        with pytest.raises(ValueError, match="pair_tiles"):
            ex.build(SimpleNamespace(pair_tiles=bad)).run_cpu(*random_problem(*ex.shapes_cpu[1], rng))


def test_the_stages_that_count_sms_follow_set_num_sms():
    """Stages 12, 15 and 20 choose their split and tiles for the device's SMs; an answer cached for one SM count
    must not be served after set_num_sms caps it (a review found stage 20's, and these two, keyed by shape only)."""
    from gemm.heuristics import set_num_sms
    full = {number: lessons_stage(number).config(*shape) for number, shape in
            ((12, (16, 2112, 7168)), (15, (16, 2112, 7168)), (20, (64, 2112, 7168)))}
    try:
        set_num_sms(40)
        capped = {number: lessons_stage(number).config(*shape) for number, shape in
                  ((12, (16, 2112, 7168)), (15, (16, 2112, 7168)), (19, (64, 2112, 7168)), (20, (64, 2112, 7168)))}
    finally:
        set_num_sms(None)
    assert full[12].split_k == 2 and capped[12].split_k == 1  # 33 tiles: 66 CTAs do not fit 40 SMs
    assert full[15].split_k == 2 and capped[15].split_k == 1
    assert (full[20].block_m, full[20].block_n) == (64, 32) and capped[20] == capped[19]  # 66 pairs > 40 SMs
