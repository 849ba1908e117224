"""Stage 19 — rank 0 two K blocks ahead: the peers finish first, and their pushes land while it still multiplies.

Stage 18 ends a split tile with a push: the peers send their FP32 totals into rank 0's inbox with ``st.async`` and
exit, and rank 0, after its own K loop, waits for those bytes, adds them and stores D. Its K blocks are shared
evenly (:func:`gemm.kernel.config.k_share`: rank r takes [r·Kb/S, (r+1)·Kb/S)), so every CTA of the cluster
finishes its K loop at about the same time, and only then does the exchange begin: the messages cross the cluster
while rank 0 waits, and the store of D waits behind them. Where Kb does not divide by S, even shares are worse than
even: 56 K blocks over three are 18, 19 and 19, so rank 0, the one that waits, finishes first.

The idea: give rank 0, the CTA that waits, more of the work. ``KernelConfig.split_k_lead`` = L gives it
E = Kb // S + L K blocks (at most Kb - (S - 1), so no peer is left empty) and shares the other R = Kb - E evenly
among the peers: rank r >= 1 takes [E + (r - 1)·R/(S - 1), E + r·R/(S - 1)) (``k_share`` with its ``lead``;
exercise 19). The peers now finish before rank 0, their messages land while it multiplies its last blocks, whose
stages its ring has mostly loaded already, and its wait at the end finds the inbox full. Too large a lead turns it
round: rank 0 finishes last by more than the exchange took, and each block too many costs a K block's time. How
long the exchange takes grows with the partials: a 256 x 64 tile pushes 64 KiB, a swapped 16 x 64 one 4 KiB.

The change: stage 18's config plus ``split_k_lead=2`` wherever it splits K, but for swapped tiles split over a pair
(production's rule, ``gemm.heuristics.split_lead``: there the small partials cross quickly, and a lead of 2, four
blocks ahead of the one peer, measured -0.4 to -0.5%). So at stage 18's decode shape, 16 x 2112 x 7168 (swapped
16 x 64 tiles over pairs), stage 19 *is* stage 18; it is measured at 64 x 2112 x 7168, where stage 18 splits 256 x 64
tiles over pairs: 56 K blocks as 30 and 26 instead of 28 and 28 (``python -m lessons diff 18 19 --m 64 --n 2112
--k 7168``). In the PTX (:meth:`gemm.kernel.generator._Kernel._lead_shares`) the shares cost two multiplies, two
adds, a subtract, a ``setp`` and a ``selp`` at the start (with S - 1 > 1 peers, two divisions by that constant too)
instead of stage 18's multiply, add and two shifts; in the SASS the same number of instructions, on the uniform
datapath (the rank is the same for every thread). Nothing else changes: the same ring, messages and epilogue. At
the ladder's 4096 x 4096 x 7168 nothing splits, and stage 19 *is* stage 18.

Measured on an H200, paired rounds against even shares on the stage's own tiles (production's config with stage
18's 256 x 64 tiles and 3 stages, which unlike the stage launches with PDL and runs no FFMA pass;
results/sweep_split_k_lead_256x64.json, 8 rounds, memset flush): a lead of 2
ahead in every round at all four shapes, +3.0% at 64 x 2112 x 7168, +6.3% at 128 x 2112 x 7168, +3.4% at
64 x 4096 x 7168 and +3.1% at 128 x 4096 x 7168 (1 gains 1.9-3.0%, 4 3.0-4.6%). With production's own tiles
(results/sweep_split_k_lead_memset.json, _clean.json; docs/benchmarks.md "Rank 0 two K blocks ahead") a lead of 2
is ahead in every round at seven of eight split shapes after the memset, +1.6 to +3.2% (16 x 2112 x 7168 split over
three +1.8%, 1,989 against 1,956 GB/s), and +0.4 to +2.5% after the clean flush. Exact on the emulator under
random schedules (pushed and gathered, swapped and not, a lead larger than the peers can give) and the emitted
share arithmetic run for every rank, split and lead; compute-sanitizer memcheck and synccheck clean on production's
split shapes (results/sanitizer_split_k_lead.txt).

Speed of light: HBM3, 3.35 TB/s: at 64 x 2112 x 7168 moving A, B, the scales and D once is 15.9 MB, 4.74 us,
which allows 409 TFLOP/s (the H200's HBM3e, 4.8 TB/s: 586). The lead moves no bytes: the bound is stage 18's, and
the change shortens the tail after the last K block. The ladder's shape is compute-bound (the FP8 tensor cores,
1,979 TFLOP/s), and there this stage is stage 18.

Measured: 68.4 TFLOP/s at M=64 N=2112 K=7168 on NVIDIA H200, 1.06x stage 18; 12% of its speed of light (HBM3e, 586
TFLOP/s), 3.5% of the FP8 peak (results/ladder_64x2112x7168.json, `python -m lessons ladder --m 64 --n 2112 --k 7168
--stages 10-20`).
"""
import lessons
from lessons.generated import GeneratedStage
from gemm.heuristics import split_lead

IDEA = "rank 0 two K blocks ahead: the split's peers finish first, and their pushes land while rank 0 multiplies"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.generator._Kernel._lead_shares"
SHAPE = (64, 2112, 7168)  # stage 18's 256 x 64 tiles split over 2 CTAs, 56 K blocks as 28 and 28, 64 KiB of partials


def lead(m: int, n: int, k: int) -> int:
    """The K blocks rank 0 takes beyond an even share at (m, n, k): production's rule (gemm.heuristics.split_lead)
    wherever stage 18 splits K: 2, but for swapped tiles split over a pair, where a lead measured no gain."""
    config = lessons.stage(18).config(m, n, k)
    return split_lead(config.split_k, config.swap_ab)


CHANGE = {"split_k_lead": lead}

STAGE = GeneratedStage(19, CHANGE, previous=lessons.stage(18).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 19`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
