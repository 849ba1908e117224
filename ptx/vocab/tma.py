"""TMA and mbarrier idioms (sm_90): bulk tensor copies into shared memory, guarded by transaction barriers.

A TMA copy (``cp.async.bulk.tensor``) moves a whole box of a tensor, described by a 128-byte tensor map
(:func:`ptx.tensor_maps.tensor_map_2d` builds it on the host), from global into shared memory; one thread issues
it and the copy engine does the rest, zero-filling what lies outside the tensor. Completion is reported to
an ``mbarrier`` in shared memory as a *transaction count*: the producer says how many bytes to expect
(``mbarrier.arrive.expect_tx``), each finished copy subtracts its bytes, and the barrier's phase completes
when both the arrivals and the bytes reach zero. Waiters poll the phase by its parity.

Pipeline bookkeeping for a ring of S stages (pure Python here, mirrored by the generated PTX):
iteration i uses stage i % S, and is the (i // S)-th use of that stage, so its full barrier completes
phase i // S: consumers wait for parity (i // S) % 2. The producer refilling a stage for iteration j
needs the consumers' release of iteration j - S, i.e. phase j // S - 1 of the empty barrier: parity
((j // S) % 2) ^ 1. For j < S that is parity 1 on a fresh barrier, which the ISA counts as already
complete ("the phase before the current one"), so the first round needs no special case.
"""
from __future__ import annotations


