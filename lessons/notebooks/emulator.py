"""Notebook cells that run a PTX stage (04-10) on the CPU emulator, intact and broken.

    emulator_cells(n)  -> [markdown, code]: stage n's generated PTX run by ptx.emulate.run_stage at a small
                          ragged shape, printed report, D compared with the float64 reference
    break_it_cells(n)  -> [markdown, code, (markdown, code) per break]: the same kernel with one small PTX
                          edit from ptx.emulate.breaks, and what the emulator reports

The cells expect the notebook's setup cell to have run (lessons.notebooks.cells.setup_cell: the repository on sys.path,
``stage = lessons.stage(n)``); they import the rest themselves. Each runs in a few seconds on one CPU core.
"""
from __future__ import annotations

from lessons.notebooks.ipynb import code, markdown

PTX_STAGES = (4, 5, 6, 7, 8, 9, 10)
# (M, N, K) per stage: ragged M and N; K blocks > pipeline stages where there is a ring, so it wraps and the
# parities flip (and a wrong producer parity is reached). Stage 04 runs in lockstep, the slowest: smaller.
SHAPES = {4: (100, 136, 512), 5: (130, 256, 640)} | {n: (130, 256, 2048) for n in range(6, 11)}
SM_COUNT = {9: 4, 10: 4}  # the generator's persistent grid: CTAs standing in for SMs (2-CTA clusters: even)


def _check(number: int) -> None:
    if number not in PTX_STAGES:
        raise ValueError(f"stage {number} is not a PTX stage the emulator runs; those are {PTX_STAGES}")


EXECUTION = {
    4: "all 256 threads of a CTA in lockstep, one NumPy vector per register; `mma.sync` and `ldmatrix` are "
       "evaluated per warp from the PTX ISA's fragment tables, and `cp.async` copies land only at "
       "`cp.async.wait_group`, so a stage read before its wait sees stale bytes",
    5: "each CTA as two cooperatively scheduled warpgroups; `wgmma` is queued at issue and reads its operands "
       "through its descriptors at `wgmma.wait_group`, and every shared-memory byte written by `cp.async` "
       "remembers its writer until that thread's `fence.proxy.async`",
    6: "each CTA as cooperatively scheduled warpgroups, with mbarriers (arrival counts, transaction bytes, "
       "phases and parities) and TMA boxes written through the tensor maps the launcher encodes",
    7: "the producer warpgroup and the math warpgroup as separate, cooperatively scheduled loops that meet only "
       "at mbarriers; the producer yields after every arrive, so a stage released too early is overwritten",
    8: "each persistent CTA walking several tiles (3 CTAs stand in for the SMs), the epilogue's `stmatrix` "
       "writes checked against the TMA store that reads them",
    9: "2-CTA clusters run together: multicast TMA writes both CTAs' shared memory, remote arrives release a "
       "stage in the peer, and a CTA that exits while its peer may still touch it is an error",
    10: "stage 09's PTX: the FFMA pass changes the cubin, not the PTX, so this is the text of notebook 09 again",
}


def emulator_cells(number: int) -> list[dict]:
    """Stage ``number``'s generated PTX on the CPU emulator, checked against the float64 reference."""
    _check(number)
    m, n, k = SHAPES[number]
    sm = SM_COUNT.get(number, 3)
    launch = f", sm_count={sm}" if number >= 7 else ""
    return [
        markdown(f"""\
## Run the PTX on the CPU: `ptx.emulate.run_stage`

`ptx.emulate` executes the PTX text this stage generates, instruction by instruction, on NumPy: no GPU, no
CUDA driver. Here it runs {EXECUTION[number]}. `run_stage(stage, a, sa, b, sb)` launches the kernel with the
grid and arguments the real launcher would use and returns D and a report: what ran, how many instructions,
and how it ended. A correct kernel ends `COMPLETED` and matches the float64 reference to the BF16 rounding of
its output (about 1e-6). The shape is small and ragged on purpose: M and N are not multiples of the block,
so the clamped loads and masked stores run too."""),
        code(f'''\
# ---- the generated PTX, executed on the CPU: D and a report of the run -----------------------------------
import numpy as np

from gemm.fp8 import calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from ptx.emulate import run_stage

m, n, k = {m}, {n}, {k}
a, sa, b, sb = random_problem(m, n, k, np.random.default_rng(0))
out, report = run_stage(stage, a, sa, b, sb{launch})
print(report)
assert report.ok, report.error
diff = calc_diff(out, reference_gemm(a, sa, b, sb))
print(f"every element written: {{bool(np.isfinite(out).all())}}, diff against the float64 reference = {{diff:.1e}}")
assert np.isfinite(out).all() and diff < 1e-3, "the emulated kernel disagrees with the float64 reference"'''),
    ]


