"""The ladder's figures, drawn by code from the layout functions the kernels themselves use.

Every figure is one function returning a :class:`matplotlib.figure.Figure` (no pyplot: nothing global, any
backend; ``python -m lessons figures`` writes the PNGs with Agg). Each is drawn from a *data* function that
tests/test_figures.py checks, and each data function calls what the kernel calls, or what the generated PTX is
proven (by the tests, on the emulator) to compute:

=============================  ===========================================================================
figure                         drawn from
=============================  ===========================================================================
01_naive_thread_map            ``output_element``, ``launch_config`` of lessons/01_naive.py
02_smem_tile_banks             ``output_element``, ``staged_k``, ``shared_word`` of lessons/02_smem_tiling.py
03_micro_tile                  ``micro_offset`` of lessons/03_register_tiling.py
04_mma_fragments               ``a/b/c_fragment_coords`` (ptx.vocab.mma_sync: the ISA's m16n8k32 maps)
04_ldmatrix_swizzle            ``a/b_ldmatrix_source`` (ptx.vocab.mma_sync), ``swizzled_offset``, stage 04's
                               ``a_fragment_offset``
05_wgmma_descriptor            ``DESCRIPTOR_FIELDS``, ``descriptor_value``, ``descriptor_fields`` (ptx.vocab.wgmma)
05_sw128_atom                  ``sw128_offset`` (ptx.vocab.wgmma)
05_wgmma_accumulator           ``accumulator_coords`` (ptx.vocab.wgmma)
06_tma_ring_timeline           stage 06's PTX run by the CPU emulator, its mbarrier/TMA/wgmma events traced
07_producer_consumer_timeline  stage 07's generator config run by the emulator (gemm.testing.emulated), traced
08_tile_raster                 ``schedule`` / ``tile_coords`` (gemm.kernel.tile_scheduler)
09_cluster_multicast           ``schedule`` + the pair rule of ``TileScheduler.pair_flags``
09_cluster_multicast_b         the same along M (``schedule(..., along_m=True)``): the pairs that share B
10_ffma_yield_bits             stage 09 / 10 cubins, ``is_yield``, ``reuse_b``, ``ffma_runs`` (ptx.passes)
11_tall_tile_waves             ``tile_rows`` (gemm.kernel.math_warpgroups: what ``MathWarpgroups.wave_row`` adds)
12_split_k_cluster             ``k_share``, ``tiles`` (gemm.kernel.config), ``grid`` (gemm.kernel.launch), stages
                               11 / 12's configs; the exchange of ``_Kernel.gather_partials``
13_uniform_datapath            stage 12 / 13 cubins, ``span`` of QGMMA (ptx.sass): each instruction's datapath
14_early_poll                  stage 13 / 14 cubins after the last QGMMA: where the full-barrier test lands
15_swap_ab                     stages 14 / 15's configs and ``SharedPlan`` (gemm.kernel.config): one CTA's ring
                               by part; the accumulator tile and its scales, unswapped and swapped
16_evict_first                 stage 16's configs and ``b_reads`` (gemm.heuristics): the tile grid, how many tiles
                               load each byte of B, and B's L2 priority, at decode and at the ladder's shape
17_even_waves                  stages 16 / 17's configs, ``grid`` (gemm.kernel.launch) and ``schedule``
                               (gemm.kernel.tile_scheduler): the tiles each CTA walks, one CTA per SM and even waves
18_split_k_push                stages 17 / 18's configs, ``SharedPlan`` (its inbox) and ``k_share``
                               (gemm.kernel.config): the gathered and the pushed exchange, rank 0's shared memory
19_split_k_lead                stages 18 / 19's configs, production's (gemm.heuristics) and ``k_share`` with its
                               lead (gemm.kernel.config): each CTA's K blocks, even and with rank 0's lead
20_narrow_pair_tiles           stages 19 / 20's configs and stage 20's ablation without the pair: the tiles over
                               D, zero-fill rows, CTAs and the bytes of A and B read
moe_grouped_layouts            ``dispatch``, ``contiguous_tiles``, ``masked_tiles`` of lessons/moe_grouped.py (the
                               scheduler's ``schedule`` / ``masked_schedule``; a topic figure, not a stage's)
=============================  ===========================================================================

The two timelines are real traces with modelled durations. :func:`trace_barriers` wraps the emulator's
mbarrier, TMA and wgmma instructions while a kernel runs and records each event with its warpgroup's own
instruction count. The emulator runs one warpgroup at a time and completes a copy at issue, so the order of each
warpgroup's events and every parity are the kernel's; :func:`replay` then gives them times under a
:class:`Timing` model (warpgroups in parallel, one step per instruction, a TMA latency, tensor-core time per
wgmma) that keeps every dependency the trace shows.

``python -m lessons figures`` writes them all to docs/figures/NN_name.png (docs/figures.md lists them; the
command is :mod:`lessons.figures.committed`). One module per family of figures:

* :mod:`lessons.figures.numba_threads`: stages 01-03, thread maps, staging lanes, shared-memory banks,
  micro-tiles;
* :mod:`lessons.figures.tensor_core_layouts`: stages 04-05, mma.sync fragments, ldmatrix and its swizzle, the
  wgmma descriptor, the SW128 atom, the accumulator;
* :mod:`lessons.figures.ring_timelines`: stages 06-07, the traced TMA ring (:func:`trace_barriers`,
  :func:`replay`, the timelines);
* :mod:`lessons.figures.tile_schedules`: stages 08-09 and MoE, the persistent raster, cluster pairs, grouped walks;
* :mod:`lessons.figures.sass_bits`: stage 10, the FFMA yield and reuse bits before and after the pass;
* :mod:`lessons.figures.tall_tiles`: stage 11, the 256-row tile's rows by math warpgroup and wave;
* :mod:`lessons.figures.split_k`: stage 12, the SMs busy at decode, K blocks by cluster rank, the DSMEM exchange;
* :mod:`lessons.figures.uniform_datapath`: stage 13, the K block's SASS by datapath, stage 12 against 13;
* :mod:`lessons.figures.early_poll`: stage 14, the SASS after a K block's last wgmma, stage 13 against 14;
* :mod:`lessons.figures.swap_ab`: stage 15, the decode ring by part and the swapped tile's scales;
* :mod:`lessons.figures.evict_first`: stage 16, how many tiles load each byte of B, and its L2 priority;
* :mod:`lessons.figures.even_waves`: stage 17, the tiles each CTA of a persistent walk computes, before and after;
* :mod:`lessons.figures.split_k_push`: stage 18, split-K's exchange gathered and pushed, and rank 0's inbox;
* :mod:`lessons.figures.split_k_lead`: stage 19, each split CTA's K blocks, even and with rank 0's lead;
* :mod:`lessons.figures.narrow_pair_tiles`: stage 20, the tiles over D between decode and prefill, and their costs;
* :mod:`lessons.figures.drawing`: what they share (the ladder's shape, an empty figure, labelled cells, a box).

matplotlib (the ``plots`` extra) is imported by this package only: ``import lessons`` does not import it.
"""
from __future__ import annotations

