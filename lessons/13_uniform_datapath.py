"""Stage 13 — the uniform datapath: tell ptxas which values every lane of a warp shares.

A Hopper SM has two integer datapaths. The vector one computes a value per thread in R registers; the *uniform*
one computes one value per warp in UR registers, on its own issue slot. ``wgmma`` takes its shared-memory
descriptors from UR registers, so a descriptor built on the vector datapath must be moved over (``R2UR``) before
every wgmma that uses it. Which datapath a value lives on is ptxas's decision, from what it can prove: a value is
uniform if it comes from uniform sources (parameters, %ctaid, constants, shared loads at uniform addresses...).

Since stage 05 each math warpgroup finds its 64 rows of A from ``%tid``: ``wg_a = (tid >> 7) * 8192``. Every lane
of a warp (indeed of a warpgroup) gets the same value, but ptxas cannot prove it from ``%tid``, so it keeps
``wg_a`` per thread, and with it every A descriptor and every +32-byte k-step of it: at the ladder's shape the
stretch of SASS from a K block's first QGMMA to its last holds 123 instructions, 13 of them R2UR and 24 vector
integer (IMAD, IADD3, ...: the FMA pipe's IMADs compete with the promotion FFMAs), and a wave's first two wgmmas
wait while the descriptors are rebuilt and moved; with the change the same stretch is 95 instructions, none of
either kind (``ptx.sass.span``; the figure 13_uniform_datapath and the notebook count them).

The change is one instruction: ``shfl.sync.idx.b32 wg_a, wg_a, 0, 31, -1`` (:func:`ptx.vocab.core.warp_broadcast`,
emitted by :meth:`gemm.kernel.math_warpgroups.MathWarpgroups.warp_uniform_values`): every lane takes lane 0's
value, and a shuffle's result from a constant lane *is* provably warp-uniform. ptxas then builds the descriptors
with ULEA / UIADD3 / ULOP3 on the uniform datapath, no R2UR left in the loop (``python -m lessons inspect 13``
against ``inspect 12``; the notebook counts them). DeepGEMM does the same with ``__shfl_sync(threadIdx.x / 128,
0)``: found by comparing its SASS with ours instruction by instruction (docs/benchmarks.md "Where DeepGEMM 2504
leads, profiled").

Only values that really are equal across the warp may be broadcast: a lane's own row of the accumulator
fragment, broadcast, would make every lane read lane 0's scales (exercise 13).

The config is stage 12's plus ``uniform_offsets=True`` (production's default). It moves no data and changes no
arithmetic: what it saves is issue slots and the FMA pipe's time, so it shows where the math warpgroups are the
limit, the compute-bound shapes (+2-5% on the H100 at 4096 x 7168 x 16384, 4096 x 4096 x 7168 and 8192^3 over two
runs, ``results/uniform_offsets.json`` and docs/benchmarks.md "SASS to SASS"), and not at decode, where HBM is.

Speed of light: the FP8 tensor cores, 1979 TFLOP/s dense, as for stages 08-12.

Measured: 1,420 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 1.05x stage 12; 72% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 72% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
import lessons
from lessons.generated import GeneratedStage

IDEA = "the uniform datapath: broadcast the warpgroup's A offset (shfl.sync) so wgmma descriptors stay in UR registers"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.math_warpgroups.MathWarpgroups.warp_uniform_values"
CHANGE = {"uniform_offsets": True}

STAGE = GeneratedStage(13, CHANGE, previous=lessons.stage(12).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 13`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
