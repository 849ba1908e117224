"""Warpgroup tensor-core idioms (sm_90a): wgmma.mma_async on e4m3, its shared-memory matrix descriptors and
the 128-byte swizzle those descriptors describe.

Two kinds of helpers, as in :mod:`ptx.vocab.mma_sync`: PTX text (one instruction or a few), and pure-Python
descriptions of *where bytes sit* (descriptor bit fields, the swizzled tile layout, the accumulator
fragment) that the generators use and the tests check against values worked out by hand from the PTX ISA.

Facts used throughout (PTX ISA 8.5, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):

* ``wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3`` is issued by a *warpgroup* (4 consecutive warps,
  128 threads); FP8 operands must be K-major, i.e. A as (M rows of K bytes) and B as (N rows of K bytes),
  which is exactly the NT contract of this repository.
* Both operands can come from shared memory through a 64-bit "matrix descriptor" (ISA "Matrix Descriptor
  Format"): start address >> 4 in bits 0-13, leading-dimension byte offset >> 4 in bits 16-29,
  stride-dimension byte offset >> 4 in bits 32-45, matrix base offset in bits 49-51, swizzle mode in bits
  62-63 (0 none, 1 = 128B, 2 = 64B, 3 = 32B).
* A tile of 128 e4m3 per row (one scale group) is one 128-byte swizzle row. The canonical K-major 128B
  layout: 8-row atoms of 1024 bytes; 16-byte chunk c of row r stored at chunk c ^ (r % 8). Stride byte
  offset = 1024 (the next 8-row atom); the leading byte offset is not used for swizzled K-major layouts
  whose K extent fits in one swizzle row (we store 1, i.e. 16 bytes, as CUTLASS does; DeepGEMM stores 0).
  A k32 step (32 bytes of K) advances the start address by 32 bytes: the hardware applies the XOR on the
  final address bits, so the tile must be 1024-byte aligned.
* Accumulator fragment of m64nNk32 .f32 (ISA "Register Fragments", wgmma D): warp w of the warpgroup owns
  rows 16w..16w+15; lane l holds N/2 floats; d[i] is at row 16w + l//4 + 8*((i//2)%2), column
  8*(i//4) + 2*(l%4) + i%2.
"""
from __future__ import annotations

from ptx.vocab.shared_memory import swizzled_offset

# -- descriptor bit fields (pure Python) ------------------------------------------------------------------
SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}  # ISA "Matrix Descriptor Format", bits 62-63
SW128_ROW_BYTES = 128  # one swizzle row: 8 chunks of 16 bytes
SW128_ATOM_BYTES = 1024  # 8 rows x 128 bytes: the pattern repeats every 1024 bytes
# Unused for swizzled K-major (module docstring): 16 encodes as 1 (CUTLASS); DeepGEMM writes 0. Flip to 0 here
# if a GPU run ever suggests the hardware reads it.
LEADING_BYTE_OFFSET = 16
K32_STEP_BYTES = 32  # one wgmma k32 step of e4m3


# ISA "Matrix Descriptor Format": field -> (first bit, width in bits); the three byte quantities are stored >> 4.
DESCRIPTOR_FIELDS = {"start_address": (0, 14), "leading_byte_offset": (16, 14), "stride_byte_offset": (32, 14),
                     "base_offset": (49, 3), "swizzle": (62, 2)}
_BYTE_FIELDS = ("start_address", "leading_byte_offset", "stride_byte_offset")


# ISA "Matrix Descriptor Format": the 64-bit value wgmma reads a shared-memory operand through.
def descriptor_bits(start_address: int, leading_byte_offset: int, stride_byte_offset: int,
                    swizzle: int = 128, base_offset: int = 0) -> int:
    for name, value in (("start_address", start_address), ("leading_byte_offset", leading_byte_offset),
                        ("stride_byte_offset", stride_byte_offset)):
        if value % 16 or not 0 <= value < 2**18:
            raise ValueError(f"{name} must be a multiple of 16 below 2**18, got {value}")
    if not 0 <= base_offset < 8:
        raise ValueError(f"base_offset is 3 bits, got {base_offset}")
    encoded = {"start_address": start_address >> 4, "leading_byte_offset": leading_byte_offset >> 4,
               "stride_byte_offset": stride_byte_offset >> 4, "base_offset": base_offset,
               "swizzle": SWIZZLE_MODE[swizzle]}
    value = 0
    for name, (first, _) in DESCRIPTOR_FIELDS.items():
        value |= encoded[name] << first
    return value


# ISA "Matrix Descriptor Format", read back: the fields of a descriptor (byte quantities in bytes, the swizzle
# as its byte width: 128, 64, 32, or 0 for none). descriptor_bits(**descriptor_fields(d)) == d for every d it made.
def descriptor_fields(descriptor: int) -> dict[str, int]:
    fields = {}
    for name, (first, width) in DESCRIPTOR_FIELDS.items():
        raw = descriptor >> first & ((1 << width) - 1)
        fields[name] = raw << 4 if name in _BYTE_FIELDS else raw
    fields["swizzle"] = {mode: size for size, mode in SWIZZLE_MODE.items()}[fields["swizzle"]]
    return fields


def descriptor_constant_part(leading_byte_offset: int | None = None,
                             stride_byte_offset: int = SW128_ATOM_BYTES, swizzle: int = 128) -> int:
    """Every field but the start address: what the PTX ORs onto (shared address >> 4) at run time."""
    lbo = LEADING_BYTE_OFFSET if leading_byte_offset is None else leading_byte_offset  # read now: a flippable flag
    return descriptor_bits(0, lbo, stride_byte_offset, swizzle)


