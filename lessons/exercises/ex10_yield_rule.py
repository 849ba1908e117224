"""Exercise 10: the yield-bit rule of the FFMA interleave pass.

Hole: ``select_flips(run) -> list of FFMAs``: which FFMAs of one run of >= 8 consecutive promotion FFMAs get the
yield bit (and lose their Rb-reuse bit). The seam: :func:`gemm.kernel.launch.cubin` runs
:func:`ptx.passes.interleave_ffma` with the seam ``ffma_rule`` (:mod:`gemm.kernel.seams`) as the rule (``choose_flips`` takes a callable and
refuses instructions outside the run). Graded on the real cubin (assembled on the CPU): the flips must be
exactly the FFMAs DeepGEMM's rule picks (the prompt states it), the patch verified (same instruction count, same
text but ``.reuse``, only the two flag bits changed, nvdisasm accepts it); on the GPU the result must be
numerically identical. The PTX, and so the emulator's answer, does not depend on the rule.
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise

STAGE = 10
PROMPT = """\
Stage 10 edits the assembled cubin. In a run of n >= 8 consecutive FFMAs (the promotion: total += scale *
accumulator), some FFMAs get the *yield* bit, so the warp scheduler may switch to the other math warpgroup there
and its WGMMAs overlap our FFMAs. A yielding warp cannot keep the operand reuse cache, so a flipped FFMA also
loses its Rb-reuse bit. DeepGEMM's rule, which stage 10 uses:
  * look only at the first floor(9 n / 16) FFMAs of the run, in order;
  * an FFMA is flipped if it has the Rb-reuse bit and a register Rb, and either its Rb was not seen before in
    the run, or the previous FFMA kept its reuse bit with the same Rb;
  * a flipped FFMA counts as "no reuse" for the next step; every FFMA's Rb counts as seen.

Fill in, in your copy of lessons/exercises/skeletons/ex10_yield_rule.py:
  * select_flips(run) -> list: the FFMAs of `run` (a list of ptx.sass.Instruction, consecutive FFMAs of one
    function) to flip, in order. Helpers: ptx.passes.reuse_b(ins.encoding), ptx.passes.second_source_register(
    ins.text), ptx.passes.is_yield.
The cubin pass (ptx/passes.py interleave_ffma) flips exactly the instructions you return."""

QUESTIONS = (
    ("Predict: how many FFMAs does the rule flip in a run of 32 whose Rb alternates between two registers, every "
     "one with its reuse bit?",
     "check with `python -m lessons inspect 10` (the FFMA listing) and ptx.passes.interleave_ffma's report"),
    ("Predict: does the pass change the instruction count, or any instruction's text other than `.reuse`?",
     "check with `python -m lessons diff 9 10` (the SASS diff: only FFMA control bits)"),
    ("Predict: can the pass change D?",
     "check with the emulator (the PTX of stages 09 and 10 is the same) and, on a GPU, the grader's comparison"),
)


def reference():
    from ptx.passes import choose_flips
    return SimpleNamespace(select_flips=lambda run: choose_flips(run, "deepgemm"))


def check_rule(solution, image, kernel: str) -> None:
    """Raise AssertionError where ``solution.select_flips`` picks other FFMAs than the stage's rule in a run of
    ``image`` (the un-passed cubin), or where the patched cubin fails verification."""
    from ptx.passes import choose_flips, ffma_runs, interleave_ffma
    from ptx.sass import disassemble
    listing = [i for i in disassemble(image) if i.function == kernel]
    runs = ffma_runs(listing)
    if not runs:
        raise AssertionError("the cubin has no FFMA run to grade the rule on")
    for run in runs:
        mine = [i.offset for i in choose_flips(run, solution.select_flips)]  # refuses picks outside the run
        want = [i.offset for i in choose_flips(run, "deepgemm")]
        if mine != want:
            raise AssertionError(f"run at {kernel}+{run[0].offset:#x} ({len(run)} FFMAs): your rule flips "
                                 f"{[hex(x) for x in mine]}, the stage's rule flips {[hex(x) for x in want]}")
    interleave_ffma(image, kernel, rule=solution.select_flips)  # verify_patch: count, text, bits, nvdisasm


class Stage10Candidate:
    def __init__(self, solution):
        import lessons
        from lessons.exercises.holed import HoledKernel
        stage = lessons.stage(STAGE)
        self.solution, self._checked = solution, False

        self.kernel = HoledKernel(stage.config, lambda m, n, k: dict(ffma_rule=solution.select_flips),
                                  cpu_stages=2, sass_shape=(4096, 4096, 7168), check=self.check,
                                  sm_count_cpu=4)

    def check(self) -> None:
        if self._checked:
            return
        from gemm.kernel import generate
        from gemm.kernel.generator import KERNEL
        from ptx.compile import compile_ptx
        m, n, k = self.kernel.sass_shape
        config = self.kernel.config_of(m, n, k)
        check_rule(self.solution, compile_ptx(generate(config, n, k)), KERNEL)
        self._checked = True

    def run_cpu(self, a, sa, b, sb):
        return self.kernel.run_cpu(a, sa, b, sb)

    def run_gpu(self, a, sa, b, sb, d, stream=None) -> None:
        self.kernel.run_gpu(a, sa, b, sb, d, stream)

    def sass(self):
        return self.kernel.sass()

    def resources(self) -> dict:
        return self.kernel.resources()


def build(solution) -> Stage10Candidate:
    return Stage10Candidate(solution)


EXERCISE = Exercise(
    stage=STAGE,
    name="yield_rule",
    objective="Choose which promotion FFMAs yield so one math warpgroup's FFMAs overlap the other's WGMMAs, and "
              "patch a real cubin safely.",
    prompt=PROMPT,
    holes=("select_flips",),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("FFMA", "QGMMA", "UTMALDG", "UCGABAR"),
    shapes_cpu=((200, 200, 384), (130, 264, 512)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    hole_kinds={"select_flips": "sass_run"},
    answer_sites={"ptx/passes.py": ("_select_deepgemm", "_select_every_other", "_SELECT", "choose_flips")},
)
