"""TMA bulk-copy idioms (sm_90): ``cp.async.bulk.tensor`` loads into shared memory (one CTA's or multicast to
several of a cluster), stores and reduce-adds back to global memory, and their bulk groups.

A TMA copy moves a whole box of a tensor, described by a 128-byte tensor map (:func:`ptx.tensor_maps.tensor_map_2d`
builds it on the host), between global and shared memory; one thread issues it and the copy engine does the rest,
zero-filling what a load reads outside the tensor and clipping what a store writes. A load reports completion to
an mbarrier as transaction bytes (:mod:`ptx.vocab.barriers`); stores complete by bulk group.
"""
from __future__ import annotations


# -- tensor-map operands ------------------------------------------------------------------------------------
# ISA "Kernel Function Parameters" + "cvta" (.param): the generic address of a by-value tensor-map parameter,
# which is what the tensorMap operand of cp.async.bulk.tensor takes (CUTLASS's __grid_constant__ CUtensorMap).
def tensormap_address(dst_u64: str, param_symbol: str, use_cvta: bool = True) -> str:
    if use_cvta:
        return f"mov.b64 {dst_u64}, {param_symbol};\ncvta.param.u64 {dst_u64}, {dst_u64};"
    return f"mov.b64 {dst_u64}, {param_symbol};"


# ISA "prefetch" (.tensormap): bring a tensor map into the cache before its first use.
def prefetch_tensormap(tensormap_u64: str) -> str:
    return f"prefetch.tensormap [{tensormap_u64}];"


# -- L2 eviction priority --------------------------------------------------------------------------------------
L2_EVICTION = ("normal", "first", "last")  # KernelConfig's names of createpolicy's primary priorities


# ISA "createpolicy" (.fractional, fraction 1.0): an opaque 64-bit cache policy under which every line a load with
# .L2::cache_hint brings into L2 gets ``priority``: evict_first lines are the first a set replaces (data read
# once), evict_last the last (data every CTA re-reads).
def create_l2_policy(dst_b64: str, priority: str) -> str:
    if priority not in L2_EVICTION:
        raise ValueError(f"L2 eviction priority must be one of {L2_EVICTION}, got {priority!r}")
    return f"createpolicy.fractional.L2::evict_{priority}.b64 {dst_b64}, 1.0;"


# -- loads ----------------------------------------------------------------------------------------------------
# ISA "cp.async.bulk.tensor" (.2d global -> shared, completion on an mbarrier by transaction bytes; with a
# ``cache_policy`` from create_l2_policy, .L2::cache_hint and the policy as the last operand).
def tma_load_2d(shared_dst: str, tensormap_u64: str, x: str | int, y: str | int, mbarrier: str,
                cache_policy: str | None = None) -> str:
    """Copy the box at (x = inner/column coordinate, y = row) into ``shared_dst``; bytes complete on ``mbarrier``."""
    hint, policy = (".L2::cache_hint", f", {cache_policy}") if cache_policy else ("", "")
    return (f"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes{hint} "
            f"[{shared_dst}], [{tensormap_u64}, {{{x}, {y}}}], [{mbarrier}]{policy};")


# ISA "cp.async.bulk.tensor" (.multicast::cluster): one load lands at the same shared offset in every CTA of
# ``cta_mask`` (bit i = rank i) and completes its bytes on the barrier at the same offset in each of them.
def tma_load_2d_multicast(shared_dst: str, tensormap_u64: str, x: str | int, y: str | int, mbarrier: str,
                          cta_mask: str, cache_policy: str | None = None) -> str:
    hint, policy = (".L2::cache_hint", f", {cache_policy}") if cache_policy else ("", "")
    return (f"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster{hint} "
            f"[{shared_dst}], [{tensormap_u64}, {{{x}, {y}}}], [{mbarrier}], {cta_mask}{policy};")


# ISA "cp.async.bulk.prefetch.tensor" (.2d, .L2, .tile): ask L2 for the box at (x, y) of a tensor; nothing lands
# in shared memory and nothing completes on a barrier: a later load of the box finds it in L2.
def tma_prefetch_2d(tensormap_u64: str, x: str | int, y: str | int) -> str:
    return f"cp.async.bulk.prefetch.tensor.2d.L2.global.tile [{tensormap_u64}, {{{x}, {y}}}];"


# -- stores ---------------------------------------------------------------------------------------------------
# ISA "cp.async.bulk.tensor" (.2d shared -> global, .bulk_group completion): the TMA store. The copy engine
# writes only the part of the box inside the tensor, so ragged edges need no masks.
def tma_store_2d(tensormap_u64: str, x: str | int, y: str | int, shared_src: str) -> str:
    return (f"cp.async.bulk.tensor.2d.global.shared::cta.bulk_group "
            f"[{tensormap_u64}, {{{x}, {y}}}], [{shared_src}];")


# ISA "cp.reduce.async.bulk.tensor" (.add, .tile, .bulk_group): the TMA store that adds the box into global
# memory instead of overwriting it (D = C + A*B in place), done by the copy engine at L2, with the same clipping.
def tma_reduce_add_2d(tensormap_u64: str, x: str | int, y: str | int, shared_src: str) -> str:
    return (f"cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group "
            f"[{tensormap_u64}, {{{x}, {y}}}], [{shared_src}];")


# ISA "cp.async.bulk.commit_group": close this thread's group of bulk copies issued so far.
def bulk_commit_group() -> str:
    return "cp.async.bulk.commit_group;"


# ISA "cp.async.bulk.wait_group": wait until at most `pending` of this thread's bulk groups are unfinished;
# `.read` waits only until their shared-memory sources have been read (the buffer may be reused).
def bulk_wait_group(pending: int, read_only: bool = False) -> str:
    return f"cp.async.bulk.wait_group{'.read' if read_only else ''} {pending};"


__all__ = [
    "L2_EVICTION", "create_l2_policy", "tensormap_address", "prefetch_tensormap", "tma_load_2d",
    "tma_load_2d_multicast", "tma_prefetch_2d", "tma_store_2d", "tma_reduce_add_2d", "bulk_commit_group", "bulk_wait_group",
]
