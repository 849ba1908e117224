"""Calls follow their tensors' device, on real GPUs (tests/test_multi_device.py has the same rules on a fake driver).

``gpu``: one Hopper GPU is enough: a foreign (non-primary) context current on the calling thread, a thread with no
context at all, two threads at once, graph capture on a side stream, facts read off the device.
``multigpu``: two Hopper GPUs (skipped with fewer; run by ``bash tools/gpu_run.sh multigpu`` on a 2-GPU machine):
tensors on ``cuda:1`` while ``cuda:0`` is current and the reverse (decode's swapped and split kernels among them),
dense + grouped (the masked decode kernel too) + a CUDA graph on ``cuda:1``, the torch custom op under compile there,
two threads driving two GPUs at once, and the errors for arguments or a stream of two devices.
"""
import os
import sys
import threading

import numpy as np
import pytest

import gemm
from gemm.fp8 import E4M3, calc_diff
from gemm.testing.problems import reference_gemm
from ptx import device as devices

sys.path.insert(0, os.path.dirname(__file__))
from test_grouped import check_contiguous, check_masked, contiguous_problem, masked_problem  # noqa: E402

SHAPES = [(1, 2112, 512), (16, 2112, 7168), (130, 384, 256), (4096, 4096, 512),  # swapped, split over three,
          (64, 2112, 7168), (128, 32768, 512),  # ..., K split over pairs, a short-K ring at compile-time offsets,
          (3001, 3968, 4224)]  # even waves (fewer CTAs than the device's SMs, counted from its own facts)


def _torch():
    return pytest.importorskip("torch")


def problem_on(device: int, m: int, n: int, k: int, rng, out_dtype=None):
    """Fresh random FP8 operands cast on ``cuda:device`` by the library's casts, a NaN-poisoned out there, and the
    float64 reference of the dequantized inputs."""
    torch = _torch()
    where = f"cuda:{device}"
    x = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32)).to(where)
    w = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32)).to(where)
    a, sa = gemm.per_token_cast_to_fp8(x, mn_major=True)
    b, sb = gemm.per_block_cast_to_fp8(w)
    assert {t.device for t in (a, sa, b, sb)} == {torch.device(where)}, "the casts must stay on the input's device"
    out = torch.full((m, n), float("nan"), dtype=out_dtype or torch.bfloat16, device=where)
    host = lambda t: t.cpu().numpy()  # noqa: E731
    want = reference_gemm(host(a.view(torch.uint8)), host(sa), host(b.view(torch.uint8)), host(sb))
    return (a, sa, b, sb), out, want


def to_device(x, device: int):
    """A host array (e4m3 through its bytes) as a torch tensor on ``cuda:device``."""
    torch = _torch()
    x = np.ascontiguousarray(x)
    if x.dtype == E4M3:
        return torch.from_numpy(x.view(np.uint8)).to(f"cuda:{device}").view(torch.float8_e4m3fn)
    return torch.from_numpy(x).to(f"cuda:{device}")


def refill(operands, device: int, rng):
    """New random operands copied into ``operands`` at their addresses (what a captured graph replays on); returns
    the new float64 reference. FP8 goes through uint8 views: copy_ between float8 tensors is not everywhere."""
    torch = _torch()
    a = operands[0]
    fresh, _, want = problem_on(device, a.shape[0], operands[2].shape[0], a.shape[1], rng)
    for target, source in zip(operands, fresh):
        if target.dtype == torch.float8_e4m3fn:
            target, source = target.view(torch.uint8), source.view(torch.uint8)
        target.copy_(source)
    return want


def check(out, want, limit=1e-3):
    got = out.float().cpu().numpy()
    assert not np.isnan(got).any(), f"{np.isnan(got).sum()} elements never written"
    diff = calc_diff(got, want)
    assert diff < limit, f"diff {diff:.3g}"
    return diff


def current_context() -> int:
    return int(devices.check(devices.driver().cuCtxGetCurrent(), "cuCtxGetCurrent"))


