"""Stage 07 — warp specialization + ``setmaxnreg``: a producer warpgroup feeds the ring; the math warpgroups only compute.

Stage 06 made thread 0 both a producer and a math thread: it refilled a stage, then ran its own wgmmas, and
it could refill only between its own K blocks, so the ring's depth was ``stages - 2`` and the first warpgroup's
wgmmas waited on the copies it had to issue. Warp specialization splits the roles by warpgroup:

* **one producer warpgroup** (threads 128 x math_wgs ..): ``setmaxnreg.dec`` to 40 registers, then all but one
  thread exit and that one walks the K blocks, waiting on each stage's *empty* barrier and issuing A, B and A's
  scales by TMA with one ``arrive.expect_tx`` on its *full* barrier. Nothing else delays it, so it runs up to
  ``stages`` K blocks ahead.
* **one or two math warpgroups**: ``setmaxnreg.inc`` to 232 registers (the 40 x 128 the producer gave back pay
  for it: 128 x 40 + 256 x 232 <= 65536), then per K block: wait *full*, four wgmmas, wait for them, **release
  the stage** (one arrival per math warp on *empty*) and only then the promotion FFMAs, so the producer refills
  while the FFMAs run. B's scales for the tile are read once into shared memory, not once per K block.

The config is stage 06's plus one change, ``producer="warpgroup", registers=(40, 232)``, and the emitter that
implements it is :class:`gemm.kernel.producer.WarpgroupProducer` (with the math side in
:meth:`gemm.kernel.generator._Kernel.math_body`). ``python -m lessons diff 6 7`` shows the PTX and SASS
difference; ptxas honours the register split (USETMAXREG in the SASS) only in whole-program mode, which is why
:mod:`ptx.compile` assembles kernels with ``setmaxnreg`` through ``ptxas`` rather than nvJitLink.

Speed of light: stage 06's, the FP8 tensor cores at 1979 TFLOP/s dense (132 SMs x 8192 flop/clk x 1.83 GHz); what
changes is how much of each K block's copy latency, and of the promotion, the tensor cores still wait for.

Measured: 1,120 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 1.19x stage 06; 57% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 57% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
from lessons.generated import GeneratedStage

IDEA = "warp specialization + setmaxnreg: a producer warpgroup issues TMA, math warpgroups compute and release early"
KIND = "ptx"
KERNEL = "fp8_gemm"
CHANGE = {"producer": "warpgroup", "registers": (40, 232)}
EMITTER = "gemm.kernel.producer.WarpgroupProducer"

STAGE = GeneratedStage(7, CHANGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm
