"""The one kernel timer every benchmark uses, the device description, and the result files.

Kernel time, not launch time (DEVELOPERS.md): we capture a CUDA graph of ``pairs`` x (flush L2; launch),
replay it, and subtract the replay time of the same graph with the flushes alone:

    kernel_us = (t(graph of flush+launch pairs) - t(graph of flushes)) / pairs

Launch gaps vanish inside a graph replay (they are up to 40% of an M=64 kernel when timed per call), and a
256 MiB flush before every call evicts the 50 MB L2 so each call reads its operands from HBM, as it would
inside a model: a memset by default, or with ``flush="clean"`` a read pass that leaves the L2 clean rather than
dirty (:mod:`gemm.testing.l2_flush` says when that matters).

``launch(stream)`` may come from Numba (``numba.cuda.external_stream``), from our PTX runtime (an int handle) or
from torch (``torch.cuda.ExternalStream``): all we need is that it enqueues one kernel call on the stream it is
given, without allocating or synchronizing.

DeepGEMM's own timers, ``bench_kineto`` (seconds per call) and ``bench`` (milliseconds per call), are here too, on
this timer, so that DeepGEMM's tests and scripts run unchanged against this library (docs/deepgemm.md).

Everything here imports on a machine without a GPU; the CUDA driver is touched only when a function runs.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Callable

FLUSH_BYTES = 256 << 20
TARGET_REPLAY_SECONDS = 0.1  # long enough for event resolution and clock noise to average out
MIN_PAIRS, MAX_PAIRS = 3, 50


@dataclass
class Timing:
    median_us: float
    min_us: float
    samples_us: list[float]
    pairs: int
    flush_us: float = float("nan")  # one L2 flush, for reference
    nodes_per_call: float | None = None  # graph nodes one call added to the timed stream (None: not counted)
    kernels_per_call: float | None = None  # of those, kernel launches (None: not counted)

    def tflops(self, flop_count: int) -> float:
        return flop_count / self.median_us / 1e6 if self.median_us > 0 else float("nan")

    def gbps(self, byte_count: int) -> float:
        return byte_count / self.median_us / 1e3 if self.median_us > 0 else float("nan")


# ---------------------------------------------------------------------------------------------- driver

def palindrome(items, rounds: int):
    """``items`` in order, then reversed, then in order, ... ``rounds`` times over: the order every bench times its
    contenders in, so that the clock's drift with heat is shared out between them rather than charged to one."""
    items = list(items)
    for round_index in range(rounds):
        yield from (items if round_index % 2 == 0 else items[::-1])


def paired_speeds(times: dict[str, list], reference: str) -> dict[str, dict]:
    """Every other entry's speed against ``reference``, round by round: ``times[name][i]`` is its time in round i of
    a :func:`palindrome`, so the ratio reference / name compares two kernels timed minutes apart at most, in one
    thermal state. Returns ``{name: {"median", "low", "high", "rounds"}}`` over the rounds both have (``None`` marks
    a round that failed). A best-of per contender compares each one's luckiest moment instead: one config under
    two names, best of three rounds, differed by up to 4% on an H200 (``results/sweep_aa_warmup0.json``)."""
    speeds = {}
    for name, own in times.items():
        if name == reference:
            continue
        ratios = sorted(r / t for r, t in zip(times[reference], own) if r is not None and t is not None)
        if ratios:
            speeds[name] = {"median": statistics.median(ratios), "low": ratios[0], "high": ratios[-1],
                            "rounds": len(ratios)}
    return speeds


def _driver():
    from cuda.bindings import driver
    return driver


