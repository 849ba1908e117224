"""Stage 16 — B read once is loaded evict_first: the weight stream recycles its own L2 lines, not the L2's others.

Every TMA load of stages 06-15 goes to L2 with the normal eviction priority: a line brought in stays until its set
needs room, and then the set gives up whichever line it ranks oldest. At decode one row of tiles covers M, so every
byte of B (the weight) is loaded once and never again (:func:`gemm.heuristics.b_reads`: one load per row of tiles,
whatever the split of K or the multicast of A); yet each of its lines, once its stage is in shared memory, pushes
out a line the L2 held before. When those lines are dirty (what the previous kernel wrote: the timer's memset
flush, or in a model the activations just computed), each one evicted is a write-back to HBM that shares the bus
with the stream's own reads. A 15-120 MB weight streamed through the 50 MB L2 turns over the whole cache.

The change: the producer creates an L2 cache policy once (``createpolicy.fractional.L2::evict_first.b64``, PTX ISA
"createpolicy") and names it on each of B's TMA loads (``cp.async.bulk.tensor ... .L2::cache_hint``, its last
operand; :func:`ptx.vocab.bulk_copies.create_l2_policy`, :meth:`gemm.kernel.producer.Ring.load`). An evict_first
line is the first its set gives up, so the stream replaces its own lines and leaves the rest of the L2 where it
was: after a 256 MiB fill, ncu at 64 x 7168 x 16384 counts 6.6-7.5 MB written back during the call instead of
26.9-29.4 MB, for the same 119 MB read (results/ncu_l2_eviction_64x7168x16384.txt). In SASS B's UTMALDG is the
same instruction with a ``desc[UR..]`` operand more (A's and sa's keep none): the policy rides in a uniform
register.

The config is stage 15's plus ``b_eviction="first"`` where one row of tiles reads B once (exercise 16: how many
tiles load each byte of B). Where B is re-read by other rows of tiles (the ladder's 4096 x 4096 x 7168: 16 rows of
256) its lines are worth keeping, and the stage is stage 15. It moves no fewer bytes and changes no instruction on
the critical path; what it saves is the write-backs of other data, so it shows only where the L2 holds dirty lines
when the call starts, as the ladder's timer leaves it (the memset flush): production's configs swept over nine shapes
measured +1.8 to +10.5% after the memset at the eight one-row shapes and -1.0 to +1.6% after a clean flush, where
evicting a clean line costs nothing (results/sweep_l2_eviction_*.json, docs/benchmarks.md "B read once, evicted
first"). A's loads as evict_last on top (every tile of a row re-reads A) measured within the spread: not taken.

What it buys at 32 x 4096 x 7168, measured on an H200 after the memset flush: 11.9 us against stage 15's 12.9
(1.09x) and cuBLAS's 22.2, in one run (results/ladder_32x4096x7168.json). The bound below is the H100's, as for
every stage: the H200's HBM3e (4.8 TB/s) would allow 302 TFLOP/s here, of which the stage reaches 52%.

Speed of light: HBM3, 3.35 TB/s: at 32 x 4096 x 7168 moving A, B, the scales and D once is 29.9 MB, 8.92 us, which
allows 211 TFLOP/s. The ladder's shape is compute-bound (the FP8 tensor cores, 1,979 TFLOP/s), and there this
stage is stage 15.

Measured: 158 TFLOP/s at M=32 N=4096 K=7168 on NVIDIA H200, 1.09x stage 15; 52% of its speed of light (HBM3e, 302
TFLOP/s), 8% of the FP8 peak (results/ladder_32x4096x7168.json, `python -m lessons ladder --m 32 --n 4096 --k 7168
--stages 14-16`).
"""
import lessons
from gemm.heuristics import reads_b_once
from lessons.generated import GeneratedStage

IDEA = "B read once loaded evict_first (createpolicy + .L2::cache_hint): the stream recycles its own L2 lines"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.producer.Ring.load"
SHAPE = (32, 4096, 7168)  # decode's up projection at 32 tokens: one row of 32 x 64 tiles streams 29 MB of weight


def hinted(m: int, n: int, k: int, reads=None) -> bool:
    """Whether the stage loads B evict_first at (m, n, k): one row of stage 15's tiles reads each byte of B
    (production's rule, :func:`gemm.heuristics.reads_b_once`; ``reads(m, config)``: an exercise's count instead of
    :func:`gemm.heuristics.b_reads`)."""
    return reads_b_once(m, lessons.stage(15).config(m, n, k), reads)


CHANGE = {"b_eviction": lambda m, n, k: "first" if hinted(m, n, k) else "normal"}

STAGE = GeneratedStage(16, CHANGE, previous=lessons.stage(15).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 16`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
