"""Where a caller's function may replace one of the generator's own decisions: an explicit, hashable argument.

The generator makes a few decisions a course exercise asks a student to make instead (``lessons/exercises``):

* ``producer_warpgroup(math_warpgroups) -> 0 | math_warpgroups``: where the producer warpgroup sits
  (:meth:`gemm.kernel.generator._Kernel.warp_specialized_body`);
* ``tile_coords(tile, m_blocks, n_blocks, raster_group) -> (m_block, n_block)`` with ``rows`` (the M the kernel
  will run at): the tile map, emitted as a table (:meth:`gemm.kernel.tile_scheduler.TileScheduler._coords`);
* ``empty_arrivals(multicast, math_warps) -> count``: the empty barrier's arrival count (``_Kernel.setup``);
* ``ffma_rule(run) -> FFMAs``: the rule of the FFMA interleave cubin pass (:func:`gemm.kernel.launch.cubin`);
* ``wave_offset(wave, warpgroups) -> rows``: how far below its wave 0 a math warpgroup's wave ``wave`` starts in a
  tile taller than the math warpgroups' 64-row slices
  (:meth:`gemm.kernel.math_warpgroups.MathWarpgroups.wave_row`);
* ``k_share(rank, split_k, k_blocks) -> (first, end)``: the K blocks a split-K cluster's CTA ``rank`` computes,
  emitted as a table (``_Kernel.setup`` in :mod:`gemm.kernel.generator`; the generator's own rule is
  :func:`gemm.kernel.config.k_share`);
* ``warp_uniform(values) -> names``: which of the math warpgroups' per-thread values
  (:data:`gemm.kernel.math_warpgroups.PER_THREAD_VALUES`) are broadcast from lane 0 of each warp, so that ptxas
  may keep them, and what is computed from them, in uniform registers (the generator's own rule: the
  warpgroup's A offset when ``KernelConfig.uniform_offsets``);
* ``next_full(stage, parity, stages) -> (stage, parity)``: the ring slot and phase parity whose full barrier the
  math warps test right after releasing ``stage`` (whose full phase ``parity`` they waited on), emitted as a table
  (``_Kernel.k_loop`` with ``KernelConfig.early_poll``; the generator's own rule is the ring's advance);
* ``token_column(register, lane) -> column``: in a swap-AB tile (``KernelConfig.swap_ab``: the weight's rows are
  wgmma's M side, the tile's token rows its N columns), which token row of the tile accumulator ``register`` of
  ``lane`` holds, so which token's A scale its promotion multiplies by; emitted as a table, read once per thread
  (:meth:`gemm.kernel.math_warpgroups.MathWarpgroups._swapped_k_block`; the generator's own rule is the wgmma
  fragment's column, :func:`gemm.kernel.math_warpgroups.fragment_column`).

A :class:`Seams` value is passed down ``generate(config, n, k, seams)``, ``cubin``, ``kernel`` and
``gemm.testing.emulated.run_gemm``, and is part of each of their cache keys (functions hash by identity), so a kernel built
with someone's function is never served to a caller without it. :data:`NO_SEAMS`, the default everywhere, is the
generator's own code: the production path passes nothing and its PTX does not change. Nothing here knows the course.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Seams:
    producer_warpgroup: Callable | None = None
    tile_coords: Callable | None = None
    rows: int | None = None  # the M the tile_coords table is made for (M is otherwise a run-time value)
    empty_arrivals: Callable | None = None
    ffma_rule: Callable | None = None
    wave_offset: Callable | None = None
    k_share: Callable | None = None
    warp_uniform: Callable | None = None
    next_full: Callable | None = None
    token_column: Callable | None = None


NO_SEAMS = Seams()

__all__ = ["Seams", "NO_SEAMS"]
