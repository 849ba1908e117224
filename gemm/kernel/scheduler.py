"""The tile scheduler emitter: which (m0, n0) output tiles a CTA computes, and in what order.

* One CTA per tile (stages 06-07): the grid is the tile count and CTA ``t`` computes tile ``t``.
* Persistent (stage 08): the grid is the SM count; CTA ``c`` computes tiles ``c, c + grid, c + 2 grid, ...``
  (a static schedule: no atomics, so the producer and the math warpgroups each run their own copy of this
  walk and agree without talking).

Tile ``t`` maps to (m block, n block) in row-major order, or in a *grouped* order (``raster_group`` = G): the
tiles are cut into groups of G consecutive n-blocks by all m-blocks, and inside a group n varies fastest.
The ~132 tiles in flight at once then cover about G n-blocks by 132/G m-blocks, so the A and B rows they read
overlap in L2 instead of streaming all of B past every A row block. The M-block count is a run-time value (M is
a kernel parameter); N, and so the n-block count, is compiled in. :func:`tile_coords` is the same map in
Python, for tests and figures.
"""
from __future__ import annotations

from contextlib import contextmanager

from gemm.fp8 import ceil_div
from gemm.kernel.config import KernelConfig
from ptx.builder import KernelBuilder


def tile_coords(tile: int, m_blocks: int, n_blocks: int, raster_group: int) -> tuple[int, int]:
    """(m block, n block) of tile ``tile``: what the emitted PTX computes."""
    if raster_group <= 0:
        return divmod(tile, n_blocks)
    group, rest = divmod(tile, raster_group * m_blocks)
    first_n = group * raster_group
    width = min(raster_group, n_blocks - first_n)
    return rest // width, first_n + rest % width


def schedule(cta: int, grid: int, m_blocks: int, n_blocks: int, raster_group: int) -> list[tuple[int, int]]:
    """The tiles CTA ``cta`` of a persistent grid of ``grid`` CTAs computes, in order."""
    return [tile_coords(t, m_blocks, n_blocks, raster_group) for t in range(cta, m_blocks * n_blocks, grid)]


class TileScheduler:
    """Emits the tile walk for one role (producer or math): ``with scheduler.tiles() as (m0, n0): ...``."""

    def __init__(self, b: KernelBuilder, config: KernelConfig, n: int, m: str, name: str):
        self.b, self.config, self.name = b, config, name
        self.n_blocks = ceil_div(n, config.block_n)
        e, r = b.emit, b.reg
        self.num_tiles = r("u32", f"{name}_tiles")
        m_blocks = r("u32", f"{name}_mblocks")
        e(f"add.u32 {m_blocks}, {m}, {config.block_m - 1};",
          f"shr.u32 {m_blocks}, {m_blocks}, {config.block_m.bit_length() - 1};",
          f"mul.lo.u32 {self.num_tiles}, {m_blocks}, {self.n_blocks};")
        self.group_tiles = None
        if config.raster_group and config.raster_group < self.n_blocks:
            self.group_tiles = r("u32", f"{name}_gtiles")
            e(f"mul.lo.u32 {self.group_tiles}, {m_blocks}, {config.raster_group};")

    def pair_flags(self, rank: str):
        """Inside :meth:`tiles` of a 2-CTA cluster: the CTAs of a pair walk tiles 2i and 2i + 1 (the grid is even),
        so both compute the same flags from the pair's first tile: whether the peer has a tile at this step and
        whether the two tiles share their rows (then A is multicast). A pair split across a row or group edge,
        or an odd last tile, loads A without multicast; both CTAs agree, so neither waits for bytes never sent."""
        from gemm.kernel.producer import PairFlags
        e, r = self.b.emit, self.b.reg
        first, second = r("u32", "pair0"), r("u32", "pair1")
        e(f"sub.u32 {first}, {self.tile}, {rank};", f"add.u32 {second}, {first}, 1;")
        m_first, _ = self._coords(first)
        m_second, _ = self._coords(second)
        alive, same, own, lead, rank0, mask = (r("pred", "p_peer"), r("pred"), r("pred", "p_own_a"),
                                              r("pred", "p_lead_a"), r("pred"), r("b16", "cta_mask"))
        e(f"setp.lt.u32 {alive}, {second}, {self.num_tiles};", f"setp.eq.u32 {same}, {m_first}, {m_second};",
          f"and.pred {same}, {same}, {alive};", f"not.pred {own}, {same};",
          f"setp.eq.u32 {rank0}, {rank}, 0;", f"and.pred {lead}, {same}, {rank0};", f"mov.b16 {mask}, 3;")
        return PairFlags(own=own, lead=lead, peer_alive=alive, mask=mask)

    def _coords(self, tile: str) -> tuple[str, str]:
        e, r, c = self.b.emit, self.b.reg, self.config
        m_block, n_block = r("u32", "mblk"), r("u32", "nblk")
        if self.group_tiles is None:
            e(f"div.u32 {m_block}, {tile}, {self.n_blocks};", f"rem.u32 {n_block}, {tile}, {self.n_blocks};")
        else:
            group, first_n, width, rest = r("u32"), r("u32"), r("u32"), r("u32")
            e(f"div.u32 {group}, {tile}, {self.group_tiles};",
              f"mul.lo.u32 {first_n}, {group}, {c.raster_group};",
              f"sub.u32 {width}, {self.n_blocks}, {first_n};",
              f"min.u32 {width}, {width}, {c.raster_group};",
              f"mul.lo.u32 {rest}, {group}, {self.group_tiles};",
              f"sub.u32 {rest}, {tile}, {rest};",
              f"div.u32 {m_block}, {rest}, {width};",
              f"rem.u32 {n_block}, {rest}, {width};",
              f"add.u32 {n_block}, {n_block}, {first_n};")
        m0, n0 = r("u32", "m0"), r("u32", "n0")
        e(f"mul.lo.u32 {m0}, {m_block}, {c.block_m};", f"mul.lo.u32 {n0}, {n_block}, {c.block_n};")
        return m0, n0

    @contextmanager
    def tiles(self):
        """The body runs once per tile of this CTA with (m0, n0) registers; persistent kernels loop (``self.tile``
        is the tile index meanwhile)."""
        b, e, r = self.b, self.b.emit, self.b.reg
        tile = self.tile = r("u32", f"{self.name}_tile")
        e(f"mov.u32 {tile}, %ctaid.x;")
        if not self.config.persistent:  # the grid is the tile count: exactly one tile, no loop
            yield self._coords(tile)
            return
        step, done, top, finished = r("u32"), r("pred"), b.label(f"{self.name}_tile"), b.label(f"{self.name}_done")
        e(f"mov.u32 {step}, %nctaid.x;")
        b.place(top)
        e(f"setp.ge.u32 {done}, {tile}, {self.num_tiles};", f"@{done} bra {finished};")
        yield self._coords(tile)
        e(f"add.u32 {tile}, {tile}, {step};", f"bra {top};")
        b.place(finished)


__all__ = ["TileScheduler", "tile_coords", "schedule"]
