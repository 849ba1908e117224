"""The timer's two ways of emptying the L2 before a timed call, and why a memory-bound kernel needs both.

* ``"memset"`` (the default, and what DeepGEMM's ``bench_kineto`` does with a 256 MB ``zero_()``): a 256 MiB
  ``cuMemsetD32Async``. It evicts the call's operands, but leaves the 50 MB L2 full of *dirty* lines: the
  timed call then evicts them as it reads, and their write-backs share HBM with its own reads. A compute-bound
  call does not notice; a call that only streams B does (64x7168x16384 measured 50.9 us after the memset and
  43.4 us after a clean read pass on the H100, docs/benchmarks.md "Clean or dirty L2").
* ``"clean"``: the same 256 MiB (zeroed once) *read* by :func:`read_pass_kernel` instead, so the L2 holds
  clean lines of it and the timed call pays for its own bytes only. Its D still reaches HBM: the write-back happens
  during the next pair's flush, inside the timed graph, so it is charged to the call. This is a decode
  step's L2: the kernel before it read weights and wrote a few activations.

The read pass is a PTX kernel of our own (no torch): each thread sums its 16-byte vectors, four loads in flight,
and stores its sum only when given somewhere to put it. The timer gives it nowhere (a null pointer, tested at
run time, so the compiler cannot drop the loads); the CPU test runs it on the emulator with random data and
checks every thread's sum, that is, that each vector is read exactly once, by the thread meant to.
"""
from __future__ import annotations

from functools import lru_cache

from ptx.builder import KernelBuilder, module
from ptx.vocab import core

FLUSHES = ("memset", "clean")
KERNEL = "l2_read_pass"
VECTOR_BYTES = 16
UNROLL = 4  # independent 16-byte loads per thread in flight: enough to keep HBM busy from ~1k warps
THREADS = 256
BLOCKS = 1024


def read_pass_ptx(unroll: int = UNROLL) -> str:
    """PTX of ``l2_read_pass(buffer, vectors, sums)``: thread t reads 16-byte vectors t, t + S, t + 2S, ... below
    ``vectors`` (S = all threads of the grid), ``unroll`` at a time, and, if ``sums`` is not null, writes the
    32-bit wrapping sum of its words to ``sums[t]``."""
    k = KernelBuilder(KERNEL, params=[("u64", "buffer"), ("u64", "vectors"), ("u64", "sums")], max_threads=THREADS)
    base, sums, slot, address, step, index, ahead, count = (k.reg("u64") for _ in range(8))
    thread, scratch, total = (k.reg("u32") for _ in range(3))
    words = k.regs("b32", 4 * unroll, "w")
    inside = k.regs("pred", unroll)
    more, wanted = k.reg("pred"), k.reg("pred")
    loop, done, finish = k.label("read"), k.label("done"), k.label("finish")
    k.emit(core.global_pointer_param(base, k.param("buffer")), core.ld_param("u64", sums, k.param("sums")),
           core.ld_param("u64", count, k.param("vectors")),
           core.global_thread_index(thread, scratch),
           core.element_address(address, base, thread, VECTOR_BYTES),
           core.special(scratch, "nctaid.x"), core.special(total, "ntid.x"),
           f"mul.wide.u32 {step}, {scratch}, {total};",  # S, the grid's threads
           f"cvt.u64.u32 {index}, {thread};",
           f"mov.u32 {total}, 0;",
           core.setp("lt", "u64", more, index, count),
           core.branch_if(more, done, negate=True))
    k.place(loop)
    for u in range(unroll):  # all loads issued before the first add waits for its data; past the end: zeros
        k.emit(f"mad.lo.u64 {ahead}, {step}, {u}, {index};",
               core.setp("lt", "u64", inside[u], ahead, count),
               *(f"mov.b32 {word}, 0;" for word in words[4 * u:4 * u + 4]),
               f"@{inside[u]} " + core.ld_global_v4(words[4 * u:4 * u + 4], address, cache=""),
               f"mad.lo.u64 {address}, {step}, {VECTOR_BYTES}, {address};")
    for word in words:
        k.emit(f"add.u32 {total}, {total}, {word};")
    k.emit(f"mad.lo.u64 {index}, {step}, {unroll}, {index};",
           core.setp("lt", "u64", more, index, count),
           core.branch_if(more, loop))
    k.place(done)
    k.emit(core.setp("ne", "u64", wanted, sums, "0"),  # a run-time test: the loads cannot be compiled away
           core.branch_if(wanted, finish, negate=True),
           core.cvta_global(sums, sums),
           core.element_address(slot, sums, thread, 4),
           core.st_global("u32", slot, total))
    k.place(finish)
    return module([k])


def read_pass_grid(vectors: int) -> int:
    """Blocks of :data:`THREADS` for a read pass over ``vectors``: enough for every SM several times over, fewer
    when there is less to read."""
    return max(1, min(BLOCKS, -(-vectors // (THREADS * UNROLL))))


@lru_cache(maxsize=None)
def read_pass_kernel():
    """The read pass, assembled and loaded (ptx.runtime.Kernel)."""
    from ptx.compile import compile_ptx
    from ptx.runtime import load_kernel
    return load_kernel(compile_ptx(read_pass_ptx()), KERNEL)


def enqueue_read_pass(buffer: int, nbytes: int, stream: int, device: int) -> None:
    """Read ``nbytes`` (a multiple of 16) at ``buffer`` on ``stream``; writes nothing."""
    if nbytes % VECTOR_BYTES:
        raise ValueError(f"l2 read pass: nbytes must be a multiple of {VECTOR_BYTES}, got {nbytes}")
    vectors = nbytes // VECTOR_BYTES
    read_pass_kernel().launch((read_pass_grid(vectors),), (THREADS,), [buffer, vectors, 0], stream=stream,
                              device=device)


__all__ = ["FLUSHES", "read_pass_ptx", "read_pass_grid", "read_pass_kernel", "enqueue_read_pass"]