# ISA "Shared Memory Matrix Layout" (K-major, 128B swizzle): physical byte offset of (row, k byte) in a tile; the
# same XOR of 16-byte chunks that stage 04 applies by hand, so it has one home (ptx.vocab.shared_memory).
def sw128_offset(row: int, k_byte: int) -> int:
    return swizzled_offset(row, k_byte)


# ISA "Register Fragments" for wgmma D (.f32): (row, col) within the warpgroup's 64 x N tile.
def accumulator_coords(warp: int, lane: int, index: int) -> tuple[int, int]:
    return 16 * warp + lane // 4 + 8 * ((index // 2) % 2), 8 * (index // 4) + 2 * (lane % 4) + index % 2


def descriptor_value(shared_address: int, constant_part: int | None = None) -> int:
    """What :func:`wgmma_descriptor`'s four instructions compute at run time for ``shared_address``."""
    constant_part = descriptor_constant_part() if constant_part is None else constant_part
    return (shared_address >> 4) & 16383 | constant_part


# -- PTX text -----------------------------------------------------------------------------------------------
def wgmma_descriptor(desc_u64: str, shared_address_u32: str, scratch_u32: str,
                     constant_part: int | None = None) -> str:
    # ISA "Matrix Descriptor Format": start address >> 4 in bits 0-13 (shared addresses are < 2**18), rest constant
    constant_part = descriptor_constant_part() if constant_part is None else constant_part
    return "\n".join([
        f"shr.u32 {scratch_u32}, {shared_address_u32}, 4;",
        f"and.b32 {scratch_u32}, {scratch_u32}, 16383;",
        f"cvt.u64.u32 {desc_u64}, {scratch_u32};",
        f"or.b64 {desc_u64}, {desc_u64}, {constant_part};",
    ])


# ISA "wgmma.fence": order register accesses (accumulators) before the wgmma that reads/writes them.
def wgmma_fence() -> str:
    return "wgmma.fence.sync.aligned;"


# ISA "wgmma.commit_group": close the batch of wgmma.mma_async issued by this warpgroup.
def wgmma_commit_group() -> str:
    return "wgmma.commit_group.sync.aligned;"


# ISA "wgmma.wait_group": wait until at most `pending` committed wgmma groups are unfinished.
def wgmma_wait_group(pending: int) -> str:
    return f"wgmma.wait_group.sync.aligned {pending};"


# ISA "wgmma.mma_async" (.m64nNk32 .f32.e4m3.e4m3, A and B from shared memory through descriptors).
def wgmma_e4m3(acc: list[str], a_desc: str, b_desc: str, scale_d: str) -> str:
    """acc (N/2 f32 registers) = A*B (+ acc when predicate ``scale_d`` is true); imm-scale-a/b = 1."""
    n = 2 * len(acc)
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma m64nNk32: N must be a multiple of 8 in 8..256, got {n}")
    return (f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "
            f"{{{', '.join(acc)}}}, {a_desc}, {b_desc}, {scale_d}, 1, 1;")


# ISA "setmaxnreg": every thread of the warpgroup (.sync.aligned) releases (.dec) or claims (.inc) registers,
# so a producer warpgroup that needs few can hand them to the math warpgroups. Counts: multiples of 8, 24..256.
def setmaxnreg(count: int, increase: bool) -> str:
    if count % 8 or not 24 <= count <= 256:
        raise ValueError(f"setmaxnreg: the count must be a multiple of 8 in 24..256, got {count}")
    return f"setmaxnreg.{'inc' if increase else 'dec'}.sync.aligned.u32 {count};"


# ISA "stmatrix" (.m8n8 .b16, sm_90): the warp stores 1, 2 or 4 8x8 matrices of 16-bit values; lane l gives the
# address of row l % 8 of matrix l // 8 and register j holds (row l // 4, columns 2(l % 4), +1) of matrix j:
# exactly the wgmma accumulator layout of 8 columns, so packed BF16 pairs go to shared memory in one instruction.
# With .trans each matrix is stored transposed: the element a lane holds at (row r, column c) goes to row c's
# address + 2 r, so an accumulator fragment of D^T lands in shared memory as D (swap AB's epilogue).
def stmatrix(regs: list[str], address: str, transpose: bool = False) -> str:
    if len(regs) not in (1, 2, 4):
        raise ValueError(f"stmatrix stores 1, 2 or 4 matrices, got {len(regs)} registers")
    trans = ".trans" if transpose else ""
    return f"stmatrix.sync.aligned.m8n8.x{len(regs)}{trans}.shared.b16 [{address}], {{{', '.join(regs)}}};"


__all__ = [
    "SWIZZLE_MODE", "SW128_ROW_BYTES", "SW128_ATOM_BYTES", "LEADING_BYTE_OFFSET", "K32_STEP_BYTES",
    "DESCRIPTOR_FIELDS", "descriptor_bits", "descriptor_fields", "descriptor_value", "descriptor_constant_part",
    "sw128_offset", "accumulator_coords",
    "wgmma_descriptor", "wgmma_fence", "wgmma_commit_group", "wgmma_wait_group", "wgmma_e4m3", "setmaxnreg",
    "stmatrix",
]
