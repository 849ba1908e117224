"""cp.async idioms (sm_80+): 16-byte copies from global to shared memory that one thread issues and waits for
by commit group, so loading the next tile overlaps the math on this one (stages 04 and 05).

These are generic-proxy writes: a wgmma that reads what they wrote needs ``fence.proxy.async`` first
(:func:`ptx.vocab.barriers.fence_proxy_async`). The TMA's bulk copies are in :mod:`ptx.vocab.bulk_copies`.
"""
from __future__ import annotations


# PTX ISA "Data movement: cp.async" (16 bytes global -> shared, L2 only; src_size < 16 zero-fills the rest).
def cp_async_16(shared_address: str, global_address: str, shared_offset: int = 0, src_size: str | None = None,
                predicate: str | None = None) -> str:
    """``global_address`` may carry its own immediate ("%rd4+4096"); ``src_size`` is a register or None (16)."""
    guard = f"@{predicate} " if predicate else ""
    size = f", {src_size}" if src_size is not None else ""
    return f"{guard}cp.async.cg.shared.global [{shared_address}+{shared_offset}], [{global_address}], 16{size};"


# PTX ISA "cp.async.commit_group": close the batch of cp.async issued by this thread since the last commit.
def cp_async_commit() -> str:
    return "cp.async.commit_group;"


# PTX ISA "cp.async.wait_group": wait until at most `pending` of this thread's committed groups are in flight.
def cp_async_wait(pending: int) -> str:
    return f"cp.async.wait_group {pending};"


__all__ = ["cp_async_16", "cp_async_commit", "cp_async_wait"]
