"""The epilogue emitters: the math warpgroups' FP32 totals -> BF16 D.

* :class:`StagedEpilogue` (stages 05-07): each warp rounds its 16 rows into a padded shared tile and copies them
  out with coalesced 16-byte ``st.global``, masked at ragged edges (:meth:`gemm.kernel.math_warpgroups.MathWarpgroups.store`).
* :class:`TmaEpilogue` (stage 08): ``stmatrix`` writes the warp's BF16 fragments straight into a shared tile laid
  out as TMA wants it (64-column atoms of 128-byte rows, 16-byte chunks XOR-swizzled by row, so the 8 rows a
  ``stmatrix`` writes land in 8 different bank groups), one thread issues a TMA store per atom, and the copy
  engine writes D, clipping rows past M and columns past N. The store is not waited for: the next tile's
  epilogue first waits until the previous stores have *read* the shared tile (``cp.async.bulk.wait_group.read``),
  so the stores drain while the next tile's main loop runs.
  FP32 D (``out_dtype="f32"``): stmatrix moves 16-bit elements only, so each thread writes its two adjacent FP32
  totals with ``st.shared.v2.f32`` into 32-column atoms (128-byte rows, the same 16-byte-chunk XOR), which puts
  a warp's 8 rows x 32 bytes in the minimum two shared-memory wavefronts. With ``accumulate`` the TMA store is
  a reduce-add (``cp.reduce.async.bulk.tensor .add``): D = C + A*B, added by the copy engine at L2.

:func:`d_tile_offset` is the shared-tile layout in Python: the emitted addresses, the emulator and the figures use it.
"""
from __future__ import annotations

from typing import Callable

from gemm.kernel.config import KernelConfig, SharedPlan, tma_store_box_columns
from gemm.kernel.math_warpgroups import MathWarpgroups
from ptx.builder import KernelBuilder
from ptx.vocab import barriers, bulk_copies, core
from ptx.vocab import wgmma as w

MATH_BARRIER = 1  # named barrier of the math warpgroups (0 is the whole CTA's; the producer's threads have exited)


def d_tile_offset(row: int, col: int, block_m: int, block_n: int, out_bytes: int = 2) -> int:
    """Byte offset of D[row, col] (BF16, or FP32 with ``out_bytes=4``) in the TMA epilogue's shared tile."""
    atom_cols = tma_store_box_columns(block_n, out_bytes)
    row_bytes = out_bytes * atom_cols
    atom, col = divmod(col, atom_cols)
    chunk, within = divmod(out_bytes * col, 16)
    if row_bytes == 128:  # 128B swizzle: chunk c of row r lives at chunk c ^ (r % 8)
        chunk ^= row % 8
    return atom * block_m * row_bytes + row * row_bytes + 16 * chunk + within


def math_barrier(config: KernelConfig) -> str:
    return core.bar_sync(MATH_BARRIER, config.math_threads)


class StagedEpilogue:
    def __init__(self, b: KernelBuilder, plan: SharedPlan, math: MathWarpgroups, smem: str, d: str, m: str):
        self.b, self.plan, self.math, self.smem, self.d, self.m = b, plan, math, smem, d, m

    def store(self, m0: str, n0: str, bound: str | None = None) -> None:
        """``bound``: D rows at or past it are not stored (a register; None: M)."""
        b, plan = self.b, self.plan
        if not plan.d_bytes:  # the tile reuses the A ring: every math warp must be done reading it
            b.emit(math_barrier(plan.config))
        staging = b.reg("u32", "staging")
        b.emit(f"add.u32 {staging}, {self.smem}, {plan.staging};")
        self.math.store(staging, self.d, m0, n0, self.m if bound is None else bound, plan.n)

    def finish(self) -> None:
        pass


