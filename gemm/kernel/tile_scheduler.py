"""The tile scheduler emitter: which (m0, n0) output tiles a CTA computes, and in what order.

* One CTA per tile (stages 06-07): the grid is the tile count and CTA ``t`` computes tile ``t``.
* Split-K: the grid is split_k CTAs per tile, and the cluster of CTAs ``split_k t .. split_k t + split_k - 1``
  computes tile ``t`` (each a share of its K blocks).
* Persistent (stage 08): the grid is the SM count; CTA ``c`` computes tiles ``c, c + grid, c + 2 grid, ...``
  (a static schedule: no atomics, so the producer and the math warpgroups each run their own copy of this
  walk and agree without talking).

Tile ``t`` maps to (m block, n block) in row-major order, or in a *grouped* order (``raster_group`` = G): the
tiles are cut into groups of G consecutive n-blocks by all m-blocks, and inside a group n varies fastest.
The ~132 tiles in flight at once then cover about G n-blocks by 132/G m-blocks, so the A and B rows they read
overlap in L2 instead of streaming all of B past every A row block. The M-block count is a run-time value (M is
a kernel parameter); N, and so the n-block count, is compiled in. :func:`tile_coords` is the same map in
Python, for tests and figures.

A pair multicasting B (``multicast_operand="b"``) needs tiles 2i and 2i + 1 in the same *column*, so its walk is
the transpose: groups of G consecutive m-blocks by all n-blocks, m fastest inside a group (column-major without
groups). A group's tile count, G times the n-blocks, is then a compile-time constant; the group's width (fewer
m-blocks in the last one) and, without groups, the m-block count are run-time divisors.

The MoE grouped GEMMs (``config.gemm_type``, :mod:`gemm.grouped`) add where a tile's operands come from:

* **contiguous**: the walk is the dense one over sum(M) rows. Each role reads the tile's group
  ``g = m_indices[m0]`` (one ``ld.global`` per tile; producer and math read the same word, so they agree) and
  skips the tile when ``g`` is not in 0..G-1 (-1 marks padding: its D rows are left as they are). B's rows are
  ``g*N + n0`` of the (G*N, K) stack of experts.
* **masked**: CTA ``c`` walks *virtual* tile indices ``c, c + grid, ...``, which number the tiles of group 0,
  then of group 1, and so on; group g has ``ceil(masked_m[g] / BLOCK_M) * n_blocks`` of them (masked_m read on
  the device, clamped to 0..M_max). A CTA's index only grows, so it keeps a cursor (group, its first virtual
  tile) and moves it forward: O(G) loads of masked_m per CTA in all. Inside a group the order is the dense one
  (row-major or the raster groups). A and D rows are ``g*M_max + m0`` of the flattened (G*M_max) rows, sa is
  loaded at (m0, g*K/128 + k), and the epilogue stores rows below ``g*M_max + masked_m[g]`` only
  (:attr:`TileScheduler.row_bound`). :func:`masked_schedule` is the same walk in Python.
"""
from __future__ import annotations

from contextlib import contextmanager

from gemm.fp8 import ceil_div, is_power_of_two
from gemm.kernel.config import KernelConfig
from gemm.kernel.seams import NO_SEAMS, Seams
from ptx.builder import KernelBuilder
from ptx.vocab import core


def tile_coords(tile: int, m_blocks: int, n_blocks: int, raster_group: int,
                along_m: bool = False) -> tuple[int, int]:
    """(m block, n block) of tile ``tile``: what the emitted PTX computes. ``along_m``: the walk of a pair that
    multicasts B (groups of ``raster_group`` m-blocks, m fastest)."""
    if along_m:
        n_block, m_block = tile_coords(tile, n_blocks, m_blocks, raster_group)
        return m_block, n_block
    if raster_group <= 0:
        return divmod(tile, n_blocks)
    group, rest = divmod(tile, raster_group * m_blocks)
    first_n = group * raster_group
    width = min(raster_group, n_blocks - first_n)
    return rest // width, first_n + rest % width


def schedule(cta: int, grid: int, m_blocks: int, n_blocks: int, raster_group: int,
             along_m: bool = False) -> list[tuple[int, int]]:
    """The tiles CTA ``cta`` of a persistent grid of ``grid`` CTAs computes, in order."""
    return [tile_coords(t, m_blocks, n_blocks, raster_group, along_m) for t in range(cta, m_blocks * n_blocks, grid)]