def _check(result):
    """cuda.bindings returns (err, *values): raise on error, return the values (one, a tuple, or None)."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"CUDA driver error {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _current_device() -> int:
    """The device of the current context; with none current, device 0's primary context is made current (the one
    Numba, torch and cuda.core all use) and 0 returned."""
    driver = _driver()
    _check(driver.cuInit(0))
    if int(_check(driver.cuCtxGetCurrent())) == 0:
        _check(driver.cuCtxSetCurrent(_check(driver.cuDevicePrimaryCtxRetain(_check(driver.cuDeviceGet(0))))))
        return 0
    return int(_check(driver.cuCtxGetDevice()))


def _ensure_primary_context(device: int | None = None) -> int:
    """Make ``device``'s primary context current (default: keep the current one, or device 0's if none); returns
    the device. A benchmark is one device's: the timer's stream, events and graphs all live in its context."""
    current = _current_device()
    if device is None or device == current:
        return current
    driver = _driver()
    _check(driver.cuCtxSetCurrent(_check(driver.cuDevicePrimaryCtxRetain(_check(driver.cuDeviceGet(device))))))
    return device


_timing_streams: dict[int, int] = {}  # device -> its timing stream
_flush_buffers: dict[tuple[int, int], int] = {}  # (device, bytes) -> a buffer the flush writes


def timing_stream(device: int | None = None) -> int:
    """One non-blocking stream per device reused by every measurement (torch caches a cuBLAS workspace per
    stream); makes that device's context current (default: the current device)."""
    device = _ensure_primary_context(device)
    if device not in _timing_streams:
        driver = _driver()
        _timing_streams[device] = int(_check(driver.cuStreamCreate(int(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))))
    return _timing_streams[device]


