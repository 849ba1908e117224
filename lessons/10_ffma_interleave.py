"""Stage 10 — FFMA interleave: a cubin -> cubin pass that sets the *yield* bit on promotion FFMAs.

No PTX changes here: the kernel is stage 09's, and the pass edits the assembled machine code. Each 128-bit Hopper
instruction carries control bits next to its opcode; bit 45 of the high word is an inverted *yield* flag and bit
59 the operand-reuse flag of the FFMA's scale register. DeepGEMM found (CUDA 12.3 vs 12.2 SASS) that letting every
other FFMA of a promotion run yield, and dropping its reuse flag (a yielded warp cannot keep the operand cache),
lets one warpgroup's FFMAs interleave with the other's wgmmas. :func:`ptx.passes.interleave_ffma` finds the runs
of >= 8 FFMAs in the SASS (``nvdisasm -hex``), flips the bits by a rule (``deepgemm``: the first 9/16 of each run,
a flip whenever the scale register is new or the previous FFMA kept its reuse; ``every_other``), writes the cubin
back and disassembles it again to prove that nothing else changed.

Measured facts first (``count_yielding_ffma`` on the SASS ptxas 13.0 writes): it already emits the alternating
yield/no-reuse pattern for CTAs of more than 8 warps and none for 8 warps or fewer. The production 256 x 128 kernel
(384 threads, two waves): 64 of its 128 promotion FFMAs yield before any pass, and DeepGEMM's rule flips 2; this
stage's 128 x 128 kernel: 32 of 64, and the rule flips 1. A 256-thread kernel (one math warpgroup, 64 x 128 tiles):
0 of 64 yield, and the rule flips 18. Whether that is worth anything is a timing question:
``results/ffma_pass.json`` (``python -m gemm bench configs bench production
"production:post_passes=('ffma_deepgemm',)" "production:post_passes=('ffma_every_other',)"``) has every shape with
and without the pass, and the production heuristics enable it only if it measured faster
(``FP8LADDER_FFMA_INTERLEAVE=deepgemm|every_other`` turns it on by hand).

The config is stage 09's plus ``post_passes=("ffma_deepgemm",)``; the "emitter" is the pass,
:func:`ptx.passes.interleave_ffma`, applied in :func:`gemm.kernel.launch.cubin`.

Speed of light: stage 09's, the FP8 tensor cores at 1979 TFLOP/s dense; the pass changes when warps issue, not what
they compute, so the most it can buy is promotion time that still stalls the tensor cores.

Measured: 1,267 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H100 80GB HBM3, 1.02x stage 09; 64% of its speed of light
(FP8 QGMMA, 1,979 TFLOP/s), 64% of the FP8 peak (results/ladder.json, `python -m lessons ladder`).
"""
import lessons
from lessons.generated import GeneratedStage

IDEA = "FFMA interleave: a cubin pass sets the yield bit (and clears reuse) on every other promotion FFMA"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "ptx.passes.interleave_ffma"
CHANGE = {"post_passes": ("ffma_deepgemm",)}

STAGE = GeneratedStage(10, CHANGE, previous=lessons.stage(9).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after the pass (what ``python -m lessons inspect 10`` should look at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    c = config(m, n, k)
    return passed_cubin(c, n, k)
