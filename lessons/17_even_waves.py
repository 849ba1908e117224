"""Stage 17 — even waves: a persistent walk launches the fewest CTAs that take as many waves.

A persistent kernel (stage 08 on) launches one CTA per SM, and each CTA walks every 132nd tile. At the ladder's
4096 x 4096 x 7168 there are 512 tiles of 256 x 128, so 116 CTAs walk four tiles and 16 walk three. The kernel
takes four tiles' time either way. The 16 short walks shorten nothing: they finish early and idle through the
fourth wave.

The change: stage 16's config plus ``KernelConfig.even_waves``. The grid becomes ceil(tiles / waves) CTAs, where waves = ceil(tiles /
SMs), rounded up to whole clusters (stage 09's pairs) and kept within the SMs
(:func:`gemm.kernel.launch.even_wave_ctas`, exercise 17). Each CTA then walks the longest walk or one tile fewer:
128 CTAs of four tiles at the ladder's shape. The kernel is the same PTX: the walk already steps by the grid's size
(``%nctaid``), so only the launch changes (``python -m lessons diff 16 17`` shows no SASS difference). In cycles
the kernel still takes four tiles' time.

Why fewer CTAs should run faster is a hypothesis, not yet a measurement: a long-K FP8 walk keeps the tensor cores
busy enough to run at the GPU's power limit (700 W on an H100 SXM or H200), where power sets the clock, and the
short walks draw power through the waves before they finish. No clock or power was recorded in the runs below;
ncu's SM frequency on both grids is the test of it.

Where it applies is production's rule (:data:`gemm.heuristics.EVEN_WAVES_MIN_K`): persistent walks with K >= 4096.
At K = 512 it measured 1.2-1.4% slower, in every round.

Measured on an H200 with production's kernels, round by round against the same config without it, 8 rounds in one
run (results/sweep_even_waves_paired.json; docs/benchmarks.md "Even waves at long K"):
- 4096 x 4096 x 7168: +2.3% (every round ahead; +2.4% in a second run, results/sweep_cta_count_paired.json);
- 4096 x 2112 x 7168: +3.0% (118 CTAs, every round ahead);
- 4096 x 7168 x 16384: +2.7% (+1.4% in the second run; 7 of 8 rounds ahead in each);
- 8192^3, where the count stays 132: 0.998, the control.
With stage 09's A multicast pairs on top, as this stage has, the second run measured +1.6% at the ladder's shape
(7 of 8 rounds ahead). The stage's own ladder row is not measured yet: it needs a ladder run on the GPU.

Speed of light: the FP8 tensor cores, 1979 TFLOP/s dense, as for stages 08-16. The stage does not move it.

Measured: not yet (no row for stage 17 in results/ladder.json).
"""
import lessons
from gemm.heuristics import EVEN_WAVES_MIN_K
from lessons.generated import GeneratedStage

IDEA = "even waves: the fewest CTAs that take as many waves, so no CTA draws power without shortening the walk"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.launch.grid"


def evened(m: int, n: int, k: int) -> bool:
    """Whether the stage launches even waves at (m, n, k): production's rule (a persistent walk, K >= 4096) on
    stage 16's config."""
    return lessons.stage(16).config(m, n, k).persistent and k >= EVEN_WAVES_MIN_K


CHANGE = {"even_waves": evened}

STAGE = GeneratedStage(17, CHANGE, previous=lessons.stage(16).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 17`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
