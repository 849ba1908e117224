"""Write notebooks/NN_*.ipynb from the cell lists in this file, so the notebooks are reviewed as code.

    python tools/make_notebooks.py           # (re)write every notebook
    python tools/make_notebooks.py --check   # exit 1 if a committed notebook differs from what is written here

One notebook per stage: the one idea (markdown), the kernel (Numba source, or an excerpt of the generated
PTX with its resource report and SASS opcode counts), a correctness check against the float64 reference,
and a timing cell; every stage notebook ends with the stage's course exercise (tools/exercise_cells.py: the
prompt from lessons/exercises and a cell that grades the student's copy). Generator stages (07+) also show their
one config change, the emitter that implements it, the SASS opcode table against the previous stage, figures
drawn from the kernel's own layout functions, and a cell for the CPU emulator; stages whose worth is a
measurement (09, 10) print it from the committed results/ file, never from numbers written here. Every cell
runs without a GPU: Numba kernels fall back to the CUDA simulator on tiny shapes, PTX is assembled and
disassembled on the CPU, and GPU-only work prints what it would need (a missing results/ file prints the command
that writes it).
Notebooks are written with stable cell ids, so diffs stay readable. Their outputs come from a run,
tools/execute_notebooks.py, and are committed: --check compares sources, ids and metadata with the outputs
stripped, and rewriting a notebook whose sources did not change keeps its outputs (a changed one is written
without outputs, to be executed again).
"""
from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the cell modules beside this file
from emulator_cells import break_it_cells, emulator_cells  # noqa: E402
from exercise_cells import exercise_cells  # noqa: E402
from moe_notebook import cells as moe_cells  # noqa: E402
from precision_notebook import cells as precision_cells  # noqa: E402


# ------------------------------------------------------------------------------------------ cells shared

def setup_cell(number: int) -> str:
    return f'''\
import os, sys
# Works from notebooks/ (Jupyter) or from the repository root (tests): make the repository importable.
ROOT = os.path.dirname(os.getcwd()) if os.path.basename(os.getcwd()) == "notebooks" else os.getcwd()
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from ptx.device import has_gpu, is_hopper
if not has_gpu():
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before numba is imported: kernels run on the CPU

import numpy as np
import lessons
from gemm.fp8 import align, bf16_to_float, calc_diff
from gemm.testing.problems import flops, gemm_bytes, random_problem, reference_gemm

stage = lessons.stage({number})
print(stage.__doc__)
print("GPU:", "Hopper" if is_hopper() else "present, not Hopper" if has_gpu() else "none (CUDA simulator)")'''


DEVICE_HELPERS = '''\
from numba import cuda

from gemm.testing.problems import mn_major_view

BF16_NAN = 0x7FC0  # poison: an output element the kernel forgets to write stays NaN


def to_device(a, sa, b, sb):
    """Host problem -> device arrays in the GEMM contract: e4m3 as bytes, sa M-major with M padded to 4."""
    m, kb = sa.shape
    sa_storage = np.zeros((kb, align(m, 4)), np.float32)
    sa_storage[:, :m] = sa.T
    # Not cuda.to_device(sa_storage)[:, :m].T: on a GPU, Numba's .T of a device array is a transposed
    # *copy* (row-major again); mn_major_view builds the strided view instead.
    return (cuda.to_device(a.view(np.uint8)), mn_major_view(cuda.to_device(sa_storage), m),
            cuda.to_device(b.view(np.uint8)), cuda.to_device(np.ascontiguousarray(sb)))


def check(m, n, k):
    """Fresh random inputs, poisoned output, one launch, compared with the float64 reference."""
    a, sa, b, sb = random_problem(m, n, k)
    d = cuda.to_device(np.full((m, n), BF16_NAN, np.uint16))
    stage.gemm(*to_device(a, sa, b, sb), d)
    cuda.synchronize()
    out = bf16_to_float(d.copy_to_host())
    diff = calc_diff(out, reference_gemm(a, sa, b, sb))
    print(f"M={m:5d} N={n:5d} K={k:5d}: every element written: {bool(np.isfinite(out).all())}, diff = {diff:.1e}")
    assert np.isfinite(out).all() and diff < 1e-3, "mismatch with the float64 reference"'''


def timing_cell(number: int, m: int = 4096, n: int = 4096, k: int = 7168) -> str:
    return f'''\
from lessons.ladder import committed_summary, percent, speed_of_light

# What the committed ladder run measured for this stage (results/ladder.json), GPU or not, and its speed of light
# (the unit that bounds it: see the stage's docstring above and lessons.ladder.UNITS).
print(committed_summary({number}))

if is_hopper():
    from gemm.testing.timer import bench_kernel
    m, n, k = {m}, {n}, {k}  # the ladder's shape
    a, sa, b, sb = to_device(*random_problem(m, n, k))
    d = cuda.device_array((m, n), np.uint16)
    timing = bench_kernel(lambda stream: stage.gemm(a, sa, b, sb, d, stream=stream))
    tflops = timing.tflops(flops(m, n, k))
    bound = speed_of_light({number}, m, n, k)
    print(f"now: M={{m}} N={{n}} K={{k}}: {{timing.median_us:.1f}} us, {{tflops:.1f}} TFLOP/s, "
          f"{{timing.gbps(gemm_bytes(m, n, k)):.0f}} GB/s, {{percent(100 * tflops / bound['bound_tflops'])}} of its "
          f"speed of light ({{bound['bound_unit']}})")
else:
    print("Timings need a Hopper GPU (there is none here). With one: python -m lessons ladder")'''


SHOW_KERNELS = '''\
import ast, importlib, importlib.util, inspect


def show_kernels(module):
    """Print the GPU functions of ``module`` (kernels and device helpers), found by their decorators."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    shown = 0
    for node in ast.parse(source).body:
        decorators = " ".join(ast.unparse(d) for d in getattr(node, "decorator_list", []))
        if isinstance(node, ast.FunctionDef) and ("jit" in decorators or "device" in decorators):
            print("\\n".join(lines[node.decorator_list[0].lineno - 1:node.end_lineno]), end="\\n\\n")
            shown += 1
    if not shown:
        print(source)'''


PTX_HELPERS = '''\
from collections import Counter

from ptx.compile import compile_ptx
from ptx.sass import disassemble, opcode_counts


def show_excerpt(text, keywords, per_keyword=3):
    """The module header and entry points, then the first lines that use each keyword (with line numbers)."""
    lines = text.splitlines()
    header = (".version", ".target", ".entry", ".maxntid", ".reqnctapercluster")
    picked = {i for i, line in enumerate(lines) if line.lstrip().startswith(header) or ".entry" in line}
    for word in keywords:
        hits = [i for i, line in enumerate(lines) if word in line]
        print(f"{word!r}: {len(hits)} lines")
        picked.update(hits[:per_keyword])
    previous = -1
    for i in sorted(picked):
        if i != previous + 1:
            print("    ...")
        print(f"{i + 1:5d}  {lines[i]}")
        previous = i
    print(f"({len(lines)} lines in all)")


def show_resources(cubin, key_opcodes):
    """ptxas's resource report and the SASS opcodes that tell whether the idea reached the machine code."""
    for name, r in cubin.resources.items():
        print(f"{name}: {r.registers} registers, {r.spill_stores + r.spill_loads} bytes spilled, "
              f"{r.local_bytes} bytes local, {r.shared_bytes} bytes static shared memory")
    instructions = disassemble(cubin)
    counts = Counter()
    for opcode, n in opcode_counts(instructions).items():
        counts[opcode.split(".")[0]] += n  # one family: SYNCS.EXCH.64 and SYNCS.ARRIVE.TRANS64 are both SYNCS
    print(f"{len(instructions)} SASS instructions; key opcodes: "
          + ", ".join(f"{op} {counts.get(op, 0)}" for op in key_opcodes))
    print("most frequent:", ", ".join(f"{op} {n}" for op, n in counts.most_common(12)))
    return instructions


def show_sass(instructions, opcode):
    """Each variant of a SASS opcode family (modifiers included): how many, and the first one in full."""
    variants = {}
    for ins in instructions:
        mnemonic = ins.text.split()[1] if ins.text.startswith("@") else ins.text.split()[0]
        if mnemonic.split(".")[0] == opcode:
            count, first = variants.get(mnemonic, (0, ins))
            variants[mnemonic] = (count + 1, first)
    for mnemonic, (count, first) in variants.items():
        print(f"{count:5d} x {mnemonic:36s} e.g. /*{first.offset:05x}*/ {first.text}")'''


# ------------------------------------------------------------------------------------------ notebook JSON

def markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": textwrap.dedent(text).strip()}