from lessons.figures.drawing import LADDER_SHAPE
from lessons.figures.early_poll import after_last_wgmma, early_poll
from lessons.figures.evict_first import b_read_map, evict_first
from lessons.figures.even_waves import even_waves, walk_lengths
from lessons.figures.narrow_pair_tiles import narrow_pair_tiles, pair_tile_variants, tile_costs
from lessons.figures.numba_threads import (micro_tile, micro_tile_map, naive_thread_map, smem_banks,
                                           smem_tile_banks, staging_lanes, thread_output_map)
from lessons.figures.ring_timelines import (Event, RingTrace, Timing, producer_consumer_timeline, replay,
                                            ring_input, ring_schedule, stage06_trace, stage07_trace,
                                            tma_ring_timeline, trace_barriers)
from lessons.figures.sass_bits import DECODE_SHAPE, ffma_bits, ffma_listings, ffma_yield_bits
from lessons.figures.split_k import split_k_cluster, split_k_map, split_k_occupancy
from lessons.figures.split_k_lead import lead_shares, split_k_lead
from lessons.figures.split_k_push import shared_map, split_k_push
from lessons.figures.swap_ab import ring_bytes, swap_ab
from lessons.figures.tall_tiles import tall_tile_map, tall_tile_waves
from lessons.figures.tensor_core_layouts import (accumulator_map, descriptor_example, fragment_owner,
                                                 ldmatrix_roles, ldmatrix_swizzle, mma_fragment_maps, mma_fragments,
                                                 stage04_swizzle, sw128_atom, sw128_layout, wgmma_accumulator,
                                                 wgmma_descriptor)
from lessons.figures.tile_schedules import (MOE_EXAMPLE, census, cluster_multicast, cluster_multicast_b, cluster_steps,
                                            moe_layouts, moe_walk_map, raster_map, tile_raster, wave_footprint)
from lessons.figures.uniform_datapath import k_block_classes, uniform_datapath

FIGURES = {
    "01_naive_thread_map": naive_thread_map,
    "02_smem_tile_banks": smem_tile_banks,
    "03_micro_tile": micro_tile,
    "04_mma_fragments": mma_fragments,
    "04_ldmatrix_swizzle": ldmatrix_swizzle,
    "05_wgmma_descriptor": wgmma_descriptor,
    "05_sw128_atom": sw128_atom,
    "05_wgmma_accumulator": wgmma_accumulator,
    "06_tma_ring_timeline": tma_ring_timeline,
    "07_producer_consumer_timeline": producer_consumer_timeline,
    "08_tile_raster": tile_raster,
    "09_cluster_multicast": cluster_multicast,
    "09_cluster_multicast_b": cluster_multicast_b,
    "10_ffma_yield_bits": ffma_yield_bits,
    "11_tall_tile_waves": tall_tile_waves,
    "12_split_k_cluster": split_k_cluster,
    "13_uniform_datapath": uniform_datapath,
    "14_early_poll": early_poll,
    "15_swap_ab": swap_ab,
    "16_evict_first": evict_first,
    "17_even_waves": even_waves,
    "18_split_k_push": split_k_push,
    "19_split_k_lead": split_k_lead,
    "20_narrow_pair_tiles": narrow_pair_tiles,
    "moe_grouped_layouts": moe_layouts,
}

__all__ = ["FIGURES", "LADDER_SHAPE", "DECODE_SHAPE", "MOE_EXAMPLE", "Event", "RingTrace", "Timing", "trace_barriers",
           "replay", "stage06_trace", "stage07_trace", "ring_schedule", "ring_input",
           "thread_output_map", "smem_banks", "staging_lanes", "micro_tile_map", "fragment_owner",
           "mma_fragment_maps", "ldmatrix_roles", "stage04_swizzle", "descriptor_example", "sw128_layout",
           "accumulator_map", "raster_map", "wave_footprint", "cluster_steps", "census", "ffma_listings", "ffma_bits",
           "moe_walk_map", "tall_tile_map", "split_k_map", "split_k_occupancy", "k_block_classes", "after_last_wgmma",
           "ring_bytes", "b_read_map", "walk_lengths", "shared_map", "lead_shares", "tile_costs", "pair_tile_variants",
           *(function.__name__ for function in FIGURES.values())]