# ----------------------------------------------------------------------------------------- one GPU
@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_a_foreign_context_on_the_calling_thread_is_given_back(m, n, k, rng):
    """A thread that made its own (non-primary) context current, as a CUDA C library may: the call runs in the
    device's primary context (where torch's memory and streams live) and leaves the thread's context current.

    torch's own work (the NaN poison, the synchronize) runs with the primary context current: with another context
    current, torch's runtime calls would use that context, whose null stream does not order with the primary's, so
    the poison could land after the GEMM (it did, depending on what ran before)."""
    torch = _torch()
    (a, sa, b, sb), out, want = problem_on(0, m, n, k, rng)
    cuda = devices.driver()
    own = devices.check(cuda.cuCtxCreate(None, 0, devices.check(cuda.cuDeviceGet(0), "cuDeviceGet")), "cuCtxCreate")
    devices.check(cuda.cuCtxPopCurrent(), "cuCtxPopCurrent")  # created current; pushed again around each call
    try:
        for _ in range(2):  # the first call prepares, the second takes the hot path
            out.fill_(float("nan"))
            torch.cuda.synchronize(0)
            devices.check(cuda.cuCtxPushCurrent(own), "cuCtxPushCurrent")
            try:
                assert current_context() == int(own)
                gemm.fp8_gemm_nt((a, sa), (b, sb), out)
                assert current_context() == int(own), "the caller's context must be current again"
            finally:
                devices.check(cuda.cuCtxPopCurrent(), "cuCtxPopCurrent")
            torch.cuda.synchronize(0)
            check(out, want)
    finally:
        devices.check(cuda.cuCtxDestroy(own), "cuCtxDestroy")


@pytest.mark.gpu
def test_a_thread_with_no_context_keeps_none(rng):
    """A fresh thread has no current context; a call (on the legacy stream: no torch call binds one first) runs in
    the device's primary context and leaves the thread as it found it."""
    torch = _torch()
    (a, sa, b, sb), out, want = problem_on(0, 256, 2112, 512, rng)
    gemm.fp8_gemm_nt((a, sa), (b, sb), out, stream=0)  # build and load here; the thread below only launches
    torch.cuda.synchronize(0)
    seen = {}

    def work():
        seen["before"] = current_context()
        gemm.fp8_gemm_nt((a, sa), (b, sb), out, stream=0)
        seen["after"] = current_context()

    out.fill_(float("nan"))
    torch.cuda.synchronize(0)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    torch.cuda.synchronize(0)
    assert seen == {"before": 0, "after": 0}, seen
    check(out, want)


@pytest.mark.gpu
def test_two_threads_at_once(rng):
    """Two threads call at once, each on its own tensors and stream; neither call changes its thread's context."""
    torch = _torch()
    problems = [problem_on(0, 256, 2112, 512, rng) for _ in range(2)]
    results, errors = {}, []
    start = threading.Barrier(2, timeout=30)

    def work(index):
        try:
            (a, sa, b, sb), out, want = problems[index]
            stream = torch.cuda.Stream(device=0)
            with torch.cuda.stream(stream):
                before = current_context()  # what torch left current on this thread
                start.wait()
                for _ in range(50):
                    gemm.fp8_gemm_nt((a, sa), (b, sb), out)
                after = current_context()
            stream.synchronize()
            results[index] = (before, after, check(out, want))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert sorted(results) == [0, 1] and all(before == after for before, after, _ in results.values()), results


