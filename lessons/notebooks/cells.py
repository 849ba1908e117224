"""Cells every stage notebook shares: the setup, the device helpers and the check, the timing, the kernel and
PTX/SASS printers, the notebook shapes of a Numba stage and of a PTX stage, and a stage's committed figures.

The code cells are text: they run in the notebook (from notebooks/ in Jupyter, or the repository root in tests),
never here.
"""
from __future__ import annotations

from lessons.ladder import LADDER_SHAPE, ladder_file
from lessons.notebooks import CHECKOUT
from lessons.notebooks.ipynb import code, markdown


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
    """Times stage ``number`` at (m, n, k): the ladder's shape, or a stage's own ``SHAPE`` (measured into
    results/ladder_MxNxK.json: lessons.ladder.ladder_file)."""
    at_ladder = (m, n, k) == LADDER_SHAPE
    results = f"results/{ladder_file((m, n, k))}"
    command = "python -m lessons ladder" + ("" if at_ladder else f" --m {m} --n {n} --k {k}")
    return f'''\
from lessons.ladder import committed_summary, percent, speed_of_light

# What the committed ladder run measured for this stage ({results}), GPU or not, and its speed of light
# (the unit that bounds it: see the stage's docstring above and lessons.ladder.UNITS).
print(committed_summary({number}))

if is_hopper():
    from gemm.heuristics import device_facts
    from gemm.testing.timer import bench_kernel
    m, n, k = {m}, {n}, {k}  # {"the ladder's shape" if at_ladder else "this stage's own shape, stage.SHAPE"}
    a, sa, b, sb = to_device(*random_problem(m, n, k))
    d = cuda.device_array((m, n), np.uint16)
    timing = bench_kernel(lambda stream: stage.gemm(a, sa, b, sb, d, stream=stream))
    tflops = timing.tflops(flops(m, n, k))
    gpu = device_facts().name  # this run's GPU, which need not be the committed run's; its HBM bounds the stage
    bound = speed_of_light({number}, m, n, k, gpu)
    print(f"now, on {{gpu}}: M={{m}} N={{n}} K={{k}}: {{timing.median_us:.1f}} us, {{tflops:.1f}} TFLOP/s, "
          f"{{timing.gbps(gemm_bytes(m, n, k)):.0f}} GB/s, {{percent(100 * tflops / bound['bound_tflops'])}} of its "
          f"speed of light ({{bound['bound_unit']}})")
else:
    print("Timings need a Hopper GPU (there is none here). With one: {command}")'''


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


TIMING_NOTE = """\
## Timing

Kernel time, not launch time: `gemm.testing.bench_kernel` captures a CUDA graph of (flush L2; launch) pairs,
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


PTX_NOTE = """\
## The generated PTX

An excerpt: the module header, then the first uses of the instructions that carry this stage's idea.
"""


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
                 cubin_code: str = "compile_ptx(ptx_text)", check_code: str | None = None,
                 shape: tuple[int, int, int] = LADDER_SHAPE) -> list[dict]:
    """``before`` goes between the setup and the PTX, ``extra`` after the SASS; ``ptx_extra`` ends the PTX cell.
    ``cubin_code``: the expression for what runs (a cubin pass changes it); ``check_code``: the GPU check cell;
    ``shape``: where the PTX is generated and the stage timed (a stage whose idea shows elsewhere: its SHAPE)."""
    m, n, k = shape
    return [
        markdown(intro),
        code(setup_cell(number)),
        *before,
        markdown(ptx_note),
        code(PTX_HELPERS + f'''\


# {ptx_comment}
ptx_text = stage.generate({m}, {n}, {k})
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
        code(timing_cell(number, *shape)),
    ]


def figure_cells(number: int) -> list[dict]:
    """The stage's committed figures (docs/figures/NN_*.png, drawn by lessons.figures; ``python -m lessons
    figures`` redraws them), shown as images so the cell costs nothing to run."""
    paths = sorted((CHECKOUT / "docs" / "figures").glob(f"{number:02d}_*.png"))
    if not paths:
        return []
    links = "\n\n".join(f"![{p.stem}](../docs/figures/{p.name})" for p in paths)
    return [markdown(f"""\
## Figures

Drawn by `lessons.figures` from the layout functions this stage's kernel uses (`python -m lessons figures`
redraws them; docs/figures.md says what each shows):

{links}
""")]
