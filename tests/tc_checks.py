"""Checks shared by the tensor-core stage tests (tests/test_stage04.py, test_stage05.py, test_stage06.py):
exact small-integer problems and the bit-exact check with a mismatch report that names the fragment geometry,
the NaN-poisoned GPU run, the sampled-rows reference check, the CUDA-graph replay check, and the assembly and
launch helpers stages 05 and 06 share."""
import numpy as np
import pytest

from gemm.fp8 import BF16, E4M3, align, bf16_to_float, calc_diff
from gemm.testing.problems import random_problem, reference_gemm

RAGGED_SHAPES = [(1, 2112, 512), (100, 2112, 512), (257, 2112, 512), (100, 2111, 256), (300, 136, 384)]
ASSEMBLY_SHAPES = [(4096, 4096, 7168), (4096, 7168, 16384), (64, 7168, 16384), (100, 2112, 512)]
BF16_NAN = 0x7FC0


# ------------------------------------------------------------------------------ exact small-integer checks
def small_integer_problem(m, n, k, rng):
    """Integers in [-4, 4] (exact in e4m3), scales 1/2, 1, 2: every partial and total is exact in FP32
    (multiples of 1/4 below 2^15), so the only rounding is the final BF16 one, as in the reference: D must
    match bit for bit. K need not be a multiple of 128: the last K block's scales cover its zero-filled rest."""
    kb = -(-k // 128)
    a = rng.integers(-4, 5, (m, k)).astype(np.float32).astype(E4M3)
    b = rng.integers(-4, 5, (n, k)).astype(np.float32).astype(E4M3)
    sa = np.exp2(rng.integers(-1, 2, (m, kb))).astype(np.float32)
    sb = np.exp2(rng.integers(-1, 2, (-(-n // 128), kb))).astype(np.float32)
    return a, sa, b, sb


def mma_sync_places(bad):
    """Where wrong outputs sit for stage 04's mma.m16n8k32 tiling (2 x 4 warps of 64 x 32)."""
    rows, cols = bad[:, 0], bad[:, 1]
    return (f"row%16 hit {np.unique(rows % 16).tolist()}, col%8 hit {np.unique(cols % 8).tolist()}, "
            f"warps (row//64, col//32) {sorted({(int(r) // 64 % 2, int(c) // 32 % 4) for r, c in bad[:200]})}")


def wgmma_places(bad):
    """Where wrong outputs sit for the wgmma m64nNk32 stages (warp w of the warpgroup holds rows 16w..16w+15)."""
    rows, cols = bad[:, 0], bad[:, 1]
    return (f"row%64 hit {np.unique(rows % 64).tolist()[:20]}, "
            f"col%8 hit {np.unique(cols % 8).tolist()}, (warp = row%64//16, col//8) "
            f"{sorted({(int(r) % 64 // 16, int(c) // 8) for r, c in bad[:200]})[:20]}")


def describe_mismatch(got, want, places=wgmma_places):
    bad = np.argwhere(~(got == want))
    return f"{len(bad)} of {got.size} wrong; first {bad[:5].tolist()}; {places(bad)}"


def assert_no_unwritten(got):
    assert not np.isnan(got).any(), f"unwritten outputs at {np.argwhere(np.isnan(got))[:5].tolist()}"


def assert_exact(got, problem, places=wgmma_places):
    want = reference_gemm(*problem).astype(np.float32).astype(BF16).astype(np.float32)
    assert_no_unwritten(got)
    assert np.array_equal(got, want), describe_mismatch(got, want, places)


# ------------------------------------------------------------------------------ layouts and runs
def sa_storage(sa, m):
    """The bytes of the M-major, M-padded-to-4 scale layout: physical (Kb, align(M, 4))."""
    storage = np.zeros((sa.shape[1], align(m, 4)), np.float32)
    storage[:, :m] = np.asarray(sa).T
    return storage


def run_on_gpu(module, a, sa, b, sb):
    """The ladder's device layout (Numba arrays, sa M-major padded to 4), D poisoned with NaN first."""
    from numba import cuda
    from gemm.testing.problems import device_problem
    problem = device_problem(a, sa, b, sb)
    problem.d.copy_to_device(np.full(problem.d.shape, BF16_NAN, np.uint16))
    module.gemm(problem.a, problem.sa, problem.b, problem.sb, problem.d)
    cuda.synchronize()
    return bf16_to_float(problem.d.copy_to_host())


def check_against_reference(got, a, sa, b, sb, rng):
    m = a.shape[0]
    assert_no_unwritten(got)
    rows = np.sort(rng.choice(m, size=min(m, 256), replace=False))
    diff = calc_diff(got[rows], reference_gemm(a[rows], sa[rows], b, sb))
    assert diff < 1e-3, f"diff {diff:.3g}"


def assert_graph_replay(module, rng, check_no_compile=False):
    """The second call, captured in a CUDA graph and replayed into a NaN-poisoned output, matches the
    reference; with check_no_compile, capturing it also compiled nothing (the first call did all of it)."""
    torch = pytest.importorskip("torch")
    import gemm
    from ptx import compile as compiler
    m, n, k = 256, 384, 512
    a, sa, b, sb = random_problem(m, n, k, rng)
    to = lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda()  # noqa: E731
    ta, tb = to(a.view(np.uint8)), to(b.view(np.uint8))
    tsa, tsb = gemm.get_mn_major_tma_aligned_tensor(to(np.ascontiguousarray(sa))), to(sb)
    out = torch.empty((m, n), dtype=torch.int16, device="cuda")
    module.gemm(ta, tsa, tb, tsb, out.view(torch.bfloat16))  # first call: compile, load (encode tensor maps)
    torch.cuda.synchronize()
    compiled = compiler.compile_count
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        module.gemm(ta, tsa, tb, tsb, out.view(torch.bfloat16), stream=torch.cuda.current_stream().cuda_stream)
    out.fill_(BF16_NAN)
    graph.replay()
    torch.cuda.synchronize()
    if check_no_compile:
        assert compiler.compile_count == compiled
    got = out.view(torch.bfloat16).float().cpu().numpy()
    assert not np.isnan(got).any()
    assert calc_diff(got, reference_gemm(a, sa, b, sb)) < 1e-3


# ------------------------------------------------------------------------------ assembly and launches (05, 06)
def assemble(module, m, n, k):
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble
    cubin = compile_ptx(module.generate(m, n, k))
    return cubin, disassemble(cubin)


def assert_clean_resources(cubin, kernel):
    res = cubin.resources[kernel]
    assert (res.spill_stores, res.spill_loads, res.stack_frame, res.local_bytes) == (0, 0, 0, 0), res
    assert res.registers <= 255


class RecordingKernel:
    """Stands in for ptx.runtime.Kernel on the CPU: records what gemm() would launch."""

    def __init__(self):
        self.launches = []

    def launch(self, grid, block, args, *, shared_bytes=0, cluster=None, stream=None):
        self.launches.append(dict(grid=grid, block=block, args=list(args), shared_bytes=shared_bytes, stream=stream))


def on_fake_device(x):
    """A host array posing as device 0's (a DeviceView): for CPU tests of checks and launch plumbing, which the
    validator would otherwise refuse as host memory (no mode relaxes that check)."""
    from ptx.arrays import DeviceView
    if not isinstance(x, np.ndarray):
        return x
    return DeviceView(x.ctypes.data, x.shape, tuple(s // x.itemsize for s in x.strides), x.dtype, 0, x)
