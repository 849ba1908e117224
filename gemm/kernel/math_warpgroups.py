"""The math warpgroups, in one home for stages 05, 06 and the production generator: wgmma issue, scale
promotion, and the staged BF16 epilogue.

Stages 05 and 06 and every generator config differ in how operand tiles reach shared memory and in who
schedules the tiles; what the math warpgroups do with a tile is the same, so it lives here:

* **one K block** (:meth:`MathWarpgroups.k_block`): warpgroup g multiplies its 64 rows of the A tile
  (rows 64g..64g+63) by the whole B tile with four ``wgmma m64nNk32`` (one per 32 bytes of K), the first
  with scale-d = false so the block's partial sum starts fresh; ``commit_group`` + ``wait_group 0``; then
  promotion: ``total += partial * (sA[row, g] * sB[n_block, g])``, one FFMA per accumulator (DeepGEMM's
  rule). Each thread's two rows (l/4 and l/4 + 8 of its warp's 16) get their sA from the stage's scale tile.
  A ``release`` callback, when given, is emitted right after the wait and before the promotion: the stage's
  bytes are no longer needed, so a producer may refill it while the FFMAs run (stage 07's rule).
  With 1x128 B scales (wgrad, :class:`ColumnScales`) every column has its own sB: the thread's BLOCK_N/4 column
  scales (columns 8j + 2(l % 4) and the next, as the accumulator fragment holds them) are read from the stage with
  ``ld.shared.v2.f32`` while the tensor cores run, and the promotion becomes ``total += partial * (sA[row] *
  sB[column])``: one FMUL and one FFMA per accumulator. They are read into registers before the release, since the
  producer may overwrite the stage as soon as it is released.
* **two K blocks in flight** (:meth:`MathWarpgroups.issue_k_block` and ``promote_k_block``,
  KernelConfig.accumulators = 2): the same wgmmas and promotion split in two, so that the K loop
  (:meth:`gemm.kernel.generator._Kernel.paired_k_loop`) can issue the next K block into :attr:`second_acc` before
  it waits for this one (``wait_group 1``); one-wave tiles only.
* **swap AB** (KernelConfig.swap_ab, :meth:`MathWarpgroups._swapped_k_block`): the B tile's rows are wgmma's 64-row
  side (warpgroup g: B rows 64g..) and the tile's BLOCK_M rows of A its N, so the accumulators hold D transposed;
  every accumulator row shares the weight block's scale, every column has its token's A scale (read from the
  stage as wgrad's column scales are), and the TMA epilogue stores them back transposed (``stmatrix .trans``).
* **the epilogue** (:meth:`MathWarpgroups.store`): the FP32 totals are rounded to BF16 pairs and written
  into a shared staging tile in the fragment layout (rows padded by 16 bytes so a warp's 32 stores hit 32
  different banks), then each warp copies its own 16 rows out with row-contiguous (coalesced) 16-byte
  stores, masked at ragged edges. Only the warp's own rows are involved, so a warp-level sync suffices.
  M may be a Python int (stages 05-06 bake it in) or a register holding the run-time M (the generator).

Layout facts (descriptors, swizzle, fragments) are in :mod:`ptx.vocab.wgmma`.
"""
from __future__ import annotations

from typing import Callable

from gemm.kernel.seams import NO_SEAMS, Seams

from ptx.builder import KernelBuilder
from ptx.vocab import core
from ptx.vocab import wgmma as w

WARPGROUP_ROWS = 64  # wgmma's M
BLOCK_K = 128  # one scale group = one 128-byte swizzle row of e4m3
K_STEPS = BLOCK_K // 32  # wgmma k32 steps per K block
A_ROW_BYTES = BLOCK_K


def staging_pitch(block_n: int) -> int:
    """Bytes per row of the BF16 staging tile: padded by 16 so rows l/4 = 0..7 start 4 banks apart."""
    return 2 * block_n + 16


def staging_bytes(block_m: int, block_n: int) -> int:
    return block_m * staging_pitch(block_n)


def store_vector_elements(n: int) -> int:
    """BF16 elements per global store: 8 (16 bytes) when every row start is 16-byte aligned, else 2 or 1."""
    return 8 if n % 8 == 0 else (2 if n % 2 == 0 else 1)