# ------------------------------------------------------------------------------------------ break it

BREAK_INTRO = """\
## Break it

Each cell below makes one small, explicit edit to this stage's PTX text, a function from `ptx.emulate.breaks`
that takes the generated PTX and returns the broken PTX, and runs the result on the emulator. The report
starts with the lines the edit changed (`-` removed, `+` added), so you can see exactly what was done, then
says how the run ended. On a GPU most of these bugs would hang the machine, corrupt the output silently, or
pass every test today and fail under a different schedule; the emulator turns each into a message or a diff.
"""


def break_setup(shape: tuple[int, int, int], sm_count: int | None) -> str:
    """The code cell the break cells need: a fixed problem at ``shape``, ``break_it(edit)`` and ``show_wrong(out)``;
    ``sm_count``: CTAs standing in for SMs (the generator's persistent grid), None for the hand-written stages."""
    m, n, k = shape
    launch = f", sm_count={sm_count}" if sm_count is not None else ""
    return f'''\
import numpy as np

from gemm.fp8 import calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from ptx.emulate import breaks, run_stage

m, n, k = {m}, {n}, {k}
problem = random_problem(m, n, k, np.random.default_rng(1))
reference = reference_gemm(*problem)


def break_it(edit):
    """Run this stage's kernel with ``edit`` applied to its PTX; print the report (the edit, then the outcome)."""
    out, report = run_stage(stage, *problem, edit=edit{launch})
    print(report)
    return out, report


def show_wrong(out):
    """How far a completed run is from the reference, and a corner of both."""
    diff = calc_diff(out, reference)
    wrong = ~np.isclose(out, reference, rtol=1e-2, atol=1e-2 * np.abs(reference).max())
    print(f"diff = {{diff:.2f}} (a correct kernel: ~1e-6); {{wrong.mean():.0%}} of the elements are wrong")
    with np.printoptions(precision=2, suppress=True, linewidth=120):
        print("emulated D[:3, :6]:\\n", out[:3, :6], "\\nreference[:3, :6]:\\n", reference[:3, :6])
    return diff'''


PARITY = ("""\
### A wrong mbarrier parity

`mbarrier.try_wait.parity` waits until the phase with the given parity has completed. A fresh barrier counts
the phase before its first (parity 1) as complete, so the producer starts its "empty" waits at parity 1: the
first pass over the ring must not wait for consumers that have nothing to release yet. `breaks.flip_parity`
starts that register at 0 instead. The producer then waits for a release that never comes, and the consumers
wait for data the producer never loads. On a GPU that is a hang; the emulator sees that no warpgroup can run
and names each one's line and the barrier phase it waits for, at once.""", '''\
out, report = break_it(breaks.flip_parity)
assert report.verdict == "deadlock" and report.seconds < 1, report''')

FENCE_05 = ("""\
### A missing `fence.proxy.async`

The `cp.async` copies write shared memory through the *generic proxy*; `wgmma` reads it through the *async
proxy*, and the two are not ordered with each other unless the writing thread executes `fence.proxy.async`
after its writes (then a barrier, so every thread's fence is done before the first `wgmma`). Without it the
tensor core may read stale bytes, on some runs, on some GPUs. `breaks.drop_proxy_fence` deletes the fence. The
emulator remembers, for every shared-memory byte, the thread whose generic write no fence has covered yet, and
reports the async-proxy read of such a byte, with the line that wrote it.""", '''\
out, report = break_it(breaks.drop_proxy_fence)
assert report.verdict == "missing fence.proxy.async", report''')

FENCE_TMA_STORE = ("""\
### A missing `fence.proxy.async`

The epilogue writes the D tile with `stmatrix` (the *generic proxy*), then one thread hands it to a TMA store,
which reads shared memory through the *async proxy*. The writers must execute `fence.proxy.async` after their
writes (then the barrier) or the store may read stale bytes. `breaks.drop_proxy_fence` deletes that fence. The
emulator remembers, for every shared-memory byte, the thread whose generic write no fence has covered yet, and
reports the TMA store that reads such bytes, with the `stmatrix` line that wrote them.""", '''\
out, report = break_it(breaks.drop_proxy_fence)
assert report.verdict == "missing fence.proxy.async", report''')