def code(text: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": textwrap.dedent(text).strip()}


def notebook(name: str, cells: list[dict]) -> dict:
    """nbformat 4.5 JSON; sources split into lines as Jupyter writes them, ids stable across rebuilds."""
    out = []
    for index, cell in enumerate(cells):
        source = cell["source"].splitlines(keepends=True)
        out.append({**cell, "id": f"{name[:2]}-{index:02d}", "source": source})
    return {
        "cells": out,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "pygments_lexer": "ipython3"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def render(nb: dict) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"  # as nbformat writes it


def strip_outputs(nb: dict) -> dict:
    """``nb`` as this generator writes it: every code cell without outputs and execution count."""
    cells = [{**cell, "outputs": [], "execution_count": None} if cell["cell_type"] == "code" else cell
             for cell in nb["cells"]]
    return {**nb, "cells": cells}


def committed(path: Path) -> dict | None:
    """The notebook at ``path``, None if there is none or it is not JSON."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def is_current(path: Path, nb: dict) -> bool:
    """Whether the notebook at ``path`` is ``nb`` once its outputs are stripped (outputs do not count)."""
    old = committed(path)
    return old is not None and render(strip_outputs(old)) == render(nb)


# ------------------------------------------------------------------------------------------ the notebooks

def numba_notebook(number: int, intro: str, kernel_note: str, check_note: str, shapes_sim, shapes_gpu,
                   extra_sources: tuple[str, ...] = ()) -> list[dict]:
    extra = "".join(f"""
if importlib.util.find_spec({m!r}):  # the device helpers the Numba stages share
    show_kernels(importlib.import_module({m!r}))""" for m in extra_sources)
    return [
        markdown(intro),
        code(setup_cell(number)),
        markdown(kernel_note),
        code(SHOW_KERNELS + "\n\n\nshow_kernels(stage)" + extra),
        markdown(check_note),
        code(DEVICE_HELPERS),
        code(f'''\
# The simulator runs every GPU thread as a Python thread: tiny shapes there, real ones on a GPU.
shapes = {shapes_gpu!r} if has_gpu() else {shapes_sim!r}
for m, n, k in shapes:
    check(m, n, k)

# For scale, a wrong kernel: the first K group's scales applied to every group (on the host, float64)
a, sa, b, sb = random_problem(256, 256, 1024)
first_group_only = reference_gemm(a, np.repeat(sa[:, :1], sa.shape[1], axis=1), b,
                                  np.repeat(sb[:, :1], sb.shape[1], axis=1))
print(f"first group's scales for every group: diff = {{calc_diff(first_group_only, reference_gemm(a, sa, b, sb)):.1e}}"
      " (pass mark 1e-3)")'''),
        markdown(TIMING_NOTE),
        code(timing_cell(number)),
    ]


def ptx_notebook(number: int, intro: str, ptx_note: str, keywords, sass_note: str, key_opcodes,
                 sass_opcodes, check_note: str, shapes_gpu, extra: list[dict] = (), before: list[dict] = (),
                 ptx_extra: str = "", ptx_comment: str = "The generator bakes the shape into the text (as "
                 "DeepGEMM's JIT does): this is the ladder's shape.",
                 assembler: str = "nvJitLink (ptxas inside): no GPU needed",
                 cubin_code: str = "compile_ptx(ptx_text)", check_code: str | None = None) -> list[dict]:
    """``before`` goes between the setup and the PTX, ``extra`` after the SASS; ``ptx_extra`` ends the PTX cell.
    ``cubin_code``: the expression for what runs (a cubin pass changes it); ``check_code``: the GPU check cell."""
    return [
        markdown(intro),
        code(setup_cell(number)),
        *before,
        markdown(ptx_note),
        code(PTX_HELPERS + f'''\


# {ptx_comment}
ptx_text = stage.generate(4096, 4096, 7168)
show_excerpt(ptx_text, {list(keywords)!r})''' + ptx_extra),
        markdown(sass_note),
        code(f'''\
cubin = {cubin_code}  # {assembler}
instructions = show_resources(cubin, {list(key_opcodes)!r})'''
             + "".join(f"\nshow_sass(instructions, {op!r})" for op in sass_opcodes)),
        *extra,
        markdown(check_note),
        code(DEVICE_HELPERS),
        code(check_code or f'''\
if is_hopper():
    for m, n, k in {shapes_gpu!r}:
        check(m, n, k)
else:
    print("Running this kernel needs a Hopper GPU (sm_90a); above, it was assembled and disassembled on the CPU.")'''),
        markdown(TIMING_NOTE),
        code(timing_cell(number)),
    ]


TIMING_NOTE = """\
## Timing

Kernel time, not launch time: `gemm.testing.timer.bench_kernel` captures a CUDA graph of (flush L2; launch) pairs,
replays it and subtracts the same graph with the flushes alone, so every call reads its operands from HBM and
launch gaps vanish. The ladder (`python -m lessons ladder`) uses the same timer for every stage and for cuBLAS;
its committed numbers are in `results/` and `docs/`.
"""

CHECK_NOTE_NUMBA = """\
## Is it right?

Fresh random FP8 operands (per-row and per-column magnitudes spread over 2^-4..2^4, so a wrong scale shows),
the output poisoned with NaN before the launch, then DeepGEMM's measure against a float64 product of the
dequantized inputs: `diff = 1 - 2·Σxy / Σ(x² + y²)`. The pass mark is 1e-3, but a correct kernel lands near
1e-6: that is the BF16 rounding of the output and nothing else. The last lines of the cell below show what a
classic promotion bug scores on the same kind of inputs: the float64 product with the first K group's scales
applied to every group (typically 1e-2 to 4e-2, far above the pass mark; it varies with the random magnitudes).
"""

CHECK_NOTE_PTX = """\
## Is it right?

On a Hopper GPU: fresh random operands, NaN-poisoned output, `diff` against the float64 reference (a correct
kernel lands near 1e-6, the BF16 rounding of the output; the pass mark is 1e-3), on ragged shapes too:
M not a multiple of the block, N = 2112. Without a GPU this cell only says so.
"""


def build() -> dict[str, dict]:
    books = {
        "00_ptx_dequant": ptx_dequant_cells(),
        "01_naive": numba_notebook(
            1, INTRO_01, KERNEL_01, CHECK_NOTE_NUMBA,
            shapes_sim=[(7, 9, 256)], shapes_gpu=[(128, 256, 512), (100, 2112, 512)],
            extra_sources=("lessons.numba_fp8",)),
        "02_smem_tiling": numba_notebook(
            2, INTRO_02, KERNEL_02, CHECK_NOTE_NUMBA,
            shapes_sim=[(20, 24, 256)], shapes_gpu=[(256, 256, 512), (100, 2112, 512)]),
        "03_register_tiling": numba_notebook(
            3, INTRO_03, KERNEL_03, CHECK_NOTE_NUMBA,
            shapes_sim=[(20, 24, 256)], shapes_gpu=[(256, 256, 512), (100, 2112, 512)]),
        "04_mma_sync": ptx_notebook(
            4, INTRO_04, PTX_04, ["mma.sync", "ldmatrix", "cp.async", "fma.rn.f32"], SASS_04,
            ["HMMA", "F2FP", "LDSM", "LDGSTS", "FFMA"], ["F2FP", "HMMA"], CHECK_NOTE_PTX,
            [(128, 256, 512), (100, 2112, 512), (300, 1000, 1024)]),
        "05_wgmma": ptx_notebook(
            5, INTRO_05, PTX_05, ["wgmma.fence", "wgmma.mma_async", "wgmma.commit_group", "wgmma.wait_group",
                                  "fence.proxy.async"],
            SASS_05, ["QGMMA", "WARPGROUP", "LDGSTS", "FFMA", "F2FP"], ["QGMMA", "WARPGROUP"], CHECK_NOTE_PTX,
            [(128, 256, 512), (100, 2112, 512), (300, 1000, 1024)]),
        "06_tma_pipeline": ptx_notebook(
            6, INTRO_06, PTX_06, ["cp.async.bulk.tensor", "mbarrier", "wgmma.mma_async"], SASS_06,
            ["UTMALDG", "SYNCS", "QGMMA", "FFMA"], ["UTMALDG", "SYNCS"], CHECK_NOTE_PTX,
            [(128, 256, 512), (100, 2112, 512), (300, 1000, 1024), (64, 7168, 1024)], extra=PLAN_06),
        "07_warp_specialization": generated_notebook(
            7, intro=INTRO_07, config_note=CONFIG_07, emitter_note=EMITTER_07,
            emitters=["gemm.kernel.producer.WarpgroupProducer.emit"],
            ptx_note=PTX_07, keywords=["setmaxnreg", "mbarrier.try_wait", "exit"], ptx_extra=PTX_EXTRA_07,
            sass_note=SASS_07, key_opcodes=["USETMAXREG", "UTMALDG", "SYNCS", "QGMMA", "FFMA"],
            sass_opcodes=["USETMAXREG"], opcodes_note=OPCODES_07, figures=RING_07, shapes_gpu=SHAPES_GPU_07),
        "08_persistent_tma_store": generated_notebook(
            8, intro=INTRO_08, config_note=CONFIG_08, emitter_note=EMITTER_08,
            emitters=["gemm.kernel.scheduler.TileScheduler.tiles", "gemm.kernel.epilogue.TmaEpilogue.store"],
            ptx_note=PTX_08, keywords=["div.u32", "%nctaid", "stmatrix", "cp.async.bulk.tensor.2d.global",
                                       "cp.async.bulk.wait_group"], ptx_extra=PTX_EXTRA_08,
            sass_note=SASS_08, key_opcodes=["UTMASTG", "STSM", "UTMALDG", "USETMAXREG", "STG", "QGMMA"],
            sass_opcodes=["UTMASTG", "STSM"], opcodes_note=OPCODES_08, figures=FIGURES_08,
            shapes_gpu=SHAPES_GPU_08, extra=ABLATION_08),
        "09_tma_multicast": generated_notebook(
            9, intro=INTRO_09, config_note=CONFIG_09, emitter_note=EMITTER_09,
            emitters=["gemm.kernel.scheduler.TileScheduler.pair_flags", "gemm.kernel.producer.Ring.load",
                      "gemm.kernel.generator._Kernel.release", "gemm.kernel.producer.WarpgroupProducer.emit"],
            ptx_note=PTX_09, keywords=["%cluster_ctarank", "barrier.cluster", ".multicast::cluster", "mapa",
                                       "mbarrier.arrive.shared::cluster", ".reqnctapercluster"],
            ptx_extra=PTX_EXTRA_09, sass_note=SASS_09,
            key_opcodes=["UTMALDG", "UCGABAR_ARV", "UCGABAR_WAIT", "SYNCS", "QGMMA", "FFMA"],
            sass_opcodes=["UTMALDG", "SYNCS", "UCGABAR_ARV", "UCGABAR_WAIT"], opcodes_note=OPCODES_09,
            opcode_families=["UCGABAR_ARV", "UCGABAR_WAIT", "MEMBAR", "ERRBAR", "CGAERRBAR", "CCTL"],
            figures=FIGURES_09, extra=MEASURED_09, shapes_gpu=SHAPES_GPU_09, check_note=CHECK_NOTE_09,
            emulator=emulator_cells(9)),
        "10_ffma_interleave": generated_notebook(
            10, intro=INTRO_10, config_note=CONFIG_10, emitter_note=EMITTER_10,
            emitters=["ptx.passes.interleave_ffma", "ptx.passes._select_deepgemm"],
            ptx_note=PTX_10, keywords=["mul.f32 %scale", "fma.rn.f32"], ptx_extra=PTX_EXTRA_10,
            sass_note=SASS_10, key_opcodes=["FFMA", "QGMMA", "UTMALDG", "UCGABAR_ARV"], sass_opcodes=["FFMA"],
            opcodes_note=OPCODES_10, figures=FIGURES_10, extra=MEASURED_10, shapes_gpu=SHAPES_GPU_10,
            check_note=CHECK_NOTE_10, check_code=CHECK_CODE_10, emulator=NUMERICS_10,
            cubin_code="stage.cubin(*SHAPE)",
            assembler="stage 09's PTX through standalone ptxas, then ptx.passes.interleave_ffma"),
    }
    for name, cells in books.items():
        number = int(name[:2])
        figures = figure_cells(number)
        timing = 2 if number else 0  # stages 01+ end with the timing note and cell
        if number in (4, 5, 6):  # hand-written PTX: run it in the emulator too, then break it
            figures += [*emulator_cells(number), *break_it_cells(number)]
        cells[len(cells) - timing:len(cells) - timing] = figures
        cells += exercise_cells(number)  # every stage notebook ends with its course exercise
    books["precision"] = precision_cells()
    books["moe_grouped"] = moe_cells()
    return {name: notebook(name, cells) for name, cells in books.items()}


def figure_cells(number: int) -> list[dict]:
    """The stage's committed figures (docs/figures/NN_*.png, drawn by lessons.figures; `python
    tools/make_figures.py` redraws them), shown as images so the cell costs nothing to run."""
    paths = sorted((ROOT / "docs" / "figures").glob(f"{number:02d}_*.png"))
    if not paths:
        return []
    links = "\n\n".join(f"![{p.stem}](../docs/figures/{p.name})" for p in paths)
    return [markdown(f"""\
## Figures

Drawn by `lessons.figures` from the layout functions this stage's kernel uses (`python tools/make_figures.py`
redraws them; docs/figures.md says what each shows):

{links}
""")]


# ------------------------------------------------------------------------------------------ stage texts

INTRO_00 = """\
# 00 · PTX from Python: an FP8 dequantization kernel

**The one idea:** a kernel can be *text that Python writes*. `generate(m, k)` builds PTX with
`ptx.builder.KernelBuilder` and the named idioms of `ptx.vocab`, with the shape substituted as constants;
`ptx.compile.compile_ptx` assembles it for `sm_90a` through nvJitLink (ptxas inside a pip wheel: no CUDA
toolkit, no GPU) and returns ptxas's resource report as data; `ptx.sass.disassemble` lists the SASS with
nvdisasm; `ptx.runtime.load_kernel(...).launch(...)` runs it with cuda-python. Every tensor-core stage of the
ladder takes this path.

The kernel is small and its answer exact: y = e4m3(x) · s per 1×128 group, in BF16, each thread handling
16 bytes. What to look for: how each PTX conversion becomes one SASS instruction —
`cvt.rn.f16x2.e4m3x2` (two FP8 values to two FP16 in one go) → `F2FP.F16.E4M3.UNPACK_B`, `cvt.f32.f16` →
`HADD2.F32`, `cvt.rn.bf16x2.f32` → `F2FP.BF16.F32.PACK_AB` — and the resource report, available before
anything runs.
"""

INTRO_01 = """\
# 01 · Naive: one thread per output, promotion from the start

**The one idea:** the fine-grained-scaled GEMM, written as plainly as possible. Thread (m, n) walks K in
groups of 128: it sums the 128 products of decoded e4m3 values in an FP32 *partial* sum, then adds
`partial · sA[m, g] · sB[n // 128, g]` to its FP32 total, and writes the total once, rounded to BF16.

That inner structure is DeepGEMM's *promotion* and it is in the contract from this first stage: the scale
changes every 128 elements of K, so no kernel can fold it into one long dot product. The tensor-core stages
keep exactly this loop nest; only where the partial sum is computed changes.

What to look for: the cost. Every FP8 byte of A is fetched by all N threads of its row and every byte of B
by all M threads of its column (through L1/L2), and each byte is decoded in software: this kernel is
bound by memory traffic and integer work, far from the math units.
"""

KERNEL_01 = """\
## The kernel

The stage's `@cuda.jit` functions, then the device-side e4m3 decode and BF16 encode the Numba stages share
(`lessons/numba_fp8.py`). An e4m3 byte is sign · 2^(e−7) · (1 + m/8) for exponent e > 0, and a subnormal
sign · 2^−6 · m/8 for e = 0; the byte 0x7F/0xFF is NaN and there is no infinity. BF16 output keeps the upper
16 bits of the FP32 total after rounding to nearest even.
"""

INTRO_02 = """\
# 02 · Shared-memory tiling

**The one idea:** threads that need the same data load it once, together. A block computes a tile of D;
for each 128-wide K group it first copies the slices of A and B that the tile needs into shared memory,
then every thread computes its partial sum from there. Each FP8 byte now leaves global memory once per
block instead of once per thread, and (in this implementation) is decoded once per block too, while
staging. The K tile is exactly one scale group, so the promotion boundary and the tile boundary coincide:
stage the group, synchronize, accumulate, promote, synchronize, next group.

**What changed vs 01:** where the operands come from. The arithmetic and the promotion are stage 01's.

What to look for: the two `cuda.syncthreads()` per K group (one before reading the tiles, one before the
next group overwrites them); coalesced staging (consecutive threads read consecutive bytes); how the tile
layout avoids shared-memory bank conflicts (a warp reading one address is a broadcast; 32 different rows of
a row-major tile would all hit the same bank unless the row pitch is padded). And what did not improve:
each thread still loads two shared-memory values per FMA, which is what stage 03 attacks.
"""

KERNEL_02 = """\
## The kernel

Shared tiles are declared with `cuda.shared.array` and sized by module constants (compile-time for Numba).
Each thread still owns one output; what moved is where its operands come from.
"""

INTRO_03 = """\
# 03 · Register tiling

**The one idea:** make every value read from shared memory feed many FMAs. Each thread computes a
micro-tile of outputs (here 8 rows × 8 columns) held in registers: per k it loads 8 values of A and 8 of B
and does 64 FFMAs with them, where stage 02 did one FFMA per two shared-memory loads.

**What changed vs 02:** a thread owns a micro-tile; the block tile grows (128 × 128 here) while the
shared-memory tile gets shallower in K (32), so one scale group now spans several tiles and the promotion
happens every few tiles rather than every tile; tiles are stored k-major so a thread's values along M or N
are contiguous (wide shared loads); and global loads are wide: 8 FP8 bytes per load, decoded while staging.

What to look for: the partial sums and totals as constant-size `cuda.local.array`s (Numba keeps them in
registers when their sizes are compile-time constants and every loop over them unrolls), the scale
product `sA·sB` computed once per row and column of the micro-tile per K group, and the register budget:
64 partials + 64 totals + the fragments is most of the 255 registers a thread may have, so one block per
SM, with latency hidden by 64 independent FFMAs rather than by occupancy.
"""

KERNEL_03 = """\
## The kernel

The staging helper, the kernel, and the promotion; compare the inner loop with stage 02's single FFMA.
"""

INTRO_04 = """\
# 04 · Warp-level tensor cores: `mma.sync` on e4m3, from raw PTX

**The one idea:** leave the CUDA cores for the tensor cores. One `mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32`
multiplies a 16×32 e4m3 fragment of A by a 32×8 fragment of B into a 16×8 FP32 accumulator held across the
32 threads of a warp. Tiles are staged in shared memory with 16-byte `cp.async` copies; the block tile is
split across warps; after each 128-wide K group the warp's accumulators (the partial sums) are scaled by
`sA·sB` and added into FP32 totals with FFMA: the promotion, unchanged.

**What changed vs 03:** the partial sum is computed by tensor cores from FP8 directly; no software decode.
From here on the kernels are PTX generated by Python (`generate(m, n, k)`), with the shape baked in.

What to look for: what the e4m3 `mma.sync` became in SASS. Hopper has no warp-level FP8 MMA: ptxas widens
the FP8 fragments to FP16 pairs (`F2FP.F16.E4M3.UNPACK_B`; 12 for an isolated m16n8k32, fewer per MMA here
because a fragment shared by several MMAs is widened once) and runs each `mma.sync` as two
`HMMA.16816.F32` (FP16 tensor-core MMAs, k = 16). This stage therefore runs at the FP16 tensor rate at best,
with conversions on the ALUs: compare the F2FP and HMMA counts below. Also: spills (must be 0), registers
(accumulators plus promoted totals) and the FFMA count, which is the promotion.
"""

PTX_04 = """\
## The generated PTX

An excerpt: the module header, then the first uses of the instructions that carry this stage's idea.
"""

SASS_04 = """\
## Resources and SASS

Assembled for `sm_90a` on the CPU. ptxas's report (registers per thread decide how many warps fit on an SM;
any spill is a bug here) and the SASS opcode counts, then the first tensor-core instructions as nvdisasm
prints them.
"""

INTRO_05 = """\
# 05 · Warpgroup tensor cores: `wgmma.mma_async`

**The one idea:** Hopper's native FP8 instruction. Four warps (a warpgroup, 128 threads) issue one
`wgmma.mma_async.m64nNk32.f32.e4m3.e4m3` whose operands are read *directly from shared memory* through
64-bit matrix descriptors (start address, leading/stride byte offsets, swizzle mode), asynchronously: the
warps issue, `wgmma.commit_group` closes the batch, and only after `wgmma.wait_group` may they read the
accumulators. Four k32 MMAs cover one 128-wide scale group; then the accumulators are promoted with FFMA,
exactly as before.

**What changed vs 04:** no `ldmatrix`, no A/B fragments in registers, no FP8→FP16 unpacking: QGMMA runs FP8
at full rate. The tiles must sit in shared memory in the 128-byte-swizzled layout the descriptor names,
and since wgmma reads shared memory through the *async proxy*, the threads that wrote a tile with
`cp.async` execute `fence.proxy.async` before the barrier that publishes it. Loads are still issued by
threads.

What to look for: `wgmma.fence` before the first MMA, the `commit_group`/`wait_group` pair, the proxy fence,
and in SASS the QGMMAs with the first of each group reading `RZ` as its accumulator: `scale-d = 0` starts a
fresh partial sum without zeroing 64 registers. Check also whether `wait_group 0` follows the commit at
once: then each warpgroup waits for its MMAs before promoting, and the tensor cores idle during its
FFMAs unless another warpgroup fills the gap.
"""

PTX_05 = PTX_04

SASS_05 = """\
## Resources and SASS

QGMMA is the FP8 warpgroup MMA (`QGMMA.64x128x32.F32.E4M3.E4M3`: 64×128 outputs, k = 32, FP32
accumulators, `gdesc` = the two shared-memory descriptors); `WARPGROUP.ARRIVE` / `WARPGROUP.DEPBAR` are what
`wgmma.fence` and `wgmma.wait_group` become. An m64n128 FP32 accumulator is 64 registers per thread and the
promoted totals need as many again: watch the register count. Compare the F2FP count with stage 04's: here
it is only the BF16 packing of the output.
"""

INTRO_06 = """\
# 06 · TMA and an mbarrier pipeline

**The one idea:** stop spending threads on loads. The Tensor Memory Accelerator copies a whole tile with
one instruction, `cp.async.bulk.tensor.2d`, described by a 128-byte tensor map built on the host
(`ptx.tensor_maps.tensor_map_2d`); the tile lands in shared memory already in the 128-byte-swizzled layout wgmma
reads, rows past M or N zero-filled, and the copy reports completion to an `mbarrier` by counting bytes. A
ring of S stages, each guarded by a *full* barrier (the producer arrives with `expect_tx` = the stage's byte
count; the TMA engine completes the transaction) and an *empty* barrier (each math warp arrives when its
MMAs on that stage are done), keeps the loads for the next groups in flight while the tensor cores work
on this one.

**What changed vs 05:** A and B tiles and A's scales arrive by TMA, issued by one thread; there is no
CTA-wide barrier left in the K loop, warps wait only for the bytes they need; the ring is as deep as the
shared-memory budget allows; the block shape follows the problem.

What to look for: UTMALDG (the TMA load) and the SYNCS family (mbarrier operations) in the SASS, the
transaction byte count per stage (A tile + B tile + scales), and the phase parity each wait checks, which
flips every time the ring wraps: waiting on the wrong parity is the classic deadlock (or silent race).
"""

PTX_06 = PTX_04

SASS_06 = """\
## Resources and SASS

`UTMALDG.2D` is a TMA tile load. The mbarrier operations are the SYNCS family: `SYNCS.EXCH.64` is
`mbarrier.init`, `SYNCS.ARRIVE.TRANS64` the producer's arrive-with-expected-bytes,
`SYNCS.PHASECHK.TRANS64.TRYWAIT` a `try_wait.parity` poll, and the plain consumer arrive shows up as
`SYNCS.ARRIVE.TRANS64.A1T0` (one arrival, zero bytes). The ring lives in dynamic shared memory (sized at
launch), so the static figure below stays 0.
"""


PLAN_06 = [
    markdown("""\
## The shared-memory plan

How deep the ring is follows from bytes: one stage holds an A tile, a B tile and BLOCK_M scales, and as many
stages as fit in 227 KiB (with two 8-byte mbarriers each, and 1 KiB of slack to align the ring to 1024 bytes at
run time) are used, up to 8. The block shape follows the problem, as
DeepGEMM's heuristics do: one math warpgroup (BLOCK_M = 64) for decode-sized M, and narrower BLOCK_N when
128-wide tiles would leave SMs idle."""),
    code('''\
for m, n, k in [(4096, 4096, 7168), (64, 7168, 16384), (128, 2112, 7168)]:
    plan = stage.Plan(m, n, k)
    barriers = plan.shared_bytes - plan.full_region - stage.ALIGN_SLACK  # a full and an empty mbarrier per stage
    terms = [plan.stages * plan.stage_bytes, barriers, stage.ALIGN_SLACK]
    assert sum(terms) == plan.shared_bytes  # the line below adds up
    print(f"M={m:5d} N={n:5d} K={k:5d}: block {plan.block_m}x{plan.block_n}, {plan.threads} threads, "
          f"{plan.grid[0] * plan.grid[1]} blocks for 132 SMs")
    print(f"    {plan.stages} stages x {plan.stage_bytes} B (A {plan.a_tile} + B {plan.b_tile} + A's scales "
          f"{plan.sa_tile}) + {plan.stages} x {barriers // plan.stages} B mbarriers + {stage.ALIGN_SLACK} B "
          f"alignment slack = {plan.shared_bytes} B")'''),
    markdown("""\
The BF16 epilogue needs no bytes of its own: it stages the output tile in the A tiles' space, free once the last
K block is computed. B's scales are read from global memory, one value per K group."""),
]


# ------------------------------------------------------------------------------------------ stages 07-08
# Generator stages: each is the previous stage's KernelConfig plus one change, so their notebooks show the
# change three ways (config fields, the emitter's source, the PTX/SASS it produced) before running it.

LADDER_SHAPE = (4096, 4096, 7168)

SPAN_HELPER = '''


def show_span(text, first, last, nth=0, after=0, width=118):
    """The lines from the nth one containing ``first`` (nth=-1: the last) to the next one containing ``last``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if first in line]
    ends = [i for i in range(starts[nth], len(lines)) if last in lines[i]] if starts else []
    if not ends:  # the generator's text moved on: say which marker, not an IndexError
        raise ValueError(f"no {first!r} ... {last!r} span in this PTX: update the markers in tools/make_notebooks.py")
    start, end = starts[nth], ends[0]
    for i in range(start, min(end + after + 1, len(lines))):
        line = lines[i] if len(lines[i]) <= width else lines[i][:width] + " ..."  # wgmma lines list 64 registers
        print(f"{i + 1:5d}  {line}")'''


def config_cells(number: int, note: str) -> list[dict]:
    return [
        markdown(note),
        code(f'''\
from lessons.diff_stages import config_changes

SHAPE = {LADDER_SHAPE!r}  # the ladder's (M, N, K)
config = stage.config(*SHAPE)
print(f"stage {number:02d}:", config.describe())
print(f"{{config.threads}} threads, {{stage.shared_bytes(*SHAPE)}} bytes of dynamic shared memory")
print()
print("gemm.kernel.KernelConfig fields that differ from stage {number - 1:02d}:")
for field, before, after in config_changes({number - 1}, {number}, *SHAPE):
    print(f"  {{field:14s}} {{before!r:>10}} -> {{after!r}}")'''),
    ]


def emitter_cells(note: str, targets: list[str]) -> list[dict]:
    """``targets``: dotted names of methods ("package.module.Class.method"), printed with inspect.getsource."""
    classes: dict[str, set[str]] = {}
    for target in targets:
        module, cls, _ = target.rsplit(".", 2)
        classes.setdefault(module, set()).add(cls)
    imports = "\n".join(f"from {module} import {', '.join(sorted(names))}" for module, names in classes.items())
    shows = "\n".join(f"print(inspect.getsource({'.'.join(t.rsplit('.', 2)[1:])}))" for t in targets)
    return [markdown(note), code(f"import inspect\n\n{imports}\n\n{shows}")]


def opcode_table_cells(number: int, note: str, families=()) -> list[dict]:
    more = "" if not families else f'''

# families outside the key list, counted on the same cubins
from lessons.diff_stages import stage_cubin
from ptx.sass import disassemble, opcode_counts

counted = [opcode_counts(disassemble(stage_cubin(s, *SHAPE))) for s in ({number - 1}, {number})]
for opcode in {list(families)!r}:
    before, after = (c.get(opcode, 0) for c in counted)
    print(f"{{opcode:12s}}{{before:10d}}{{after:10d}}" + ("  <-" if before != after else ""))'''
    return [
        markdown(note),
        code(f'''\
from lessons.diff_stages import opcode_table

print(f"{{'SASS family':12s}}{{'stage {number - 1:02d}':>10s}}{{'stage {number:02d}':>10s}}")
for opcode, before, after in opcode_table({number - 1}, {number}, *SHAPE):
    print(f"{{opcode:12s}}{{before:10d}}{{after:10d}}" + ("  <-" if before != after else ""))''' + more),
    ]


INTRO_07 = """\
# 07 · Warp specialization + `setmaxnreg`

**The one idea:** loading and computing are different jobs, so give them to different warps. In stage 06
thread 0 was both the producer and a math thread: it could refill a stage only between its own K blocks, so
the ring ran `stages - 2` blocks ahead, and its warpgroup's wgmmas waited while it issued copies. Now the
CTA has one more warpgroup, the **producer**. It hands registers back (`setmaxnreg.dec` to 40 per thread),
all but one of its threads exit, and the one left does nothing but wait for an *empty* stage and issue the
next K block's three TMA copies (A, B, A's scales) behind one `arrive.expect_tx` on the stage's *full*
barrier. The two **math warpgroups** take the registers (`setmaxnreg.inc` to 232) and, per K block: wait
*full*, issue four wgmmas, wait for them, **release the stage** (one arrival per warp on *empty*), and only
then promote with FFMA, so the copy into that stage overlaps the promotion.

**What changed vs 06:** two config fields that form one idea, `producer="warpgroup", registers=(40, 232)`.
Same blocks, same ring layout, same math; B's scales are read into shared memory once per tile.

Why move registers: an SM has 65,536 of them and the launch gives every thread the same count, at most
65,536 / 384 threads → 168. The math threads need more (64 accumulators + 64 promoted totals + addresses),
the producer thread needs a few dozen. `setmaxnreg` re-deals them per warpgroup after launch:
128 × 40 + 256 × 232 = 64,512 ≤ 65,536.

What to look for: `setmaxnreg` in the PTX and `USETMAXREG` in the SASS — ptxas honours it only when it
assembles the whole program, so `compile_ptx` sends this kernel through standalone ptxas instead of nvJitLink
(which compiles separately and drops it, warning C7504); the producer's first parity is 1 (a fresh
barrier passes a parity-1 wait at once, so the first round of stages needs no release); the release placed
before the FFMAs; and UTMALDG falling to 3 in SASS: one copy of each load in one producer loop, where stage
06 unrolled a prologue.
"""

CONFIG_07 = """\
## The config and its one change

Stage 07 is not hand-written: it is `gemm.kernel.KernelConfig` with stage 06's blocks and ring, plus the
change above, generated by the production generator (`gemm/kernel/`). `python -m lessons diff 6 7` prints this
table, the PTX diff and the SASS opcode table below. The stage count may differ from 06's when the new
layout needs other shared memory (here, the B scales of a tile).
"""

EMITTER_07 = """\
## The emitter that implements it

`WarpgroupProducer.emit` writes the producer warpgroup's body: give registers back, exit all but the leader,
then for every tile of this CTA and every K block wait on *empty* with the running parity, expect the stage's
bytes on *full*, issue the three copies, advance (stage, parity). The math side, with `setmaxnreg.inc` and the
release before the promotion, is `gemm.kernel.generator._Kernel.math_body`.
"""

PTX_07 = """\
## The generated PTX

The header, the key instructions, then the two roles in full: the math warpgroups' K-block loop up to the
release and the first promotion FFMAs, and the producer branch. Register names carry the generator's
counters; `python -m lessons diff 6 7` shows the same text as a diff against stage 06.
"""

PTX_EXTRA_07 = SPAN_HELPER + '''


print("\\nmath warpgroups, one K block: wait full -> 4 wgmmas -> wait -> release empty -> promote")
show_span(ptx_text, "$wait_full", "mbarrier.arrive.shared", after=3)
print("\\nthe producer warpgroup")
show_span(ptx_text, "setmaxnreg.dec", "bra $produce")'''

SASS_07 = """\
## Resources and SASS

ptxas's register count is what every thread gets at launch (65,536 / 384, rounded down to a multiple of 8);
`USETMAXREG.DEALLOC.CTAPOOL 0x28` gives the producer's down to 40 and `USETMAXREG.TRY_ALLOC.CTAPOOL 0xe8`
asks the CTA's pool for 232, retrying (the `UP0` predicate) until the producer's have been returned. This
kernel needs more than 232 registers nowhere, so no spills.
"""

OPCODES_07 = """\
## What changed in the SASS (`lessons diff 6 7`)

The key opcode families of both stages at the ladder's shape. USETMAXREG appears; UTMALDG falls because the
producer is one loop rather than an unrolled prologue plus a refill; the math itself (QGMMA, FFMA, F2FP) is
unchanged: this stage moves work between warps, it does not change the arithmetic.
"""

RING_07 = [
    markdown("""\
## The ring, over time

A schematic of S = 4 stages over 10 K blocks (durations are made up; the order and the parities are not).
The producer may load K block i into stage i mod 4 once the math warpgroups released K block i − 4 from it;
it polls the stage's *empty* barrier with parity `producer_wait_parity(i, S)`, which starts at 1 (a fresh
barrier counts as having completed the phase before phase 0). The math warpgroups poll *full* with the
parity of `pipeline_slot(i, S)`, which flips each time the ring wraps. Both come from `ptx.vocab.barriers`, the
same functions whose PTX the generator emits. Note the release *before* the promotion: the next copy
into the stage starts while the FFMAs run."""),
    code('''\
import matplotlib.pyplot as plt
from ptx.vocab.barriers import pipeline_slot, producer_wait_parity

S, K_BLOCKS = 4, 10
COPY, MMA, PROMOTE, ISSUE = 3.0, 1.0, 0.6, 0.2  # schematic durations (arbitrary units)
issue, arrive, start, release = [], [], [], []
for i in range(K_BLOCKS):
    # the producer needs stage i % S empty: released by K block i - S (the first S stages start empty)
    issue.append(max(issue[-1] + ISSUE if issue else 0.0, release[i - S] if i >= S else 0.0))
    arrive.append(issue[i] + COPY)
    # the math warpgroups need the bytes and their own previous block's promotion to be done
    start.append(max(arrive[i], release[i - 1] + PROMOTE if i else 0.0))
    release.append(start[i] + MMA)

print(" K block  stage  producer waits empty(parity)  math waits full(parity)")
for i in range(K_BLOCKS):
    slot, full_parity = pipeline_slot(i, S)
    print(f"{i:8d} {slot:6d} {producer_wait_parity(i, S):29d} {full_parity:24d}")

fig, ax = plt.subplots(figsize=(12, 3.6))
rows = {"producer": S + 1, **{f"stage {s}": S - s for s in range(S)}, "math FFMA": 0}
for i in range(K_BLOCKS):
    slot, full_parity = pipeline_slot(i, S)
    y = rows[f"stage {slot}"]
    ax.broken_barh([(issue[i], COPY)], (y - 0.35, 0.7), color="tab:blue", alpha=0.35)  # TMA in flight
    ax.broken_barh([(arrive[i], start[i] - arrive[i])], (y - 0.35, 0.7), color="0.85")  # full, not yet used
    ax.broken_barh([(start[i], MMA)], (y - 0.35, 0.7), color="tab:orange")  # wgmmas read the stage
    ax.text(issue[i] + 0.05, y, f"k{i}", va="center", fontsize=8)
    ax.text(start[i] + MMA / 2, y, f"full P{full_parity}", ha="center", va="center", fontsize=7)
    ax.plot(issue[i], rows["producer"], "v", color="tab:blue")
    label_y = rows["producer"] + (0.25 if i % 2 == 0 else 0.55)  # staggered: the first issues are close together
    ax.text(issue[i], label_y, f"E{producer_wait_parity(i, S)}", ha="center", fontsize=7)
    ax.broken_barh([(release[i], PROMOTE)], (rows["math FFMA"] - 0.35, 0.7), color="tab:green")
ax.set_yticks(list(rows.values()), list(rows))
ax.set_ylim(-0.7, S + 2.1)
ax.set_xlabel("time (schematic)")
ax.set_title("blue: TMA copy in flight, grey: stage full and waiting, orange: wgmmas (then release), "
             "green: promotion; E/P = parity waited on", fontsize=9)
plt.tight_layout()
plt.show()'''),
]

INTRO_08 = """\
# 08 · Persistent tile scheduler + TMA-store epilogue

**The one idea:** stop paying per tile for what only needs paying once per SM. Stage 07 launched one CTA per
128×128 output tile: every CTA initialised its barriers, waited for its first copies with the tensor cores
idle, and at the end had every warp store D while nothing else ran. Stage 08 launches one CTA per SM and
lets each walk the tiles: CTA c computes tiles c, c + grid, c + 2·grid, … Two changes make that pay:

* **a persistent, grouped schedule** (`gemm.kernel.scheduler`). The producer's (stage, parity) counters carry
  across tiles, so it loads the next tile's first K blocks while the math warpgroups finish this one. Tiles
  are numbered in groups of G n-blocks (n fastest inside a group), so the ~132 tiles in flight read few
  distinct rows of A and of B, and those stay in L2.
* **a TMA-store epilogue** (`gemm.kernel.epilogue.TmaEpilogue`). `stmatrix` writes each warp's BF16 fragments
  into a 128B-swizzled shared tile without bank conflicts, one thread issues one TMA store per 64-column
  atom, and nobody waits for it: the next tile's epilogue first waits until those stores have *read* the
  tile (`cp.async.bulk.wait_group.read 0`), so D drains while the next main loop runs.

**What changed vs 07:** `persistent=True, raster_group=G, epilogue="tma"` (the staged epilogue stays where
N % 8 ≠ 0: a TMA store needs 16-byte rows). This is two ideas in one stage, so it carries ablations: each
idea turned off on its own (`python -m lessons ablate 8`). It is also the production kernel's shape:
`gemm.fp8_gemm_nt` runs this generator with the heuristics' blocks.

What to look for: `%nctaid.x` (the grid size, the tile stride) and `div.u32`/`rem.u32` (the grouped order,
computed at run time because M is a parameter), `stmatrix`, `cp.async.bulk.tensor.2d.global` (the store,
SASS `UTMASTG`) with `commit_group`/`wait_group.read`, and in SASS `STSM` replacing the staged epilogue's
STS/LDS/STG.
"""

CONFIG_08 = """\
## The config and its one change

Stage 07's config with the schedule and the epilogue changed (the raster group G comes from
`gemm.heuristics.raster_group` for the block shape and this device's SM count). The ring may lose a stage:
the D tile now has its own shared region, since the ring is busy with the next tile while D is stored.
"""

EMITTER_08 = """\
## The emitters that implement it

`TileScheduler.tiles` is the tile walk each role runs (the producer and the math warpgroups each run their
own copy; a static schedule needs no communication): start at `%ctaid.x`, step by `%nctaid.x`, map the tile
number to (m0, n0). `TmaEpilogue.store` is the new epilogue: wait for the previous tile's stores to have read
the shared tile, `stmatrix` the BF16 values, fence the async proxy, one thread issues the TMA stores and
commits them as a bulk group.
"""

PTX_08 = """\
## The generated PTX

The key instructions, then the math warpgroups' tile loop head (the grouped tile → (m0, n0) map) and the
epilogue: the deferred wait, the first `stmatrix`, … the last one, the proxy fence, the TMA stores.
"""

PTX_EXTRA_08 = SPAN_HELPER + '''


print("\\nthe math warpgroups' tile walk")
show_span(ptx_text, "%ctaid.x", "mul.lo.u32 %n0")
print("\\nthe epilogue: deferred wait, stmatrix into the swizzled tile ...")
show_span(ptx_text, "cp.async.bulk.wait_group.read", "stmatrix")
print("    ... then the TMA stores")
show_span(ptx_text, "stmatrix", "cp.async.bulk.commit_group", nth=-1)'''

SASS_08 = """\
## Resources and SASS

`STSM.16.M88.4` is `stmatrix.x4` (four 8×8 matrices of 16-bit values per warp), `UTMASTG.2D` the TMA store,
`UTMACMDFLUSH` the `commit_group` and `DEPBAR.LE SB0` the bulk-group wait. The registers are 07's: the
schedule and the epilogue are cheap in registers; USETMAXREG is still there.
"""

OPCODES_08 = """\
## What changed in the SASS (`lessons diff 7 8`)

UTMASTG, STSM and DEPBAR appear; STG disappears (D leaves by TMA) and most STS/LDS with it (the staged
epilogue's shared round trip); BAR rises by the epilogue's named barriers. The math is untouched.
"""

FIGURES_08 = [
    markdown("""\
## The persistent schedule, drawn from the scheduler

`gemm.kernel.scheduler.schedule(cta, grid, m_blocks, n_blocks, raster_group)` is the tile walk the PTX
computes, in Python. Below: a 12 × 20 grid of tiles and 13 CTAs (a toy GPU), colored by the CTA that computes
each tile and labeled with its step (the step-0 tiles run together, then step 1, …). Boxed: the first wave,
the 13 tiles in flight at once. Row-major (G = 0) the wave is a strip across all of B's columns; grouped
(G = 4) it is a compact block, so it reads fewer A row blocks + B column blocks, and a neighbouring wave
re-reads what is still in L2."""),
    code('''\
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from gemm.heuristics import device_facts
from lessons.figures import tile_raster, wave_footprint  # the figure drawn from the scheduler's own functions

display(tile_raster(12, 20, 13, (0, 4)))

m_blocks, n_blocks = -(-SHAPE[0] // config.block_m), -(-SHAPE[1] // config.block_n)
grid = min(device_facts().sm_count, m_blocks * n_blocks)
print(f"the ladder's shape: {m_blocks} x {n_blocks} tiles on {grid} CTAs; A+B blocks read per wave: "
      f"row-major {wave_footprint(m_blocks, n_blocks, grid, 0):.1f}, "
      f"G = {config.raster_group} {wave_footprint(m_blocks, n_blocks, grid, config.raster_group):.1f}")'''),
    markdown("""\
## The D tile in shared memory, drawn from `d_tile_offset`

`stmatrix` writes 8×8 matrices of 16-bit values: 8 rows of one 8-column group, 16 bytes per row. Shared
memory serves 128 bytes per cycle as 8 chunks of 16 bytes (4 banks each); 8 rows that land in the same chunk
serialise 8 ways. The TMA store's 128-byte swizzle puts chunk c of row r at chunk c ⊕ (r mod 8), so the 8 rows
of any column group fill all 8 chunks. Below, the top-left 16 × 64 corner of the tile: which 16-byte chunk
of its 128-byte row each (row, 8-column group) occupies, without and with the swizzle;
`gemm.kernel.epilogue.d_tile_offset` is the function the emitted addresses and the emulator use. The boxes
are two of the 8×8 matrices `stmatrix` writes (an `.x4` writes four: two column groups × two row halves)."""),
    code('''\
from gemm.kernel.config import tma_store_box_columns
from gemm.kernel.epilogue import d_tile_offset

ROWS, GROUPS = 16, 8  # a 16 x 64 corner: 8-column groups of 16 bytes
row_bytes = 2 * tma_store_box_columns(config.block_n)  # one row of a 64-column BF16 atom: 128 bytes
swizzled = np.array([[d_tile_offset(r, 8 * g, config.block_m, config.block_n) % row_bytes // 16 for g in range(GROUPS)]
                     for r in range(ROWS)])
plain = np.tile(np.arange(GROUPS), (ROWS, 1))  # the same tile, row-major without the swizzle
fig, axes = plt.subplots(1, 2, figsize=(8, 5.5))
for ax, chunks, title in ((axes[0], plain, "row-major: 8-way conflicts"), (axes[1], swizzled, "128B swizzle")):
    ax.imshow(chunks, cmap=plt.get_cmap("tab10", 10), vmin=-0.5, vmax=9.5)
    for (r, g), chunk in np.ndenumerate(chunks):
        ax.text(g, r, chunk, ha="center", va="center", fontsize=8)
    for r0, g in ((0, 0), (8, 3)):  # two of the 8x8 matrices stmatrix writes
        ax.add_patch(Rectangle((g - 0.5, r0 - 0.5), 1, 8, fill=False, lw=2.5, ec="black"))
    ax.set_title(f"{title}\\n(number = 16-byte chunk of the row)", fontsize=10)
    ax.set_xlabel("8-column group (16 bytes of BF16)")
    ax.set_ylabel("row of D")
plt.tight_layout()
plt.show()
conflict_free = all(len(set(swizzled[r0:r0 + 8, g])) == 8 for r0 in range(0, ROWS, 8) for g in range(GROUPS))
print("every 8-row matrix of the swizzled tile covers 8 distinct chunks:", conflict_free)'''),
]

ABLATION_08 = [
    markdown("""\
## Ablations: each idea of this stage turned off on its own

`ABLATIONS` lists, per idea, the config change that undoes it. `python -m lessons ablate 8` checks and times
stage 07, stage 08 and each ablation on the same shape with the same timer (a Hopper GPU is needed) and
writes `results/ablation_08.json`, which this cell prints when it exists."""),
    code('''\
import json
from pathlib import Path

from lessons.ablate import ablation_configs

for label, change in stage.ABLATIONS.items():
    print(f"{label:24s} {change}")
print()
for name, ablated in ablation_configs(8, *SHAPE).items():
    print(f"  {name:32s} {ablated.describe()}")

ablation = Path(ROOT, "results", "ablation_08.json")
if ablation.exists():
    from gemm.testing.bench_configs import CONFIG_COLUMNS
    from gemm.testing.records import Column, format_table
    result = json.loads(ablation.read_text())
    print(f"\\nresults/ablation_08.json ({result['device'].get('name', '?')}, {result['date'][:10]}), "
          f"M={result['shape']['m']} N={result['shape']['n']} K={result['shape']['k']}:")
    print(format_table(CONFIG_COLUMNS + [Column("vs_stage", "vs stage 08", "{:.2f}x")], result["rows"]))
else:
    print("\\nNo results/ablation_08.json yet: on a Hopper GPU, python -m lessons ablate 8 writes it.")'''),
]

SHAPES_GPU_07 = [(128, 256, 512), (100, 2112, 512), (300, 1000, 1024), (100, 2111, 256), (64, 7168, 1024)]
# more tiles than SMs: every CTA walks several tiles, so the ring and the deferred store wait cross tiles
SHAPES_GPU_08 = SHAPES_GPU_07 + [(1000, 4096, 512)]


# ------------------------------------------------------------------------------------------ stages 09-10

SWEEP_HELPER = '''\
import json
from pathlib import Path
from statistics import median

NOISE = 0.01  # this notebook's threshold for "faster" or "slower"; a choice, not a measured noise figure


def show_sweep(name, command, ratios=None):
    """A tools/sweep_configs.py result: TFLOP/s per shape and config, then each ratio (config, baseline) per shape
    and over all shapes (min / median / max). ``ratios`` defaults to every config against the first."""
    path = Path(ROOT, "results", name)
    if not path.exists():
        print(f"No results/{name} yet. On a Hopper GPU this writes it:\\n    {command}")
        return None
    result = json.loads(path.read_text())
    names = result["configs"]
    ratios = [(a, b) for a, b in (ratios or [(c, names[0]) for c in names[1:]]) if a in names and b in names]
    print(f"results/{name}: {result['device'].get('name', '?')}, {result['date'][:10]}; {result.get('timing', '')}")
    for i, config in enumerate(names):
        print(f"  c{i} = {config}")
    label = {config: f"c{i}" for i, config in enumerate(names)}
    tflops = {((row["m"], row["n"], row["k"]), row["name"]): row["tflops"] for row in result["rows"]
              if row.get("status") == "ok" and row.get("tflops")}
    shapes = list(dict.fromkeys((row["m"], row["n"], row["k"]) for row in result["rows"]))
    print(f"\\n{'M':>6}{'N':>7}{'K':>7}" + "".join(f"{label[c] + ' TFLOP/s':>13}" for c in names)
          + "".join(f"{label[a] + '/' + label[b]:>10}" for a, b in ratios))
    per_ratio = {pair: [] for pair in ratios}
    for shape in shapes:
        line = f"{shape[0]:6d}{shape[1]:7d}{shape[2]:7d}"
        line += "".join(f"{tflops[shape, c]:13.1f}" if (shape, c) in tflops else f"{'-':>13}" for c in names)
        for a, b in ratios:
            if (shape, a) in tflops and (shape, b) in tflops:
                per_ratio[a, b].append((tflops[shape, a] / tflops[shape, b], shape))
                line += f"{per_ratio[a, b][-1][0]:9.3f}x"
            else:
                line += f"{'-':>10}"
        print(line)
    print()
    for (a, b), values in per_ratio.items():
        if not values:
            continue
        ratio = [v for v, _ in values]
        (low, low_shape), (high, high_shape), middle = min(values), max(values), median(ratio)
        verdict = ("no gain: the median is within the threshold" if abs(middle - 1) <= NOISE
                   else "a gain" if middle > 1 else "a loss")
        print(f"{label[a]}/{label[b]} over {len(values)} shapes: min {low:.3f}x {low_shape}, median {middle:.3f}x, "
              f"max {high:.3f}x {high_shape}")
        print(f"    faster by more than {NOISE:.0%} on {sum(r > 1 + NOISE for r in ratio)}, slower by more than "
              f"{NOISE:.0%} on {sum(r < 1 - NOISE for r in ratio)}: {verdict}")
    return per_ratio'''

MULTICAST_COMMAND = ('python tools/sweep_configs.py "4096,4096,7168;4096,7168,16384;4096,2112,7168" production '
                     '"production:multicast=2" stage08 stage09 --json results/multicast.json')
FFMA_COMMAND = ('python tools/sweep_configs.py bench production "production:post_passes=(\'ffma_deepgemm\',)" '
                '"production:post_passes=(\'ffma_every_other\',)" --json results/ffma_pass.json')

INTRO_09 = """\
# 09 · TMA multicast across 2-CTA clusters

**The one idea:** two SMs that need the same bytes should fetch them once. In stage 08's grouped order,
consecutive tiles are neighbours along N, so tiles 2i and 2i + 1 usually read the same rows of A. Launch the
persistent grid in *clusters* of two CTAs (`.reqnctapercluster 2, 1, 1`): CTAs 2c and 2c + 1 run on two SMs of
one GPC and, since the grid is even, walk tiles 2i and 2i + 1 side by side. Then the pair needs A (and A's
scales) once. Four things make that safe:

* **issue**: rank 0's producer loads A with `cp.async.bulk.tensor ... .multicast::cluster` and CTA mask 0b11: the
  box lands at the same shared-memory offset in both CTAs and completes its bytes on the *full* barrier at the
  same offset in each. Rank 1 issues only B; its full barrier still expects A's bytes, which come from rank 0.
* **release**: rank 0's next multicast overwrites the stage in *both* CTAs, so a stage may be refilled only when
  both CTAs' math warps are done with it. Every *empty* barrier counts the math warps of both CTAs, and each
  warp releases twice: lane 0 on CTA 0's barrier, lane 1 on CTA 1's, the address translated into the peer's
  shared memory by `mapa` and signalled with `mbarrier.arrive.shared::cluster`.
* **agreement**: both CTAs compute, from the pair's first tile, whether the peer has a tile at this step and
  whether the two tiles share their rows. A pair split by a row or group edge, or an odd last tile, loads A
  without multicast, and a CTA without a peer sends both releases to itself. Both sides compute the same flags,
  so nobody waits for bytes that are never sent.
* **start and end**: a cluster barrier after the barriers are initialised (the peer must not arrive on a barrier
  that does not exist yet) and, before exit, each producer drains its ring (waits for the last `stages`
  releases) and the cluster meets again, so no remote arrive or multicast lands in a CTA that has exited.

**What changed vs 08:** `multicast=2` wherever stage 08 is persistent (a one-CTA-per-tile grid has no walk to
pair). Per K block a tile reads BLOCK_M rows of A and BLOCK_N rows of B from L2; a pair sharing rows now reads
A once for both. Stage 08's profile (`results/ncu_08_4096x4096x7168.txt`, summarised in docs/ladder.md) is
where to look for how busy L2 was before.

What to look for: the cluster header and `%cluster_ctarank`; the two cluster barriers; the predicated loads
(`@%p_own_a` plain, `@%p_lead_a` multicast); `mapa` + the cluster-scope arrive in the release; in SASS
`UTMALDG.2D.MULTICAST`, `SYNCS.ARRIVE.TRANS64.RED` (the remote arrive) and `UCGABAR_ARV` / `UCGABAR_WAIT`
(the cluster barrier).
"""

CONFIG_09 = """\
## The config and its one change

Stage 08's config plus `multicast=2`. Blocks, ring depth and the shared-memory plan are 08's: the barriers only
count more arrivals. `gemm.kernel.config.KernelConfig` refuses multicast without a producer warpgroup and a
persistent walk, since the pairing *is* the walk.
"""

EMITTER_09 = """\
## The emitters that implement it

Four places, one per rule above. `TileScheduler.pair_flags` is the agreement (both roles of both CTAs run it
on the same tile numbers); `Ring.load` is the issue (own A, or multicast by the leader, then B);
`_Kernel.release` is a math warp's release (local, or lanes 0 and 1 to CTA 0 and CTA 1); and the end of
`WarpgroupProducer.emit` is the drain. The cluster barriers themselves are in `_Kernel.setup` and
`_Kernel.warp_specialized_body`.
"""

PTX_09 = """\
## The generated PTX

The key instructions, then the four places in order: the start (barrier init fenced at cluster scope, the rank,
the first cluster barrier), the producer's pair flags and one K block's loads, a math warp's release, and the
end (the drain, one wait per stage, then the cluster barrier).
"""

PTX_EXTRA_09 = SPAN_HELPER + '''


print("\\nstart: barriers initialised, then both CTAs meet before anyone arrives remotely")
show_span(ptx_text, "fence.mbarrier_init", "barrier.cluster.wait")
print("\\nthe producer's pair flags for a tile (the math warpgroups run the same rule) ...")
show_span(ptx_text, "setp.lt.u32 %p_peer", "mov.b16 %cta_mask", nth=-1)
print("    ... and one K block: own A (or rank 0 multicasts it), then B")
show_span(ptx_text, "mbarrier.arrive.expect_tx", "[%tmap_b")
print("\\na math warp's release: lane l targets CTA l when there is a peer, else its own CTA ...")
show_span(ptx_text, "selp.u32 %release_rank", "selp.u32 %release_rank")
print("    ... mapa translates the empty barrier's address into that CTA's shared memory")
show_span(ptx_text, "bar.warp.sync", "mbarrier.arrive.shared::cluster")
print("\\nend: the producer drains its ring (the first of its waits) ...")
show_span(ptx_text, "$drain_empty", "bra $drain_empty")
print("    ... and the cluster meets again before exit")
show_span(ptx_text, "$end", "ret;", nth=-1)'''

SASS_09 = """\
## Resources and SASS

`UTMALDG.2D.MULTICAST` is the multicast load (its last operand is the CTA mask); the plain `UTMALDG.2D` loads of
A stay for pairs that do not share rows. `SYNCS.ARRIVE.TRANS64.RED.A1T0` is the release through `mapa`: an
arrive on a barrier addressed in the cluster's shared window, possibly the peer's. `UCGABAR_ARV` /
`UCGABAR_WAIT` are `barrier.cluster.arrive` / `.wait` (CGA, "cooperative grid array", is the hardware's name for
a cluster), each arrive after the fences its `.release` asks for and each wait followed by the cache invalidation
its `.acquire` asks for. More `SYNCS.PHASECHK` polls: the drain.
"""

OPCODES_09 = """\
## What changed in the SASS (`lessons diff 8 9`)

UTMALDG rises (the multicast copies of A and its scales beside the plain ones), SYNCS rises (the remote release
and the drain's waits); the math (QGMMA, FFMA, F2FP) is untouched. The second table counts families the key
list does not include: the cluster barrier and the fences around it, absent from stage 08.
"""

SHAPES_GPU_09 = SHAPES_GPU_08 + [(1100, 2112, 512), (300, 4000, 512)]  # split pairs and a CTA without a peer

CHECK_NOTE_09 = """\
## Is it right?

On a Hopper GPU: fresh random operands, NaN-poisoned output, `diff` against the float64 reference (a correct
kernel lands near 1e-6; the pass mark is 1e-3), on stage 08's shapes plus two whose walks contain every case
of the agreement: at 1100 × 2112 × 512 and 300 × 4000 × 512 some pairs straddle a row edge (each CTA loads its
own A) and the tile count is odd (the last CTA has no peer and releases to itself). A disagreement between the
two CTAs would not show as a wrong number but as a hang. Without a GPU this cell only says so.
"""

FIGURES_09 = [
    markdown("""\
## Which tiles share A, drawn from the scheduler

`schedule(cta, grid, m_blocks, n_blocks, raster_group)` is each CTA's walk; in a cluster, CTAs 2c and 2c + 1
walk theirs side by side, so at step j they hold tiles t and t + 1. Below, each tile is colored by its cluster
(lighter: rank 1) and labeled rank·step. Boxed pairs share their m block: A is multicast. A dashed link is a pair
whose tiles sit in different rows (each CTA loads its own A); a dotted box is a CTA whose peer has no tile at
that step. Left: 6 × 10 tiles on 8 CTAs (4 clusters), G = 4, where every pair shares rows. Right: 5 × 9 tiles,
same grid and G: the last group is one n-block wide, so its pairs are vertical, and the tile count is odd."""),
    code('''\
from gemm.heuristics import device_facts
from gemm.kernel.launch import grid as launch_grid
from lessons.figures import census, cluster_multicast, cluster_steps  # pair_flags' rule, drawn

display(cluster_multicast(((6, 10), (5, 9)), grid=8, group=4))

# The same census for this stage's config on the ladder's shape: how many A loads the pairs save.
m_blocks, n_blocks = -(-SHAPE[0] // config.block_m), -(-SHAPE[1] // config.block_n)
ctas = launch_grid(config, SHAPE[0], SHAPE[1], device_facts().sm_count)
shared, split, lone = census(cluster_steps(ctas, m_blocks, n_blocks, config.raster_group))
tiles = m_blocks * n_blocks
rows_before = tiles * (config.block_m + config.block_n)  # rows of A and B fed from L2 per K block, all tiles
rows_after = rows_before - shared * config.block_m
print(f"the ladder's shape: {tiles} tiles on {ctas} CTAs ({ctas // 2} clusters, G = {config.raster_group}): "
      f"{shared} pairs share A, {split} split, lone CTA steps: {lone}")
print(f"rows read from L2 per K block, summed over the tiles: {rows_before} -> {rows_after} "
      f"({rows_after / rows_before:.2f}x; A alone: {(tiles - shared) / tiles:.2f}x)")'''),
]

MEASURED_09 = [
    markdown("""\
## Measured: gain or no gain, the honest result

`tools/sweep_configs.py` checks and times named configs with the one kernel timer: the production config with
and without `multicast=2`, and stages 08 and 09 (128 × 128 tiles) on three large shapes. The cell prints the
result when `results/multicast.json` exists, and otherwise the command that writes it."""),
    code(SWEEP_HELPER + f'''


show_sweep("multicast.json", {MULTICAST_COMMAND!r},
           ratios=[("production:multicast=2", "production"), ("stage09", "stage08")])

from gemm.heuristics import choose_config
print(f"\\nthe production heuristics' config at {{SHAPE}}: {{choose_config(*SHAPE).describe()}}")'''),
    markdown("""\
## Reading the result

Multicast trades L2 traffic for coupling. What it saves is printed under the figure above: the rows of A the
pairs no longer read. What it costs is not in any count: each stage is refilled only after the slower of two CTAs
released it, rank 1's A arrives when rank 0's producer gets to it, and the cluster barriers at start and end.
If L2 was not what limited stage 08, the saving buys nothing and the coupling remains, so a ratio below 1 is a
possible honest outcome; the profile of stage 08 (`results/ncu_08_4096x4096x7168.txt`) is the evidence to read
next to it. The production heuristics' choice is printed above (`A multicast` appears in it only when it is on);
docs/benchmarks.md keeps the table, regenerated from the same file."""),
]

INTRO_10 = """\
# 10 · FFMA interleave: a pass over the machine code

**The one idea:** some of what makes a kernel fast exists only in SASS. Every 128-bit Hopper instruction carries
control bits next to its opcode: stall counts, dependency barriers, a *yield* hint (the warp scheduler may switch
to another warp after this instruction) and operand *reuse* flags (keep a source register in the operand cache
for the next instruction). PTX cannot set them; ptxas does. DeepGEMM found that letting every other promotion
FFMA yield, and dropping the reuse flag of its scale register (a warp that yields cannot count on the cache),
lets one math warpgroup's FFMAs interleave with the other's wgmmas, and patched its cubins after compilation.
Stage 10 is that patch as a cubin → cubin pass, `ptx.passes.interleave_ffma`:

* find the runs of ≥ 8 consecutive FFMAs in the listing (`ffma_runs`, on nvdisasm's output with encodings);
* choose FFMAs by a rule: `deepgemm` (in the first 9/16 of a run, an FFMA whose Rb keeps reuse is flipped when
  its Rb is new in the run, or when the previous FFMA kept reuse on the same Rb) or `every_other`;
* clear two bits of each chosen FFMA's high word, `FLIP_MASK`: bit 45, the *inverted* yield flag (0 = yield,
  `is_yield`), and bit 59, the reuse flag of the second source Rb (`reuse_b`);
* write the cubin back and disassemble it again: same instructions, same text but `.reuse`, no other byte moved.

**What changed vs 09:** `post_passes=("ffma_deepgemm",)`. The PTX is stage 09's, line for line; only the cubin
differs.

What to look for: how many FFMAs yield *before* the pass. The ptxas this repository uses already emits the
alternating yield / no-reuse pattern for CTAs of more than 8 warps (the 384-thread kernels) and none for 8 warps
or fewer, so the rule finds little to flip on the ladder's kernel and more on a one-math-warpgroup kernel. Then
the measured table: whether the flips are worth anything on this GPU.
"""

CONFIG_10 = """\
## The config and its one change

Stage 09's config plus a post-pass. `gemm.kernel.launch.cubin` assembles the PTX and then applies each name in
`post_passes` (here DeepGEMM's rule); `stage.cubin(m, n, k)` is that cubin, and it is what `stage.gemm` loads.
"""

EMITTER_10 = """\
## The "emitter": a pass over the cubin

Nothing in the generator changed. The pass, `interleave_ffma`: disassemble once, find the runs, choose the
FFMAs, patch their encodings, then `verify_patch` disassembles the new image and compares it with the old one
instruction by instruction and byte by byte. The rule, `_select_deepgemm`, is a dozen lines.
"""

PTX_10 = """\
## The generated PTX

Stage 09's text: the promotion is a scale product (`mul.f32`) and one `fma.rn.f32` per accumulator, which
ptxas turns into the FFMAs the pass edits. The diff against stage 09 is empty: the pass works below PTX.
"""

PTX_EXTRA_10 = '''

from lessons.diff_stages import ptx_diff

print("\\nPTX diff against stage 09 (instructions, register numbers ignored):", ptx_diff(9, 10, *SHAPE) or "none")'''

SASS_10 = """\
## Resources and SASS

The cubin that runs: stage 09's PTX assembled by ptxas, then the pass (`stage.cubin`). Registers and opcode
counts are stage 09's, necessarily: the pass changes no instruction, only two bits of some. nvdisasm prints the
reuse flag (`.reuse` on an operand) but not the yield bit; `is_yield` reads it from the encoding.
"""

OPCODES_10 = """\
## What changed in the SASS (`lessons diff 9 10`)

Every family's count is stage 09's. The one row that can move is the last, "FFMA yield": the FFMAs whose
yield bit is on.
"""

FIGURES_10 = [
    markdown("""\
## The bits, before and after

Stage 09's cubin (what ptxas wrote) and stage 10's (the same after the pass), disassembled with encodings.
First the runs the pass looks at and the first 12 FFMAs of the run it changed, with the yield bit (Y) and the Rb
reuse bit (R) side by side; then the counts on the ladder's shape (two math warpgroups, 384 threads) and on a
decode shape (M = 64: one math warpgroup, 256 threads)."""),
    code('''\
from lessons.diff_stages import stage_cubin
from ptx.passes import FLIP_MASK, count_yielding_ffma, ffma_runs, is_yield, reuse_b

before = disassemble(stage_cubin(9, *SHAPE))  # stage 09: what ptxas wrote
after = instructions  # stage 10: the same cubin after the pass (the SASS cell above)
runs = list(zip(ffma_runs(before), ffma_runs(after)))
changed = [i for i, (old, new) in enumerate(runs) if any(x.encoding != y.encoding for x, y in zip(old, new))]
shown = changed[0] if changed else 0
print(f"{len(runs)} runs of >= 8 consecutive FFMAs, of lengths {[len(old) for old, _ in runs]}; "
      f"the pass changed run(s) {changed}")
print(f"\\nrun {shown}, first 12 FFMAs (Y = yields, R = Rb kept in the reuse cache; . = bit off)")
print(f"{'offset':>8}  {'instruction (stage 09)':40s} 09: Y R   10: Y R")
bit = lambda on: "1" if on else "."
for old, new in list(zip(*runs[shown]))[:12]:
    flipped = old.encoding ^ new.encoding
    note = f"  <- high-word bits {flipped >> 64:#018x} (FLIP_MASK)" if flipped else ""
    print(f"{old.offset:8x}  {old.text:40s}     {bit(is_yield(old.encoding))} {bit(reuse_b(old.encoding))}"
          f"       {bit(is_yield(new.encoding))} {bit(reuse_b(new.encoding))}{note}")
    assert not flipped or flipped >> 64 == FLIP_MASK

DECODE = (64, 7168, 16384)  # one math warpgroup: at most 8 warps per CTA
listings = {SHAPE: (before, after), DECODE: (disassemble(stage_cubin(9, *DECODE)), disassemble(stage.cubin(*DECODE)))}
print()
for (m, n, k), (old, new) in listings.items():
    threads = stage.config(m, n, k).threads
    (yield_before, total), (yield_after, _) = count_yielding_ffma(old), count_yielding_ffma(new)
    print(f"M={m:5d} N={n:5d} K={k:5d}, {threads} threads ({threads // 32} warps): "
          f"{yield_before} of {total} FFMAs yield before the pass, {yield_after} after")'''),
    markdown("""\
## Yield and reuse along the kernel's FFMAs

Every FFMA of each kernel in listing order, one column each: the yield bit and the Rb-reuse bit, before (09) and
after (10) the pass. Red boxes: the FFMAs the pass flipped. The bars underneath are the runs the rule walks (the
first 9/16 of each is where DeepGEMM's rule may flip). On the ladder's kernel ptxas already alternates: a
yielding FFMA never keeps reuse."""),
    code('''\
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

fig, axes = plt.subplots(len(listings), 1, figsize=(14, 2.3 * len(listings)), squeeze=False)
ON = {"yield": np.array([0.17, 0.63, 0.17]), "reuse": np.array([1.0, 0.5, 0.05])}
for ax, ((m, n, k), (old, new)) in zip(axes[:, 0], listings.items()):
    ffma_old = [i for i in old if i.opcode == "FFMA"]
    ffma_new = [i for i in new if i.opcode == "FFMA"]
    column = {(i.function, i.offset): c for c, i in enumerate(ffma_old)}
    rows = [("yield, 09", "yield", ffma_old, is_yield), ("yield, 10", "yield", ffma_new, is_yield),
            ("Rb reuse, 09", "reuse", ffma_old, reuse_b), ("Rb reuse, 10", "reuse", ffma_new, reuse_b)]
    image = np.full((len(rows), len(ffma_old), 3), 0.93)
    for r, (_, kind, listing, bit_of) in enumerate(rows):
        for c, ins in enumerate(listing):
            if bit_of(ins.encoding):
                image[r, c] = ON[kind]
    ax.imshow(image, aspect="auto", extent=(-0.5, len(ffma_old) - 0.5, len(rows) - 0.5, -0.5))
    ax.vlines(np.arange(len(ffma_old) - 1) + 0.5, -0.5, len(rows) - 0.5, color="white", lw=0.8)  # one cell each
    ax.hlines(np.arange(len(rows) - 1) + 0.5, -0.5, len(ffma_old) - 0.5, color="white", lw=0.8)
    for c, (x, y) in enumerate(zip(ffma_old, ffma_new)):
        if x.encoding != y.encoding:
            ax.add_patch(Rectangle((c - 0.5, -0.5), 1, len(rows), fill=False, lw=2, ec="red"))
    for run in ffma_runs(old):
        first, last = column[run[0].function, run[0].offset], column[run[-1].function, run[-1].offset]
        ax.plot([first - 0.4, last + 0.4], [len(rows) - 0.3] * 2, color="black", lw=3, clip_on=False)
        ax.plot([first - 0.4, first - 0.4 + len(run) * 9 // 16], [len(rows) - 0.15] * 2, color="0.5", lw=2,
                clip_on=False)
    ax.set_yticks(range(len(rows)), [label for label, *_ in rows])
    ax.set_xticks(range(0, len(ffma_old), 8))
    threads = stage.config(m, n, k).threads
    ax.set_title(f"M={m} N={n} K={k}, {threads} threads: {len(ffma_old)} FFMAs in listing order "
                 f"(green: yields, orange: keeps Rb; red box: flipped)", fontsize=10)
axes[-1, 0].set_xlabel("FFMA index in the kernel (black bar: a run; grey: its first 9/16)")
plt.tight_layout()
plt.show()'''),
]

MEASURED_10 = [
    markdown("""\
## Measured: gain or no gain, the honest result

`results/ffma_pass.json`: every benchmark shape (the 18 DeepSeek shapes and 8192³) with the production config
as it is (c0), with DeepGEMM's rule applied to its cubin (c1) and with every other promotion FFMA yielding (c2),
each checked against the float64 reference and timed with the one kernel timer. Per shape, TFLOP/s and the
ratios to c0; then over all shapes the smallest, median and largest ratio."""),
    code(SWEEP_HELPER + f'''


show_sweep("ffma_pass.json", {FFMA_COMMAND!r})

from gemm.heuristics import choose_config
print(f"\\npasses the production heuristics apply now: {{choose_config(*SHAPE).post_passes or 'none'}}")'''),
    markdown("""\
## Reading the result

Read the median first, then the extremes: each ratio comes from one timing per config and shape, so a single
shape mixes the pass's effect with run-to-run variation, and an outlier is a reason to time that shape again
(`python tools/sweep_configs.py M,N,K ...`), not a conclusion. The counts earlier say what to expect. On the
two-math-warpgroup kernels (the large-M rows) ptxas already lets half the promotion FFMAs yield, the pattern
DeepGEMM had to patch in; its rule then changes one or two FFMAs, and a ratio near 1 is the expected result.
`every_other` changes more than ptxas chose (more yields, fewer reused operands), so its rows show what
*adding* yields to ptxas's pattern does. On one-math-warpgroup kernels ptxas emits no yields and the rule sets
some, but there is no second math warpgroup whose wgmmas the FFMAs could interleave with.

So the stage stays in the ladder for what it teaches: SASS has state that PTX cannot express, a pass over the
cubin can set it, and re-disassembly proves it touched nothing else. Whether it pays is a measurement per
toolchain and GPU, which is why production applies it only on request (`FP8LADDER_FFMA_INTERLEAVE`), and the
table in docs/benchmarks.md is regenerated from the same file."""),
]

NUMERICS_10 = [
    markdown("""\
## Numerics: unchanged by construction

The CPU emulator runs PTX, and stage 10's PTX is stage 09's: emulating it is emulating stage 09 (notebook 09).
What differs is machine code, and only in scheduling hints: yield says when the scheduler may switch warps,
reuse whether an operand comes from the operand cache or the register file. Neither changes which instruction
runs on which values, so every rounding is the same and D is bit-identical. The pass checks this itself
(`verify_patch`); the cell below repeats it on the two cubins, and on a Hopper GPU the next section compares
stage 10's output with stage 09's bit for bit."""),
    code('''\
from lessons.diff_stages import ptx_diff

assert not ptx_diff(9, 10, *SHAPE), "stage 10 must be stage 09's PTX"
assert [(i.function, i.offset, i.opcode) for i in before] == [(i.function, i.offset, i.opcode) for i in after]
moved = [(old, new) for old, new in zip(before, after) if old.encoding != new.encoding]
for old, new in moved:
    assert old.opcode == "FFMA" and (old.encoding ^ new.encoding) & ~(FLIP_MASK << 64) == 0, old.text
image_before, image_after = stage_cubin(9, *SHAPE).image, cubin.image
print("PTX: identical to stage 09")
print(f"SASS: {len(after)} instructions, same opcodes and operands; {len(moved)} changed, all FFMAs, only in "
      f"the yield and Rb-reuse bits")
print(f"cubin: {len(image_after)} bytes (stage 09: {len(image_before)}), "
      f"{sum(x != y for x, y in zip(image_before, image_after))} of them differ")'''),
]

SHAPES_GPU_10 = SHAPES_GPU_09

CHECK_NOTE_10 = """\
## Is it right?

On a Hopper GPU: stage 09's checks (fresh operands, NaN-poisoned output, `diff` against the float64 reference on
ragged shapes), and for each shape the same inputs through stage 09 and stage 10, whose outputs must be equal
bit for bit: the pass changes scheduling, not arithmetic. Without a GPU this cell only says so.
"""

CHECK_CODE_10 = f'''\
if is_hopper():
    for m, n, k in {SHAPES_GPU_10!r}:
        check(m, n, k)
        inputs = to_device(*random_problem(m, n, k))
        outputs = []
        for module in (lessons.stage(9), stage):
            d = cuda.to_device(np.full((m, n), BF16_NAN, np.uint16))
            module.gemm(*inputs, d)
            cuda.synchronize()
            outputs.append(d.copy_to_host())
        print(f"    stage 10 bit-identical to stage 09: {{np.array_equal(*outputs)}}")
        assert np.array_equal(*outputs), "the pass changed the numbers"
else:
    print("Running this kernel needs a Hopper GPU (sm_90a); above, it was assembled, passed and disassembled on "
          "the CPU.")'''


def generated_notebook(number: int, *, intro, config_note, emitter_note, emitters, ptx_note, keywords,
                       ptx_extra, sass_note, key_opcodes, sass_opcodes, opcodes_note, figures, shapes_gpu,
                       extra=(), check_note=None, emulator=None, opcode_families=(),
                       cubin_code="compile_ptx(ptx_text)", check_code=None,
                       assembler="setmaxnreg inside: standalone ptxas, whole-program (ptx/compile.py says why)"
                       ) -> list[dict]:
    """``emulator``: the cells that replace the standard emulator run; ``opcode_families``: SASS families the key
    opcode table does not list but this stage's change brings in."""
    return ptx_notebook(
        number, intro, ptx_note, keywords, sass_note, key_opcodes, sass_opcodes, check_note or CHECK_NOTE_GENERATED,
        shapes_gpu,
        before=[*config_cells(number, config_note), *emitter_cells(emitter_note, emitters)],
        extra=[*opcode_table_cells(number, opcodes_note, opcode_families), *figures, *extra,
               *(emulator if emulator is not None else emulator_cells(number)), *break_it_cells(number)],
        ptx_extra=ptx_extra,
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the ladder's shape.",
        assembler=assembler, cubin_code=cubin_code, check_code=check_code)


CHECK_NOTE_GENERATED = """\
## Is it right?

On a Hopper GPU: fresh random operands, NaN-poisoned output, `diff` against the float64 reference (a correct
kernel lands near 1e-6, the BF16 rounding of the output; the pass mark is 1e-3), on ragged shapes: M not a
multiple of the block, N = 2112, N = 2111 (no 16-byte rows: stage 08 keeps the staged epilogue there), and for
stage 08 a shape with more tiles than SMs, so each CTA walks several tiles and the ring's parities and the
deferred store wait cross tile boundaries. The config is chosen per shape (`stage.config(m, n, k)`), as the
ladder does. Without a GPU this cell only says so.
"""


def ptx_dequant_cells() -> list[dict]:
    return [
        markdown(INTRO_00),
        code(setup_cell(0)),
        markdown("## The generated PTX\n\nThe header, then the first lines of each step: load 16 bytes, "
                 "convert pairs, scale, pack to BF16, store."),
        code(PTX_HELPERS + '''\


ptx_text = stage.generate(4096, 7168)  # (M, K) baked in
show_excerpt(ptx_text, ["ld.global", "cvt.rn.f16x2.e4m3x2", "cvt.f32.f16", "mul.rn.f32", "cvt.rn.bf16x2.f32",
                        "st.global"], per_keyword=2)'''),
        markdown("## Resources and SASS\n\nAssembled for `sm_90a` on this machine, GPU or not. Count the "
                 "conversions: 8 unpacks (16 FP8 bytes → 16 FP16) and 8 packs (16 FP32 → 16 BF16) per thread."),
        code('''\
cubin = compile_ptx(ptx_text)
instructions = show_resources(cubin, ["F2FP", "HADD2", "FMUL", "LDG", "STG"])
show_sass(instructions, "F2FP")
show_sass(instructions, "HADD2")'''),
        markdown("""\
## Is it right?

On the host, `stage.reference` says what the kernel must produce: bf16(f32(e4m3) · s), rounded to nearest
even. On a Hopper GPU the kernel's output must match it bit for bit (the output is poisoned first)."""),
        code('''\
from gemm.fp8 import BF16, dequantize_per_token, per_token_cast_to_fp8

x = np.random.default_rng().standard_normal((64, 512), dtype=np.float32)
q, scale = per_token_cast_to_fp8(x)
expected = stage.reference(q, scale)
print("first values, float64 dequantized:", np.round(dequantize_per_token(q, scale)[0, :4], 5))
print("first values, BF16 (reference):   ", expected[0, :4].view(BF16).astype(np.float32))

if is_hopper():
    from numba import cuda
    y = cuda.to_device(np.full(q.shape, 0x7FC0, np.uint16))  # NaN poison
    stage.dequantize(cuda.to_device(q.view(np.uint8)), cuda.to_device(scale), y)
    cuda.synchronize()
    got = y.copy_to_host()
    print("bit-identical to the reference:", bool(np.array_equal(got, expected)))
    assert np.array_equal(got, expected)
else:
    print("Launching needs a Hopper GPU (sm_90a); above, the kernel was generated, assembled and disassembled.")'''),
        markdown("""\
## Timing

Dequantization moves bytes and does almost no math, so it is measured in GB/s: 1 byte read and 2 written per
element, plus the scales. Compare with the H100's ~3 TB/s device-to-device copy."""),
        code('''\
if is_hopper():
    from numba import cuda
    from gemm.testing.timer import bench_kernel
    m, k = 4096, 7168
    q, scale = per_token_cast_to_fp8(np.random.default_rng().standard_normal((m, k), dtype=np.float32))
    x_d, s_d = cuda.to_device(q.view(np.uint8)), cuda.to_device(scale)
    y = cuda.device_array((m, k), np.uint16)
    timing = bench_kernel(lambda stream: stage.dequantize(x_d, s_d, y, stream=stream))
    moved = 3 * m * k + 4 * scale.size
    print(f"M={m} K={k}: {timing.median_us:.1f} us, {timing.gbps(moved):.0f} GB/s")
else:
    print("Timings need a Hopper GPU (there is none here).")'''),
    ]


# ------------------------------------------------------------------------------------------ main

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed notebooks, outputs stripped; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, nb in build().items():
        path = NOTEBOOKS / f"{name}.ipynb"
        if is_current(path, nb):
            continue  # sources unchanged: the committed outputs stay
        stale.append(path.name)
        if not args.check:
            NOTEBOOKS.mkdir(exist_ok=True)
            path.write_text(render(nb))
            print(f"wrote {path.relative_to(ROOT)} (without outputs)")
    if stale and args.check:
        print("out of date (run python tools/make_notebooks.py):", ", ".join(stale))
        return 1
    if stale:
        print("execute them to store their outputs: PYTHONPATH=. python tools/execute_notebooks.py",
              " ".join(f"notebooks/{name}" for name in stale))
    else:
        print("every notebook is current (outputs kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
