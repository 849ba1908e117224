"""Exercise 06: the barrier parity of the TMA + mbarrier ring (``lessons/06_tma_pipeline.py``).

Holes: ``pipeline_slot(iteration, stages) -> (stage, parity)`` and ``producer_wait_parity(iteration, stages)``,
the bookkeeping of :mod:`ptx.vocab.barriers`. The seam: the stage-06 emitter seeds its loop counters from them (the
consumer's (stage, parity) of K block 0, the producer's stage and empty-barrier parity of its first refill, the
stages of the prologue loads), through ``generate_for(plan, bookkeeping=...)``; the loop then advances the counters
(stage + 1, parity flipped on the wrap), so the functions must also agree with that advance for every iteration
(checked before the kernel runs, with the iteration that disagrees named).
"""
from __future__ import annotations

from types import SimpleNamespace

from lessons.exercises import Exercise

STAGE = 6
PROMPT = """\
Stage 06 keeps a ring of S shared-memory stages; K block i lives in one stage, guarded by a *full* mbarrier
(the TMA bytes landed) and an *empty* mbarrier (every math warp released it). An mbarrier does not count
uses: a waiter names the *parity* of the phase it waits for, and `mbarrier.try_wait.parity` returns once that
phase has completed. A fresh barrier is in phase 0, and waiting for parity 1 ("the phase before") returns at
once.

Fill in, in your copy of lessons/exercises/skeletons/ex06_barrier_parity.py:
  * pipeline_slot(iteration, stages) -> (stage, parity): the stage K block `iteration` uses and the parity of
    the full-barrier phase the consumers wait for before reading it;
  * producer_wait_parity(iteration, stages) -> parity: the parity of the empty-barrier phase the producer waits
    for before loading K block `iteration` into its stage (the release of the K block that used the stage
    before it).
The generator seeds its loop counters from your functions and advances them itself (stage + 1, wrapping at S;
parity flips on the wrap), so your functions must agree with that advance. Look at ptx/vocab/barriers.py's
docstring and the `mbarrier_wait_parity` helper, and at lessons/06_tma_pipeline.py's main_loop."""

QUESTIONS = (
    ("Predict: with S = 8 stages, which parity does the consumer wait for on K block 8, and which does the "
     "producer wait for before loading K block 6 (its first refill)?",
     "check with `python -m lessons inspect 6` (the `mov.u32 %p_parity` and `mbarrier.try_wait.parity` lines of "
     "the PTX) and ptx.vocab.barriers.pipeline_slot"),
    ("Predict: if the producer's first wait used parity 0 instead, would the kernel compute a wrong answer, "
     "hang, or still be right?",
     "check with the emulator: `lessons.stage(6).emulate(..., bookkeeping=(pipeline_slot, your_parity))` names "
     "the deadlocked wait (ptx.emulate.EmulationError)"),
    ("Predict: how many K blocks must K have before the ring wraps for a 64x64 block (S = 8, ahead = S - 2)?",
     "check with `python -m lessons inspect 6` (the stage count) and the emulator at K = 1024 vs 1152"),
)


def reference():
    from ptx.vocab import barriers
    return SimpleNamespace(pipeline_slot=barriers.pipeline_slot, producer_wait_parity=barriers.producer_wait_parity)


