"""Tensor maps and TMA (cp.async.bulk.tensor.2d) loads and stores, modelled from the PTX ISA's text.

A box is (rows x cols) elements at column x, row y of a 2-D tensor. In shared memory it is rows of
cols * itemsize bytes; with the 128B swizzle (rows of exactly 128 bytes) the 16-byte chunk bits 4-6 of each
address are XORed with its bits 7-9, the same pattern wgmma descriptors decode. Loads zero-fill what lies
outside the tensor and complete the box's bytes on an mbarrier at once (the copy is done at issue). Stores
write only the elements inside the tensor (clipping) and are asynchronous: each joins the issuing thread's
open bulk group and is performed (shared memory read, global written) only at cp.async.bulk.wait_group, so a
kernel that overwrites its staging tile before waiting stores the wrong bytes, as hardware could.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .common import EmulationError


@dataclass
class FakeTensorMap:
    """What cuTensorMapEncodeTiled would encode, for the emulator: ``data`` is the tensor's buffer (any shape,
    viewed flat; C-contiguous if the kernel stores through the map, since stores write it in place)."""
    data: np.ndarray
    dtype: np.dtype
    shape: tuple[int, int]  # rows, cols (elements)
    row_stride_bytes: int
    box: tuple[int, int]  # rows, cols
    swizzle: int  # 0 or 128

    def __post_init__(self):
        self.dtype = np.dtype(self.dtype)


def _swizzle_128(addresses: np.ndarray) -> np.ndarray:
    return addresses ^ (((addresses >> 7) & 7) << 4)


def box_addresses(tmap: FakeTensorMap, smem_address: int) -> np.ndarray:
    """(rows, row bytes) shared-memory addresses of the box's bytes."""
    rows, cols = tmap.box
    row_bytes = cols * tmap.dtype.itemsize
    if row_bytes % 16:
        raise EmulationError(f"box rows of {row_bytes} bytes: TMA needs a multiple of 16")
    if smem_address % (1024 if tmap.swizzle else 128):
        raise EmulationError(f"TMA shared address {smem_address} is misaligned for swizzle {tmap.swizzle}")
    addresses = smem_address + np.arange(rows * row_bytes, dtype=np.int64)
    if tmap.swizzle == 128:
        if row_bytes != 128:
            raise EmulationError("the model covers 128-byte box rows with the 128B swizzle only")
        addresses = _swizzle_128(addresses)
    elif tmap.swizzle:
        raise EmulationError("only swizzle 0 and 128 are modelled")
    return addresses.reshape(rows, row_bytes)


def _window(tmap: FakeTensorMap, x: int, y: int):
    """Box rows and row bytes that fall inside the tensor, and their byte offsets in the tensor's buffer."""
    rows, cols = tmap.box
    item = tmap.dtype.itemsize
    box_rows = np.arange(max(0, -y), max(max(0, -y), min(rows, tmap.shape[0] - y)))
    box_bytes = np.arange(max(0, -x) * item, max(max(0, -x), min(cols, tmap.shape[1] - x)) * item)
    offsets = (y + box_rows)[:, None] * tmap.row_stride_bytes + x * item + box_bytes[None, :]
    flat = tmap.data.reshape(-1).view(np.uint8)
    if offsets.size and offsets.max() >= flat.size:
        raise EmulationError(f"tensor map describes byte {offsets.max()} of a {flat.size}-byte buffer")
    return np.ix_(box_rows, box_bytes), offsets, flat


def load(smem: np.ndarray, tmap: FakeTensorMap, x: int, y: int, smem_address: int) -> int:
    """Copy the box into shared memory (zero outside the tensor); returns the bytes to complete_tx."""
    addresses = box_addresses(tmap, smem_address)
    if addresses.max() >= smem.size:
        raise EmulationError(f"TMA load to {smem_address} runs past the {smem.size} bytes of shared memory")
    box = np.zeros(addresses.shape, np.uint8)
    inside, offsets, flat = _window(tmap, x, y)
    box[inside] = flat[offsets]
    smem[addresses] = box
    return box.size


@dataclass
class PendingStore:
    tmap: FakeTensorMap
    x: int
    y: int
    smem_address: int
    reduce: str | None = None  # "add": cp.reduce.async.bulk.tensor adds the box into global memory

    def perform(self, smem: np.ndarray):
        addresses = box_addresses(self.tmap, self.smem_address)
        if addresses.max() >= smem.size:
            raise EmulationError(f"TMA store from {self.smem_address} runs past shared memory")
        if not self.tmap.data.flags.c_contiguous:
            raise EmulationError("a tensor map that is stored through needs C-contiguous data")
        inside, offsets, flat = _window(self.tmap, self.x, self.y)
        if self.reduce is None:
            flat[offsets] = smem[addresses][inside]
        elif self.reduce == "add" and self.tmap.dtype == np.float32:  # element-wise, in the tensor's type
            values = np.ascontiguousarray(smem[addresses][inside]).view(np.float32)
            old = flat[offsets].copy().view(np.float32)
            flat[offsets] = (old + values).view(np.uint8)
        else:
            raise EmulationError(f"TMA reduce .{self.reduce} on {self.tmap.dtype} is not modelled")


@dataclass
class BulkGroups:
    """Per-thread bulk async-groups of TMA stores (PTX ISA "cp.async.bulk.commit_group" / "wait_group")."""
    open: dict[int, list[PendingStore]] = field(default_factory=dict)
    committed: dict[int, list[list[PendingStore]]] = field(default_factory=dict)

    def issue(self, thread: int, store: PendingStore):
        self.open.setdefault(thread, []).append(store)

    def commit(self, thread: int):
        self.committed.setdefault(thread, []).append(self.open.pop(thread, []))

    def wait(self, thread: int, keep: int, smem: np.ndarray):
        groups = self.committed.get(thread, [])
        while len(groups) > keep:
            for store in groups.pop(0):
                store.perform(smem)

    def pending(self) -> list[int]:
        """Threads with stores not yet performed."""
        return sorted({t for t, s in self.open.items() if s} | {t for t, g in self.committed.items() if any(g)})


__all__ = ["FakeTensorMap", "box_addresses", "load", "PendingStore", "BulkGroups", "_swizzle_128"]
