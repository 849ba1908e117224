"""mbarrier and fence idioms (sm_90): the transaction barriers that TMA copies complete on, the ring's parity
bookkeeping, the proxy fence, and the cluster-wide barrier.

An ``mbarrier`` in shared memory completes a *phase* when both its expected arrivals and its expected
transaction bytes reach zero: the producer says how many bytes to expect (``mbarrier.arrive.expect_tx``), each
finished bulk copy (:mod:`ptx.vocab.bulk_copies`) subtracts its bytes. Waiters poll the phase by its parity.

Pipeline bookkeeping for a ring of S stages (pure Python here, mirrored by the generated PTX):
iteration i uses stage i % S, and is the (i // S)-th use of that stage, so its full barrier completes
phase i // S: consumers wait for parity (i // S) % 2. The producer refilling a stage for iteration j
needs the consumers' release of iteration j - S, i.e. phase j // S - 1 of the empty barrier: parity
((j // S) % 2) ^ 1. For j < S that is parity 1 on a fresh barrier, which the ISA counts as already
complete ("the phase before the current one"), so the first round needs no special case.

Named barriers (``bar.sync``, ``bar.arrive``) are in :mod:`ptx.vocab.core`.
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
def mbarrier_wait_parity(address: str, parity: str | int, ready_pred: str, label: str, cluster: bool = False) -> str:
    """A try_wait loop; ``label`` must be fresh (KernelBuilder.label) and ``ready_pred`` a .pred register.
    ``cluster``: acquire at cluster scope (the default is .acquire.cta), for a phase completed by another CTA's
    release (st.async's complete_tx is a release at cluster scope: only a cluster-scope acquire pairs with it)."""
    scope = ".acquire.cluster" if cluster else ""
    return "\n".join([
        f"{label}:",
        f"mbarrier.try_wait.parity{scope}.shared::cta.b64 {ready_pred}, [{address}], {parity};",
        f"@!{ready_pred} bra {label};",
    ])


# ISA "mbarrier.test_wait" (.parity): the non-blocking form: ``ready_pred`` says whether the phase with parity
# ``parity`` has completed, now (acquire semantics when it has, as try_wait's)
def mbarrier_test_parity(address: str, parity: str | int, ready_pred: str) -> str:
    return f"mbarrier.test_wait.parity.shared::cta.b64 {ready_pred}, [{address}], {parity};"


# ISA "mbarrier.arrive" (.shared::cluster): one arrival on a barrier of any CTA of the cluster. Default semantics
# (release at CTA scope), as CUTLASS's ClusterBarrier::arrive: the .release.cluster form adds a MEMBAR per arrive,
# and what it orders here (this warp's finished wgmma reads of the stage) is already complete at the arrive.
def mbarrier_arrive_cluster(cluster_address: str) -> str:
    return f"mbarrier.arrive.shared::cluster.b64 _, [{cluster_address}];"


# -- proxies -------------------------------------------------------------------------------------------------
# ISA "membar/fence" (fence.proxy.async): order this thread's generic-proxy shared-memory accesses with
# later async-proxy ones (wgmma operand reads, TMA): needed after st.shared / cp.async writes that wgmma reads.
def fence_proxy_async() -> str:
    return "fence.proxy.async.shared::cta;"


# -- clusters ------------------------------------------------------------------------------------------------
# ISA "barrier.cluster": every thread of every CTA of the cluster arrives, then waits for all (release/acquire:
# barrier inits and shared writes before it are visible to the other CTA after it). Not .aligned: the threads
# of a warp may reach it on different paths (the producer's elected thread comes later than the others).
def cluster_sync() -> str:
    return "barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;"


# The two halves of cluster_sync, for a thread with work between its arrival and its wait (split-K's rank 0 stores
# D after arriving on the phase its peers wait for before they exit).
def cluster_arrive() -> str:
    return "barrier.cluster.arrive.release;"


def cluster_wait() -> str:
    return "barrier.cluster.wait.acquire;"


# An arrival that orders nothing by itself (.relaxed), after a fence.mbarrier_init.release.cluster: the barriers
# this CTA initialised are visible to a peer once it has waited on the phase (CUTLASS's cluster_arrive_relaxed).
def cluster_arrive_relaxed() -> str:
    return "barrier.cluster.arrive.relaxed;"


# Programmatic dependent launch (PTX ISA, parallel synchronization instructions: griddepcontrol; sm_90). A grid launched with the
# programmatic-serialization attribute may start while the previous grid on the stream is still running:
# ``.wait`` blocks until that grid has completed and its memory operations are visible (a no-op without the
# attribute), so it must come before this grid touches memory the previous one may read or write;
# ``.launch_dependents`` lets the next grid start once every CTA of this one has issued it (or exited).
def grid_dependency_wait() -> str:
    return "griddepcontrol.wait;"


def launch_dependents() -> str:
    return "griddepcontrol.launch_dependents;"


__all__ = [
    "grid_dependency_wait", "launch_dependents", "pipeline_slot", "producer_wait_parity", "advance", "mbarrier_init", "fence_mbarrier_init",
    "mbarrier_arrive_expect_tx", "mbarrier_arrive", "mbarrier_wait_parity", "mbarrier_arrive_cluster",
    "fence_proxy_async", "cluster_sync", "cluster_arrive", "cluster_wait", "cluster_arrive_relaxed",
]