def check_bookkeeping(solution, stages_range=range(3, 9), iterations: int = 40) -> None:
    """Raise AssertionError where the functions disagree with the kernel's counters (stage + 1, wrapping at S,
    parity flipping on the wrap) or with a fresh barrier's phase (a consumer's first wait must be for phase 0)."""
    from ptx.vocab.barriers import advance
    for stages in stages_range:
        first = tuple(solution.pipeline_slot(0, stages))
        if first[1] != 0:
            raise AssertionError(f"pipeline_slot(0, {stages}) = {first}: the first use of a stage must wait for the "
                                 "full barrier's phase 0 (a fresh barrier passes a parity-1 wait at once, before "
                                 "any byte has landed)")
        for i in range(iterations):
            now, nxt = tuple(solution.pipeline_slot(i, stages)), tuple(solution.pipeline_slot(i + 1, stages))
            want = advance(*now, stages)
            if nxt != want:
                raise AssertionError(f"pipeline_slot({i + 1}, {stages}) = {nxt}, but the kernel advances "
                                     f"pipeline_slot({i}, {stages}) = {now} to {want} (stage + 1, wrapping at S; "
                                     "the parity flips on the wrap)")
            p_now, p_next = solution.producer_wait_parity(i, stages), solution.producer_wait_parity(i + 1, stages)
            want_p = p_now ^ (1 if want[0] == 0 else 0)
            if p_next != want_p:
                raise AssertionError(f"producer_wait_parity({i + 1}, {stages}) = {p_next}, but the kernel's producer "
                                     f"parity goes from producer_wait_parity({i}, {stages}) = {p_now} to {want_p} "
                                     "(it flips when the producer's stage wraps)")


class Stage06Candidate:
    """lessons/06_tma_pipeline.py's own kernel with the student's bookkeeping plugged in."""

    SASS_SHAPE = (256, 512, 1152)

    def __init__(self, solution):
        self.solution = solution
        self._kernels: dict = {}
        self._cubin = None

    def _bookkeeping(self) -> tuple:
        return self.solution.pipeline_slot, self.solution.producer_wait_parity

    def _ptx(self, m: int, n: int, k: int) -> str:
        import lessons
        stage = lessons.stage(6)
        return stage.generate_for(stage.Plan(m, n, k), self._bookkeeping())

    def run_cpu(self, a, sa, b, sb):
        import lessons
        check_bookkeeping(self.solution)
        return lessons.stage(6).emulate(a, sa, b, sb, bookkeeping=self._bookkeeping())

    def run_gpu(self, a, sa, b, sb, d, stream=None) -> None:
        import lessons
        from gemm.validate import check_gemm_args
        from ptx.compile import compile_ptx
        from ptx.runtime import load_kernel
        stage = lessons.stage(6)
        args = check_gemm_args(a, sa, b, sb, d)
        m, n, k = args.m, args.n, args.k
        if (m, n, k) not in self._kernels:
            stage._check_shape(m, n, k)
            self._kernels[m, n, k] = load_kernel(compile_ptx(self._ptx(m, n, k)), stage.KERNEL)
        plan = stage.Plan(m, n, k)
        maps = stage._tensor_maps(args.a.ptr, args.b.ptr, args.sa.ptr, m, n, k, args.sa_stride)
        self._kernels[m, n, k].launch(plan.grid, plan.threads, [*maps, args.sb.ptr, args.d.ptr],
                                      shared_bytes=plan.shared_bytes, stream=stream, device=args.device)

    def cubin(self):
        from ptx.compile import compile_ptx
        if self._cubin is None:
            self._cubin = compile_ptx(self._ptx(*self.SASS_SHAPE))
        return self._cubin

    def sass(self):
        import lessons
        from ptx.sass import disassemble
        check_bookkeeping(self.solution)
        return disassemble(self.cubin(), lessons.stage(6).KERNEL)

    def resources(self):
        return next(iter(self.cubin().resources.values()))


def build(solution) -> Stage06Candidate:
    return Stage06Candidate(solution)


EXERCISE = Exercise(
    stage=STAGE,
    name="barrier_parity",
    objective="Derive which mbarrier phase parity a consumer and a producer wait for at any iteration of an "
              "S-stage TMA ring, and see a wrong one deadlock.",
    prompt=PROMPT,
    holes=("pipeline_slot", "producer_wait_parity"),
    questions=QUESTIONS,
    reference=reference,
    build=build,
    required_sass=("UTMALDG", "SYNCS", "QGMMA"),
    # ragged M and N; K = 9 and 10 K blocks > 8 stages: the ring wraps and the parities flip
    shapes_cpu=((70, 200, 1152), (130, 72, 1280)),
    shapes_gpu=((1000, 2112, 512), (4096, 4096, 7168)),
    perf_threshold=None,
    answer_sites={"ptx/vocab/barriers.py": ("advance", "pipeline_slot", "producer_wait_parity")},
)