FENCE_NONE = """\
### Why there is no missing-fence break here

In this stage TMA writes the operand tiles and `wgmma` reads them, both through the async proxy, and the
epilogue stages D with `st.shared` / `ld.shared` (generic proxy only): no generic write is read by the async
proxy, so no operand fence is needed. The one `fence.proxy.async` left follows `mbarrier.init`; the emulator
keeps mbarriers as objects rather than shared-memory bytes and does not check that one. See notebook 05 (a
`cp.async` tile read by `wgmma`) and notebook 08 (an `stmatrix` tile read by a TMA store) for this break."""

EARLY_READ = ("""\
### Reading the accumulators before `wgmma.wait_group`

`wgmma.mma_async` returns at once; the tensor core writes the accumulator registers later, and only
`wgmma.wait_group` says it is done. `breaks.read_accumulators_early` moves the wait below the first instruction
that reads an accumulator (the promotion's first FFMA), which then reads a register still being written. On a
GPU that is silently wrong numbers; the emulator flags the read and names the `wgmma` still in flight.""", '''\
out, report = break_it(breaks.read_accumulators_early)
assert report.verdict == "accumulator read before wgmma.wait_group", report''')

SWIZZLE_COPIES = ("""\
### A wrong swizzle

Each thread's 16-byte `cp.async` chunk goes to chunk `c ^ (row % 8)` of its 128-byte row, the 128B swizzle
that spreads {readers} over all the shared-memory banks. `breaks.unswizzle_copies` deletes that one `xor`: the
copies land in plain row-major order while the readers still expect the swizzled layout. Nothing in the
kernel can notice, so the emulator runs to completion, and the result is wrong: the diff shows it.""", '''\
out, report = break_it(breaks.unswizzle_copies)
assert report.ok and show_wrong(out) > 0.1''')

SWIZZLE_DESCRIPTOR = ("""\
### A wrong swizzle

TMA writes each operand tile 128B-swizzled (the tensor map says so), and the `wgmma` descriptor must say the
same: its bits 62-63 are the layout type, 1 for the 128B swizzle. `breaks.descriptor_swizzle_64b` changes the
descriptor constants to type 2, the 64B swizzle, so the tensor core decodes the tiles with the wrong pattern
(rows 64 bytes apart, 2 address bits XORed instead of 3). Nothing is out of bounds and nothing waits, so the
run completes, and the result is wrong: the diff shows it.""", '''\
out, report = break_it(breaks.descriptor_swizzle_64b)
assert report.ok and show_wrong(out) > 0.1''')

EARLY_COPIES = ("""\
### Waiting for too few copies

`cp.async.wait_group N` waits until at most N groups of this thread's copies are still in flight; with two
stages loading ahead, N = 1 leaves exactly the next block's copies pending. `breaks.wait_for_fewer_copies`
makes it N + 1, so the block about to be used may still be in flight. The emulator lands copies only at the
wait, as the slowest memory system could, so the stage read is stale: wrong numbers, shown by the diff.""", '''\
out, report = break_it(breaks.wait_for_fewer_copies)
assert report.ok and show_wrong(out) > 0.1''')

NO_MBARRIER = """\
Stage {number:02d} has no mbarriers (they come with TMA in stage 06){more}: its breaks are the ones below."""


def break_it_cells(number: int) -> list[dict]:
    """Stage ``number``'s kernel with one PTX edit at a time, and what the emulator reports for each."""
    _check(number)
    if number == 4:
        breaks = [SWIZZLE_COPIES, EARLY_COPIES]
        note = NO_MBARRIER.format(number=4, more=", no async proxy and no `wgmma` (stage 05)")
    elif number == 5:
        breaks = [FENCE_05, EARLY_READ, SWIZZLE_COPIES]
        note = NO_MBARRIER.format(number=5, more="")
    elif number in (6, 7):
        breaks, note = [PARITY, EARLY_READ, SWIZZLE_DESCRIPTOR], None
    else:
        breaks, note = [PARITY, FENCE_TMA_STORE, EARLY_READ, SWIZZLE_DESCRIPTOR], None
    readers = "the `ldmatrix` reads" if number == 4 else "the tensor core's reads"
    sm_count = SM_COUNT.get(number, 3) if number >= 7 else None
    cells = [markdown(BREAK_INTRO + ("\n" + note if note else "")), code(break_setup(SHAPES[number], sm_count))]
    for text, source in breaks:
        cells += [markdown(text.replace("{readers}", readers)), code(source)]
    if number in (6, 7):
        cells.insert(4, markdown(FENCE_NONE))  # after the parity break
    return cells


__all__ = ["emulator_cells", "break_it_cells", "break_setup", "PTX_STAGES", "SHAPES"]
