"""Stages 06-07: the TMA ring over time, from real traces. :func:`trace_barriers` records the emulator's
mbarrier, TMA and wgmma events while a kernel runs; :func:`replay` gives them times under a :class:`Timing`
model; :func:`ring_schedule` reads them as the ring's bookkeeping the timelines draw."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

import lessons
from lessons.figures.drawing import LADDER_SHAPE, new_figure


@dataclass(frozen=True)
class Event:
    """One traced instruction. ``step``: the CTA's instruction count just after it (the emulator's clock, which
    interleaves the warpgroups as its cooperative scheduler ran them); ``local``: the instructions its own
    warpgroup had executed by then."""
    step: int
    local: int
    cta: tuple
    warpgroup: int
    kind: str  # expect_tx | arrive | wait (a try_wait that passed) | block (one that did not) | complete (a phase
    #            completed) | tma (a TMA load) | mma (wgmma.mma_async) | wgmma_wait (wgmma.wait_group)
    address: int | None = None  # the mbarrier's shared offset
    parity: int | None = None  # waited parity; for "complete", the parity of the phase that completed
    threads: int = 0


@contextlib.contextmanager
def trace_barriers():
    """Record the mbarrier, TMA-load and wgmma events of every kernel the emulator (ptx.emulate) runs inside the
    ``with`` (a list of :class:`Event`): wraps :class:`ptx.emulate.Warpgroup`'s methods, restored on exit."""
    from ptx.emulate.warpgroup import Warpgroup
    events: list[Event] = []
    names = ("advance", "mbarrier", "bulk", "wgmma")
    original = {name: getattr(Warpgroup, name) for name in names}
    own_methods = {name: Warpgroup.__dict__[name] for name in names if name in Warpgroup.__dict__}
    local, entry = {}, {}  # per warpgroup: instructions before this turn, CTA step at the start of this turn

    def record(self, kind, address=None, parity=None, threads=0):
        key = id(self)
        own = local.get(key, 0) + self.cta.steps - entry.get(key, self.cta.steps)
        events.append(Event(self.cta.steps, own, self.cta.ctaid, self.index, kind, address, parity, threads))

    def completions(self, before):
        for address, barrier in self.cta.barriers.items():
            for phase in range(before.get(address, 0), barrier.phase):
                record(self, "complete", address, phase % 2)

    def advance(self):
        key = id(self)
        entry[key] = self.cta.steps
        try:
            return original["advance"](self)
        finally:
            local[key] = local.get(key, 0) + self.cta.steps - entry.pop(key)

    def mbarrier(self, opcode, kind, ops, mask):
        if not mask.any() or kind == "init":
            return original["mbarrier"](self, opcode, kind, ops, mask)
        operands = ops if kind == "expect_tx" else ops[1:]
        address = int(self.address(operands[0])[mask][0])
        waits = kind in ("try_wait", "test_wait")
        parity = int(self.value(operands[1])[mask][0]) & 1 if waits else None
        before = {a: b.phase for a, b in self.cta.barriers.items()}
        original["mbarrier"](self, opcode, kind, ops, mask)
        name = ("block" if self.wait is not None else "wait") if waits else \
            ("expect_tx" if "expect_tx" in opcode else kind)
        record(self, name, address, parity, int(mask.sum()))
        completions(self, before)

    def bulk(self, parts, ops, mask, *args, **kwargs):
        before = {a: b.phase for a, b in self.cta.barriers.items()}
        result = original["bulk"](self, parts, ops, mask, *args, **kwargs)
        if mask.any() and parts[3:5] == ["tensor", "2d"] and parts[5].startswith("shared"):
            record(self, "tma", int(self.address(ops[2])[mask][0]), threads=int(mask.sum()))
        completions(self, before)
        return result

    def wgmma(self, parts, ops, mask):
        result = original["wgmma"](self, parts, ops, mask)
        if parts[1] in ("mma_async", "wait_group"):
            record(self, "mma" if parts[1] == "mma_async" else "wgmma_wait")
        return result

    Warpgroup.advance, Warpgroup.mbarrier, Warpgroup.bulk, Warpgroup.wgmma = advance, mbarrier, bulk, wgmma
    try:
        yield events
    finally:  # as it was: a method Warpgroup inherits (bulk, from AsyncProxy) must not stay set on it
        for name in names:
            if name in own_methods:
                setattr(Warpgroup, name, own_methods[name])
            else:
                delattr(Warpgroup, name)


