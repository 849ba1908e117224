"""Stage 18 — split-K partials pushed with st.async: the peers send their totals to rank 0 and exit.

Stage 12 splits a decode tile's K blocks over a cluster of S CTAs and brings their FP32 totals together by
*gathering* (:meth:`gemm.kernel.generator._Kernel.gather_partials`): ranks 1.. store their totals in their own
shared memory and arrive on the cluster barrier; rank 0 waits for that phase, reads each peer's totals through
distributed shared memory (``mapa`` + ``ld.shared::cluster.v4``) and arrives on a second phase, which the peers wait
for before they exit (a CTA's shared memory vanishes with it). Each phase is a release and an acquire at cluster
scope, and all of it sits between the last K block and the store of D.

The idea: *push* instead (:meth:`gemm.kernel.generator._Kernel.push_partials`). Rank 0 keeps an inbox in its own
shared memory, one slot of partials per peer (:class:`gemm.kernel.config.SharedPlan`: ``inbox_region``, peer r's
slot at (r - 1) x ``partials_bytes``, its thread t's group j of four totals at 16 (j x threads + t)). Each peer
sends its totals there with ``st.async``, whose bytes complete on rank 0's inbox mbarrier (``complete_tx``), and
exits. Rank 0 counts bytes, not messages: right after the barrier's init its thread 0 arrives on it once,
announcing every peer's bytes, (S - 1) x ``partials_bytes`` (``mbarrier.arrive.expect_tx``; exercise 18), and after
the K loop rank 0's math threads wait for the phase with ``mbarrier.try_wait.parity.acquire.cluster`` (cluster
scope, to pair with st.async's cluster-scope release; the default ``.acquire.cta`` does not, and the emulator names
it), then add the peers' totals from their own shared memory. One cluster-barrier phase is left: every thread
arrives on it at the start (``barrier.cluster.arrive.relaxed``, after the init and the arrive), and a peer waits
on it before its first message, so no message reaches a barrier not yet initialised, or ahead of the count that
expects it (without that wait the emulator catches a message to an uninitialised barrier).

The change: stage 17's config plus ``KernelConfig.split_k_push`` wherever it splits K. In the PTX at
16 x 2112 x 7168 (the stage's tiles: 16 tokens x 64 weight rows, K split over 2) six ``barrier.cluster.arrive`` and
six ``.wait`` become one of each, and ``ld.shared::cluster`` becomes ``st.async`` (``python -m lessons diff 17 18
--m 16 --n 2112 --k 7168``: +40 -40 lines). In the SASS, 8 ``UCGABAR_ARV``, 8 ``UCGABAR_WAIT``, 18 ``MEMBAR`` and
8 ``CCTL`` become 1, 1, 2 and 3, with 2 ``STAS`` (the messages) and no ``LD``. The inbox costs (S - 1) x
``partials_bytes`` of every CTA's shared memory (a launch gives every CTA the same size; only rank 0's inbox is
used): 4 KiB here (112,016 bytes against 107,904), but 64 KiB for a 256 x 64 tile, which costs stage 17's
256 x 64 tiles at 64 x 2112 x 7168 a ring stage (4 to 3; not measured there, where production's tiles are 64 x 32
and keep 10). At the ladder's
4096 x 4096 x 7168 nothing splits, and stage 18 *is* stage 17: the same PTX, byte for byte.

Measured on an H200 with production's kernels (which split decode's swapped tiles over three CTAs, not two as
this stage does), eight rounds paired against the gathered exchange, every round ahead
(results/sweep_split_k_push_memset.json, _clean.json; docs/benchmarks.md "The partials pushed"): after the
timer's memset flush +4.4% at 16 x 2112 x 7168 (1,952 against 1,865 GB/s), +2.1% at 32 x 4096 x 7168, +5.2% at
64 x 2112 x 7168, +4.5% at 128 x 2112 x 7168, +5.0% at 48 x 2112 x 7168, +2.6% at 16 x 4096 x 7168, +4.1% and
+3.1% at M = 5 and 1; after the clean flush +6.2% at 16 x 2112 x 7168 (2,209 GB/s), +2.1% at 32 x 4096 x 7168,
+7.1% at 64 x 2112 x 7168, +5.8% at 5 x 2112 x 7168. Those kernels armed the inbox barrier after the K loop; armed
at the start, as here, the same comparison read +4.0% at 16 x 2112 x 7168 (1,970 against 1,884 GB/s), +1.8% at
32 x 4096, +4.7% at 64 x 2112, +5.3% at 128 x 2112 and +4.0% at 5 x 2112 x 7168
(results/sweep_split_k_push_start_memset.json). Production now pushes wherever it splits (gemm.heuristics). In the
ladder's run at this shape, this stage against stage 17: 8.3 against 8.7 us, cuBLAS 15.4; one run of three
pairs each, whose ranges overlap (8.06-8.89 against 8.22-8.93 us): the paired sweeps above are the evidence.
compute-sanitizer's memcheck and synccheck are clean on the pushed kernel; racecheck does not finish on it, even at
12 CTAs and with the barrier armed at the start, where the gathered kernel finishes in 2.75 s with no hazard
(results/sanitizer_split_k_push.txt): why is not established. On the CPU the emulator models st.async: the pushed exchange is exact under
random schedules, and a message before the start phase or a CTA-scoped wait is an error it names.

Speed of light: HBM3, 3.35 TB/s: at 16 x 2112 x 7168 moving A, B, the scales and D once is 15.3 MB, 4.58 us,
which allows 106 TFLOP/s (the H200's HBM3e, 4.8 TB/s: 152). The exchange moves no HBM bytes, so the bound at this
shape is stage 17's; the push shortens the tail after the last K block. The ladder's shape is compute-bound (the
FP8 tensor cores, 1,979 TFLOP/s), and there this stage is stage 17.

Measured: 58.2 TFLOP/s at M=16 N=2112 K=7168 on NVIDIA H200, 1.04x stage 17; 38% of its speed of light (HBM3e, 152
TFLOP/s), 2.9% of the FP8 peak (results/ladder_16x2112x7168.json, `python -m lessons ladder --m 16 --n 2112 --k 7168
--stages 10-18`).
"""
import lessons
from lessons.generated import GeneratedStage

IDEA = "split-K partials pushed: peers st.async their totals into rank 0's inbox and exit; one cluster phase left"
KIND = "ptx"
KERNEL = "fp8_gemm"
EMITTER = "gemm.kernel.generator._Kernel.push_partials"
SHAPE = (16, 2112, 7168)  # stage 12's decode shape: stage 17 splits it over 2 CTAs and gathers their totals


def pushed(m: int, n: int, k: int) -> bool:
    """Whether the stage pushes its partials at (m, n, k): wherever stage 17 splits K (production's rule)."""
    return lessons.stage(17).config(m, n, k).split_k > 1


CHANGE = {"split_k_push": pushed}

STAGE = GeneratedStage(18, CHANGE, previous=lessons.stage(17).STAGE)
config, generate, shared_bytes, gemm = STAGE.config, STAGE.generate, STAGE.shared_bytes, STAGE.gemm


def cubin(m: int, n: int, k: int):
    """The stage's cubin after stage 10's pass (what ``python -m lessons inspect 18`` looks at)."""
    from gemm.kernel.launch import cubin as passed_cubin
    return passed_cubin(config(m, n, k), n, k)