class TmaEpilogue:
    """``d``: D's global address, needed only by stores with a row bound (:meth:`store`)."""

    def __init__(self, b: KernelBuilder, plan: SharedPlan, math: MathWarpgroups, smem: str, tmap_d: str,
                 d: str | None = None):
        self.b, self.plan, self.math, self.tmap_d, self.d = b, plan, math, tmap_d, d
        c = plan.config
        self.atom_cols = tma_store_box_columns(c.block_n, c.out_bytes)
        self.row_bytes = c.out_bytes * self.atom_cols
        # the whole tile, or a part of it (one wave's rows, one atom's columns) that the tile passes through
        self.buffer_rows, self.buffer_cols = c.d_buffer_shape
        e, r = b.emit, b.reg
        self.store_thread = r("pred", "p_store")
        e(f"setp.eq.u32 {self.store_thread}, {math.tid}, 0;")
        self.tile = r("u32", "dtile")
        e(f"add.u32 {self.tile}, {smem}, {plan.d_region};")
        if c.out_dtype == "f32":
            self._setup_f32()
            return
        if c.swap_ab:
            self._setup_transposed()
            return
        # this lane's stmatrix row (matrix q = lane / 8 holds rows 8(q % 2).. of column group j + q / 2)
        q, row = r("u32"), r("u32", "drow")
        e(f"shr.u32 {q}, {math.lane}, 3;", f"and.b32 {row}, {q}, 1;", f"shl.b32 {row}, {row}, 3;",
          f"mad.lo.u32 {row}, {math.warp}, 16, {row};")
        low = r("u32")
        e(f"and.b32 {low}, {math.lane}, 7;", f"add.u32 {row}, {row}, {low};", f"shr.u32 {q}, {q}, 1;")
        self.row_address = r("u32", "drow_addr")
        self.lane_chunk = r("u32", "dchunk")
        row_bytes = 2 * self.atom_cols
        e(f"mad.lo.u32 {self.row_address}, {row}, {row_bytes}, {self.tile};")
        if self.atom_cols == 64:  # the lane's chunk bits before the per-group XOR: (j + q/2) ^ (row % 8), j even
            e(f"xor.b32 {self.lane_chunk}, {q}, {low};")
        else:
            e(f"shl.b32 {self.lane_chunk}, {q}, 4;", f"add.u32 {self.row_address}, {self.row_address}, {self.lane_chunk};")

    def _setup_f32(self) -> None:
        """This lane's row (warp * 16 + lane / 4; +8 for the second half) and its swizzled chunk bits: the lane's
        two columns 2(lane % 4).. of group g sit in chunk 2(g % 4) + (lane / 2) % 2 of the row, XOR row % 8."""
        e, r, math = self.b.emit, self.b.reg, self.math
        row, low = r("u32", "drow"), r("u32")
        e(f"shr.u32 {low}, {math.lane}, 2;", f"mad.lo.u32 {row}, {math.warp}, 16, {low};")
        self.row_address = r("u32", "drow_addr")
        e(f"mad.lo.u32 {self.row_address}, {row}, {self.row_bytes}, {self.tile};")
        self.lane_chunk = r("u32", "dchunk")  # swizzled: ((lane >> 1) & 1) ^ (row % 8), row % 8 == lane >> 2
        e(f"shr.u32 {self.lane_chunk}, {math.lane}, 1;", f"and.b32 {self.lane_chunk}, {self.lane_chunk}, 1;")
        if self.row_bytes == 128:
            e(f"xor.b32 {self.lane_chunk}, {self.lane_chunk}, {low};")
        e(f"shl.b32 {self.lane_chunk}, {self.lane_chunk}, 4;")
        within = r("u32")  # the lane's 8 bytes inside its 16-byte chunk
        e(f"and.b32 {within}, {math.lane}, 1;", f"shl.b32 {within}, {within}, 3;",
          f"add.u32 {self.row_address}, {self.row_address}, {within};")

    def _setup_transposed(self) -> None:
        """swap_ab: the totals are D transposed (the thread's rows are D's columns 16 warp + l/4, + 8; its columns
        D's rows 8j + 2(l % 4), + 1), written back with ``stmatrix .trans``. Lane l names row l % 8 of matrix
        q = l / 8, which .trans fills with that matrix's *column* l % 8: D row 8(j + q / 2) + l % 8 (j the pair's
        first column group), its 8 consecutive D columns 16 (warp % 4) + 8 (q % 2).. of atom warp / 4, one 16-byte
        chunk, XOR-swizzled by the D row (l % 8): the tile :func:`d_tile_offset` lays out, as unswapped."""
        e, r, math, c = self.b.emit, self.b.reg, self.math, self.plan.config
        q, low, row, chunk, atom = r("u32"), r("u32"), r("u32"), r("u32"), r("u32")
        e(f"shr.u32 {q}, {math.lane}, 3;", f"and.b32 {low}, {math.lane}, 7;",
          f"shr.u32 {row}, {q}, 1;", f"mad.lo.u32 {row}, {row}, 8, {low};",  # D row within the pair's 16
          f"and.b32 {chunk}, {math.warp}, 3;", f"shl.b32 {chunk}, {chunk}, 1;",
          f"and.b32 {atom}, {q}, 1;", f"add.u32 {chunk}, {chunk}, {atom};", f"xor.b32 {chunk}, {chunk}, {low};",
          f"shr.u32 {atom}, {math.warp}, 2;")
        self.row_address = r("u32", "drow_addr")
        e(f"mul.lo.u32 {self.row_address}, {atom}, {c.block_m * self.row_bytes};",
          f"mad.lo.u32 {self.row_address}, {row}, {self.row_bytes}, {self.row_address};",
          f"mad.lo.u32 {self.row_address}, {chunk}, 16, {self.row_address};",
          f"add.u32 {self.row_address}, {self.row_address}, {self.tile};")

    def _write_transposed(self, total: list[str]) -> None:
        """swap_ab: the thread's totals into the D tile, BF16, by ``stmatrix .trans``: four matrices (two column
        groups of the accumulators, both row halves) per instruction, two for a last odd group."""
        b, e = self.b, self.b.emit
        groups = len(total) // 4
        for g in range(0, groups, 2):
            regs = []
            for group in range(g, min(g + 2, groups)):
                for half in range(2):
                    packed = b.reg("b32")
                    e(core.cvt_f32x2_to_bf16x2(packed, total[4 * group + 2 * half + 1], total[4 * group + 2 * half]))
                    regs.append(packed)
            address = self.row_address
            if g:  # the pair's D rows start 8 g further down
                address = b.reg("u32")
                e(f"add.u32 {address}, {self.row_address}, {8 * g * self.row_bytes};")
            e(w.stmatrix(regs, address, transpose=True))

    def _address_f32(self, group: int, wave: int, half: int) -> str:
        """Shared address of this lane's two FP32 totals of 8-column group ``group``, rows +8 for ``half``."""
        e, r = self.b.emit, self.b.reg
        atom, col = divmod(group * 8 % self.buffer_cols, self.atom_cols)
        row0 = self.math.wave_row(wave) % self.buffer_rows + 8 * half  # multiples of 8: the same swizzle phase
        offset = (atom * self.buffer_rows + row0) * self.row_bytes
        address = r("u32")
        if self.row_bytes == 128:
            e(f"xor.b32 {address}, {self.lane_chunk}, {16 * (col // 4)};")  # col // 4: the group's chunk pair
        else:
            e(f"add.u32 {address}, {self.lane_chunk}, {4 * col};")
        e(f"add.u32 {address}, {address}, {self.row_address};")
        if offset:
            e(f"add.u32 {address}, {address}, {offset};")
        return address

    def _write_f32(self, waves, groups) -> None:
        for wave, total in waves:
            for group in groups:
                for half in range(2):
                    lo, hi = total[4 * group + 2 * half], total[4 * group + 2 * half + 1]
                    self.b.emit(f"st.shared.v2.f32 [{self._address_f32(group, wave, half)}], {{{lo}, {hi}}};")

    def _address(self, group: int, wave: int) -> str:
        """Shared address this lane gives stmatrix for the column-group pair starting at ``group`` (even) of
        wave ``wave`` (its rows lie ``math.wave_row(wave)`` further down; a multiple of 8, so the swizzle phase is the
        same)."""
        e, r = self.b.emit, self.b.reg
        atom, chunk = divmod(group * 8 % self.buffer_cols, self.atom_cols)
        atom_offset = (atom * self.buffer_rows + self.math.wave_row(wave) % self.buffer_rows) * 2 * self.atom_cols
        address = r("u32")
        if self.atom_cols == 64:
            e(f"xor.b32 {address}, {self.lane_chunk}, {chunk // 8};", f"shl.b32 {address}, {address}, 4;",
              f"add.u32 {address}, {address}, {self.row_address};")
            if atom_offset:
                e(f"add.u32 {address}, {address}, {atom_offset};")
        else:
            e(f"add.u32 {address}, {self.row_address}, {atom_offset + 2 * chunk};")
        return address

    def drain(self) -> None:
        """The store thread waits until the stores issued so far have read the buffer: what :meth:`store`'s first
        pass does unless told it is done. ptxas completes every wgmma group in flight before a
        ``cp.async.bulk.wait_group``, so a K loop that keeps wgmmas in flight across the epilogue
        (KernelConfig.overlap_epilogue) drains before it issues them."""
        self.b.emit(f"@{self.store_thread} {bulk_copies.bulk_wait_group(0, read_only=True)}")

    def store(self, m0: str, n0: str, bound: str | None = None, drained: bool = False,
              after_writes: Callable[[], None] | None = None) -> None:
        """The tile's totals to D[m0.., n0..]. ``bound`` (a register, for the masked grouped GEMM): D rows at or
        past it must stay untouched, which the TMA store cannot promise (it clips at the tensor's edges only), so
        a pass whose rows reach past ``bound`` is copied out of the shared buffer by the math threads with
        row-masked ``st.global`` instead (:meth:`_copy_rows_below`); passes of rows all below it use TMA.
        ``drained``: the caller ran :meth:`drain` since the last stores, so the first pass only synchronizes.
        ``after_writes()`` (one pass only) emits what follows the threads' shared writes, before the fence that hands
        them to the TMA unit."""
        e, c = self.b.emit, self.plan.config
        waves = list(enumerate(self.math.totals))
        row_passes, col_passes = c.block_m // self.buffer_rows, c.block_n // self.buffer_cols
        per_pass = len(waves) // row_passes
        for row_pass in range(row_passes):
            for col_pass in range(col_passes):
                # the buffer is free once the stores issued from it (the previous tile's, or this tile's previous
                # pass) have read it
                if not (drained and row_pass == col_pass == 0):
                    self.drain()
                e(math_barrier(c))
                first_group = col_pass * self.buffer_cols // 8
                self._write(waves[row_pass * per_pass:(row_pass + 1) * per_pass],
                            range(first_group, first_group + self.buffer_cols // 8))
                if after_writes is not None:
                    if row_passes * col_passes != 1:
                        raise ValueError("after_writes runs after the whole tile's shared writes: one pass only")
                    after_writes()
                e(barriers.fence_proxy_async(), math_barrier(c))  # every warp's shared writes visible to the TMA unit
                if bound is None:
                    self._issue_stores(m0, n0, row_pass * self.buffer_rows, col_pass * self.buffer_cols)
                else:
                    self._bounded_stores(m0, n0, row_pass * self.buffer_rows, col_pass * self.buffer_cols, bound)

    def _bounded_stores(self, m0: str, n0: str, row0: int, col0: int, bound: str) -> None:
        """TMA stores when the buffer's rows all lie below ``bound`` (uniform across the CTA), else the masked copy."""
        b, e, r = self.b, self.b.emit, self.b.reg
        end, whole, done, partial = r("u32"), r("pred"), b.label("bounded_done"), b.label("partial_rows")
        e(f"add.u32 {end}, {m0}, {row0 + self.buffer_rows};", f"setp.gt.u32 {whole}, {end}, {bound};",
          f"@{whole} bra {partial};")
        self._issue_stores(m0, n0, row0, col0)
        e(f"bra {done};")
        b.place(partial)
        self._copy_rows_below(m0, n0, row0, col0, bound)
        b.place(done)

    def _copy_rows_below(self, m0: str, n0: str, row0: int, col0: int, bound: str) -> None:
        """The math threads read the buffer in 16-byte chunks (undoing the swizzle, :func:`d_tile_offset`) and
        store those of rows below ``bound`` and columns below N to D with ``st.global.v4``. Generic-proxy reads of
        generic writes after the math barrier: no proxy fence needed; the next pass's first barrier orders these
        reads before the buffer is written again."""
        b, e, r, c = self.b, self.b.emit, self.b.reg, self.plan.config
        item = c.out_bytes
        chunk_items = 16 // item
        row_chunks = self.buffer_cols // chunk_items  # 16-byte chunks per buffer row
        atom_chunks = self.row_bytes // 16  # per atom row
        total = self.buffer_rows * row_chunks
        n = self.plan.n
        for first in range(0, total, c.math_threads):
            index, row, chunk, skip = r("u32"), r("u32"), r("u32"), b.label("copy_skip")
            outside = r("pred")
            e(f"add.u32 {index}, {self.math.tid}, {first};")
            if first + c.math_threads > total:
                e(f"setp.ge.u32 {outside}, {index}, {total};", f"@{outside} bra {skip};")
            e(f"div.u32 {row}, {index}, {row_chunks};", f"rem.u32 {chunk}, {index}, {row_chunks};")
            grow, gcol, keep, keep_col = r("u32"), r("u32"), r("pred"), r("pred")
            e(f"add.u32 {grow}, {m0}, {row};", f"add.u32 {grow}, {grow}, {row0};",
              f"mad.lo.u32 {gcol}, {chunk}, {chunk_items}, {n0};", f"add.u32 {gcol}, {gcol}, {col0};",
              f"setp.lt.u32 {keep}, {grow}, {bound};", f"setp.lt.u32 {keep_col}, {gcol}, {n};",
              f"and.pred {keep}, {keep}, {keep_col};", f"@!{keep} bra {skip};")
            # shared address: atom = chunk / atom_chunks, chunk within the atom XOR row % 8 (128-byte rows)
            atom, within, address = r("u32"), r("u32"), r("u32")
            e(f"div.u32 {atom}, {chunk}, {atom_chunks};", f"rem.u32 {within}, {chunk}, {atom_chunks};")
            if self.row_bytes == 128:
                low = r("u32")
                e(f"and.b32 {low}, {row}, 7;", f"xor.b32 {within}, {within}, {low};")
            e(f"mul.lo.u32 {address}, {atom}, {self.buffer_rows * self.row_bytes};",
              f"mad.lo.u32 {address}, {row}, {self.row_bytes}, {address};",
              f"mad.lo.u32 {address}, {within}, 16, {address};", f"add.u32 {address}, {address}, {self.tile};")
            values = b.regs("b32", 4)
            pointer, wide = r("u64"), r("u64")
            e(f"ld.shared.v4.b32 {{{', '.join(values)}}}, [{address}];",
              f"mul.wide.u32 {pointer}, {grow}, {item * n};", f"mul.wide.u32 {wide}, {gcol}, {item};",
              f"add.u64 {pointer}, {pointer}, {wide};", f"add.u64 {pointer}, {pointer}, {self.d};",
              f"st.global.v4.b32 [{pointer}], {{{', '.join(values)}}};")
            b.place(skip)

    def _issue_stores(self, m0: str, n0: str, row0: int, col0: int) -> None:
        """One elected thread stores the buffer's atoms at D[m0 + row0.., n0 + col0..] and commits the group."""
        b, e, c = self.b, self.b.emit, self.plan.config
        skip = b.label("stored")
        e(f"@!{self.store_thread} bra {skip};")
        y = m0
        if row0:
            y = b.reg("u32")
            e(f"add.u32 {y}, {m0}, {row0};")
        store = bulk_copies.tma_reduce_add_2d if c.accumulate else bulk_copies.tma_store_2d
        for atom in range(self.buffer_cols // self.atom_cols):
            x = b.reg("u32")
            e(f"add.u32 {x}, {n0}, {col0 + atom * self.atom_cols};",
              store(self.tmap_d, x, y, f"{self.tile}+{atom * self.buffer_rows * self.row_bytes}"))
        e(bulk_copies.bulk_commit_group())
        b.place(skip)

    def _write(self, waves, groups) -> None:
        """The totals of ``waves`` [(wave, registers)], 8-column ``groups``, into the buffer: stmatrix (BF16, in
        pairs of groups) or st.shared (FP32)."""
        if self.plan.config.out_dtype == "f32":
            self._write_f32(waves, groups)
            return
        if self.plan.config.swap_ab:  # one wave, one pass: the whole tile
            self._write_transposed(waves[0][1])
            return
        b, e = self.b, self.b.emit
        for wave, total in waves:
            for g in range(groups.start, groups.stop, 2):
                regs = []
                for group in range(g, min(g + 2, groups.stop)):
                    for half in range(2):  # rows l/4 and l/4 + 8 of the warp's 16
                        packed = b.reg("b32")
                        lo, hi = total[4 * group + 2 * half], total[4 * group + 2 * half + 1]
                        e(core.cvt_f32x2_to_bf16x2(packed, hi, lo))
                        regs.append(packed)
                e(w.stmatrix(regs, self._address(g, wave)))

    def finish(self) -> None:
        """Before exit: the last stores must have read shared memory; their global writes need no wait (the
        copy engine completes them; kernel completion orders them before later work, as CUTLASS relies on)."""
        self.b.emit(f"@{self.store_thread} {bulk_copies.bulk_wait_group(0, read_only=True)}")


__all__ = ["StagedEpilogue", "TmaEpilogue", "d_tile_offset", "MATH_BARRIER"]
