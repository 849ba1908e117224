"""The timer's clean L2 flush (gemm.testing.l2_flush): its read pass on the PTX emulator and in SASS (CPU), on the
GPU, and the flush argument through the timer and the benches."""
import numpy as np
import pytest

from gemm.testing.l2_flush import FLUSHES, KERNEL, read_pass_grid, read_pass_ptx


def _sums_by_thread(data: np.ndarray, vectors: int, threads: int) -> np.ndarray:
    """What each of ``threads`` grid threads must sum: vector v belongs to thread v mod threads."""
    per_vector = data[:4 * vectors].reshape(vectors, 4).sum(axis=1, dtype=np.uint64)
    sums = np.zeros(threads, np.uint64)
    np.add.at(sums, np.arange(vectors) % threads, per_vector)
    return (sums % (1 << 32)).astype(np.uint32)


@pytest.mark.parametrize("blocks, threads, vectors", [(2, 32, 2 * 32 * 4 * 3),  # whole unrolled rounds
                                                      (3, 32, 1001)])  # a ragged last round: loads past the end off
def test_the_read_pass_reads_every_vector_once_on_the_emulator(rng, blocks, threads, vectors):
    from ptx.emulate.lockstep import run_kernel
    data = rng.integers(0, 1 << 32, size=4 * vectors + 64, dtype=np.uint32)  # a tail it must not read
    sums = np.full(blocks * threads, 0xDEADBEEF, np.uint32)
    run_kernel(read_pass_ptx(), KERNEL, (blocks,), threads, 0, {"buffer": data, "vectors": vectors, "sums": sums})
    np.testing.assert_array_equal(sums, _sums_by_thread(data, vectors, blocks * threads))


def test_the_read_pass_keeps_its_four_wide_loads_in_sass():
    """The timer calls it with no sums pointer: ptxas must still emit every load (128-bit, four per round)."""
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble
    loads = [i for i in disassemble(compile_ptx(read_pass_ptx())) if i.opcode == "LDG"]
    assert len(loads) == 4 and all(".128" in i.text for i in loads), [i.text for i in loads]


def test_read_pass_grid_fills_the_gpu_and_shrinks_for_small_reads():
    assert read_pass_grid(16 << 20) == 1024
    assert read_pass_grid(1) == 1 and read_pass_grid(1025) == 2


def test_a_bad_flush_is_a_clear_error_before_any_gpu_work():
    from gemm.testing.l2_flush import enqueue_read_pass
    from gemm.testing.timer import bench_kernel
    with pytest.raises(ValueError, match="flush must be one of memset, clean"):
        bench_kernel(lambda stream: None, flush="dirty")
    with pytest.raises(ValueError, match="multiple of 16"):
        enqueue_read_pass(0, 100, 0, 0)
    assert FLUSHES == ("memset", "clean")


def test_the_benches_take_the_flush():
    from gemm.__main__ import main
    for argv in (["bench", "dense", "--flush", "bogus"], ["bench", "configs", "1,2,3", "production", "--flush", "x"]):
        with pytest.raises(SystemExit):
            main(argv)


# ------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_the_read_pass_sums_on_the_gpu(rng):
    from gemm.testing.l2_flush import THREADS, read_pass_kernel
    from gemm.testing.timer import _check, _driver, timing_stream
    from ptx.runtime import synchronize
    stream = timing_stream()
    vectors = 3 * THREADS * 4 * 7 + 5
    blocks = read_pass_grid(vectors)
    data = rng.integers(0, 1 << 32, size=4 * vectors, dtype=np.uint32)
    sums = np.zeros(blocks * THREADS, np.uint32)
    driver = _driver()
    buffer, out = (int(_check(driver.cuMemAlloc(array.nbytes))) for array in (data, sums))
    try:
        _check(driver.cuMemcpyHtoD(buffer, data.ctypes.data, data.nbytes))
        read_pass_kernel().launch((blocks,), (THREADS,), [buffer, vectors, out], stream=stream)
        synchronize(stream)
        _check(driver.cuMemcpyDtoH(sums.ctypes.data, out, sums.nbytes))
    finally:
        driver.cuMemFree(buffer)
        driver.cuMemFree(out)
    np.testing.assert_array_equal(sums, _sums_by_thread(data, vectors, blocks * THREADS))


@pytest.mark.gpu
def test_bench_kernel_times_after_either_flush():
    from numba import cuda

    from gemm.testing.timer import bench_kernel

    @cuda.jit
    def fill(out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = i

    out = cuda.device_array(16 << 20 >> 2, dtype=np.float32)
    blocks = (out.size + 255) // 256
    for flush in FLUSHES:
        timing = bench_kernel(lambda stream: fill[blocks, 256, cuda.external_stream(stream)](out), flush=flush)
        assert 0 < timing.median_us < 1000 and timing.flush_us > 10, (flush, timing)
        assert timing.nodes_per_call == 1, "the flush is not part of the call"