def masked_schedule(cta: int, grid: int, masked_m, m_max: int, block_m: int, n_blocks: int,
                    raster_group: int) -> list[tuple[int, int, int]]:
    """The (group, m block, n block) tiles CTA ``cta`` of a masked grouped GEMM computes, in order."""
    counts = [ceil_div(min(max(int(x), 0), m_max), block_m) for x in masked_m]
    starts = [0]
    for count in counts:
        starts.append(starts[-1] + count * n_blocks)
    out = []
    for tile in range(cta, starts[-1], grid):
        group = max(g for g in range(len(counts)) if starts[g] <= tile)
        raster = raster_group if raster_group < n_blocks else 0
        out.append((group, *tile_coords(tile - starts[group], counts[group], n_blocks, raster)))
    return out


class TileScheduler:
    """Emits the tile walk for one role (producer or math): ``with scheduler.tiles() as (m0, n0): ...``.

    Where the tile's operands and output rows are, for the grouped GEMMs (``layout``: the u64 global address of
    m_indices or masked_m, ``groups``: G, both registers), inside :meth:`tiles`: :attr:`a_row` (A's and D's row,
    m0 for a dense tile), :attr:`b_row` (B's row, n0), :attr:`sa_k_base` (added to the K block for sa's row, or
    None), :attr:`group` (the tile's group register, or None) and :attr:`row_bound` (D rows at or past it are not
    stored; None: M, the dense bound)."""

    def __init__(self, b: KernelBuilder, config: KernelConfig, n: int, m: str, name: str,
                 layout: str | None = None, groups: str | None = None, k_blocks: int = 0,
                 seams: Seams = NO_SEAMS):
        self.b, self.config, self.name, self.seams = b, config, name, seams
        self.n, self.m, self.layout, self.groups, self.k_blocks = n, m, layout, groups, k_blocks
        self.n_blocks = ceil_div(n, config.block_n)
        self.group = self.sa_k_base = self.row_bound = None
        e, r = b.emit, b.reg
        if config.gemm_type == "masked":  # the tile count is walked group by group in tiles()
            self.group_tiles = None
            return
        self.num_tiles = r("u32", f"{name}_tiles")
        m_blocks = r("u32", f"{name}_mblocks")
        e(f"add.u32 {m_blocks}, {m}, {config.block_m - 1};",
          f"shr.u32 {m_blocks}, {m_blocks}, {config.block_m.bit_length() - 1};",
          f"mul.lo.u32 {self.num_tiles}, {m_blocks}, {self.n_blocks};")
        self.m_blocks, self.group_tiles = m_blocks, None
        if config.multicast_operand == "b":  # the walk along M: a group's tile count is compiled in (_coords_along_m)
            return
        if config.raster_group and config.raster_group < self.n_blocks:
            self.group_tiles = r("u32", f"{name}_gtiles")
            e(f"mul.lo.u32 {self.group_tiles}, {m_blocks}, {config.raster_group};")

    def pair_flags(self, rank: str):
        """Inside :meth:`tiles` of a 2-CTA cluster: the CTAs of a pair walk tiles 2i and 2i + 1 (the grid is even),
        so both compute the same flags from the pair's first tile: whether the peer has a tile at this step and
        whether the two tiles share the multicast operand (their rows for A, their columns for B). A pair split
        across a row, column or group edge, or an odd last tile, loads it without multicast; both CTAs agree, so
        neither waits for bytes never sent. Without a second tile the first stands in for it (a tile index past
        the last could divide by a zero-wide raster group, or read past a tile_coords table), and the flag is off."""
        from gemm.kernel.producer import PairFlags
        e, r = self.b.emit, self.b.reg
        operand = self.config.multicast_operand
        first, second, probe = r("u32", "pair0"), r("u32", "pair1"), r("u32", "pair1_at")
        alive, same, own, lead, rank0, mask = (r("pred", "p_peer"), r("pred"), r("pred", f"p_own_{operand}"),
                                              r("pred", f"p_lead_{operand}"), r("pred"), r("b16", "cta_mask"))
        e(f"sub.u32 {first}, {self.tile}, {rank};", f"add.u32 {second}, {first}, 1;",
          f"setp.lt.u32 {alive}, {second}, {self.num_tiles};", f"selp.u32 {probe}, {second}, {first}, {alive};")
        shared_coordinate = 0 if operand == "a" else 1  # m0 for A's rows, n0 for B's columns
        first_at = self._coords(first)[shared_coordinate]
        second_at = self._coords(probe)[shared_coordinate]
        e(f"setp.eq.u32 {same}, {first_at}, {second_at};",
          f"and.pred {same}, {same}, {alive};", f"not.pred {own}, {same};",
          f"setp.eq.u32 {rank0}, {rank}, 0;", f"and.pred {lead}, {same}, {rank0};", f"mov.b16 {mask}, 3;")
        return PairFlags(own=own, lead=lead, peer_alive=alive, mask=mask, operand=operand)

    def _coords(self, tile: str) -> tuple[str, str]:
        e, r, c = self.b.emit, self.b.reg, self.config
        m_block, n_block = r("u32", "mblk"), r("u32", "nblk")
        table = self.seams.tile_coords  # a caller's tile map (gemm.kernel.seams), else the grouped raster
        if table is not None:
            self._coords_table(table, tile, m_block, n_block)
        elif c.multicast_operand == "b":
            self._coords_along_m(tile, m_block, n_block)
        elif self.group_tiles is None and c.raster_shifts and is_power_of_two(self.n_blocks):
            e(f"shr.u32 {m_block}, {tile}, {self.n_blocks.bit_length() - 1};",
              f"and.b32 {n_block}, {tile}, {self.n_blocks - 1};")
        elif self.group_tiles is None:
            e(f"div.u32 {m_block}, {tile}, {self.n_blocks};", f"rem.u32 {n_block}, {tile}, {self.n_blocks};")
        elif c.raster_shifts and self.n_blocks % c.raster_group == 0 and is_power_of_two(c.raster_group):
            # every group is raster_group blocks wide: one division (by the run-time group size), then shifts
            group, first_n, rest, shift = r("u32"), r("u32"), r("u32"), c.raster_group.bit_length() - 1
            e(f"div.u32 {group}, {tile}, {self.group_tiles};",
              f"mul.lo.u32 {rest}, {group}, {self.group_tiles};", f"sub.u32 {rest}, {tile}, {rest};",
              f"shr.u32 {m_block}, {rest}, {shift};", f"and.b32 {n_block}, {rest}, {c.raster_group - 1};",
              f"shl.b32 {first_n}, {group}, {shift};", f"add.u32 {n_block}, {n_block}, {first_n};")
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

    def _coords_along_m(self, tile: str, m_block: str, n_block: str) -> None:
        """The walk along M (:func:`tile_coords` with ``along_m``): groups of G m-blocks by all n-blocks, m fastest;
        G * n_blocks tiles per group, a compile-time constant, and the last group's width min(G, m_blocks - first)."""
        e, r, c = self.b.emit, self.b.reg, self.config
        if not c.raster_group:
            e(f"div.u32 {n_block}, {tile}, {self.m_blocks};", f"rem.u32 {m_block}, {tile}, {self.m_blocks};")
            return
        group, first_m, width, rest = r("u32"), r("u32"), r("u32"), r("u32")
        e(f"div.u32 {group}, {tile}, {c.raster_group * self.n_blocks};",
          f"mul.lo.u32 {first_m}, {group}, {c.raster_group};",
          f"sub.u32 {width}, {self.m_blocks}, {first_m};",
          f"min.u32 {width}, {width}, {c.raster_group};",
          f"mul.lo.u32 {rest}, {group}, {c.raster_group * self.n_blocks};",
          f"sub.u32 {rest}, {tile}, {rest};",
          f"div.u32 {n_block}, {rest}, {width};",
          f"rem.u32 {m_block}, {rest}, {width};",
          f"add.u32 {m_block}, {m_block}, {first_m};")

    def _coords_table(self, function, tile: str, m_block: str, n_block: str) -> None:
        """(m block, n block) of ``tile`` by a Python ``function(tile, m_blocks, n_blocks, raster_group)`` evaluated
        for every tile of M = ``seams.rows`` rows, kept as a ``.const`` table of packed (m << 16 | n) and read with
        one uniform ``ld.const`` per tile (the exercise seam). An unrolled compare-and-select chain instead costs
        2 instructions per tile of the grid, each time a tile starts: 15% of stage 08 at 4096 x 4096 x 7168."""
        e, r, c = self.b.emit, self.b.reg, self.config
        rows = self.seams.rows
        if self.config.grouped or rows is None:
            raise ValueError("the tile_coords seam needs a dense GEMM and rows=M (the M the kernel will run at)")
        if c.multicast_operand == "b":
            raise ValueError("the tile_coords seam gives a walk of its own, and multicast_operand='b' needs the walk "
                             "along M (tile_coords(..., along_m=True)): use multicast_operand='a' with the seam")
        m_blocks = ceil_div(rows, c.block_m)
        packed, offset, address = r("u32", "tile_mn"), r("u64", "tile_off"), r("u64", "tile_at")
        values = []
        for t in range(m_blocks * self.n_blocks):
            coords = function(t, m_blocks, self.n_blocks, c.raster_group)
            if (type(coords) is not tuple or len(coords) != 2  # exactly: a subclass could index unlike it iterates
                    or not all(type(x) is int and 0 <= x < 2**16 for x in coords)):
                raise ValueError(f"tile_coords({t}, {m_blocks}, {self.n_blocks}, {c.raster_group}) must be a pair "
                                 f"of ints in 0..65535 (m_block, n_block), got {coords!r}")
            values.append(coords[0] << 16 | coords[1])
        table = self.b.const_table("tile_coords_table", values)  # one per kernel, whichever role asks first
        e(f"mul.wide.u32 {offset}, {tile}, 4;", f"mov.u64 {address}, {table};",
          f"add.s64 {address}, {address}, {offset};", f"ld.const.u32 {packed}, [{address}];",
          f"shr.u32 {m_block}, {packed}, 16;", f"and.b32 {n_block}, {packed}, 65535;")

    @contextmanager
    def tiles(self):
        """The body runs once per tile of this CTA with (m0, n0) registers; persistent kernels loop (``self.tile``
        is the tile index meanwhile). Grouped GEMMs set the attributes named in the class docstring first."""
        if self.config.gemm_type == "masked":
            yield from self._masked_tiles()
            return
        b, e, r = self.b, self.b.emit, self.b.reg
        tile = self.tile = r("u32", f"{self.name}_tile")
        e(f"mov.u32 {tile}, %ctaid.x;")
        if self.config.split_k > 1:  # a cluster of split_k consecutive CTAs shares one tile
            e(core.divide_by_constant(tile, tile, self.config.split_k))
        if not self.config.persistent:  # the grid is the tile count: exactly one tile, no loop
            if self.config.gemm_type == "contiguous":
                skip = b.label(f"{self.name}_skip")
                yield self._contiguous_group(*self._coords(tile), skip)
                b.place(skip)
                return
            yield self._coords(tile)
            return
        step, done, top, finished = r("u32"), r("pred"), b.label(f"{self.name}_tile"), b.label(f"{self.name}_done")
        self.step = step
        e(f"mov.u32 {step}, %nctaid.x;")
        b.place(top)
        e(f"setp.ge.u32 {done}, {tile}, {self.num_tiles};", f"@{done} bra {finished};")
        if self.config.gemm_type == "contiguous":
            skip = b.label(f"{self.name}_skip")
            yield self._contiguous_group(*self._coords(tile), skip)
            b.place(skip)
        else:
            yield self._coords(tile)
        e(f"add.u32 {tile}, {tile}, {step};", f"bra {top};")
        b.place(finished)

    def next_tile(self) -> tuple[str, str]:
        """Inside :meth:`tiles` of a persistent dense walk: (a predicate set when this CTA has a next tile, that
        tile's index); ask :meth:`coords` of it only where the predicate is set (a tile_coords table has no entry
        past the last tile)."""
        e, r = self.b.emit, self.b.reg
        following, more = r("u32", "next_tile"), r("pred", "p_next_tile")
        e(f"add.u32 {following}, {self.tile}, {self.step};", f"setp.lt.u32 {more}, {following}, {self.num_tiles};")
        return more, following

    def coords(self, tile: str) -> tuple[str, str]:
        """(m0, n0) of a dense tile index: the walk's own order."""
        return self._coords(tile)

    # -- grouped GEMMs ------------------------------------------------------------------------------
    def _contiguous_group(self, m0: str, n0: str, skip: str) -> tuple[str, str]:
        """g = m_indices[m0]; a tile whose g is not in 0..G-1 (-1: padding) branches to ``skip``; B row g*N + n0."""
        e, r = self.b.emit, self.b.reg
        address, group, outside = r("u64"), r("u32", f"{self.name}_group"), r("pred")
        e(f"mul.wide.u32 {address}, {m0}, 4;", f"add.u64 {address}, {address}, {self.layout};",
          f"ld.global.nc.u32 {group}, [{address}];",
          # unsigned: -1 (padding) is 0xffffffff, past every group
          f"setp.ge.u32 {outside}, {group}, {self.groups};", f"@{outside} bra {skip};")
        self.group, self.a_row, self.sa_x = group, m0, m0
        self.b_row = r("u32", "b_row")
        e(f"mad.lo.u32 {self.b_row}, {group}, {self.n}, {n0};")
        return m0, n0

    def _load_group(self, group: str, rows: str, m_blocks: str, count: str) -> None:
        """rows = clamp(masked_m[group], 0, M_max); m_blocks = ceil(rows / BLOCK_M); count = m_blocks * n_blocks."""
        e, r, c = self.b.emit, self.b.reg, self.config
        address = r("u64")
        e(f"mul.wide.u32 {address}, {group}, 4;", f"add.u64 {address}, {address}, {self.layout};",
          f"ld.global.nc.u32 {rows}, [{address}];", f"max.s32 {rows}, {rows}, 0;", f"min.s32 {rows}, {rows}, {self.m};",
          f"add.u32 {m_blocks}, {rows}, {c.block_m - 1};",
          f"shr.u32 {m_blocks}, {m_blocks}, {c.block_m.bit_length() - 1};",
          f"mul.lo.u32 {count}, {m_blocks}, {self.n_blocks};")
        if self.group_tiles is not None:
            e(f"mul.lo.u32 {self.group_tiles}, {m_blocks}, {self.config.raster_group};")

    def _masked_tiles(self):
        b, e, r, c = self.b, self.b.emit, self.b.reg, self.config
        name = self.name
        tile = self.tile = r("u32", f"{name}_tile")
        step = r("u32")
        group, rows, m_blocks = r("u32", f"{name}_group"), r("u32", f"{name}_rows"), r("u32", f"{name}_mblocks")
        first, count, end = r("u32", f"{name}_first"), r("u32", f"{name}_count"), r("u32", f"{name}_end")
        if c.raster_group and c.raster_group < self.n_blocks:
            self.group_tiles = r("u32", f"{name}_gtiles")
        e(f"mov.u32 {tile}, %ctaid.x;", f"mov.u32 {step}, %nctaid.x;", f"mov.u32 {group}, 0;",
          f"mov.u32 {first}, 0;")
        self._load_group(group, rows, m_blocks, count)  # G >= 1 (checked on the host)
        e(f"add.u32 {end}, {first}, {count};")
        seek, found, finished = b.label(f"{name}_seek"), b.label(f"{name}_found"), b.label(f"{name}_done")
        inside, done = r("pred"), r("pred")
        b.place(seek)  # move the cursor to the group holding this tile (t only grows: never backwards)
        e(f"setp.lt.u32 {inside}, {tile}, {end};", f"@{inside} bra {found};",
          f"add.u32 {group}, {group}, 1;", f"setp.ge.u32 {done}, {group}, {self.groups};", f"@{done} bra {finished};",
          f"mov.u32 {first}, {end};")
        self._load_group(group, rows, m_blocks, count)
        e(f"add.u32 {end}, {first}, {count};", f"bra {seek};")
        b.place(found)
        local = r("u32", "local_tile")
        e(f"sub.u32 {local}, {tile}, {first};")
        m0, n0 = self._coords(local)  # in the group: its m_blocks (and raster group tiles) are loaded
        base = r("u32", "group_row")
        self.group, self.b_row = group, r("u32", "b_row")
        self.a_row, self.row_bound, self.sa_k_base = r("u32", "a_row"), r("u32", "row_bound"), r("u32", "sa_k")
        e(f"mul.lo.u32 {base}, {group}, {self.m};", f"add.u32 {self.a_row}, {base}, {m0};",
          f"add.u32 {self.row_bound}, {base}, {rows};", f"mul.lo.u32 {self.sa_k_base}, {group}, {self.k_blocks};",
          f"mad.lo.u32 {self.b_row}, {group}, {self.n}, {n0};")
        self.sa_x = m0
        yield m0, n0
        e(f"add.u32 {tile}, {tile}, {step};", f"bra {seek};")
        b.place(finished)


__all__ = ["TileScheduler", "tile_coords", "schedule", "masked_schedule"]