@pytest.mark.gpu
def test_graph_capture_on_a_side_stream(rng):
    torch = _torch()
    (a, sa, b, sb), out, _ = problem_on(0, 200, 2112, 512, rng)
    side = torch.cuda.Stream(device=0)
    gemm.fp8_gemm_nt((a, sa), (b, sb), out)  # build and load outside the capture
    torch.cuda.synchronize(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    for _ in range(2):
        want = refill((a, sa, b, sb), 0, rng)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(0)
        check(out, want)


@pytest.mark.gpu
def test_facts_come_from_the_device():
    torch = _torch()
    from gemm.heuristics import device_facts
    for device in range(devices.device_count()):
        facts, props = device_facts(device), torch.cuda.get_device_properties(device)
        assert facts.sm_count == props.multi_processor_count
        assert facts.name == props.name
        assert facts.l2_bytes == props.L2_cache_size
        print(f"cuda:{device}: {facts}")


# ----------------------------------------------------------------------------------------- two GPUs
@pytest.mark.multigpu
@pytest.mark.parametrize("current, target", [(0, 1), (1, 0)])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_tensors_on_one_gpu_while_another_is_current(current, target, m, n, k, rng):
    torch = _torch()
    torch.cuda.set_device(current)
    (a, sa, b, sb), out, want = problem_on(target, m, n, k, rng)
    (a32, sa32, b32, sb32), out32, _ = problem_on(target, m, n, k, rng, out_dtype=torch.float32)
    before = current_context()
    for _ in range(2):  # prepared, then the hot path
        out.fill_(float("nan"))
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    if n % 4 == 0:
        out32.zero_()
        gemm.fp8_gemm_nt((a, sa), (b, sb), out32, c=out32)  # D += A*B on the target's device
    assert current_context() == before and torch.cuda.current_device() == current
    torch.cuda.synchronize(target)
    check(out, want)
    if n % 4 == 0:
        check(out32, want, limit=1e-5)


@pytest.mark.multigpu
def test_grouped_on_the_second_gpu(rng):
    torch = _torch()
    torch.cuda.set_device(0)
    on = lambda x: to_device(x, 1)  # noqa: E731
    a, sa, b, sb, m_indices = contiguous_problem((100, 0, 300), 2112, 512, rng, padding_blocks=1)
    out = torch.full((len(m_indices), 2112), float("nan"), dtype=torch.bfloat16, device="cuda:1")
    gemm.m_grouped_fp8_gemm_nt_contiguous((on(a), gemm.get_mn_major_tma_aligned_tensor(on(sa))), (on(b), on(sb)),
                                          out, on(m_indices))
    torch.cuda.synchronize(1)
    from gemm.heuristics import choose_grouped_config, device_facts
    block_m = choose_grouped_config("contiguous", len(m_indices), 2112, 512, 3, device_facts(1)).block_m
    check_contiguous(out.float().cpu().numpy(), a, sa, b, sb, m_indices, block_m)

    a, sa, b, sb = masked_problem(3, 128, 2112, 512, rng)
    counts = np.array([5, 0, 128], np.int32)
    out = torch.full((3, 128, 2112), float("nan"), dtype=torch.bfloat16, device="cuda:1")
    gemm.m_grouped_fp8_gemm_nt_masked((on(a), gemm.grouped.masked_sa_to_mn_major(on(sa))), (on(b), on(sb)), out,
                                      on(counts), 64)
    torch.cuda.synchronize(1)
    check_masked(out.float().cpu().numpy(), a, sa, b, sb, counts)

    counts = np.array([5, 0, 16], np.int32)  # expected_m 16: the swapped masked kernel
    out = torch.full((3, 128, 2112), float("nan"), dtype=torch.bfloat16, device="cuda:1")
    gemm.m_grouped_fp8_gemm_nt_masked((on(a), gemm.grouped.masked_sa_to_mn_major(on(sa))), (on(b), on(sb)), out,
                                      on(counts), 16)
    torch.cuda.synchronize(1)
    check_masked(out.float().cpu().numpy(), a, sa, b, sb, counts)


@pytest.mark.multigpu
def test_cuda_graph_and_compile_on_the_second_gpu(rng):
    torch = _torch()
    torch.cuda.set_device(0)
    (a, sa, b, sb), out, _ = problem_on(1, 256, 2112, 512, rng)
    gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    torch.cuda.synchronize(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(1), torch.cuda.graph(graph):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    want = refill((a, sa, b, sb), 1, rng)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize(1)
    check(out, want)

    @torch.compile(fullgraph=True)
    def linear(a, sa, b, sb, out):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
        return out + 0

    out.fill_(float("nan"))
    check(linear(a, sa, b, sb, out), want)


@pytest.mark.multigpu
def test_two_threads_drive_two_gpus_at_once(rng):
    torch = _torch()
    problems = {device: problem_on(device, 4096, 4096, 7168, rng) for device in (0, 1)}
    errors, diffs = [], {}
    start = threading.Barrier(2, timeout=60)

    def work(device):
        try:
            torch.cuda.set_device(1 - device)  # each thread has the *other* GPU current
            (a, sa, b, sb), out, want = problems[device]
            start.wait()
            for _ in range(20):
                gemm.fp8_gemm_nt((a, sa), (b, sb), out)
            torch.cuda.synchronize(device)
            assert torch.cuda.current_device() == 1 - device
            diffs[device] = check(out, want)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(device,)) for device in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    assert sorted(diffs) == [0, 1]


@pytest.mark.multigpu
def test_arguments_or_a_stream_on_two_gpus_are_named(rng):
    torch = _torch()
    (a, sa, b, sb), out, _ = problem_on(0, 128, 256, 256, rng)
    with pytest.raises(devices.DeviceMismatchError, match=r"a on cuda:0, sa on cuda:0, b on cuda:1, sb on cuda:0"):
        gemm.fp8_gemm_nt((a, sa), (b.to("cuda:1"), sb), out)
    other = torch.cuda.Stream(device=1)
    with pytest.raises(devices.DeviceMismatchError, match="stream: the stream belongs to cuda:1, but the arguments "
                                                          "are on cuda:0"):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out, stream=other)
    with pytest.raises(devices.DeviceMismatchError, match="one CUDA device"):
        gemm.m_grouped_fp8_gemm_nt_masked((a[None], sa[None]), (b[None].to("cuda:1"), sb[None]), out[None],
                                          torch.ones(1, dtype=torch.int32, device="cuda:0"), 64)
