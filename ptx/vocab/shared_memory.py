"""Shared-memory idioms: a symbol's address, the dynamically sized declaration, a peer CTA's address in a
cluster, and the 128-byte XOR swizzle of tiles whose rows are one K block of e4m3.
"""
from __future__ import annotations

# -- the swizzled tile layout (pure Python) -------------------------------------------------------------
ROW_BYTES = 128  # one K block of 128 e4m3 values per tile row
CHUNK_BYTES = 16  # ldmatrix rows and cp.async copies are 16 bytes


def swizzled_offset(row: int, k_byte: int) -> int:
    """Byte offset of (row, k_byte) in a tile of 128-byte rows whose 16-byte chunks are XOR-swizzled.

    Chunk c of row r is stored at chunk c ^ (r % 8): the eight rows an ldmatrix phase reads at one logical
    chunk land in eight different 16-byte bank groups, so neither ldmatrix nor cp.async conflicts. It is also
    the pattern of TMA's and wgmma's 128-byte swizzle (:func:`ptx.vocab.wgmma.sw128_offset`).
    """
    chunk, within = divmod(k_byte, CHUNK_BYTES)
    return row * ROW_BYTES + ((chunk ^ (row % 8)) * CHUNK_BYTES) + within


# -- PTX text --------------------------------------------------------------------------------------------
# PTX ISA "Shared memory state space" + "mov": the 32-bit shared-window address of a .shared symbol.
def shared_address_of(dest: str, symbol: str) -> str:
    return f"mov.u32 {dest}, {symbol};"


# PTX ISA ".extern" (module scope): the dynamically sized shared memory given at launch.
def dynamic_shared_declaration(symbol: str, align: int = 128) -> str:
    return f".extern .shared .align {align} .b8 {symbol}[];"


# PTX ISA "mapa": the address of the same shared variable in CTA ``rank`` of the cluster (a shared::cluster address).
def mapa(dst_u32: str, shared_address: str, rank: str | int) -> str:
    return f"mapa.shared::cluster.u32 {dst_u32}, {shared_address}, {rank};"


# PTX ISA "st" (.shared::cta, .v4): four 32-bit values at a 16-byte aligned address of this CTA's shared memory.
def st_shared_v4(address: str, values: list[str], offset: int = 0) -> str:
    return f"st.shared.v4.f32 [{address}{f'+{offset}' if offset else ''}], {{{', '.join(values)}}};"


# PTX ISA "ld" (.shared::cluster, .v4; sm_90): four 32-bit values from any CTA of the cluster, at a mapa address
# (distributed shared memory). Their writer's stores must be ordered before it, e.g. by barrier.cluster.
def ld_shared_cluster_v4(values: list[str], cluster_address: str, offset: int = 0) -> str:
    return f"ld.shared::cluster.v4.f32 {{{', '.join(values)}}}, [{cluster_address}{f'+{offset}' if offset else ''}];"


# PTX ISA "ld" (.shared::cta, .v4): four 32-bit values from a 16-byte aligned address of this CTA's shared memory.
def ld_shared_v4(values: list[str], address: str, offset: int = 0) -> str:
    return f"ld.shared.v4.f32 {{{', '.join(values)}}}, [{address}{f'+{offset}' if offset else ''}];"


# PTX ISA "st.async" (sm_90, PTX 8.1): four 32-bit values into another CTA's shared memory at a mapa address, the
# bytes completed on that CTA's mbarrier (also a mapa address): a one-way message, ordered for its reader by the
# barrier's phase, with no cluster barrier between writer and reader.
def st_async_v4(cluster_address: str, values: list[str], cluster_barrier: str, offset: int = 0) -> str:
    return (f"st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 "
            f"[{cluster_address}{f'+{offset}' if offset else ''}], {{{', '.join(values)}}}, [{cluster_barrier}];")


__all__ = ["ROW_BYTES", "CHUNK_BYTES", "swizzled_offset", "shared_address_of", "dynamic_shared_declaration", "mapa",
           "st_shared_v4", "ld_shared_cluster_v4", "ld_shared_v4", "st_async_v4"]
