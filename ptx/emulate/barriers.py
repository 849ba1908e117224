"""mbarriers and named barriers (bar.sync / bar.arrive), and what a blocked warpgroup waits for.

mbarrier (PTX ISA 8.5 "mbarrier"): pending arrivals and transaction bytes per phase; the phase completes when
both reach zero. try_wait.parity(P) is true once the phase with parity P has completed, i.e. when the current
(incomplete) phase's parity differs from P; a fresh barrier counts the phase before it (parity 1) as complete.

Named barriers (PTX ISA "bar, barrier"): 16 per CTA. ``bar.sync id, count`` / ``bar.arrive id, count`` count
arrivals per warp (32 for every warp executing it, as hardware does) and complete at ``count``; ``bar.sync id``
without a count waits for every thread of the CTA that has not exited (counted per thread, so exits of other
threads can complete it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .common import EmulationError


@dataclass
class Barrier:
    count: int
    pending: int
    tx: int = 0
    phase: int = 0  # completed phases
    # (warpgroup, warp) -> completed phases that warp has seen (ptx.emulate.warpgroup: a test_wait may see one late)
    seen: dict = field(default_factory=dict)
    # st.async bytes from another CTA in the current phase; then the phase count at which such a phase completed:
    # its complete_tx is a release at cluster scope, which only a wait acquiring at cluster scope pairs with
    remote_data_pending: bool = False
    remote_data_phase: int = -1

    def arrive(self, times: int = 1):
        self.pending -= times
        self._maybe_complete()

    def complete_tx(self, nbytes: int):
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self):
        if self.pending < 0:
            raise EmulationError("more arrivals than the barrier's count in one phase")
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            if self.remote_data_pending:
                self.remote_data_phase, self.remote_data_pending = self.phase, False

    def ready(self, parity: int) -> bool:
        return self.phase % 2 != parity

    def describe(self) -> str:
        return (f"{self.phase} phases completed (current parity {self.phase % 2}), {self.pending} of "
                f"{self.count} arrivals and {self.tx} transaction bytes pending")


@dataclass
class NamedBarrier:
    arrived: int = 0
    count: int | None = None  # None: every thread of the CTA that has not exited
    generation: int = 0  # completions so far: a waiter resumes once it moves past the one it arrived in


class NamedBarriers:
    def __init__(self, live_threads):
        self.live_threads = live_threads  # () -> threads of the CTA that have not exited
        self.barriers = [NamedBarrier() for _ in range(16)]

    def arrive(self, barrier_id: int, count: int | None, arrivals: int) -> int:
        """Record ``arrivals``; returns the generation they belong to (complete once it is passed)."""
        if not 0 <= barrier_id < 16:
            raise EmulationError(f"named barrier {barrier_id}: ids are 0..15")
        if count is not None and (count <= 0 or count % 32):
            raise EmulationError(f"bar {barrier_id}, {count}: the thread count must be a positive multiple of 32")
        barrier = self.barriers[barrier_id]
        if barrier.arrived and barrier.count != count:
            raise EmulationError(f"bar {barrier_id} used with thread counts {barrier.count} and {count} at once")
        barrier.count = count
        barrier.arrived += arrivals
        generation = barrier.generation
        self.poll(barrier_id)
        return generation

    def poll(self, barrier_id: int) -> int:
        barrier = self.barriers[barrier_id]
        expected = self.live_threads() if barrier.count is None else barrier.count
        if barrier.arrived and barrier.arrived >= expected:
            if barrier.arrived > expected and barrier.count is not None:
                raise EmulationError(f"bar {barrier_id}: {barrier.arrived} threads arrived for a count of "
                                     f"{barrier.count}")
            barrier.arrived, barrier.count = 0, None
            barrier.generation += 1
        return barrier.generation

    def describe(self, barrier_id: int) -> str:
        barrier = self.barriers[barrier_id]
        expected = f"all {self.live_threads()} live" if barrier.count is None else barrier.count
        return f"{barrier.arrived} of {expected} threads arrived"


class ClusterBarrier:
    def __init__(self, ctas):
        self.ctas = ctas  # the cluster's CTAs, by rank (each has ``exited``, one flag per thread)
        self.generation = 0  # completed phases
        self.arrived: dict[int, np.ndarray] = {}  # rank -> threads arrived in the current phase
        self.token: dict[int, np.ndarray] = {}  # rank -> generation each thread last arrived in, -1 once waited

    def _state(self, rank: int):
        if rank not in self.arrived:
            threads = self.ctas[rank].exited.size
            self.arrived[rank], self.token[rank] = np.zeros(threads, bool), np.full(threads, -1, np.int64)
        return self.arrived[rank], self.token[rank]

    def arrive(self, rank: int, threads: np.ndarray):
        arrived, token = self._state(rank)
        if (token[threads] >= 0).any():
            raise EmulationError(f"barrier.cluster.arrive by threads {threads[token[threads] >= 0][:4].tolist()} "
                                 "that arrived before without a barrier.cluster.wait")
        arrived[threads], token[threads] = True, self.generation
        self.poll()

    def wait(self, rank: int, threads: np.ndarray) -> int:
        """Consume the threads' arrivals; returns the generation that must be passed before they go on."""
        _, token = self._state(rank)
        tokens = set(token[threads].tolist())
        if -1 in tokens:
            raise EmulationError(f"barrier.cluster.wait by threads {threads[token[threads] < 0][:4].tolist()} "
                                 "that did not barrier.cluster.arrive first")
        if len(tokens) != 1:
            raise EmulationError(f"barrier.cluster.wait by threads that arrived in different phases {tokens}")
        token[threads] = -1
        return tokens.pop()

    def poll(self) -> int:
        states = [self._state(rank)[0] | cta.exited for rank, cta in enumerate(self.ctas)]
        if any(a.any() for a in self.arrived.values()) and all(s.all() for s in states):
            self.generation += 1
            for arrived in self.arrived.values():
                arrived[:] = False
        return self.generation

    def describe(self) -> str:
        counts = []
        for rank, cta in enumerate(self.ctas):
            arrived, _ = self._state(rank)
            counts.append(f"CTA rank {rank} {int(arrived.sum())} arrived, {int((~arrived & ~cta.exited).sum())} "
                          "live not yet")
        return f"barrier.cluster ({self.generation} phases completed; " + ", ".join(counts) + ")"


# -- what a blocked warpgroup waits for --------------------------------------------------------------------
@dataclass
class MbarrierWait:
    barrier: Barrier
    address: int
    parity: int
    after: bool = False  # resume at the try_wait itself: it runs again and now succeeds

    def ready(self) -> bool:
        return self.barrier.ready(self.parity)

    def describe(self) -> str:
        return f"mbarrier at shared {self.address} to complete the phase of parity {self.parity} " \
               f"({self.barrier.describe()})"


@dataclass
class NamedWait:
    barriers: NamedBarriers
    barrier_id: int
    generation: int
    after: bool = True  # already arrived: resume after the bar.sync

    def ready(self) -> bool:
        return self.barriers.poll(self.barrier_id) > self.generation

    def describe(self) -> str:
        return f"named barrier {self.barrier_id} ({self.barriers.describe(self.barrier_id)})"


@dataclass
class ClusterWait:
    barrier: ClusterBarrier
    generation: int
    after: bool = True  # the wait consumed the arrival: resume after it

    def ready(self) -> bool:
        return self.barrier.poll() > self.generation

    def describe(self) -> str:
        return self.barrier.describe()


__all__ = ["Barrier", "NamedBarrier", "NamedBarriers", "ClusterBarrier", "MbarrierWait", "NamedWait",
           "ClusterWait"]
