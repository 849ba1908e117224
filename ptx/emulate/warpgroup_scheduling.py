"""A CTA as cooperatively scheduled warpgroups, and :func:`run_kernel`.

Why warpgroups: a warp-specialized kernel's producer warpgroup (one elected thread looping over TMA loads
while the others exit) and its math warpgroups loop independently and meet only through mbarriers and named
barriers, which lockstep over the whole CTA cannot run. Each warpgroup runs until it blocks (an mbarrier
wait that is not ready, a bar.sync not yet complete), yields (after every mbarrier.arrive / bar.arrive, unless
``preempt=False``) or finishes; the scheduler then picks the next runnable warpgroup, round-robin or, with a
``seed``, at random. Nothing is asynchronous except what the kernel waits for, so when no warpgroup can run
the CTA is deadlocked: the error names each warpgroup's line and what it waits for.

Clusters (``run_kernel(..., cluster=2)``): the CTAs of a cluster run together, their warpgroups in one pool
(round-robin goes over CTA 0's warpgroups, then CTA 1's), each CTA with its own shared memory, registers and
barriers, so a deadlock is found across the cluster. A peer's shared memory is reached only through
shared::cluster addresses (mapa; ptx.emulate.common), remote mbarrier arrives and TMA multicast; touching a
peer whose threads have all exited is an error ("remote access to an exited CTA"), the bug a kernel avoids by
draining its peers' arrivals before exit. At the end of the cluster every CTA gets the usual exit checks.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from . import session
from .barriers import ClusterBarrier, NamedBarriers
from .common import CLUSTER_RANKS, EmulationError, GlobalMemory, Program, grid_2d, split_shared
from .bulk_copies import BulkGroups, FakeTensorMap
from .warpgroup import Warpgroup


class Cluster:
    """The CTAs of one thread-block cluster (consecutive %ctaid.x), run together: all their warpgroups in one
    cooperatively scheduled pool, so deadlock detection covers the cluster. A lone CTA is a cluster of one."""

    def __init__(self, size: int, rng=None):
        self.size, self.rng = size, rng  # rng: random.Random for seeded scheduling, None for round-robin
        self.ctas: list[ScheduledCTA] = []  # by rank; ScheduledCTA appends itself
        self.barrier = ClusterBarrier(self.ctas)

    def target(self, address: int, source: ScheduledCTA, what: str, remote: bool = True):
        """(CTA, offset) that a shared address names for ``source``; ``remote``: the operand is .shared::cluster
        (a mapa result may name a peer), else it must be CTA-local. Touching a finished peer is an error."""
        rank, offset = split_shared(address)
        if rank is None:
            return source, offset
        if not remote:
            raise EmulationError(f"{what}: shared::cluster address {address:#x} (a mapa result) in a .shared::cta "
                                 "operand, which takes a CTA-local address")
        if rank >= self.size:
            raise EmulationError(f"{what}: shared::cluster address {address:#x} names CTA rank {rank} of a "
                                 f"cluster of {self.size}")
        return self.peer(rank, source, what, offset), offset

    def peer(self, rank: int, source: ScheduledCTA, what: str, offset: int) -> ScheduledCTA:
        cta = self.ctas[rank]
        if cta is not source and cta.finished:
            raise EmulationError(
                f"remote access to an exited CTA: {what} from CTA rank {source.rank} {source.ctaid} targets shared "
                f"offset {offset} of CTA rank {rank} {cta.ctaid}, whose threads have all exited (a CTA must not "
                "exit while its peers may still arrive on its barriers or multicast into it: drain them first)")
        return cta

    def run(self):
        if len(self.ctas) != self.size:
            raise EmulationError(f"a cluster of {self.size} CTAs has {len(self.ctas)}")
        pool = [w for cta in self.ctas for w in cta.warpgroups]
        for slot, w in enumerate(pool):
            w.slot = slot
        last = -1
        while True:
            unfinished = [w for w in pool if not w.done]
            if not unfinished:
                break
            runnable = [w for w in unfinished if w.wait is None or w.wait.ready()]
            if not runnable:
                first = self.ctas[0]
                cluster_id = first.specials["%clusterid.x"] if first.nctaid[1] == 1 else \
                    (first.specials["%clusterid.x"], first.specials["%clusterid.y"])
                where = f"CTA {first.ctaid}" if self.size == 1 else \
                    f"cluster {cluster_id} (CTAs " + ", ".join(str(c.ctaid) for c in self.ctas) + ")"
                raise EmulationError(f"deadlock in {where}: " + "; ".join(
                    f"{w.where()} waits for {w.wait.describe()}" for w in unfinished))
            if self.rng is not None:
                chosen = self.rng.choice(runnable)
            else:  # the first runnable warpgroup after the last one that ran
                chosen = min(runnable, key=lambda w: (w.slot - last - 1) % len(pool))
            chosen.cta.switches += chosen.slot != last
            last = chosen.slot
            chosen.wait = None
            chosen.advance()
        for cta in self.ctas:
            cta.check_clean_exit()


class ScheduledCTA:
    def __init__(self, program: Program, params: dict, symbols: dict, tensor_maps: dict, memory: GlobalMemory,
                 ctaid, nctaid, threads: int, shared_bytes: int, *, preempt: bool = True, rng=None,
                 max_steps: int = 20_000_000, cluster: Cluster | None = None):
        self.program, self.params, self.symbols, self.tensor_maps = program, params, symbols, tensor_maps
        self.memory, self.ctaid, self.nctaid = memory, tuple(ctaid), tuple(nctaid)
        self.cluster = cluster if cluster is not None else Cluster(1, rng)
        self.rank, size = len(self.cluster.ctas), self.cluster.size
        if self.rank >= size:
            raise EmulationError(f"a cluster of {size} CTAs cannot take another")
        self.cluster.ctas.append(self)
        self.specials = {"%cluster_ctarank": self.rank, "%cluster_nctarank": size,
                         "%clusterid.x": self.ctaid[0] // size, "%clusterid.y": self.ctaid[1], "%clusterid.z": 0,
                         "%nclusterid.x": self.nctaid[0] // size, "%nclusterid.y": self.nctaid[1],
                         "%nclusterid.z": 1, "%cluster_ctaid.x": self.rank, "%cluster_ctaid.y": 0,
                         "%cluster_ctaid.z": 0, "%cluster_nctaid.x": size, "%cluster_nctaid.y": 1,
                         "%cluster_nctaid.z": 1, "%ntid.x": threads}
        self.smem = np.zeros(shared_bytes, np.uint8)
        # per byte: the thread (rank * 1024 + tid) whose generic-proxy write no fence.proxy.async has covered yet,
        # -1 for none, and the line of that write (ptx.emulate.async_proxy, "Proxies")
        self.generic_writer = np.full(shared_bytes, -1, np.int32)
        self.generic_line = np.zeros(shared_bytes, np.int32)
        self.exited = np.zeros(threads, bool)
        self.barriers = {}  # mbarriers by shared address
        self.named = NamedBarriers(lambda: int((~self.exited).sum()))
        self.bulk = BulkGroups()
        self.preempt, self.rng, self.max_steps, self.steps, self.switches = preempt, rng, max_steps, 0, 0
        self.warpgroups = [Warpgroup(self, i, min(128, threads - 128 * i)) for i in range(-(-threads // 128))]

    @property
    def finished(self) -> bool:
        """Every thread has exited (every warpgroup ran to its end)."""
        return all(w.done for w in self.warpgroups)

    def step(self):
        self.steps += 1
        if self.steps > self.max_steps:
            raise EmulationError(f"more than {self.max_steps} steps: " + "; ".join(w.where() for w in self.warpgroups))

    def run(self):
        """Run this CTA's cluster (the CTA alone unless it was built into a larger one)."""
        self.cluster.run()

    def check_clean_exit(self):
        pending = self.bulk.pending()
        if pending:
            raise EmulationError(f"bulk store pending at exit (threads {pending[:8]}): cp.async.bulk.wait_group "
                                 "must cover every committed TMA store before the CTA exits")
        for address, barrier in self.barriers.items():
            if barrier.tx != 0 or barrier.pending != barrier.count:
                where = f" of CTA rank {self.rank} {self.ctaid}" if self.cluster.size > 1 else ""
                raise EmulationError(f"mbarrier at shared {address}{where} left mid-phase: {barrier.describe()}")


