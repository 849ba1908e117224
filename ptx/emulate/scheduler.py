"""A CTA as cooperatively scheduled warpgroups, and :func:`run_kernel`.

Why warpgroups: a warp-specialized kernel's producer warpgroup (one elected thread looping over TMA loads
while the others exit) and its math warpgroups loop independently and meet only through mbarriers and named
barriers, which lockstep over the whole CTA cannot run. Each warpgroup runs until it blocks (an mbarrier
wait that is not ready, a bar.sync not yet complete), yields (after every mbarrier.arrive / bar.arrive, unless
``preempt=False``) or finishes; the scheduler then picks the next runnable warpgroup, round-robin or, with a
``seed``, at random. Nothing is asynchronous except what the kernel waits for, so when no warpgroup can run
the CTA is deadlocked: the error names each warpgroup's line and what it waits for.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .barriers import NamedBarriers
from .common import EmulationError, GlobalMemory, Program, grid_2d
from .tma import BulkGroups, FakeTensorMap
from .warpgroup import Warpgroup


class ScheduledCTA:
    def __init__(self, program: Program, params: dict, symbols: dict, tensor_maps: dict, memory: GlobalMemory,
                 ctaid, nctaid, threads: int, shared_bytes: int, *, preempt: bool = True, rng=None,
                 max_steps: int = 20_000_000):
        self.program, self.params, self.symbols, self.tensor_maps = program, params, symbols, tensor_maps
        self.memory, self.ctaid, self.nctaid = memory, ctaid, nctaid
        self.smem = np.zeros(shared_bytes, np.uint8)
        self.exited = np.zeros(threads, bool)
        self.barriers = {}  # mbarriers by shared address
        self.named = NamedBarriers(lambda: int((~self.exited).sum()))
        self.bulk = BulkGroups()
        self.preempt, self.rng, self.max_steps, self.steps, self.switches = preempt, rng, max_steps, 0, 0
        self.warpgroups = [Warpgroup(self, i, min(128, threads - 128 * i)) for i in range(-(-threads // 128))]

    def step(self):
        self.steps += 1
        if self.steps > self.max_steps:
            raise EmulationError(f"more than {self.max_steps} steps: " + "; ".join(w.where() for w in self.warpgroups))

    def run(self):
        last = -1
        while True:
            unfinished = [w for w in self.warpgroups if not w.done]
            if not unfinished:
                break
            runnable = [w for w in unfinished if w.wait is None or w.wait.ready()]
            if not runnable:
                raise EmulationError(f"deadlock in CTA {self.ctaid}: " + "; ".join(
                    f"{w.where()} waits for {w.wait.describe()}" for w in unfinished))
            if self.rng is not None:
                chosen = self.rng.choice(runnable)
            else:  # the first runnable warpgroup after the last one that ran
                chosen = min(runnable, key=lambda w: (w.index - last - 1) % len(self.warpgroups))
            self.switches += chosen.index != last
            last = chosen.index
            chosen.wait = None
            chosen.advance()
        self.check_clean_exit()

    def check_clean_exit(self):
        pending = self.bulk.pending()
        if pending:
            raise EmulationError(f"bulk store pending at exit (threads {pending[:8]}): cp.async.bulk.wait_group "
                                 "must cover every committed TMA store before the CTA exits")
        for address, barrier in self.barriers.items():
            if barrier.tx != 0 or barrier.pending != barrier.count:
                raise EmulationError(f"mbarrier at shared {address} left mid-phase: {barrier.describe()}")


@dataclass
class RunStats:
    ctas: int = 0
    steps: int = 0  # instructions executed by warpgroups (labels included), summed over CTAs
    switches: int = 0  # times the scheduler changed warpgroup, summed over CTAs


def run_kernel(ptx: str, kernel: str, grid, threads: int, shared_bytes: int, args: dict, *, preempt: bool = True,
               seed: int | None = None, max_steps: int = 20_000_000) -> RunStats:
    """Run every CTA of ``grid`` ((x, y) or (x,)) one after another, each as cooperatively scheduled warpgroups.

    ``args`` by parameter name (the PTX's ``{kernel}_param_{name}``): a FakeTensorMap is a by-value tensor map
    (``mov.b64 %rd, param`` gives its address), an ndarray a global buffer (written in place), an int a scalar.
    ``preempt``: yield after every mbarrier.arrive / bar.arrive; ``seed``: pick the next warpgroup at random
    (reproducibly) instead of round-robin."""
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
    program, nctaid = Program(ptx, kernel), grid_2d(grid)
    rng = random.Random(seed) if seed is not None else None
    stats = RunStats()
    for y in range(nctaid[1]):
        for x in range(nctaid[0]):
            cta = ScheduledCTA(program, params, symbols, tensor_maps, memory, (x, y), nctaid, threads, shared_bytes,
                               preempt=preempt, rng=rng, max_steps=max_steps)
            cta.run()
            stats.ctas, stats.steps, stats.switches = stats.ctas + 1, stats.steps + cta.steps, \
                stats.switches + cta.switches
    return stats


__all__ = ["ScheduledCTA", "RunStats", "run_kernel"]
