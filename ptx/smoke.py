"""GPU smoke test of the PTX runtime paths, end to end: prints PASS/FAIL per item and goes on after a failure.

    python -m ptx smoke              (each item in a process of its own; --inline: all in this one)

tests/test_ptx_toolchain.py runs the same items, one test each, on a Hopper GPU.

Items: compile (nvJitLink), plain launch, >48 KiB dynamic shared memory, a cluster of 2 reading its peer's
shared memory, a TMA tensor map passed by value (2-D box load with an mbarrier, ragged edge filled with
zeros; and a 128-byte swizzled box), pointers from Numba and torch (float8_e4m3fn, bfloat16) arrays, and a CUDA graph captured from a
stream and replayed. Each item runs in its own process (``--inline``: all in one), so a sticky CUDA
error cannot fail the items after it. Numba and torch are optional: without them their items say SKIP. Device memory is handled with the driver API directly so that an item
does not depend on Numba unless it tests Numba. Exit status: the number of failed items.
"""
from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
import time
import traceback

import numpy as np
from cuda.bindings import driver

from ptx.builder import PtxModule
from ptx.compile import compile_ptx
from ptx.runtime import ensure_context, load_kernel
from ptx.tensor_maps import tensor_map_2d

HEADER = ".version 8.5\n.target sm_90a\n.address_size 64\n"
# Written by hand, so each module states its kernels' parameters (what ptx.builder.module records by itself).
U32, U64, TENSOR_MAP = ("u32", 0), ("u64", 0), ("b8", 128)

# out[tid] = tid * 3 + value: the simplest launch.
PTX_FILL = PtxModule(HEADER + """
.visible .entry fill(.param .u64 out, .param .u32 value)
{
    .reg .b32 %r<6>; .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out]; ld.param.u32 %r1, [value];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.u32 %r2, %r2, %r3, %r4;
    mad.lo.u32 %r3, %r2, 3, %r1;
    mul.wide.u32 %rd2, %r2, 4; add.s64 %rd1, %rd1, %rd2;
    st.global.u32 [%rd1], %r3;
    ret;
}
""", {"fill": [U64, U32]})

# Each thread writes tid+1 into dynamic smem at byte offset `base + 4*tid`, then reads its neighbour's.
PTX_BIG_SMEM = PtxModule(HEADER + """
.extern .shared .align 16 .b8 dynamic_smem[];
.visible .entry big_smem(.param .u64 out, .param .u32 base)
{
    .reg .b32 %r<8>; .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out]; ld.param.u32 %r1, [base];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %tid.x; mov.u32 %r3, dynamic_smem;
    add.u32 %r3, %r3, %r1;
    shl.b32 %r4, %r2, 2; add.u32 %r5, %r3, %r4;
    add.u32 %r6, %r2, 1; st.shared.u32 [%r5], %r6;
    bar.sync 0;
    mov.u32 %r7, %ntid.x; add.u32 %r6, %r2, 1; rem.u32 %r6, %r6, %r7;
    shl.b32 %r6, %r6, 2; add.u32 %r6, %r3, %r6; ld.shared.u32 %r6, [%r6];
    mul.wide.u32 %rd2, %r2, 4; add.s64 %rd1, %rd1, %rd2;
    st.global.u32 [%rd1], %r6;
    ret;
}
""", {"big_smem": [U64, U32]})