@dataclass
class RunStats:
    ctas: int = 0
    steps: int = 0  # instructions executed by warpgroups (labels included), summed over CTAs
    switches: int = 0  # times the scheduler changed warpgroup, summed over CTAs (counted for the CTA it ran)
    clusters: int = 0


def run_kernel(ptx: str, kernel: str, grid, threads: int, shared_bytes: int, args: dict, *, preempt: bool = True,
               seed: int | None = None, max_steps: int = 20_000_000, cluster: int = 1) -> RunStats:
    """Run every cluster of ``grid`` ((x, y) or (x,)) one after another, each as cooperatively scheduled
    warpgroups; ``cluster`` CTAs with consecutive %ctaid.x (rank = %ctaid.x % cluster) form one cluster and
    run together (grid x must be a multiple of it). cluster=1: every CTA alone, one after another.

    ``args`` by parameter name (the PTX's ``{kernel}_param_{name}``): a FakeTensorMap is a by-value tensor map
    (``mov.b64 %rd, param`` gives its address), an ndarray a global buffer (written in place), an int a scalar.
    ``preempt``: yield after every mbarrier.arrive / bar.arrive / barrier.cluster.arrive; ``seed``: pick the
    next warpgroup at random (reproducibly) instead of round-robin. ``max_steps`` is per CTA.
    Inside a ptx.emulate.session.capture the PTX may be edited first and the run is recorded."""
    ptx, record = session.prepare(ptx, kernel, "warpgroups", threads)
    program, nctaid = Program(ptx, kernel), grid_2d(grid)
    if not 1 <= cluster <= CLUSTER_RANKS or nctaid[0] % cluster:
        raise EmulationError(f"cluster of {cluster} CTAs for a grid of {nctaid}: the cluster size must be 1.."
                             f"{CLUSTER_RANKS} and divide the grid's x")
    memory = GlobalMemory()
    params, symbols, tensor_maps = {}, {"smem": 0}, {}
    for name, value in args.items():
        param = f"{kernel}_param_{name}"
        if isinstance(value, FakeTensorMap):
            handle = 0x7000_0000 + len(tensor_maps) * 0x100
            symbols[param], tensor_maps[handle] = handle, value
        elif isinstance(value, np.ndarray):
            params[param] = memory.add(name, value)
        else:
            params[param] = int(value)
    for name, table in program.constants.items():
        symbols[name] = memory.add(name, table.copy())
    rng = random.Random(seed) if seed is not None else None
    stats = RunStats()
    for y in range(nctaid[1]):
        for x in range(0, nctaid[0], cluster):
            group = Cluster(cluster, rng)
            ctas = [ScheduledCTA(program, params, symbols, tensor_maps, memory, (x + rank, y), nctaid, threads,
                                 shared_bytes, preempt=preempt, rng=rng, max_steps=max_steps, cluster=group)
                    for rank in range(cluster)]
            try:
                group.run()
            finally:  # a run that stops on an error still counts what it executed
                stats.clusters += 1
                for cta in ctas:
                    stats.ctas, stats.steps, stats.switches = stats.ctas + 1, stats.steps + cta.steps, \
                        stats.switches + cta.switches
                if record is not None:
                    record.update(ctas=stats.ctas, clusters=stats.clusters, steps=stats.steps,
                                  switches=stats.switches, cluster=cluster)
    return stats


__all__ = ["Cluster", "ScheduledCTA", "RunStats", "run_kernel"]
