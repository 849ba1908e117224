"""ptx.emulate.run_stage and the "break it" edits of ptx.emulate.breaks (CPU): each edit of a generated kernel's
PTX is caught with the right report, deadlock, missing fence.proxy.async, accumulator read before
wgmma.wait_group, or (a wrong swizzle, copies waited for too early) a wrong result; the fence model on a
hand-written kernel; the notebook cells of lessons/notebooks/emulator.py compile.

The intact stages on the emulator are tested at many shapes elsewhere, through the same launch code:
tests/test_stage04.py, test_stage05.py, test_stage06.py (``test_emulated_kernel_*``) and tests/test_generator.py
(``test_configs_on_the_emulator_*``, every generator config). Here each runs once through run_stage, the
learner-facing entry point, to check the report of a clean run."""

import numpy as np
import pytest

import lessons
from gemm.fp8 import calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from ptx.emulate import EmulationError, FakeTensorMap, breaks, run_kernel, run_stage

SMALL = (64, 64, 256)
RING = (64, 64, 1152)  # 9 K blocks, more than any stage count: the producer waits on an "empty" barrier


def problem(shape, seed=0):
    return random_problem(*shape, np.random.default_rng(seed))


def diff(out, p):
    return calc_diff(out, reference_gemm(*p))


# ------------------------------------------------------------------------------ intact, through run_stage
@pytest.mark.parametrize("number, executor", [(4, "lockstep"), (5, "warpgroups"), (6, "warpgroups"),
                                              (8, "warpgroups")])
def test_intact_stage_completes_and_matches_the_reference(number, executor):
    p = problem((70, 136, 384))
    out, report = run_stage(lessons.stage(number), *p)
    assert report.ok and report.verdict == "completed" and not report.changes, report
    assert [run["executor"] for run in report.runs] == [executor] and report.runs[0]["steps"] > 0
    assert np.isfinite(out).all() and diff(out, p) < 1e-5
    assert "COMPLETED" in str(report)


# ------------------------------------------------------------------------------ a wrong mbarrier parity
@pytest.mark.parametrize("number", [6, 7, 9])  # inline producer, producer warpgroup, 2-CTA clusters
def test_wrong_parity_deadlocks_at_once(number):
    out, report = run_stage(lessons.stage(number), *problem(RING), edit=breaks.flip_parity)
    assert out is None and report.verdict == "deadlock", report
    assert report.seconds < 1, report.seconds
    (removed, added) = report.changes
    assert removed[1] == "-" and removed[2].strip().endswith(", 1;") and added[2].strip().endswith(", 0;")
    register = added[2].split()[1].rstrip(",")
    # the producer's wait, on the register the edit changed, is named with the phase it waits for
    assert f"{register}; (1 threads active" in report.error and "phase of parity 0" in report.error
    assert "deadlock in" in str(report) and "waits for mbarrier" in str(report)


# ------------------------------------------------------------------------------ a missing fence.proxy.async
def test_missing_fence_between_cp_async_and_wgmma():
    out, report = run_stage(lessons.stage(5), *problem(SMALL), edit=breaks.drop_proxy_fence)
    assert report.verdict == "missing fence.proxy.async", report
    assert [(sign, text.strip()) for _, sign, text in report.changes] == [("-", "fence.proxy.async.shared::cta;")]
    assert "wgmma.mma_async's A operand (the async proxy) reads" in report.error
    assert ": cp.async.cg.shared.global" in report.error  # the line that wrote the bytes


@pytest.mark.parametrize("number", [8, 9])
def test_missing_fence_between_stmatrix_and_the_tma_store(number):
    out, report = run_stage(lessons.stage(number), *problem(SMALL), edit=breaks.drop_proxy_fence)
    assert report.verdict == "missing fence.proxy.async", report
    assert "a TMA store (the async proxy) reads" in report.error and ": stmatrix.sync.aligned" in report.error


def fence_kernel(fence: str) -> str:
    """128 threads each write a word of a 4 x 32 f32 tile with st.shared; ``fence`` ("all", "all but 5",
    "none") execute fence.proxy.async; after bar.sync thread 0 stores the tile with TMA."""
    guard = {"all": "", "all but 5": "@%p0 ", "none": "// "}[fence]
    return f""".version 8.5
.target sm_90a
.address_size 64
.extern .shared .align 1024 .b8 smem[];
.visible .entry fenced(
    .param .align 64 .b8 fenced_param_tmap[128]
)
.maxntid 128, 1, 1
{{
.reg .b32 %r<8>;
.reg .b64 %rd<2>;
.reg .pred %p<2>;
mov.u32 %r0, %tid.x;
mov.u32 %r1, smem;
shl.b32 %r2, %r0, 2;
add.u32 %r2, %r2, %r1;
st.shared.b32 [%r2], %r0;
setp.ne.u32 %p0, %r0, 5;
{guard}fence.proxy.async.shared::cta;
bar.sync 0;
setp.ne.u32 %p1, %r0, 0;
@%p1 bra $done;
mov.b64 %rd0, fenced_param_tmap;
cvta.param.u64 %rd0, %rd0;
mov.u32 %r3, 0;
cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd0, {{%r3, %r3}}], [%r1];
cp.async.bulk.commit_group;
cp.async.bulk.wait_group.read 0;
$done:
ret;
}}
"""