# Cluster of 2: each CTA stores (rank+1)*100 in its smem, then reads the other CTA's value over DSMEM.
# out[block] = (my rank, cluster size, peer's value).
PTX_CLUSTER = PtxModule(HEADER + """
.visible .entry cluster_peer(.param .u64 out)
{
    .reg .b32 %r<10>; .reg .b64 %rd<4>; .reg .pred %p<2>;
    .shared .align 4 .b32 slot;
    ld.param.u64 %rd1, [out]; cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %cluster_ctarank; mov.u32 %r2, %cluster_nctarank;
    mov.u32 %r3, slot;
    mov.u32 %r9, %tid.x; setp.eq.u32 %p1, %r9, 0;
    add.u32 %r4, %r1, 1; mul.lo.u32 %r4, %r4, 100;
    @%p1 st.shared.u32 [%r3], %r4;
    barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;
    add.u32 %r5, %r1, 1; rem.u32 %r5, %r5, %r2;
    mapa.shared::cluster.u32 %r6, %r3, %r5;
    ld.shared::cluster.u32 %r7, [%r6];
    mov.u32 %r8, %ctaid.x; mul.wide.u32 %rd2, %r8, 12; add.s64 %rd1, %rd1, %rd2;
    @%p1 st.global.u32 [%rd1], %r1;  // 12-byte records: only 4-byte aligned
    @%p1 st.global.u32 [%rd1+4], %r2;
    @%p1 st.global.u32 [%rd1+8], %r7;
    barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;
    ret;
}
""", {"cluster_peer": [U64]})

# One TMA 2-D box (box_rows x box_cols bytes) at (row, col) into smem, then 128 threads copy smem to out as is
# (swizzled or not). The tile is 1024-byte aligned: the 128-byte swizzle pattern repeats every 8 rows of 128 B.
def tma_box_ptx(box_rows: int, box_cols: int) -> PtxModule:
    nbytes = box_rows * box_cols
    return PtxModule(HEADER + f"""
.visible .entry tma_box(.param .align 64 .b8 tmap[128], .param .u64 out, .param .u32 row, .param .u32 col)
{{
    .reg .b32 %r<12>; .reg .b64 %rd<6>; .reg .pred %p<3>;
    .shared .align 1024 .b8 tile[{nbytes}];
    .shared .align 8 .b64 full;
    mov.u64 %rd1, tmap; cvta.param.u64 %rd1, %rd1;
    ld.param.u64 %rd2, [out]; cvta.to.global.u64 %rd2, %rd2;
    ld.param.u32 %r1, [row]; ld.param.u32 %r2, [col];
    mov.u32 %r3, tile; mov.u32 %r4, full;
    mov.u32 %r10, %tid.x; setp.eq.u32 %p1, %r10, 0;
    @%p1 mbarrier.init.shared::cta.b64 [%r4], 1;
    fence.proxy.async.shared::cta;
    bar.sync 0;
    @%p1 mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r4], {nbytes};
    @%p1 cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
        [%r3], [%rd1, {{%r2, %r1}}], [%r4];
$wait:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r4], 0;
    @!%p2 bra $wait;
    mov.u32 %r5, %tid.x;
$copy:
    setp.ge.u32 %p2, %r5, {nbytes // 4};
    @%p2 bra $done;
    shl.b32 %r6, %r5, 2; add.u32 %r7, %r3, %r6; ld.shared.u32 %r8, [%r7];
    cvt.u64.u32 %rd3, %r6; add.s64 %rd4, %rd2, %rd3; st.global.u32 [%rd4], %r8;
    mov.u32 %r9, %ntid.x; add.u32 %r5, %r5, %r9;
    bra $copy;
$done:
    ret;
}}
""", {"tma_box": [TENSOR_MAP, U64, U32, U32]})


def unswizzle_128b(tile: np.ndarray) -> np.ndarray:
    """Undo TMA's 128-byte swizzle of a tile with 128-byte rows: 16-byte chunk c of row r sits at c ^ (r % 8)."""
    rows = tile.shape[0]
    chunks = tile.reshape(rows, 8, 16)
    physical = np.arange(8)[None, :] ^ (np.arange(rows)[:, None] % 8)
    return np.take_along_axis(chunks, physical[:, :, None], axis=1).reshape(rows, 128)


PTX_TMA = tma_box_ptx(32, 64)
PTX_TMA_SWIZZLED = tma_box_ptx(16, 128)


