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

Why fewer CTAs run faster: in cycles, not by a higher clock. The hypothesis this stage started from: a long-K FP8
walk runs at the GPU's power limit (700 W), where power sets the clock, and the short walks draw power without
shortening anything, so fewer CTAs would run at a higher clock. Recorded (``python -m gemm bench configs ...
--clocks``, nvidia-smi's SM clock and power sampled through each round; results/sweep_even_waves_clocks.json), the
even grid's median clock is not higher: 1,714 against 1,718 MHz at the ladder's shape (706 and 703 W, at the cap),
1,868 against 1,875 at 4096 x 2112 x 7168, while it is ahead by 1.0% and 2.2%, every round. With the clock locked
by ncu at 1.25 GHz, inside the timer's graph (20 calls each; results/ncu_graph_ew_*.txt), it is still ahead: 206.3
against 207.6 us and 262.0k against 266.1k SM cycles at the ladder's shape, 118.9 against 120.1 us and 148.3k
against 152.0k cycles at 4096 x 2112 x 7168. At the ladder's shape it also reads 108 MB from DRAM against 123: 128
CTAs start each wave on exactly 8 tile rows by 16 tile columns, half of stage 08's raster group
(:func:`gemm.kernel.tile_scheduler.tile_coords`); 132 start waves that straddle 9 rows and up to 24 columns. At
4096 x 2112 x 7168 even waves reads more (76 against 73 MB) and still saves cycles: there no cause is found.

Where it applies is production's rule (:func:`gemm.heuristics.evens_waves`): persistent walks with K >= 4096.
At K = 512 it measured 1.2-1.4% slower, in every round.

Measured on an H200 with production's kernels, round by round against the same config without it, 8 rounds in one
run (results/sweep_even_waves_paired.json; docs/benchmarks.md "Even waves at long K"):
- 4096 x 4096 x 7168: +2.3% (every round ahead; +2.4% in a second run, results/sweep_cta_count_paired.json);
- 4096 x 2112 x 7168: +3.0% (118 CTAs, every round ahead);
- 4096 x 7168 x 16384: +2.7% (+1.4% in the second run; 7 of 8 rounds ahead in each);
- 8192^3, where the count stays 132: 0.998, the control.
With stage 09's A multicast pairs on top, as this stage has, the second run measured +1.6% at the ladder's shape
(7 of 8 rounds ahead). The ladder times each stage once (a median of five, not round by round), so its ratio to stage 16 below (1.00x;
1.01x in the run before) is inside that run's resolution; the rounds above are the evidence.

Speed of light: the FP8 tensor cores, 1979 TFLOP/s dense, as for stages 08-16. The stage does not move it.

Measured: 1,455 TFLOP/s at M=4096 N=4096 K=7168 on NVIDIA H200, 1.01x stage 16; 74% of its speed of light (FP8
QGMMA, 1,979 TFLOP/s), 74% of the FP8 peak (results/ladder_h200.json, `python -m lessons ladder`).
"""
import lessons
from gemm.heuristics import evens_waves
from lessons.generated import GeneratedStage

IDEA = "even waves: the fewest CTAs that take as many waves, so every CTA walks the longest walk or one tile fewer"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.launch.grid"


def evened(m: int, n: int, k: int) -> bool:
    """Whether the stage launches even waves at (m, n, k): production's rule (:func:`gemm.heuristics.evens_waves`)
    on stage 16's config."""
    config = lessons.stage(16).config(m, n, k)
    return evens_waves(config.persistent, k, config.out_dtype, config.accumulate, config.epilogue)


CHANGE = {"even_waves": evened}

STAGE = GeneratedStage(17, CHANGE, previous=lessons.stage(16).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 17`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
