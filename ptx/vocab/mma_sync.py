"""Warp-level tensor-core idioms: mma.sync m16n8k32 on e4m3, ldmatrix, and the fragment layouts behind them.

Two kinds of helpers live here. The PTX ones return one instruction's text. The pure-Python ones describe
*which matrix element sits where* (fragment layouts, ldmatrix lane roles); the tests check them against the
PTX ISA tables, against each other (ldmatrix composed with our addressing must yield exactly the mma
fragment) and against the generator's address math. The shared-memory swizzle the addressing uses is in
:mod:`ptx.vocab.shared_memory`, the cp.async copies that fill the tiles in :mod:`ptx.vocab.async_copies`.

Layout facts used throughout (PTX ISA "Matrix Fragments for mma.m16n8k32", 8-bit types), with
``g = lane // 4`` (groupID) and ``t = lane % 4`` (threadID_in_group); every .b32 register holds four
consecutive K elements, lowest K in the lowest byte:

* A (16 x 32, row-major):  a0 = row g, k 4t..4t+3;  a1 = row g+8, same k;  a2, a3 = the same rows at k+16.
* B (32 x 8, "col", i.e. stored as N rows of K):  b0 = n g, k 4t..4t+3;  b1 = n g, k 16+4t..16+4t+3.
* C/D (16 x 8 f32):  c0, c1 = row g, cols 2t, 2t+1;  c2, c3 = row g+8, cols 2t, 2t+1.
"""
from __future__ import annotations


# -- fragment layouts (pure Python) --------------------------------------------------------------------
# PTX ISA "Matrix Fragments for mma.m16n8k32": (row, k) of byte `byte` of A register `reg` held by `lane`.
def a_fragment_coords(lane: int, reg: int, byte: int) -> tuple[int, int]:
    g, t = divmod(lane, 4)
    return g + 8 * (reg % 2), 16 * (reg // 2) + 4 * t + byte


# PTX ISA "Matrix Fragments for mma.m16n8k32": (n, k) of byte `byte` of B register `reg` held by `lane`.
def b_fragment_coords(lane: int, reg: int, byte: int) -> tuple[int, int]:
    g, t = divmod(lane, 4)
    return g, 16 * reg + 4 * t + byte


# PTX ISA "Matrix Fragments for mma.m16n8k32": (row, col) of accumulator `index` (0..3) held by `lane`.
def c_fragment_coords(lane: int, index: int) -> tuple[int, int]:
    g, t = divmod(lane, 4)
    return g + 8 * (index // 2), 2 * t + index % 2


# PTX ISA "ldmatrix": with .x4, lanes 8j..8j+7 give the row addresses of matrix j (row lane % 8).
def ldmatrix_x4_address_role(lane: int) -> tuple[int, int]:
    """(matrix, row) whose 16-byte row address ``lane`` supplies to ldmatrix.m8n8.x4."""
    return lane // 8, lane % 8


# PTX ISA "ldmatrix": result register j of `lane` holds matrix j, row lane // 4, b16 elements 2*(lane%4)..+1.
def ldmatrix_received(lane: int, byte: int) -> tuple[int, int]:
    """(row, byte within the 16-byte row) of byte ``byte`` (0..3) of any result register of ``lane``."""
    return lane // 4, 4 * (lane % 4) + byte


def a_ldmatrix_source(lane: int) -> tuple[int, int]:
    """(row within the 16-row A tile, k byte 0 or 16) that ``lane`` points ldmatrix.x4 at.

    Matrices 0..3 must be (rows 0-7, k 0-15), (rows 8-15, k 0-15), (rows 0-7, k 16-31), (rows 8-15, k 16-31)
    so that result registers 0..3 are a0..a3.
    """
    return lane % 16, 16 * (lane // 16)


def b_ldmatrix_source(lane: int) -> tuple[int, int]:
    """(n within a 16-wide pair of n8 tiles, k byte 0 or 16) that ``lane`` points ldmatrix.x4 at.

    Matrices 0..3 are (n 0-7, k 0-15), (n 0-7, k 16-31), (n 8-15, k 0-15), (n 8-15, k 16-31): result registers
    0, 1 are b0, b1 of the first n8 tile and 2, 3 those of the second.
    """
    return 8 * (lane // 16) + lane % 8, 16 * ((lane // 8) % 2)


# -- PTX text --------------------------------------------------------------------------------------------
def _vec(regs) -> str:
    return "{" + ", ".join(regs) + "}"


# PTX ISA "Warp-level matrix multiply-accumulate: mma" (.m16n8k32 .row.col .f32.e4m3.e4m3.f32).
def mma_m16n8k32_e4m3(d: list[str], a: list[str], b: list[str], c: list[str]) -> str:
    assert len(d) == 4 and len(a) == 4 and len(b) == 2 and len(c) == 4
    return f"mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {_vec(d)}, {_vec(a)}, {_vec(b)}, {_vec(c)};"


# PTX ISA "Warp-level matrix load: ldmatrix" (.m8n8.x4 .b16: four 8x16-byte matrices, one register each).
def ldmatrix_x4(regs: list[str], address: str, offset: int = 0) -> str:
    assert len(regs) == 4
    return f"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {_vec(regs)}, [{address}+{offset}];"


__all__ = [
    "a_fragment_coords", "b_fragment_coords", "c_fragment_coords", "ldmatrix_x4_address_role",
    "ldmatrix_received", "a_ldmatrix_source", "b_ldmatrix_source", "mma_m16n8k32_e4m3", "ldmatrix_x4",
]
