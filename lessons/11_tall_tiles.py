"""Stage 11 — tall tiles: 256 x 128, each math warpgroup computing two 64-row waves against one B tile.

Stages 07-10 give each CTA a 128 x 128 tile: math warpgroup g multiplies its 64 rows of A by the whole B tile, so
per K block a CTA pulls 128 rows of A and 128 of B from L2 for 128 x 128 outputs. The stage 08 profile
(results/ncu_08_4096x4096x7168.txt) found that feed the limit: L2 at 77% of its throughput, the SMs at 75%.
Double the tile's height and the same B tile serves twice the rows:

* **two waves per warpgroup** (:class:`gemm.kernel.math_warpgroups.MathWarpgroups`): warpgroup g owns rows
  64g + 128w of the 256-row tile for waves w = 0, 1. Per K block it issues the first wave's four
  ``wgmma m64n128k32`` into its accumulator, waits, promotes them into the wave's FP32 totals, then does the same for
  the second wave with the same B descriptor: B's shared bytes are read by twice the rows.
* **the cost is registers and ring depth**: each math thread now keeps two 64-register totals plus the 64-register
  partial sum (192 of the 232 that ``setmaxnreg`` gives it: a 256 x 256 tile would not fit), and a stage holds
  256 x 128 + 128 x 128 bytes, so 3 stages fit in shared memory where 128 x 128 tiles had 5.

The feed per output falls from (128 + 128) / (128 x 128) to (256 + 128) / (256 x 128) rows of K: 25% fewer L2 bytes
per FLOP, and half the tiles (the per-tile prologue and epilogue, too). DeepGEMM's large-shape kernels use the
same 256 x 128 tile, and the production heuristics pick it wherever there are enough rows
(:func:`gemm.heuristics.choose_blocks`). The config is stage 10's plus ``block_m=256`` (the ring depth follows from
shared memory: :func:`gemm.kernel.config.max_stages`); the emitter is the wave loop of
:meth:`gemm.kernel.math_warpgroups.MathWarpgroups.k_block`.

Speed of light: the FP8 tensor cores, 1979 TFLOP/s dense, as for stages 08-10; what this stage changes is how much
of the tensor cores' time the L2 feed and the per-tile overhead leave idle.

Measured: 1,362 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 1.07x stage 10; 69% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 69% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
import lessons
from lessons.generated import GeneratedStage

IDEA = "tall 256 x 128 tiles: each math warpgroup runs two 64-row waves against one B tile (25% less L2 feed/FLOP)"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.math_warpgroups.MathWarpgroups.k_block"
CHANGE = {"block_m": 256}

STAGE = GeneratedStage(11, CHANGE, previous=lessons.stage(10).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 11`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