# -- bookkeeping (pure Python) ------------------------------------------------------------------------------
def pipeline_slot(iteration: int, stages: int) -> tuple[int, int]:
    """(stage, parity of the full-barrier phase) that iteration ``iteration`` consumes."""
    return iteration % stages, (iteration // stages) % 2


def producer_wait_parity(iteration: int, stages: int) -> int:
    """Parity of the empty-barrier phase the producer waits on before loading ``iteration``."""
    return ((iteration // stages) % 2) ^ 1


def advance(stage: int, parity: int, stages: int) -> tuple[int, int]:
    """The next iteration's (stage, parity): what the PTX's loop counters do (stage wraps, parity flips)."""
    stage += 1
    if stage == stages:
        return 0, parity ^ 1
    return stage, parity


# -- mbarrier ------------------------------------------------------------------------------------------------
# ISA "mbarrier.init": a barrier in shared memory expecting `count` arrivals per phase.
def mbarrier_init(address: str, count: int) -> str:
    return f"mbarrier.init.shared::cta.b64 [{address}], {count};"


# ISA "fence.mbarrier_init": make initialised barriers visible to the async proxy / other CTAs of the cluster.
def fence_mbarrier_init() -> str:
    return "fence.mbarrier_init.release.cluster;"


# ISA "mbarrier.expect_tx" / "mbarrier.arrive" (.expect_tx): arrive once and expect `nbytes` of transactions.
def mbarrier_arrive_expect_tx(address: str, nbytes: int | str) -> str:
    return f"mbarrier.arrive.expect_tx.shared::cta.b64 _, [{address}], {nbytes};"


# ISA "mbarrier.arrive": one arrival (release semantics at CTA scope).
def mbarrier_arrive(address: str) -> str:
    return f"mbarrier.arrive.shared::cta.b64 _, [{address}];"


# ISA "mbarrier.test_wait/try_wait" (.parity): spin until the phase with parity `parity` has completed.
def mbarrier_wait_parity(address: str, parity: str | int, ready_pred: str, label: str) -> str:
    """A try_wait loop; ``label`` must be fresh (KernelBuilder.label) and ``ready_pred`` a .pred register."""
    return "\n".join([
        f"{label}:",
        f"mbarrier.try_wait.parity.shared::cta.b64 {ready_pred}, [{address}], {parity};",
        f"@!{ready_pred} bra {label};",
    ])


# -- proxies -------------------------------------------------------------------------------------------------
# ISA "membar/fence" (fence.proxy.async): order this thread's generic-proxy shared-memory accesses with
# later async-proxy ones (wgmma operand reads, TMA): needed after st.shared / cp.async writes that wgmma reads.
def fence_proxy_async() -> str:
    return "fence.proxy.async.shared::cta;"


# -- TMA ---------------------------------------------------------------------------------------------------
# ISA "Kernel Function Parameters" + "cvta" (.param): the generic address of a by-value tensor-map parameter,
# which is what the tensorMap operand of cp.async.bulk.tensor takes (CUTLASS's __grid_constant__ CUtensorMap).
def tensormap_address(dst_u64: str, param_symbol: str, use_cvta: bool = True) -> str:
    if use_cvta:
        return f"mov.b64 {dst_u64}, {param_symbol};\ncvta.param.u64 {dst_u64}, {dst_u64};"
    return f"mov.b64 {dst_u64}, {param_symbol};"


# ISA "prefetch" (.tensormap): bring a tensor map into the cache before its first use.
def prefetch_tensormap(tensormap_u64: str) -> str:
    return f"prefetch.tensormap [{tensormap_u64}];"


# ISA "cp.async.bulk.tensor" (.2d global -> shared, completion on an mbarrier by transaction bytes).
def tma_load_2d(shared_dst: str, tensormap_u64: str, x: str | int, y: str | int, mbarrier: str) -> str:
    """Copy the box at (x = inner/column coordinate, y = row) into ``shared_dst``; bytes complete on ``mbarrier``."""
    return (f"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
            f"[{shared_dst}], [{tensormap_u64}, {{{x}, {y}}}], [{mbarrier}];")


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


# -- clusters (sm_90): two CTAs that see each other's shared memory and share TMA copies -------------------------
# ISA "Special Registers" (%cluster_ctarank): this CTA's rank in its cluster.
def cluster_rank(dst_u32: str) -> str:
    return f"mov.u32 {dst_u32}, %cluster_ctarank;"


# ISA "mapa": the address of the same shared variable in CTA ``rank`` of the cluster (a shared::cluster address).
def mapa(dst_u32: str, shared_address: str, rank: str | int) -> str:
    return f"mapa.shared::cluster.u32 {dst_u32}, {shared_address}, {rank};"


# ISA "mbarrier.arrive" (.shared::cluster): one arrival on a barrier of any CTA of the cluster. Default semantics
# (release at CTA scope), as CUTLASS's ClusterBarrier::arrive: the .release.cluster form adds a MEMBAR per arrive,
# and what it orders here (this warp's finished wgmma reads of the stage) is already complete at the arrive.
def mbarrier_arrive_cluster(cluster_address: str) -> str:
    return f"mbarrier.arrive.shared::cluster.b64 _, [{cluster_address}];"


# ISA "cp.async.bulk.tensor" (.multicast::cluster): one load lands at the same shared offset in every CTA of
# ``cta_mask`` (bit i = rank i) and completes its bytes on the barrier at the same offset in each of them.
def tma_load_2d_multicast(shared_dst: str, tensormap_u64: str, x: str | int, y: str | int, mbarrier: str,
                          cta_mask: str) -> str:
    return (f"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
            f"[{shared_dst}], [{tensormap_u64}, {{{x}, {y}}}], [{mbarrier}], {cta_mask};")


# ISA "barrier.cluster": every thread of every CTA of the cluster arrives, then waits for all (release/acquire:
# barrier inits and shared writes before it are visible to the other CTA after it). Not .aligned: the threads
# of a warp may reach it on different paths (the producer's elected thread comes later than the others).
def cluster_sync() -> str:
    return "barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;"


__all__ = [
    "pipeline_slot", "producer_wait_parity", "advance", "mbarrier_init", "fence_mbarrier_init",
    "mbarrier_arrive_expect_tx", "mbarrier_arrive", "mbarrier_wait_parity", "fence_proxy_async",
    "tensormap_address", "prefetch_tensormap", "tma_load_2d", "tma_store_2d", "tma_reduce_add_2d", "bulk_commit_group", "bulk_wait_group",
    "cluster_rank", "mapa", "mbarrier_arrive_cluster", "tma_load_2d_multicast", "cluster_sync",
]