# out[i] = in[i] for i < count bytes, one byte per thread: dtype-agnostic pointer test.
PTX_COPY = PtxModule(HEADER + """
.visible .entry copy_bytes(.param .u64 dst, .param .u64 src, .param .u32 count)
{
    .reg .b32 %r<6>; .reg .b64 %rd<6>; .reg .pred %p<2>; .reg .b16 %h<2>;
    ld.param.u64 %rd1, [dst]; ld.param.u64 %rd2, [src]; ld.param.u32 %r1, [count];
    cvta.to.global.u64 %rd1, %rd1; cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.u32 %r2, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r2, %r1;
    @%p1 bra $end;
    cvt.u64.u32 %rd3, %r2; add.s64 %rd4, %rd2, %rd3; add.s64 %rd5, %rd1, %rd3;
    ld.global.u8 %h1, [%rd4]; st.global.u8 [%rd5], %h1;
$end:
    ret;
}
""", {"copy_bytes": [U64, U64, U32]})

# data[i] += 1: replaying a graph of it n times must add n.
PTX_INCREMENT = PtxModule(HEADER + """
.visible .entry increment(.param .u64 data)
{
    .reg .b32 %r<6>; .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [data]; cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x; mad.lo.u32 %r2, %r2, %r3, %r4;
    mul.wide.u32 %rd2, %r2, 4; add.s64 %rd1, %rd1, %rd2;
    ld.global.u32 %r1, [%rd1]; add.u32 %r1, %r1, 1; st.global.u32 [%rd1], %r1;
    ret;
}
""", {"increment": [U64]})


# -- device memory through the driver (independent of Numba) -----------------------------------------
def _ok(result, what):
    err, *rest = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err.name}")
    return rest[0] if rest else None