def run_fenced(fence):
    out = np.zeros((4, 32), np.uint32)
    run_kernel(fence_kernel(fence), "fenced", (1,), 128, 1024,
               dict(tmap=FakeTensorMap(out, np.uint32, out.shape, 128, (4, 32), 0)))
    return out


def test_each_writer_must_fence_its_own_writes():
    np.testing.assert_array_equal(run_fenced("all").reshape(-1), np.arange(128))
    with pytest.raises(EmulationError, match=r"missing fence.proxy.async: a TMA store .* reads 512 bytes .* "
                                             r"offset 0, was written by thread 0 at line 17: st.shared.b32"):
        run_fenced("none")
    with pytest.raises(EmulationError, match=r"reads 4 bytes .* offset 20, was written by thread 5 "):
        run_fenced("all but 5")  # the others' fences do not cover thread 5's write


def test_fence_kernel_assembles_for_sm90a():
    from ptx.compile import compile_ptx
    assert "fenced" in compile_ptx(fence_kernel("all but 5"), assembler="nvjitlink").resources


# ------------------------------------------------------------------------------ wgmma waited for too late
@pytest.mark.parametrize("number", [5, 6, 8])
def test_reading_accumulators_before_wgmma_wait_group(number):
    out, report = run_stage(lessons.stage(number), *problem(SMALL), edit=breaks.read_accumulators_early)
    assert report.verdict == "accumulator read before wgmma.wait_group", report
    (removed, added) = report.changes
    assert removed[1] == "-" and added[1] == "+" and "wgmma.wait_group" in removed[2] == added[2]
    assert removed[0] < added[0]  # moved down
    line = int(report.error.split(":")[0].removeprefix("line "))
    assert removed[0] < line < added[0] and "fma.rn.f32" in report.error  # the read, between the two places
    assert "belongs to the wgmma.mma_async at line" in report.error


# ------------------------------------------------------------------------------ wrong answers
@pytest.mark.parametrize("number, edit", [(4, breaks.unswizzle_copies), (5, breaks.unswizzle_copies),
                                          (6, breaks.descriptor_swizzle_64b), (8, breaks.descriptor_swizzle_64b),
                                          (4, breaks.wait_for_fewer_copies)])
def test_wrong_swizzle_or_early_copies_give_a_wrong_result(number, edit):
    p = problem(SMALL)
    out, report = run_stage(lessons.stage(number), *p, edit=edit)
    assert report.ok and report.changes, report
    assert np.isfinite(out).all() and diff(out, p) > 0.1


def test_swizzle_edits_are_one_line_or_the_descriptor_constants():
    text = lessons.stage(5).generate(*SMALL)
    assert len(text.splitlines()) - len(breaks.unswizzle_copies(text).splitlines()) == 1
    swapped = breaks.descriptor_swizzle_64b(text)
    assert "0x8000004000010000;" in swapped and "4611686293305360384" not in swapped
    assert "4611686293305360384" in text  # 1 << 62 | SBO 1024 | LBO 16: the 128B swizzle


# ------------------------------------------------------------------------------ edits that cannot apply
@pytest.mark.parametrize("number, edit", [(4, breaks.flip_parity), (5, breaks.flip_parity),
                                          (4, breaks.read_accumulators_early), (4, breaks.drop_proxy_fence),
                                          (6, breaks.unswizzle_copies), (4, breaks.descriptor_swizzle_64b)])
def test_an_edit_with_nothing_to_break_says_so(number, edit):
    with pytest.raises(ValueError):
        run_stage(lessons.stage(number), *problem((8, 8, 128)), edit=edit)


def test_an_edit_that_changes_nothing_is_an_error():
    with pytest.raises(ValueError, match="changed nothing"):
        run_stage(lessons.stage(6), *problem((8, 8, 128)), edit=lambda text: text)


# ------------------------------------------------------------------------------ the notebook cells
@pytest.mark.parametrize("number", range(4, 11))
def test_notebook_cells_compile(number):
    from lessons.notebooks.emulator import break_it_cells, emulator_cells
    cells = emulator_cells(number) + break_it_cells(number)
    assert {cell["cell_type"] for cell in cells} == {"markdown", "code"}
    for cell in cells:
        if cell["cell_type"] == "code":
            compile(cell["source"], f"stage {number}", "exec")
