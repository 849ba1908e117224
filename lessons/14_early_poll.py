"""Stage 14 — the next stage's barrier, tested before the promotion instead of polled after it.

Per K block a math warpgroup waits for a stage's full barrier, runs its wgmmas, waits for them, releases the stage
(an arrive on its empty barrier) and promotes the partial sums into its FP32 totals: 64 FFMAs per wave at
256 x 128. Only then, at the top of the next K block, does it poll the next stage's full barrier
(``mbarrier.try_wait``): a round trip to the SM's barrier unit on the path from one K block's last FFMA to the
next K block's first wgmma, every K block, even when the data landed long ago.

The change: right after the release, step the ring and *test* the next stage's full barrier with
``mbarrier.test_wait`` (:func:`ptx.vocab.barriers.mbarrier_test_parity`), which does not block: it only says
whether that phase has completed. The promotion FFMAs, which need nothing from it, hide the test's latency; the
next K block branches past the blocking wait when the test said yes, and waits as before when it said no
(:meth:`gemm.kernel.generator._Kernel.k_loop`). In SASS the test is a ``SYNCS.PHASECHK.TRANS64`` without
``.TRYWAIT`` shortly after the release's arrive, with 52 of the last wave's 64 FFMAs still to come at the ladder's
shape (``python -m lessons inspect 14``; the figure 14_early_poll). DeepGEMM gets the same placement another way: its ring is unrolled by its stage count,
so ptxas hoists the next stage's wait into the FFMAs in two K blocks of three (found comparing its SASS with ours,
docs/benchmarks.md).

The test must name the right barrier *and* the right phase: the next slot, and the parity that slot's next full
phase will have, which flips when the ring wraps (exercise 14). Name the stage just released, or a parity one
phase behind, and the test can say "full" for data that is not there: the wait is skipped, the warps read a stage
the producer has not filled, and the ring's bookkeeping falls out of step (wrong D, or a deadlock), whenever the
producer is not already far enough ahead: a race, which a run may or may not show.

The config is stage 13's plus ``early_poll=True`` (production's default). It moves no data and adds one
instruction per K block; what it saves is latency on the critical path between K blocks, so, like stage 13, it
shows where the math warpgroups are the limit, and it is small: the median over eight shapes is +1.0% and +0.7%
in the two config orders (``results/early_poll.json``, ``results/early_poll_reversed.json``), at the 1% the
notebooks call noise; no shape was slower by more than 0.4% except the first one timed, where the clock swung
8% either way. It is kept in production because it never measured a real loss; as a teaching stage it is a small
gain, taught as one.

Speed of light: the FP8 tensor cores, 1979 TFLOP/s dense, as for stages 08-13.

Measured: 1,438 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 1.01x stage 13; 73% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 73% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
import lessons
from lessons.generated import GeneratedStage

IDEA = "the next stage's full barrier tested (mbarrier.test_wait) before the promotion, its latency under the FFMAs"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.generator._Kernel.k_loop"
CHANGE = {"early_poll": True}

STAGE = GeneratedStage(14, CHANGE, previous=lessons.stage(13).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 14`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