@dataclass(frozen=True)
class Timing:
    """The model a trace is replayed with: every traced instruction takes one step of its own warpgroup
    (warpgroups run in parallel), a TMA load lands ``tma`` steps after it is issued, and each wgmma.mma_async
    holds the SM's tensor cores for ``wgmma`` steps (the warpgroups' wgmmas queue for them). Defaults: about an
    H100's cycles (a m64n128k32 e4m3 wgmma is 524,288 FLOP at ~8,192 FLOP per cycle per SM; an L2 hit ~600)."""
    tma: int = 600
    wgmma: int = 64


def replay(events, timing: Timing = Timing()) -> tuple[list[float], list[float]]:
    """(time of each event, time its warpgroup reached it) under ``timing``: each warpgroup keeps its own
    instruction counts between its events (``Event.local``) and every dependency the trace shows holds: a passed
    wait is no earlier than the completion of the phase it waited for (it was *reached* earlier when it had to
    wait), a full phase completes when its last TMA load lands, an empty phase at its last arrival, and
    wgmma.wait_group when its warpgroup's wgmmas are done."""
    times, arrivals, clock, last_local = [], [], {}, {}
    completed: dict = {}  # (cta, address) -> completion times of its phases, in order
    tensor_cores_free, in_flight = 0.0, {}
    cause = {}  # warpgroup -> (time, kind) of its last non-completion event
    for e in events:
        key = (e.cta, e.warpgroup)
        if e.kind == "complete":
            when, kind = cause[key]
            completed.setdefault((e.cta, e.address), []).append(when + (timing.tma if kind == "tma" else 0))
            times.append(completed[(e.cta, e.address)][-1])
            arrivals.append(times[-1])
            continue
        t = clock.get(key, 0.0) + e.local - last_local.get(key, 0)
        arrivals.append(t)
        if e.kind == "wait":
            phases = completed.get((e.cta, e.address), [])
            index = len(phases) - 1 if (len(phases) - 1) % 2 == e.parity else len(phases) - 2
            if index >= 0:  # else the fresh barrier's phase "-1", complete from the start
                t = max(t, phases[index])
        elif e.kind == "mma":
            tensor_cores_free = max(t, tensor_cores_free) + timing.wgmma
            in_flight.setdefault(key, []).append(tensor_cores_free)
        elif e.kind == "wgmma_wait":
            t = max([t, *in_flight.pop(key, [])])
        clock[key], last_local[key] = t, e.local
        cause[key] = (t, e.kind)
        times.append(t)
    return times, arrivals


@dataclass(frozen=True)
class RingTrace:
    """A traced run of one CTA's TMA ring: ``stages`` stages whose full/empty mbarriers sit at
    ``full_region + 8 s`` / ``empty_region + 8 s``; ``producer`` is the warpgroup of the TMA-issuing thread."""
    title: str
    stages: int
    k_blocks: int
    producer: int
    math: tuple[int, ...]
    full_region: int
    empty_region: int
    events: tuple[Event, ...]

    def barrier(self, address: int) -> tuple[str, int]:
        for kind, region in (("full", self.full_region), ("empty", self.empty_region)):
            if region <= address < region + 8 * self.stages:
                return kind, (address - region) // 8
        raise ValueError(f"shared offset {address} is no barrier of the ring")


