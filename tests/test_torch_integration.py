"""fp8_gemm_nt as PyTorch code uses it (GPU): FP32 output, D = C + A*B, the host hot path, torch.compile
(fullgraph) through the custom op, CUDA-graph capture and replay."""
import numpy as np
import pytest

import gemm
from gemm.fp8 import calc_diff
from gemm.testing.problems import reference_gemm

pytestmark = pytest.mark.gpu
RAGGED = [(1, 2112, 512), (70, 384, 256), (130, 2112, 512), (200, 7168, 2048), (4096, 4096, 512)]


def _torch():
    return pytest.importorskip("torch")


def _problem(m, n, k, rng):
    """The library's own casts (M-major sa), fresh random data, and the float64 reference on the host."""
    torch = _torch()
    x = torch.from_numpy(rng.standard_normal((m, k), dtype=np.float32)).cuda()
    w = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32)).cuda()
    a, sa = gemm.per_token_cast_to_fp8(x, mn_major=True)
    b, sb = gemm.per_block_cast_to_fp8(w)
    host = lambda t: t.cpu().numpy()  # noqa: E731
    want = reference_gemm(host(a.view(torch.uint8)), host(sa), host(b.view(torch.uint8)), host(sb))
    return (a, sa, b, sb), want


def _copy_into(targets, sources):
    """New values at the old addresses (FP8 through uint8 views: copy_ between float8 tensors is not everywhere)."""
    torch = _torch()
    for target, source in zip(targets, sources):
        if target.dtype == torch.float8_e4m3fn:
            target, source = target.view(torch.uint8), source.view(torch.uint8)
        target.copy_(source)


def _nan(m, n, dtype):
    torch = _torch()
    return torch.full((m, n), float("nan"), dtype=dtype, device="cuda")


@pytest.mark.parametrize("m, n, k", RAGGED)
def test_fp32_output_is_written_everywhere_and_more_accurate_than_bf16(m, n, k, rng):
    torch = _torch()
    (a, sa, b, sb), want = _problem(m, n, k, rng)
    out32, out16 = _nan(m, n, torch.float32), _nan(m, n, torch.bfloat16)
    gemm.fp8_gemm_nt((a, sa), (b, sb), out32)
    gemm.fp8_gemm_nt((a, sa), (b, sb), out16)
    got32, got16 = out32.cpu().numpy(), out16.float().cpu().numpy()
    assert not np.isnan(got32).any(), f"{np.isnan(got32).sum()} elements never written"
    diff32, diff16 = calc_diff(got32, want), calc_diff(got16, want)
    print(f"{m}x{n}x{k}: diff FP32 out {diff32:.2e}, BF16 out {diff16:.2e}")
    assert diff32 < 1e-3 and diff32 < diff16 / 10  # no BF16 rounding: the FP32 promotion's precision survives


@pytest.mark.parametrize("in_place", [False, True], ids=["c separate", "c is out"])
@pytest.mark.parametrize("m, n, k", RAGGED[:4])
def test_c_accumulation(m, n, k, in_place, rng):
    torch = _torch()
    (a, sa, b, sb), want = _problem(m, n, k, rng)
    c = torch.from_numpy(rng.standard_normal((m, n), dtype=np.float32)).cuda() * 10
    c_host = c.cpu().numpy().astype(np.float64)
    if in_place:
        out = c
    else:
        out = _nan(m, n, torch.float32)
    gemm.fp8_gemm_nt((a, sa), (b, sb), out, c=c)
    got = out.cpu().numpy()
    assert not np.isnan(got).any()
    assert calc_diff(got, want + c_host) < 1e-5
    if not in_place:
        np.testing.assert_array_equal(c.cpu().numpy(), c_host.astype(np.float32))  # c is read, never written


def test_hot_path_reuses_the_prepared_launch_and_stays_correct(rng, monkeypatch):
    """Second call with the same tensors: no checks, no config, no maps (a counting _run proves it); new values
    at the same addresses are still read (the kernel reads memory, the plan holds only addresses)."""
    torch = _torch()
    from gemm import dispatch
    (a, sa, b, sb), want = _problem(130, 2112, 512, rng)
    out = _nan(130, 2112, torch.bfloat16)
    gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    calls = []
    real_run = dispatch.run_dense
    monkeypatch.setattr(dispatch, "run_dense", lambda *args, **kw: calls.append(1) or real_run(*args, **kw))
    (a2, sa2, b2, sb2), want2 = _problem(130, 2112, 512, rng)
    _copy_into((a, sa, b, sb), (a2, sa2, b2, sb2))
    out.fill_(float("nan"))
    gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    torch.cuda.synchronize()
    assert calls == [], "the second call with the same signature went through the slow path"
    assert calc_diff(out.float().cpu().numpy(), want2) < 1e-3
    gemm.set_num_sms(64)  # a new SM limit is a new signature
    try:
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
        assert calls == [1]
    finally:
        gemm.set_num_sms(0)


def test_torch_compile_fullgraph(rng):
    torch = _torch()
    (a, sa, b, sb), want = _problem(200, 2112, 512, rng)

    def linear(a, sa, b, sb):
        out = torch.empty((a.shape[0], b.shape[0]), dtype=torch.bfloat16, device=a.device)
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
        return out.float() * 2

    compiled = torch.compile(linear, fullgraph=True)
    got = compiled(a, sa, b, sb)
    torch.cuda.synchronize()
    assert calc_diff(got.cpu().numpy() / 2, want) < 1e-3
    assert torch.equal(got, linear(a, sa, b, sb))  # the op gives the eager result bit for bit


def test_custom_op_in_place_accumulation_under_compile(rng):
    torch = _torch()
    (a, sa, b, sb), want = _problem(70, 384, 256, rng)
    c = torch.ones((70, 384), dtype=torch.float32, device="cuda")

    @torch.compile(fullgraph=True)
    def accumulate(a, sa, b, sb, d):
        gemm.fp8_gemm_nt((a, sa), (b, sb), d, c=d)
        return d + 0

    got = accumulate(a, sa, b, sb, c)
    torch.cuda.synchronize()
    assert calc_diff(got.cpu().numpy(), want + 1) < 1e-5


def test_cuda_graph_capture_and_replay_with_new_inputs(rng):
    torch = _torch()
    m, n, k = 256, 2112, 512
    (a, sa, b, sb), _ = _problem(m, n, k, rng)
    out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    out32 = torch.zeros((m, n), dtype=torch.float32, device="cuda")
    gemm.fp8_gemm_nt((a, sa), (b, sb), out)  # compile and load outside the capture
    gemm.fp8_gemm_nt((a, sa), (b, sb), out32, c=out32)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm.fp8_gemm_nt((a, sa), (b, sb), out)
        gemm.fp8_gemm_nt((a, sa), (b, sb), out32, c=out32)
    for _ in range(2):
        (a2, sa2, b2, sb2), want = _problem(m, n, k, rng)
        _copy_into((a, sa, b, sb), (a2, sa2, b2, sb2))
        out.fill_(float("nan"))
        out32.fill_(3.0)
        graph.replay()
        torch.cuda.synchronize()
        assert calc_diff(out.float().cpu().numpy(), want) < 1e-3
        assert calc_diff(out32.cpu().numpy(), want + 3) < 1e-5