def math_warpgroup_count(block_m: int) -> int:
    """Math warpgroups of a ``block_m``-row tile: one per 64 rows, at most two (a taller tile gives them waves)."""
    return min(block_m // WARPGROUP_ROWS, 2)


def tile_rows(block_m: int) -> list[tuple[int, int, int]]:
    """(warpgroup, wave, first row) of every 64-row slice of a ``block_m``-row tile, in row order: warpgroup g's
    wave w starts at row 64 g + 64 * warpgroups * w, so wave w of all the warpgroups is one contiguous slab (the
    256-row tile: warpgroup 0 owns rows 0-63 and 128-191, warpgroup 1 rows 64-127 and 192-255). The emitted
    addresses (:meth:`MathWarpgroups.wave_row`) and the figures use it."""
    warpgroups = math_warpgroup_count(block_m)
    if block_m <= 0 or block_m % (WARPGROUP_ROWS * warpgroups):
        raise ValueError(f"block_m={block_m}: 64, or a multiple of 128 (two math warpgroups, whole waves)")
    waves = block_m // (WARPGROUP_ROWS * warpgroups)
    return sorted(((g, wave, WARPGROUP_ROWS * g + WARPGROUP_ROWS * warpgroups * wave)
                   for g in range(warpgroups) for wave in range(waves)), key=lambda slice_: slice_[2])


class ColumnScales:
    """A stage's 1x128 B scales for :meth:`MathWarpgroups.k_block`: ``tile`` (u32 shared address) holds BLOCK_N
    floats, one per column of the tile, for this K block."""

    def __init__(self, tile: str):
        self.tile = tile


def fragment_column(block_n: int, lane: int, index: int) -> int:
    """Column of accumulator ``index`` of ``lane`` in a m64nNk32 fragment: 8 (i // 4) + 2 (lane % 4) + i % 2 (the
    layout the 1x128 column scales are read in; :mod:`ptx.vocab.wgmma` has the whole fragment)."""
    if not 0 <= index < block_n // 2:
        raise ValueError(f"accumulator index {index} outside 0..{block_n // 2 - 1}")
    return 8 * (index // 4) + 2 * (lane % 4) + index % 2


def store_slots(block_n: int, vec: int, lane: int, it: int) -> tuple[int, int]:
    """(row within the warp's 16, column) that ``lane`` copies out in pass ``it`` of the epilogue."""
    per_row = block_n // vec
    flat = it * 32 + lane
    return flat // per_row, (flat % per_row) * vec


# a math thread's values made from %tid (MathWarpgroups.__init__): its lane and warp, its first accumulator row in
# the tile, and its warpgroup's byte offset in the A tile; the first and third differ between the lanes of a warp
PER_THREAD_VALUES = ("lane", "warp", "fragment_row", "warpgroup_offset")


class PreIssued:
    """A K block whose wave 0 may already be in flight (KernelConfig.overlap_epilogue): ``flag`` (a predicate
    register) is set where it is; ``row_scales``, its two A-scale registers, which the issue fills on either path."""

    def __init__(self, b: KernelBuilder):
        self.flag = b.reg("pred", "p_pre_issued")
        self.row_scales = (b.reg("f32", "sa_pre"), b.reg("f32", "sa_pre"))


class MathWarpgroups:
    """Emits the consumer side of a (block_m x block_n) tile into ``b``; ``tid`` is %tid.x in a register.
    ``seams``: a caller's ``wave_offset`` in place of :meth:`wave_row`'s rule (:mod:`gemm.kernel.seams`).
    ``uniform_offset``: broadcast the warpgroup's A offset from lane 0 (KernelConfig.uniform_offsets;
    :meth:`warp_uniform_values`). ``accumulators``: wgmma accumulator sets (2: :attr:`second_acc` too, for a
    K loop that keeps two K blocks in flight, KernelConfig.accumulators)."""

    def __init__(self, b: KernelBuilder, block_m: int, block_n: int, tid: str, seams: Seams = NO_SEAMS,
                 uniform_offset: bool = False, accumulators: int = 1, swap_ab: bool = False):
        rows, columns = (block_n, block_m) if swap_ab else (block_m, block_n)  # wgmma's M side and its N
        if rows % WARPGROUP_ROWS or columns % 8 or not 8 <= columns <= 256:
            raise ValueError(f"block {block_m}x{block_n}{' (swap_ab)' if swap_ab else ''}: wgmma's M side must be a "
                             "multiple of 64, its N a multiple of 8 up to 256")
        if swap_ab and seams.wave_offset is not None:
            raise ValueError("the wave_offset seam places 64-row waves of A; swap_ab tiles have one wave of B rows")
        if not swap_ab and seams.token_column is not None:
            raise ValueError("the token_column seam places a swap_ab tile's token columns; this tile is not swapped "
                             "(KernelConfig.swap_ab=False)")
        self.b, self.block_m, self.block_n, self.tid, self.seams = b, block_m, block_n, tid, seams
        self.swap_ab, self.columns = swap_ab, columns
        # at most two math warpgroups; a taller block gives each of them several 64-row *waves* (DeepGEMM's
        # 256-row block: warpgroup g owns rows 64g + 128w), which share the B tile and its scale. swap_ab: warpgroup
        # g owns B's rows 64g.. of the tile, in one wave
        self.warpgroups = math_warpgroup_count(rows)
        self.waves = rows // (WARPGROUP_ROWS * self.warpgroups)
        self.wave_rows = WARPGROUP_ROWS * self.warpgroups
        self.threads = 128 * self.warpgroups
        e, r = b.emit, b.reg
        self.lane, self.warp = r("u32", "lane"), r("u32", "warp")
        self.row = r("u32", "frag_row")  # this thread's first accumulator row within the block tile
        # byte offset of this warpgroup's 64 rows in the tile wgmma reads as A (the B tile with swap_ab)
        self.wg_a_offset = r("u32", "wg_a")
        t = r("u32")
        e(f"and.b32 {self.lane}, {tid}, 31;", f"shr.u32 {self.warp}, {tid}, 5;",
          f"shl.b32 {self.row}, {self.warp}, 4;", f"shr.u32 {t}, {self.lane}, 2;",
          f"add.u32 {self.row}, {self.row}, {t};",
          f"shr.u32 {self.wg_a_offset}, {tid}, 7;",
          f"mul.lo.u32 {self.wg_a_offset}, {self.wg_a_offset}, {WARPGROUP_ROWS * A_ROW_BYTES};")
        values = {"lane": self.lane, "warp": self.warp, "fragment_row": self.row, "warpgroup_offset": self.wg_a_offset}
        for name in self.warp_uniform_values(uniform_offset):
            e(core.warp_broadcast(values[name], values[name]))
        self.acc = b.regs("f32", columns // 2, "acc")
        self.second_acc = b.regs("f32", columns // 2, "acc") if accumulators == 2 else None
        self.totals = [b.regs("f32", columns // 2, "tot") for _ in range(self.waves)]
        self.zero_totals()
        # scale-d of wgmma is a predicate: false = overwrite (a fresh partial sum), true = accumulate
        self.fresh, self.accumulate = r("pred", "p_fresh"), r("pred", "p_acc")
        e(f"setp.ne.u32 {self.fresh}, {tid}, {tid};", f"setp.eq.u32 {self.accumulate}, {tid}, {tid};")
        self.constant_desc = w.descriptor_constant_part()
        self.token_offsets = self._token_column_offsets() if seams.token_column is not None else None

    def warp_uniform_values(self, uniform_offset: bool) -> tuple[str, ...]:
        """The per-thread values broadcast from lane 0 (:data:`PER_THREAD_VALUES`). Computed from %tid, ptxas keeps
        a value per thread even where all 32 lanes agree, and rebuilds every wgmma descriptor made from it per
        thread (at 256x128: 18 IMAD + 16 R2UR a k-block); a value from shfl.sync is known to be warp-uniform, so
        what is made from it stays on the uniform datapath, as DeepGEMM's __shfl_sync does. The rule: the
        warpgroup's A offset when ``uniform_offset``, or the seam ``warp_uniform``'s answer, checked."""
        chosen = self.seams.warp_uniform
        if chosen is None:
            return ("warpgroup_offset",) if uniform_offset else ()
        names = chosen(PER_THREAD_VALUES)
        if (not isinstance(names, (tuple, list)) or any(type(n) is not str or n not in PER_THREAD_VALUES for n in names)
                or len(set(names)) != len(names)):
            raise ValueError(f"warp_uniform({PER_THREAD_VALUES}) = {names!r}: must be a tuple of distinct names "
                             f"from {PER_THREAD_VALUES}")
        return tuple(names)

    def wave_row(self, wave: int) -> int:
        """Rows from a warpgroup's wave 0 to its wave ``wave`` (the same for every warpgroup): ``wave * wave_rows``,
        so wave w of all the warpgroups is one contiguous slab (:func:`tile_rows`), or the seam ``wave_offset``'s
        answer (:mod:`gemm.kernel.seams`), checked: a multiple of 64 in [0, block_m). Every emitted address of a
        wave (its A rows and A scales, its rows of D and of the staging/TMA tile) adds this."""
        offset = self.seams.wave_offset
        if offset is None:
            return wave * self.wave_rows
        rows = offset(wave, self.warpgroups)
        # exactly int: a subclass's arithmetic or formatting could put its own text into the PTX
        if type(rows) is not int or rows % WARPGROUP_ROWS or not 0 <= rows < self.block_m:
            raise ValueError(f"wave_offset({wave}, {self.warpgroups}) = {rows!r}: must be an int, a multiple of "
                             f"{WARPGROUP_ROWS}, at least 0 and below block_m={self.block_m}")
        return rows

    def zero_totals(self) -> None:
        self.b.emit(*(f"mov.f32 {x}, 0f00000000;" for total in self.totals for x in total))

    # -- one K block ---------------------------------------------------------------------------------
    def k_block(self, a_tile: str, b_tile: str, sa_tile: str, sb_value: str | tuple[str, str] | ColumnScales,
                release: Callable[[], None] | None = None, former_groups: int | None = None,
                assign: bool = False, pre_issued: "PreIssued | None" = None) -> None:
        """Multiply this stage's tiles (u32 shared addresses, 1024-aligned) and promote into the totals;
        ``release()`` emits the stage's release between the wgmma wait and the promotion.

        ``sb_value`` is the tile's B scale for this K block, or a pair when the tile spans two 128-wide B-scale
        blocks: its first ``former_groups`` 8-column groups take the first (a compile-time split); or, 1x128,
        the stage's :class:`ColumnScales`. With ``swap_ab`` the roles of the tiles in the wgmma swap
        (:meth:`_swapped_k_block`). ``assign``: the tile's first K block, whose promotion writes the totals instead of
        adding to them (KernelConfig.first_block_assigns: no zeroing before it). ``pre_issued``
        (KernelConfig.overlap_epilogue): where its predicate is set, wave 0's wgmmas were issued before the previous
        tile's epilogue (:meth:`issue_first_wave`, its A scales in the same registers), so only the wait remains."""
        if self.swap_ab:
            return self._swapped_k_block(a_tile, b_tile, sa_tile, sb_value, release, assign)
        e = self.b.emit
        scratch, b_desc = self._b_descriptor(b_tile)
        column_scales = None
        for wave, total in enumerate(self.totals):
            if wave == 0 and pre_issued is not None:
                issued = self.b.label("first_wave_issued")
                e(f"@{pre_issued.flag} bra {issued};")
                sa_lo, sa_hi = self._issue_wave(0, a_tile, b_desc, scratch, sa_tile, self.acc, pre_issued.row_scales)
                self.b.place(issued)
            else:
                sa_lo, sa_hi = self._issue_wave(wave, a_tile, b_desc, scratch, sa_tile, self.acc)
            if isinstance(sb_value, ColumnScales):
                if column_scales is None:  # once per K block, while the first wave's MMAs run
                    column_scales = self._load_column_scales(sb_value.tile)
                e(w.wgmma_wait_group(0))
                if release is not None and wave == self.waves - 1:
                    release()
                self._promote_by_column(total, sa_lo, sa_hi, column_scales, assign)
                continue
            e(w.wgmma_wait_group(0))
            if release is not None and wave == self.waves - 1:
                release()
            self._promote(total, self.acc, sa_lo, sa_hi, sb_value, former_groups, assign)

    def issue_first_wave(self, a_tile: str, b_tile: str, sa_tile: str, pre_issued: "PreIssued") -> None:
        """Wave 0 of a K block's wgmmas into :attr:`acc`, committed, its A scales into ``pre_issued.row_scales``;
        :meth:`k_block` with ``pre_issued`` waits for it (KernelConfig.overlap_epilogue: issued before the previous
        tile's epilogue, which touches the totals only, never :attr:`acc`)."""
        scratch, b_desc = self._b_descriptor(b_tile)
        self._issue_wave(0, a_tile, b_desc, scratch, sa_tile, self.acc, pre_issued.row_scales)

    # -- K blocks in flight two at a time (KernelConfig.accumulators == 2) ----------------------------------
    def issue_k_block(self, a_tile: str, b_tile: str, sa_tile: str, acc: list[str],
                      row_scales: tuple[str, str]) -> None:
        """One K block's four wgmmas into ``acc`` (this or :attr:`second_acc`), committed as one group, the thread's
        two A scales loaded into ``row_scales`` for :meth:`promote_k_block`; one-wave tiles only. The caller waits
        for the group (``wgmma.wait_group 1`` while the next K block's group runs) and releases the stage."""
        if self.waves != 1:
            raise ValueError(f"{self.block_m}-row tiles give each warpgroup {self.waves} waves: one accumulator set "
                             "per K block in flight needs one wave")
        scratch, b_desc = self._b_descriptor(b_tile)
        self._issue_wave(0, a_tile, b_desc, scratch, sa_tile, acc, row_scales)

    def promote_k_block(self, acc: list[str], row_scales: tuple[str, str], sb_value: str | tuple[str, str],
                        former_groups: int | None = None) -> None:
        """totals += ``acc`` * (sA * sB) for a K block whose group :meth:`issue_k_block` committed and the caller
        waited for."""
        self._promote(self.totals[0], acc, *row_scales, sb_value, former_groups)

    def _b_descriptor(self, b_tile: str) -> tuple[str, str]:
        scratch, b_desc = self.b.reg("u32"), self.b.reg("u64", "bdesc")
        self.b.emit(w.wgmma_descriptor(b_desc, b_tile, scratch, self.constant_desc))
        return scratch, b_desc

    def _issue_wave(self, wave: int, a_tile: str, b_desc: str, scratch: str, sa_tile: str, acc: list[str],
                    row_scales: tuple[str, str] | None = None) -> tuple[str, str]:
        """Wave ``wave``'s A descriptor, its two A scales (into ``row_scales``, or fresh registers), and its four
        wgmmas into ``acc``, committed; returns the scales' registers."""
        e, r = self.b.emit, self.b.reg
        a_addr, a_desc = r("u32"), r("u64", "adesc")
        e(f"add.u32 {a_addr}, {a_tile}, {self.wg_a_offset};",
          *([f"add.u32 {a_addr}, {a_addr}, {self.wave_row(wave) * A_ROW_BYTES};"] if self.wave_row(wave) else []),
          w.wgmma_descriptor(a_desc, a_addr, scratch, self.constant_desc))
        # this K group's activation scales of the thread's two rows, read before the tensor cores start
        sa_addr = r("u32")
        sa_lo, sa_hi = row_scales or (r("f32", "sa"), r("f32", "sa"))
        e(f"shl.b32 {sa_addr}, {self.row}, 2;", f"add.u32 {sa_addr}, {sa_addr}, {sa_tile};",
          f"ld.shared.f32 {sa_lo}, [{sa_addr}+{4 * self.wave_row(wave)}];",
          f"ld.shared.f32 {sa_hi}, [{sa_addr}+{4 * self.wave_row(wave) + 32}];")
        self._issue_wgmmas(acc, a_desc, b_desc)
        return sa_lo, sa_hi

    def _issue_wgmmas(self, acc: list[str], a_desc: str, b_desc: str) -> None:
        """One K block's four wgmmas (k32 steps) into ``acc``, the first overwriting it, committed as one group."""
        e, r = self.b.emit, self.b.reg
        e(w.wgmma_fence())  # the accumulators were last touched by the FFMAs of the previous wave or block
        for step in range(K_STEPS):
            a_k, b_k = a_desc, b_desc
            if step:  # the start address advances 32 bytes per k32 step; descriptors count 16-byte units
                a_k, b_k = r("u64", "adesc"), r("u64", "bdesc")
                advance = step * w.K32_STEP_BYTES >> 4
                e(f"add.s64 {a_k}, {a_desc}, {advance};", f"add.s64 {b_k}, {b_desc}, {advance};")
            e(w.wgmma_e4m3(acc, a_k, b_k, self.fresh if step == 0 else self.accumulate))
        e(w.wgmma_commit_group())

    # -- swap AB: B's rows as wgmma's M, A's rows as its N (KernelConfig.swap_ab) -------------------------
    def _swapped_k_block(self, a_tile: str, b_tile: str, sa_tile: str, sb_value: str,
                         release: Callable[[], None] | None, assign: bool = False) -> None:
        """Warpgroup g's 64 rows of the B tile (wgmma's A) times the tile's BLOCK_M rows of A (wgmma's B, N =
        BLOCK_M): the accumulators hold D transposed, row = B row (l/4, l/4 + 8 of the warp's 16), column = A row
        (8j + 2(l % 4), +1). Every row shares the weight block's scale ``sb_value``; every column has its own A
        scale, the stage's ``sa`` entry of that row of A, read as wgrad reads its column scales. So the promotion
        is ``total += partial * (sb * sa[column])``, the product formed once per column the thread holds (its rows
        all share sb), not once per accumulator as :meth:`_promote_by_column` must."""
        e, r = self.b.emit, self.b.reg
        scratch, tokens_desc = self._b_descriptor(a_tile)
        weight, weight_desc = r("u32"), r("u64", "adesc")
        e(f"add.u32 {weight}, {b_tile}, {self.wg_a_offset};",
          w.wgmma_descriptor(weight_desc, weight, scratch, self.constant_desc))
        self._issue_wgmmas(self.acc, weight_desc, tokens_desc)
        if self.token_offsets is None:
            column_scales = self._load_column_scales(sa_tile)  # while the tensor cores run; before the release
            scale_of = [2 * (i // 4) + i % 2 for i in range(len(self.acc))]  # fragment_column, minus the lane part
        else:  # the seam's columns: one scale per accumulator, each from its own table entry
            column_scales = self._load_token_scales(sa_tile)
            scale_of = list(range(len(self.acc)))
        e(w.wgmma_wait_group(0))
        if release is not None:
            release()
        scales = []
        for column_scale in column_scales:
            scale = r("f32", "scale")
            e(f"mul.f32 {scale}, {sb_value}, {column_scale};")
            scales.append(scale)
        promote = core.promote_first if assign else core.promote
        for i, (running, partial) in enumerate(zip(self.totals[0], self.acc)):
            e(promote(running, partial, scales[scale_of[i]]))

    def _token_column_offsets(self) -> list[str]:
        """The seam ``token_column(register, lane)`` for every lane and accumulator, checked (an int naming one of
        the tile's token rows) and kept as a ``.const`` table; each thread reads its row of it once, before the K
        loop, as byte offsets into a stage's A-scale tile. A wrong column is a wrong answer (a token's partial sum
        scaled by another token's scale), not a fault: every offset stays inside the tile."""
        e, r, count = self.b.emit, self.b.reg, len(self.acc)
        values = []
        for lane in range(32):
            for register in range(count):
                column = self.seams.token_column(register, lane)
                if type(column) is not int or not 0 <= column < self.columns:
                    raise ValueError(f"token_column({register}, {lane}) must be an int naming one of the tile's "
                                     f"{self.columns} token rows (0..{self.columns - 1}), got {column!r}")
                values.append(column)
        table = self.b.const_table("token_column_table", values)
        row, address = r("u64"), r("u64")
        e(f"mul.wide.u32 {row}, {self.lane}, {4 * count};", f"mov.u64 {address}, {table};",
          f"add.s64 {address}, {address}, {row};")
        offsets = self.b.regs("u32", count, "tok_off")
        for register, offset in enumerate(offsets):
            e(f"ld.const.u32 {offset}, [{address}+{4 * register}];", f"shl.b32 {offset}, {offset}, 2;")
        return offsets

    def _load_token_scales(self, tile: str) -> list[str]:
        """One A scale per accumulator, at the token row the seam's table names (:meth:`_token_column_offsets`)."""
        e, r = self.b.emit, self.b.reg
        scales = []
        for offset in self.token_offsets:
            address, scale = r("u32"), r("f32", "sbc")
            e(f"add.u32 {address}, {tile}, {offset};", f"ld.shared.f32 {scale}, [{address}];")
            scales.append(scale)
        return scales

    def _promote(self, total: list[str], acc: list[str], sa_lo: str, sa_hi: str, sb_value: str | tuple[str, str],
                 former_groups: int | None, assign: bool = False) -> None:
        """total += acc * (sa[row] * sb), one FFMA per accumulator (``assign``: total = ..., one FMUL); a pair of B
        scales splits at ``former_groups``."""
        e, r = self.b.emit, self.b.reg
        pairs = sb_value if isinstance(sb_value, tuple) else (sb_value,)
        scales = []  # (row l/4 scale, row l/4 + 8 scale) per B-scale block
        for sb in pairs:
            scale_lo, scale_hi = r("f32", "scale"), r("f32", "scale")
            e(f"mul.f32 {scale_lo}, {sa_lo}, {sb};", f"mul.f32 {scale_hi}, {sa_hi}, {sb};")
            scales.append((scale_lo, scale_hi))
        split = self.block_n // 8 if former_groups is None else former_groups
        promote = core.promote_first if assign else core.promote
        for i, (running, partial) in enumerate(zip(total, acc)):
            block = 0 if i // 4 < split else 1
            e(promote(running, partial, scales[block][(i // 2) % 2]))

    def _load_column_scales(self, tile: str) -> list[str]:
        """The thread's BLOCK_N/4 column scales of this K block: pairs (8j + 2(l % 4), +1) by ``ld.shared.v2``."""
        e, r = self.b.emit, self.b.reg
        lane_pair, address = r("u32"), r("u32", "sb_cols")
        e(f"and.b32 {lane_pair}, {self.lane}, 3;", f"mad.lo.u32 {address}, {lane_pair}, 8, {tile};")
        scales = []
        for group in range(self.columns // 8):
            pair = [r("f32", "sbc"), r("f32", "sbc")]
            e(f"ld.shared.v2.f32 {{{pair[0]}, {pair[1]}}}, [{address}+{32 * group}];")
            scales += pair
        return scales

    def _promote_by_column(self, total: list[str], sa_lo: str, sa_hi: str, column_scales: list[str],
                           assign: bool = False) -> None:
        """total[i] += partial[i] * (sa[row of i] * sb[column of i]): the scale product per accumulator (FMUL),
        then the promotion (FFMA), as DeepGEMM's wgrad kernel does."""
        e, r = self.b.emit, self.b.reg
        for i, (running, partial) in enumerate(zip(total, self.acc)):
            scale = r("f32", "scale")
            row_scale = sa_hi if (i // 2) % 2 else sa_lo
            e(f"mul.f32 {scale}, {row_scale}, {column_scales[2 * (i // 4) + i % 2]};",
              (core.promote_first if assign else core.promote)(running, partial, scale))

    # -- epilogue -----------------------------------------------------------------------------------
    def store(self, staging: str, d: str, m0: str, n0: str, m: int | str, n: int) -> None:
        """BF16(totals) -> D[m0:, n0:] through ``staging`` (u32 shared address of >= staging_bytes bytes).

        The caller must have synchronized the CTA if ``staging`` overlaps operand tiles still being read.
        """
        for wave in range(self.waves):
            self._store_wave(wave, staging, d, m0, n0, m, n)

    def _store_wave(self, wave: int, staging: str, d: str, m0: str, n0: str, m: int | str, n: int) -> None:
        e, r = self.b.emit, self.b.reg
        pitch = staging_pitch(self.block_n)
        total = self.totals[wave]
        warp_base, t, write = r("u32", "stg"), r("u32"), r("u32", "stg_w")
        rows = self.wave_row(wave)
        if rows:  # the wave's rows sit wave_row(wave) further down, in D and in the staging tile
            wave_m0, wave_staging = r("u32", "m0w"), r("u32", "stgw")
            e(f"add.u32 {wave_m0}, {m0}, {rows};",
              f"add.u32 {wave_staging}, {staging}, {rows * pitch};")
            m0, staging = wave_m0, wave_staging
        e(f"mul.lo.u32 {warp_base}, {self.warp}, {16 * pitch};", f"add.u32 {warp_base}, {warp_base}, {staging};",
          f"shr.u32 {t}, {self.lane}, 2;", f"mul.lo.u32 {write}, {t}, {pitch};",
          f"and.b32 {t}, {self.lane}, 3;", f"shl.b32 {t}, {t}, 2;", f"add.u32 {write}, {write}, {t};",
          f"add.u32 {write}, {write}, {warp_base};")
        for j in range(self.block_n // 8):
            for half in range(2):
                packed = r("b32")
                lo, hi = total[4 * j + 2 * half], total[4 * j + 2 * half + 1]
                e(core.cvt_f32x2_to_bf16x2(packed, hi, lo),
                  f"st.shared.b32 [{write}+{8 * half * pitch + 16 * j}], {packed};")
        e("bar.warp.sync 0xffffffff;")  # the warp's staging writes are visible to all its lanes

        vec = store_vector_elements(n)
        nbytes, per_row = 2 * vec, self.block_n // vec
        lane_row, lane_col = r("u32", "lrow"), r("u32", "lcol")
        if per_row < 32:
            e(f"shr.u32 {lane_row}, {self.lane}, {per_row.bit_length() - 1};",
              f"and.b32 {lane_col}, {self.lane}, {per_row - 1};")
        else:
            e(f"mov.u32 {lane_row}, 0;", f"mov.u32 {lane_col}, {self.lane};")
        read, grow, gcol = r("u32", "stg_r"), r("u32", "grow"), r("u32", "gcol")
        e(f"mul.lo.u32 {read}, {lane_row}, {pitch};", f"mad.lo.u32 {read}, {lane_col}, {nbytes}, {read};",
          f"add.u32 {read}, {read}, {warp_base};",
          f"shl.b32 {grow}, {self.warp}, 4;", f"add.u32 {grow}, {grow}, {lane_row};", f"add.u32 {grow}, {grow}, {m0};",
          f"mad.lo.u32 {gcol}, {lane_col}, {vec}, {n0};")
        ptr, wide = r("u64", "dptr"), r("u64")
        e(f"mul.wide.u32 {ptr}, {grow}, {2 * n};", f"mul.wide.u32 {wide}, {gcol}, 2;",
          f"add.u64 {ptr}, {ptr}, {wide};", f"add.u64 {ptr}, {ptr}, {d};")
        ragged_m, ragged_n = not isinstance(m, int) or m % self.block_m != 0, n % self.block_n != 0
        kind = {8: ("v4.b32", 4), 2: ("b32", 1), 1: ("b16", 1)}[vec]
        for it in range(16 * per_row // 32):
            row_off, col_off = it * 32 // per_row, (it * 32) % per_row * vec  # store_slots minus the lane part
            values = r("b32") if kind[1] == 1 and vec == 2 else None
            regs = self.b.regs("b32", 4) if vec == 8 else [r("b16") if vec == 1 else values]
            operand = "{" + ", ".join(regs) + "}" if vec == 8 else regs[0]
            e(f"ld.shared.{kind[0]} {operand}, [{read}+{row_off * pitch + col_off * 2}];")
            guards = []
            if ragged_m:
                p = r("pred")
                if isinstance(m, int):
                    e(f"setp.lt.s32 {p}, {grow}, {m - row_off};")
                else:
                    row = r("u32")
                    e(f"add.u32 {row}, {grow}, {row_off};", f"setp.lt.u32 {p}, {row}, {m};")
                guards.append(p)
            if ragged_n:
                p = r("pred")
                e(f"setp.lt.s32 {p}, {gcol}, {n - col_off};")
                guards.append(p)
            if len(guards) == 2:
                e(f"and.pred {guards[0]}, {guards[0]}, {guards[1]};")
            guard = f"@{guards[0]} " if guards else ""
            e(f"{guard}st.global.{kind[0]} [{ptr}+{2 * (row_off * n + col_off)}], {operand};")


__all__ = ["MathWarpgroups", "PER_THREAD_VALUES", "ColumnScales", "PreIssued", "fragment_column", "tile_rows",
           "math_warpgroup_count", "staging_pitch", "staging_bytes",
           "store_vector_elements", "store_slots",
           "BLOCK_K", "K_STEPS", "WARPGROUP_ROWS"]