def ring_input(m: int, n: int, k: int):
    rng = np.random.default_rng(0)
    a = rng.integers(0, 0x38, (m, k), dtype=np.uint8)  # small positive e4m3 values
    b = rng.integers(0, 0x38, (n, k), dtype=np.uint8)
    return a, np.ones((m, k // 128), np.float32), b, np.ones((-(-n // 128), k // 128), np.float32)


def stage06_trace(k_blocks: int = 10) -> RingTrace:
    """Stage 06's kernel with the ladder shape's plan (128 x 128 blocks and its stage count), run by the emulator
    on one tile with K = ``k_blocks`` x 128, traced."""
    from gemm.fp8 import align
    from ptx.emulate import FakeTensorMap, run_kernel
    stage = lessons.stage(6)
    ladder = stage.Plan(*LADDER_SHAPE)
    m, n, k = ladder.block_m, ladder.block_n, k_blocks * 128
    plan = stage.Plan(m, n, k, (ladder.block_m, ladder.block_n))
    a, sa, b, sb = ring_input(m, n, k)
    storage = np.zeros((k // 128, align(m, 4)), np.float32)
    storage[:, :m] = sa.T
    arrays = {"tmap_a": a, "tmap_b": b, "tmap_sa": storage}
    maps = {name: FakeTensorMap(arrays[name], np.dtype(spec["dtype"]), spec["shape"], spec["row_stride_bytes"],
                                spec["box"], spec["swizzle"])
            for name, spec in stage.tensor_map_specs(plan, align(m, 4)).items()}
    with trace_barriers() as events:
        run_kernel(stage.generate_for(plan), stage.KERNEL, plan.grid, plan.threads, plan.shared_bytes,
                   dict(**maps, sb=sb, d=np.zeros((m, n), np.uint16)))
    return RingTrace(f"Stage 06: {plan.block_m} x {plan.block_n} tile, {plan.stages} stages, thread 0 of warpgroup "
                     f"0 produces inline, {plan.ahead} K blocks ahead", plan.stages, k_blocks, 0,
                     tuple(range(plan.block_m // 64)), plan.full_region, plan.empty_region,
                     tuple(e for e in events if e.cta == (0, 0)))


def stage07_trace(k_blocks: int = 10) -> RingTrace:
    """Stage 07's config at the ladder shape, run by gemm.testing.emulated.run_gemm on one tile with K = k_blocks x 128."""
    from gemm.testing.emulated import run_gemm
    from gemm.kernel import SharedPlan
    config = lessons.stage(7).config(*LADDER_SHAPE)
    m, n, k = config.block_m, config.block_n, k_blocks * 128
    with trace_barriers() as events:
        run_gemm(config, *ring_input(m, n, k), sm_count=1)
    plan = SharedPlan(config, n, k)
    return RingTrace(f"Stage 07: {config.describe()}", config.stages, k_blocks, config.math_warpgroups,
                     tuple(range(config.math_warpgroups)), plan.full_region, plan.empty_region,
                     tuple(e for e in events if e.cta == (0, 0)))


def ring_schedule(trace: RingTrace, replayed=None) -> dict[str, list[dict]]:
    """The trace read as the ring's bookkeeping, at the times of ``replayed`` (:func:`replay`'s result; default
    the emulator's steps). ``loads``: per K block j in issue order, {j, stage, issue (its arrive.expect_tx),
    full_parity (of the phase its bytes complete), released (its empty phase completed), producer_parity (the
    empty parity waited on before it; None for the prologue's unwaited loads), producer_blocked (when the
    producer reached that wait, if it had to wait)}. ``uses``: per math warpgroup and K block i, {warpgroup, i,
    stage, parity (the full parity waited on), reached (the wait), start (passed), wgmma_done, release}."""
    times, arrivals = replayed if replayed is not None else ([e.step for e in trace.events],) * 2
    loads, uses, reached, pending = [], {w: [] for w in trace.math}, {}, None
    full_done = {s: [] for s in range(trace.stages)}
    empty_done = {s: [] for s in range(trace.stages)}
    for e, t, arrived in zip(trace.events, times, arrivals):
        if e.kind in ("mma", "tma"):
            continue
        if e.kind == "wgmma_wait":
            if e.warpgroup in uses and uses[e.warpgroup]:
                uses[e.warpgroup][-1]["wgmma_done"] = t
            continue
        kind, stage = trace.barrier(e.address)
        key = (e.warpgroup, e.address)
        if e.kind == "block":
            reached.setdefault(key, arrived)
        elif e.kind == "wait" and kind == "empty" and e.warpgroup == trace.producer:
            pending = (e.parity, reached.pop(key, arrived), t, stage)
        elif e.kind == "wait" and kind == "full" and e.warpgroup in uses:
            uses[e.warpgroup].append(dict(warpgroup=e.warpgroup, i=len(uses[e.warpgroup]), stage=stage,
                                          parity=e.parity, reached=reached.pop(key, arrived), start=t,
                                          wgmma_done=None, release=None))
        elif e.kind == "expect_tx":
            parity, since, passed, waited = pending if pending else (None, None, None, stage)
            if waited != stage:
                raise ValueError(f"the producer waited on stage {waited} and loaded stage {stage}")
            loads.append(dict(j=len(loads), stage=stage, issue=t, producer_parity=parity,
                              producer_blocked=since if since is not None and passed > since else None,
                              full_parity=None, released=None))
            pending = None
        elif e.kind == "arrive" and kind == "empty" and e.warpgroup in uses and uses[e.warpgroup]:
            uses[e.warpgroup][-1]["release"] = t
        elif e.kind == "complete":
            (full_done if kind == "full" else empty_done)[stage].append((t, e.parity))
    for load in loads:
        nth = load["j"] // trace.stages  # the n-th use of its stage
        if nth < len(full_done[load["stage"]]):
            load["full_parity"] = full_done[load["stage"]][nth][1]
        if nth < len(empty_done[load["stage"]]):
            load["released"] = empty_done[load["stage"]][nth][0]
    return {"loads": loads, "uses": [u for w in trace.math for u in uses[w]]}


def _ring_timeline(trace: RingTrace, note: str, timing: Timing = Timing()) -> Figure:
    schedule = ring_schedule(trace, replay(trace.events, timing))
    loads, uses = schedule["loads"], schedule["uses"]
    end = max([u["release"] or u["start"] for u in uses] + [x["released"] or x["issue"] for x in loads])
    fig = new_figure(15, 2.4 + 0.5 * (trace.stages + len(trace.math) + 1))
    ax = fig.add_subplot()
    rows = {f"producer (warpgroup {trace.producer})": 0,
            **{f"math warpgroup {w}": 1 + i for i, w in enumerate(trace.math)}}
    rows.update({f"stage {s}": len(rows) + s for s in range(trace.stages)})
    parity_color = {0: "tab:blue", 1: "tab:purple", None: "0.6"}
    h = 0.34
    blocked = dict(fc="none", ec="tab:red", hatch="////", lw=0.6)
    y = 0
    for load in loads:
        if load["producer_blocked"] is not None:
            ax.broken_barh([(load["producer_blocked"], load["issue"] - load["producer_blocked"])], (y - h, 2 * h),
                           **blocked)
        ax.plot(load["issue"], y, marker="v", color=parity_color[load["full_parity"]], ms=7)
    groups = []  # loads issued close together share one label
    for load in loads:
        if groups and load["issue"] - groups[-1][0]["issue"] < end / 40:
            groups[-1].append(load)
        else:
            groups.append([load])
    for group in groups:
        parities = {x["producer_parity"] for x in group}
        waited = "no wait" if parities == {None} else ("E" + "/".join(str(p) for p in sorted(parities - {None})))
        ks = f"k{group[0]['j']}" + (f"-k{group[-1]['j']}" if len(group) > 1 else "")
        ax.text(group[0]["issue"], y - 0.42, f"{ks}\n{waited}", ha="center" if len(group) == 1 else "left",
                va="bottom", fontsize=6)
    for use in uses:
        y = rows[f"math warpgroup {use['warpgroup']}"]
        if use["start"] > use["reached"]:
            ax.broken_barh([(use["reached"], use["start"] - use["reached"])], (y - h, 2 * h), **blocked)
        done = use["wgmma_done"] or use["start"]
        ax.broken_barh([(use["start"], done - use["start"])], (y - h, 2 * h), fc="tab:orange")
        following = [u["reached"] for u in uses if u["warpgroup"] == use["warpgroup"] and u["i"] == use["i"] + 1]
        stop = following[0] if following else max(done, use["release"] or done)
        ax.broken_barh([(done, stop - done)], (y - h, 2 * h), fc="tab:green", alpha=0.6)
        if use["release"] is not None:
            ax.plot([use["release"]] * 2, [y - 0.45, y + 0.45], color="black", lw=1.6)
        ax.text(use["start"] + end / 400, y, f"k{use['i']}\nF{use['parity']}", va="center", fontsize=6)
    for load in loads:
        y = rows[f"stage {load['stage']}"]
        stop = load["released"] if load["released"] is not None else end
        color = parity_color[load["full_parity"]]
        ax.broken_barh([(load["issue"], timing.tma)], (y - h, 2 * h), fc="none", ec=color, hatch="....", lw=0.6)
        ax.broken_barh([(load["issue"] + timing.tma, max(stop - load["issue"] - timing.tma, 0))], (y - h, 2 * h),
                       fc=color, alpha=0.35, ec=color)
        ax.text(load["issue"] + end / 300, y, f"k{load['j']}: full phase parity {load['full_parity']}", va="center",
                fontsize=6)
    ax.set_yticks(list(rows.values()), list(rows))
    ax.set_ylim(len(rows) - 0.4, -0.9)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel(f"modelled time (steps ~ cycles): each traced instruction 1 step of its warpgroup, a TMA load "
                  f"lands {timing.tma} steps after issue, a wgmma holds the tensor cores {timing.wgmma} steps "
                  "(lessons.figures.Timing)")
    ax.legend(handles=[Patch(fc="none", ec="tab:blue", hatch="....", label="TMA in flight"),
                       Patch(fc="tab:blue", alpha=0.35, label="stage holds K block k (full parity 0) .. released"),
                       Patch(fc="tab:purple", alpha=0.35, label="... full parity 1 (it flips at every wrap)"),
                       Patch(fc="tab:orange", label="wgmma: full wait passed .. wait_group"),
                       Patch(fc="tab:green", alpha=0.6, label="promotion FFMAs, rest of the iteration"),
                       Patch(**blocked, label="waiting on an mbarrier")],
              loc="upper center", bbox_to_anchor=(0.5, -0.09), fontsize=7, ncol=6)
    ax.set_title(f"{trace.title}; {trace.k_blocks} K blocks.\n{note}\n▼ k: the producer's arrive.expect_tx + "
                 "TMA for K block k, E = the empty parity it waited on; F = the full parity a math warpgroup waited "
                 "on; | = its release (arrive on empty).\nEvents, their order per warpgroup and the parities are "
                 "the emulated kernel's (ptx.emulate, traced); the times are that trace replayed with the model "
                 "below.", fontsize=8)
    return fig


def tma_ring_timeline() -> Figure:
    return _ring_timeline(stage06_trace(), "Thread 0 refills stage (i + S - 2) % S before its own K block i, once "
                          "both warpgroups released it; the release comes after the promotion.")


def producer_consumer_timeline() -> Figure:
    return _ring_timeline(stage07_trace(), "The producer warpgroup runs up to S K blocks ahead; the math "
                          "warpgroups release a stage before their promotion FFMAs.")