class DeviceBuffer:
    def __init__(self, nbytes: int):
        ensure_context()
        self.nbytes = nbytes
        self.ptr = int(_ok(driver.cuMemAlloc(nbytes), "cuMemAlloc"))

    @classmethod
    def from_host(cls, host: np.ndarray) -> "DeviceBuffer":
        host = np.ascontiguousarray(host)
        buffer = cls(host.nbytes)
        _ok(driver.cuMemcpyHtoD(buffer.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        return buffer

    def to_host(self, dtype, shape) -> np.ndarray:
        host = np.empty(shape, dtype=dtype)
        assert host.nbytes <= self.nbytes
        _ok(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        _ok(driver.cuMemcpyDtoH(host.ctypes.data, self.ptr, host.nbytes), "cuMemcpyDtoH")
        return host

    def fill(self, byte: int):
        _ok(driver.cuMemsetD8(self.ptr, byte, self.nbytes), "cuMemsetD8")

    def __del__(self):
        try:
            driver.cuMemFree(self.ptr)
        except Exception:
            pass


def _kernel(ptx_text: PtxModule, name: str):
    return load_kernel(compile_ptx(ptx_text), name)


def _expect_equal(got, want, what):
    if not np.array_equal(got, want):
        bad = np.argwhere(np.asarray(got) != np.asarray(want))
        raise AssertionError(f"{what}: {len(bad)} mismatches, first at {bad[:3].tolist()}: "
                             f"got {np.asarray(got)[tuple(bad[0])]} want {np.asarray(want)[tuple(bad[0])]}")


# -- the items ---------------------------------------------------------------------------------------
def item_environment():
    from cuda.core import Device  # optional beside cuda.bindings: only this item needs it
    device = Device(ensure_context())
    versions = {p: metadata.version(p) for p in ("cuda-core", "cuda-bindings", "nvidia-nvjitlink", "numba-cuda")}
    driver_version = _ok(driver.cuDriverGetVersion(), "cuDriverGetVersion")
    return f"{device.name} cc={device.compute_capability} driver={driver_version} {versions}"


def item_compile():
    cubins = [compile_ptx(p) for p in (PTX_FILL, PTX_BIG_SMEM, PTX_CLUSTER, PTX_TMA,
                                          PTX_TMA_SWIZZLED, PTX_COPY, PTX_INCREMENT)]
    return "; ".join(f"{name}: {res.registers} regs, {res.spills} spill bytes"
                     for cubin in cubins for name, res in cubin.resources.items())


def item_launch():
    out = DeviceBuffer(256 * 4)
    out.fill(0xFF)
    _kernel(PTX_FILL, "fill").launch(2, 128, [out.ptr, np.uint32(7)])
    _expect_equal(out.to_host(np.uint32, 256), np.arange(256, dtype=np.uint32) * 3 + 7, "fill")
    return "256 threads wrote tid*3+7"


def item_big_shared_memory():
    shared_bytes = 200 * 1024
    threads = 256
    base = shared_bytes - threads * 4  # touch the top of the allocation: proves all of it is there
    out = DeviceBuffer(threads * 4)
    out.fill(0xFF)
    _kernel(PTX_BIG_SMEM, "big_smem").launch(1, threads, [out.ptr, np.uint32(base)], shared_bytes=shared_bytes)
    want = (np.arange(threads, dtype=np.uint32) + 1) % threads + 1
    _expect_equal(out.to_host(np.uint32, threads), want, "big smem")
    return f"{shared_bytes} bytes of dynamic shared memory"


def item_cluster():
    blocks = 8
    out = DeviceBuffer(blocks * 12)
    out.fill(0xFF)
    _kernel(PTX_CLUSTER, "cluster_peer").launch(blocks, 64, [out.ptr], cluster=2)
    got = out.to_host(np.uint32, (blocks, 3))
    rank = np.arange(blocks) % 2
    want = np.stack([rank, np.full(blocks, 2), ((rank + 1) % 2 + 1) * 100], axis=1).astype(np.uint32)
    _expect_equal(got, want, "cluster (rank, size, peer value)")
    return "cluster of 2: ranks, sizes and distributed shared memory reads correct"


def _tensor_map_boxes(box_rows: int, box_cols: int, swizzle: int, ptx_text: PtxModule) -> str:
    rows, cols = 48, 256  # a box at row 40 runs past the last row: TMA must fill zeros
    host = np.random.default_rng().integers(0, 256, (rows, cols), dtype=np.uint8)
    source = DeviceBuffer.from_host(host)
    kernel = _kernel(ptx_text, "tma_box")
    out = DeviceBuffer(box_rows * box_cols)
    tmap = tensor_map_2d(source.ptr, np.uint8, (rows, cols), cols, (box_rows, box_cols), swizzle=swizzle)
    corners = [(0, 0), (8, 64), (40, 128)]
    for row, col in corners:
        out.fill(0xAB)
        kernel.launch(1, 128, [tmap, out.ptr, np.uint32(row), np.uint32(col)])
        want = np.zeros((box_rows, box_cols), np.uint8)
        part = host[row:row + box_rows, col:col + box_cols]
        want[:part.shape[0], :part.shape[1]] = part
        got = out.to_host(np.uint8, (box_rows, box_cols))
        if swizzle == 128:
            got = unswizzle_128b(got)
        _expect_equal(got, want, f"TMA box {box_rows}x{box_cols} swizzle {swizzle} at ({row}, {col})")
    return f"{box_rows}x{box_cols} boxes at {corners} match numpy (incl. zero fill past the last row)"


def item_tensor_map():
    return _tensor_map_boxes(32, 64, 0, PTX_TMA)


def item_tensor_map_swizzled():
    return _tensor_map_boxes(16, 128, 128, PTX_TMA_SWIZZLED)


def item_numba_pointers():
    try:  # no kernel is compiled by Numba here, so gemm._compat's NumPy shim is not needed
        from numba import cuda
    except ImportError:
        return "SKIP: numba-cuda not importable"
    host = np.random.default_rng().integers(0, 256, 1000, dtype=np.uint8)
    source, destination = cuda.to_device(host), cuda.device_array(1000, dtype=np.uint8)
    _kernel(PTX_COPY, "copy_bytes").launch(8, 128, [destination, source, np.uint32(1000)])
    cuda.synchronize()
    _expect_equal(destination.copy_to_host(), host, "numba copy")
    return "numba device arrays passed as pointers"


def item_torch_pointers():
    try:
        import torch
    except ImportError:
        return "SKIP: torch not importable"
    results = []
    for dtype in (torch.float8_e4m3fn, torch.bfloat16):
        source = torch.randn(33, 40, device="cuda").to(dtype)
        nbytes = source.numel() * source.element_size()
        poison = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device="cuda")  # all-ones: NaN in both
        destination = poison.view(dtype).view(source.shape)
        _kernel(PTX_COPY, "copy_bytes").launch((nbytes + 127) // 128, 128,
                                               [destination, source, np.uint32(nbytes)],
                                               stream=torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        same = torch.equal(destination.view(torch.uint8), source.view(torch.uint8))
        if not same:
            raise AssertionError(f"torch {dtype}: copy differs")
        results.append(str(dtype))
    return f"torch tensors {results} passed as pointers (on torch's current stream)"


def item_cuda_graph():
    ensure_context()
    data = DeviceBuffer(512 * 4)
    data.fill(0)
    kernel = _kernel(PTX_INCREMENT, "increment")
    stream = _ok(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    handle = int(stream)
    # Warm-up outside capture (loads the module, raises the smem limit): the contract every stage states.
    kernel.launch(4, 128, [data.ptr], stream=handle, cluster=2, shared_bytes=64 * 1024)
    _ok(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
    data.fill(0)
    _ok(driver.cuStreamBeginCapture(stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        "cuStreamBeginCapture")
    try:
        # The same launch paths as above, inside capture: a cluster and > 48 KiB of dynamic smem.
        kernel.launch(4, 128, [data.ptr], stream=handle, cluster=2, shared_bytes=64 * 1024)
    finally:
        graph = _ok(driver.cuStreamEndCapture(stream), "cuStreamEndCapture")
    if int(data.to_host(np.uint32, 512).max()) != 0:
        raise AssertionError("the captured launch ran during capture")
    executable = _ok(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    replays = 5
    start = time.perf_counter()
    for _ in range(replays):
        _ok(driver.cuGraphLaunch(executable, stream), "cuGraphLaunch")
    _ok(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
    elapsed = time.perf_counter() - start
    _expect_equal(data.to_host(np.uint32, 512), np.full(512, replays, np.uint32), "graph replays")
    driver.cuGraphExecDestroy(executable)
    driver.cuGraphDestroy(graph)
    driver.cuStreamDestroy(stream)
    return f"captured once, replayed {replays}x ({elapsed * 1e6 / replays:.1f} us per replay incl. host)"


ITEMS = [
    ("environment", item_environment),
    ("compile (nvJitLink)", item_compile),
    ("launch", item_launch),
    ("dynamic smem > 48 KiB", item_big_shared_memory),
    ("cluster of 2 + DSMEM", item_cluster),
    ("tensor map by value (TMA 2-D)", item_tensor_map),
    ("tensor map, 128-byte swizzle", item_tensor_map_swizzled),
    ("numba device array pointers", item_numba_pointers),
    ("torch tensor pointers (e4m3, bf16)", item_torch_pointers),
    ("CUDA graph capture + replay", item_cuda_graph),
]


def run_item(index: int) -> bool:
    name, item = ITEMS[index]
    try:
        detail = item()
        status = "SKIP" if str(detail).startswith("SKIP") else "PASS"
        print(f"{status} {name}: {detail}", flush=True)
        return True
    except Exception:
        print(f"FAIL {name}", flush=True)
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        return False


def main(argv: list[str]) -> int:
    """Each item runs in its own process, so a sticky CUDA error (illegal address) cannot fail the rest."""
    if argv[:1] == ["--item"]:
        return 0 if run_item(int(argv[1])) else 1
    inline = argv[:1] == ["--inline"]
    failed = 0
    for index, (name, _) in enumerate(ITEMS):
        if inline:
            failed += not run_item(index)
            continue
        try:
            done = subprocess.run([sys.executable, "-m", "ptx", "smoke", "--item", str(index)], timeout=300)
            if done.returncode != 0:
                failed += 1
                if done.returncode < 0 or done.returncode > 1:
                    print(f"FAIL {name}: the item process exited with status {done.returncode}", flush=True)
        except subprocess.TimeoutExpired:
            failed += 1
            print(f"FAIL {name}: timed out after 300 s (a hang: a wait that never completes?)", flush=True)
    print(f"ptx smoke: {len(ITEMS) - failed}/{len(ITEMS)} items passed", flush=True)
    return failed