def _flush_buffer(flush_bytes: int, device: int = 0) -> int:
    if (device, flush_bytes) not in _flush_buffers:
        buffer = int(_check(_driver().cuMemAlloc(flush_bytes)))
        _check(_driver().cuMemsetD32(buffer, 0, flush_bytes // 4))  # the read pass reads zeros, writes nothing
        _flush_buffers[device, flush_bytes] = buffer
    return _flush_buffers[device, flush_bytes]


def check_flush(flush: str) -> str:
    from gemm.testing.l2_flush import FLUSHES
    if flush not in FLUSHES:
        raise ValueError(f"flush must be one of {', '.join(FLUSHES)}, got {flush!r}")
    return flush


def _enqueue_flush(buffer: int, flush_bytes: int, stream: int, flush: str = "memset", device: int = 0) -> None:
    if flush == "clean":
        from gemm.testing.l2_flush import enqueue_read_pass
        enqueue_read_pass(buffer, flush_bytes, stream, device)
        # A memset node (4 bytes) between the read pass and the call: a call launched with programmatic
        # dependent launch would otherwise start its CTAs during the read pass's last wave, and the timer would
        # charge the call for the flush it slowed; after a memset it waits, as after the memset flush.
        _check(_driver().cuMemsetD32Async(buffer, 0, 1, stream))
    else:
        _check(_driver().cuMemsetD32Async(buffer, 0, flush_bytes // 4, stream))


def _elapsed_ms(stream: int, enqueue: Callable[[], None]) -> float:
    driver = _driver()
    start = _check(driver.cuEventCreate(int(driver.CUevent_flags.CU_EVENT_DEFAULT)))
    end = _check(driver.cuEventCreate(int(driver.CUevent_flags.CU_EVENT_DEFAULT)))
    try:
        _check(driver.cuEventRecord(start, stream))
        enqueue()
        _check(driver.cuEventRecord(end, stream))
        _check(driver.cuEventSynchronize(end))
        return float(_check(driver.cuEventElapsedTime(start, end)))
    finally:
        driver.cuEventDestroy(start)
        driver.cuEventDestroy(end)


def _node_counts(graph) -> tuple[int | None, int | None]:
    """(all nodes, kernel nodes) of a captured graph; None for a count the driver could not give."""
    driver = _driver()
    err, _, count = driver.cuGraphGetNodes(graph, 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        return None, None
    if not count:
        return 0, 0
    err, nodes, count = driver.cuGraphGetNodes(graph, count)
    if err != driver.CUresult.CUDA_SUCCESS:
        return None, None
    kernels = 0
    for node in nodes[:count]:
        err, node_type = driver.cuGraphNodeGetType(node)
        if err != driver.CUresult.CUDA_SUCCESS:
            return int(count), None
        kernels += node_type == driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    return int(count), kernels


def _per_call(counts: list, calls: int, index: int) -> float | None:
    """What one call added to the graph: counts[0] (the graph with the calls) less counts[1] (without them, when
    captured), divided by ``calls``; None if a count is missing. ``index``: 0 for all nodes, 1 for kernel nodes."""
    values = [count[index] for count in counts]
    if None in values:
        return None
    return (values[0] - sum(values[1:])) / calls


def _capture(stream: int, enqueue: Callable[[], None], counts: list | None = None):
    """Record what ``enqueue`` puts on ``stream`` into an instantiated graph (its (nodes, kernel nodes) appended to
    ``counts``: work a call put on another stream is in no node, and runs untimed).

    Relaxed mode: the libraries we time (Numba, torch, cuda.core) may make driver calls that the stricter
    modes reject during a capture, such as lazy module loading; what they enqueue still lands in the graph.
    """
    driver = _driver()
    _check(driver.cuStreamBeginCapture(stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
    try:
        enqueue()
    except BaseException:
        err, graph = driver.cuStreamEndCapture(stream)  # leave the stream usable before re-raising
        if err == driver.CUresult.CUDA_SUCCESS and int(graph):
            driver.cuGraphDestroy(graph)
        raise
    try:
        graph = _check(driver.cuStreamEndCapture(stream))
    except RuntimeError as error:
        raise RuntimeError(f"graph capture failed ({error}): the launch must not allocate, copy to/from the "
                           "host or synchronize; run it once before timing") from error
    try:
        if counts is not None:
            counts.append(_node_counts(graph))
        return _check(driver.cuGraphInstantiate(graph, 0))
    finally:
        driver.cuGraphDestroy(graph)


def choose_pairs(call_seconds: float, flush_seconds: float) -> int:
    """How many (flush; call) pairs make one replay last about TARGET_REPLAY_SECONDS, within [3, 50]."""
    per_pair = max(call_seconds + flush_seconds, 1e-7)
    return max(MIN_PAIRS, min(MAX_PAIRS, round(TARGET_REPLAY_SECONDS / per_pair)))


def bench_kernel(launch: Callable[[int], None], *, flush_bytes: int = FLUSH_BYTES, pairs: int | None = None,
                 reps: int = 5, before_replay: Callable[[], None] | None = None, device: int | None = None,
                 flush: str = "memset") -> Timing:
    """Kernel time of ``launch(stream_handle)`` (see the module docstring); median and min over ``reps``.
    ``flush``: "memset" (L2 left dirty) or "clean" (a read pass; L2 left clean), :mod:`gemm.testing.l2_flush`.

    ``before_replay()`` runs once, after both graphs are captured and before the first replay: a grader poisons the
    output there, so what it reads afterwards was written by the replays themselves, not by a call outside them."""
    check_flush(flush)
    driver = _driver()
    stream = timing_stream(device)  # ``device``'s (default: the current one's); its context is current from here
    device = _current_device()
    buffer = _flush_buffer(flush_bytes, device)

    def enqueue_flush():
        _enqueue_flush(buffer, flush_bytes, stream, flush, device)

    launch(stream)  # compilation, first-touch allocations and caches happen here, never inside the capture
    _check(driver.cuStreamSynchronize(stream))
    call_ms = _elapsed_ms(stream, lambda: launch(stream))
    flush_ms = _elapsed_ms(stream, enqueue_flush)
    if pairs is None:
        pairs = choose_pairs(call_ms / 1e3, flush_ms / 1e3)

    def pairs_of_flush_and_call():
        for _ in range(pairs):
            enqueue_flush()
            launch(stream)

    def flushes_only():
        for _ in range(pairs):
            enqueue_flush()

    counts: list = []
    with_calls = _capture(stream, pairs_of_flush_and_call, counts)
    flushes = _capture(stream, flushes_only, counts)
    try:
        if before_replay is not None:
            before_replay()
        for graph in (with_calls, flushes):  # warm: uploads the graph, settles clocks
            _elapsed_ms(stream, lambda g=graph: _check(driver.cuGraphLaunch(g, stream)))
        samples, flush_samples = [], []
        for _ in range(reps):  # interleaved, so slow drifts (clocks, temperature) hit both alike
            total_ms = _elapsed_ms(stream, lambda: _check(driver.cuGraphLaunch(with_calls, stream)))
            flush_total_ms = _elapsed_ms(stream, lambda: _check(driver.cuGraphLaunch(flushes, stream)))
            samples.append((total_ms - flush_total_ms) * 1e3 / pairs)
            flush_samples.append(flush_total_ms * 1e3 / pairs)
    finally:
        driver.cuGraphExecDestroy(with_calls)
        driver.cuGraphExecDestroy(flushes)
    return Timing(statistics.median(samples), min(samples), samples, pairs, statistics.median(flush_samples),
                  _per_call(counts, pairs, 0), _per_call(counts, pairs, 1))


def bench_back_to_back(launch: Callable[[int], None], *, calls: int = 50, reps: int = 5,
                       device: int | None = None) -> Timing:
    """Time per call of ``calls`` launches back to back in one CUDA graph, no flush between them: what a chain of
    small dependent GEMMs (a decode step's layers) sees, launch gaps and each kernel's ramp-up and tail included.
    This is the measure for programmatic dependent launch, which overlaps one call's prologue with the previous
    call's tail; operands stay in L2 after the first call, so it is not a bandwidth figure."""
    driver = _driver()
    stream = timing_stream(device)
    launch(stream)
    _check(driver.cuStreamSynchronize(stream))
    counts: list = []
    graph = _capture(stream, lambda: [launch(stream) for _ in range(calls)], counts)
    try:
        _elapsed_ms(stream, lambda: _check(driver.cuGraphLaunch(graph, stream)))  # upload, settle clocks
        samples = [_elapsed_ms(stream, lambda: _check(driver.cuGraphLaunch(graph, stream))) * 1e3 / calls
                   for _ in range(reps)]
    finally:
        driver.cuGraphExecDestroy(graph)
    return Timing(statistics.median(samples), min(samples), samples, calls,
                  nodes_per_call=_per_call(counts, calls, 0), kernels_per_call=_per_call(counts, calls, 1))


# ------------------------------------------------------------------------------------- DeepGEMM's timers

def torch_launch(fn: Callable[[], None]) -> Callable[[int], None]:
    """``fn()``, torch work enqueued on torch's current stream, as a ``launch(stream)`` for the timers above: each
    call runs with ``stream`` as torch's current stream.

    What ``fn`` allocates (a scale conversion does) comes from torch's caching allocator as usual: the first call,
    outside any capture, leaves the block cached, each captured call takes it and frees it again, and the replays
    follow the capture with no torch allocation between them, so nothing else holds the block they write."""
    import torch
    streams: dict[int, object] = {}

    def launch(stream: int) -> None:
        if stream not in streams:
            streams[stream] = torch.cuda.ExternalStream(stream)
        with torch.cuda.stream(streams[stream]):
            fn()

    return launch


def _torch_with_cuda(caller: str):
    try:
        import torch
    except ImportError as error:
        raise RuntimeError(f"{caller} times torch work on a CUDA GPU: torch is not installed") from error
    if not torch.cuda.is_available():
        raise RuntimeError(f"{caller} needs a CUDA GPU: torch.cuda.is_available() is False")
    return torch


@contextlib.contextmanager
def _output_silenced(silenced: bool):
    """stdout and stderr to /dev/null at the file descriptors (kineto and CUDA libraries print from C++), with
    sys.stdout and sys.stderr."""
    if not silenced:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        with open(os.devnull, "w") as null:
            for fd in saved:
                os.dup2(null.fileno(), fd)
            with contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
                yield
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def bench_kineto(fn: Callable[[], None], kernel_names, num_tests: int = 30, suppress_kineto_output: bool = False,
                 trace_path: str | None = None, barrier_comm_profiling: bool = False, flush_l2: bool = True,
                 with_multiple_kernels: bool = False):
    """DeepGEMM's ``bench_kineto`` on this module's timer: seconds per call of ``fn()`` (torch work on torch's current
    stream, CUDA-graph capturable), as a float, or a tuple of it, one per name, when ``kernel_names`` is a tuple.

    DeepGEMM averages the profiled durations of the kernels whose names contain ``kernel_names``. Here ``fn`` is
    captured in a CUDA graph and the whole call is timed, everything it enqueues included: ``num_tests`` (L2 flush;
    call) pairs less the flushes (:func:`bench_kernel`), or with ``flush_l2=False`` ``num_tests`` calls back to back
    (:func:`bench_back_to_back`). ``kernel_names`` (a str or a tuple of str) therefore selects the return shape only.
    ``with_multiple_kernels=True``: DeepGEMM's mean per kernel launch, here the call's time divided by the kernel
    nodes one call adds to the graph (helper kernels such as a scale transpose count as launches, where DeepGEMM
    counts only the named kernel; the time per call if the driver cannot list the nodes). ``trace_path``: ``num_tests`` more calls under torch's profiler, written there as a
    Chrome trace. ``suppress_kineto_output``: stdout and stderr silenced from the second call on (the first, where
    kernels are built, prints as DeepGEMM's does). ``barrier_comm_profiling`` (DeepGEMM evens out several ranks'
    launch overhead before timing communication) is not supported: ValueError.
    """
    torch = _torch_with_cuda("bench_kineto")
    is_tuple = isinstance(kernel_names, tuple)
    names = kernel_names if is_tuple else (kernel_names,)
    if not all(isinstance(name, str) for name in names) or not (is_tuple or isinstance(kernel_names, str)):
        raise TypeError(f"bench_kineto: kernel_names must be a str or a tuple of str, got {kernel_names!r}")
    if barrier_comm_profiling:
        raise ValueError("bench_kineto: barrier_comm_profiling is not supported (a graph replay of one rank's calls "
                         "times no launch overhead to even out, and no collective across ranks)")
    fn()
    torch.cuda.synchronize()  # the timing stream does not wait on torch's streams, where the operands were made
    device = torch.cuda.current_device()
    with _output_silenced(suppress_kineto_output):
        launch = torch_launch(fn)
        timing = (bench_kernel(launch, pairs=num_tests, device=device) if flush_l2
                  else bench_back_to_back(launch, calls=num_tests, device=device))
        if trace_path is not None:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
                for _ in range(num_tests):
                    fn()
                torch.cuda.synchronize()
            profiler.export_chrome_trace(trace_path)
    seconds = timing.median_us * 1e-6
    if timing.kernels_per_call == 0:
        raise RuntimeError("bench_kineto: fn enqueued no kernel on torch's current stream; there is nothing to time")
    if with_multiple_kernels and timing.kernels_per_call is not None:
        seconds /= timing.kernels_per_call
    return tuple(seconds for _ in names) if is_tuple else seconds


def bench(fn: Callable[[], None], num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False) -> float:
    """DeepGEMM's ``bench``: milliseconds per call of ``fn()`` (torch work on torch's current stream, CUDA-graph
    capturable) over ``num_tests`` calls back to back, L2 not flushed between them, after ``num_warmups`` calls
    (:func:`bench_back_to_back`). DeepGEMM times the calls from the host and, with ``high_precision``, first queues a
    large matmul so that the launches run ahead of the GPU; a graph replay has no host launches in it, so
    ``high_precision`` changes nothing here."""
    torch = _torch_with_cuda("bench")
    for _ in range(num_warmups):
        fn()
    torch.cuda.synchronize()  # the timing stream does not wait on torch's streams, where the operands were made
    timing = bench_back_to_back(torch_launch(fn), calls=num_tests, device=torch.cuda.current_device())
    return timing.median_us / 1e3
