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

from dataclasses import dataclass

from .common import EmulationError


@dataclass
class Barrier:
    count: int
    pending: int
    tx: int = 0
    phase: int = 0  # completed phases

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


__all__ = ["Barrier", "NamedBarrier", "NamedBarriers", "MbarrierWait", "NamedWait"]
