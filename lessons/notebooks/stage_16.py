"""Notebook 16: B read once, loaded evict_first, at the stage's shape: the config, the policy and the hinted loads in
PTX and SASS, how many tiles read B, what ncu counted and the runs measured, and the emulator refusing a hint
without its policy."""
from __future__ import annotations

import lessons
from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.generator_stages import (CHECK_NOTE_GENERATED, emitter_cells, opcode_table_cells,
                                                two_shape_config_cells)
from lessons.notebooks.ipynb import code, markdown

SHAPE = lessons.stage(16).SHAPE  # where the idea shows (32 x 4096 x 7168); the cells read stage.SHAPE

INTRO = """\
# 16 · B read once, loaded evict_first

**The one idea:** tell L2 which lines to give up first. Every TMA load so far went to L2 with the normal eviction
priority, so each line of B that arrives pushes out a line the L2 held before. At decode one row of tiles covers
M: each byte of B (the weight) is loaded once and never asked for again, yet its 15-120 MB turn over the whole
50 MB L2. Where the lines it pushes out are dirty (what the previous kernel wrote; the ladder's memset flush), each
one is a write-back to HBM on the same bus as the stream's reads.

The change: the producer thread creates a cache policy once (`createpolicy.fractional.L2::evict_first.b64`) and
names it on each of B's TMA loads (`cp.async.bulk.tensor ... .L2::cache_hint`, the policy as the last operand). An
evict_first line is the first its set gives up, so the stream recycles its own lines and the rest of the L2 stays.

**What changed vs 15:** `b_eviction="first"` where one row of tiles reads B once (exercise 16: how many tiles load
each byte of B). Where other rows re-read B (the ladder's shape: 16 rows of 256) the stage is stage 15.

What to look for: `createpolicy` and `.L2::cache_hint` in the PTX; the same UTMALDG count in the SASS, each with a
`desc[UR..]` operand on B's; fewer bytes written back (ncu) and a faster call after the memset flush, none after a clean
one.
"""

CONFIG_CELLS = two_shape_config_cells(16, """\
## The config and its change, at two shapes

Stage 15's config plus `b_eviction`, at the stage's shape (hinted) and at the ladder's, where B is re-read and
nothing differs.""")

EMITTER = """\
## The emitters: the policy, and the loads that name it

`Ring.create_policies` runs once in the producer's one thread (after the others leave) and keeps a 64-bit policy
register per hinted operand; `Ring.load` passes B's to its two copies (B and, with 1x128 scales, sb). The PTX idiom
is `ptx.vocab.bulk_copies.create_l2_policy`, and `tma_load_2d` adds the qualifier and the operand."""

PTX = """\
## The generated PTX

At the stage's shape: the policy created once, and B's load naming it (A's and sa's keep the normal priority)."""

SASS = """\
## Resources and SASS

The cubin that runs, at the stage's shape: the same three UTMALDG per stage; B's (the last one listed) takes a
descriptor operand, the policy."""

OPCODES = """\
## What changed in the SASS (`lessons diff 15 16`, at the stage's shape)

Nothing on the math warps' path: the hint is an operand of the producer's loads, plus the instructions that build
the policy once."""

LOADS_CELLS = [
    markdown("""\
## The three loads of a stage, in SASS

A's, sa's and B's TMA loads as ptxas wrote them: only B's names the policy (`desc[UR..]`)."""),
    code('''\
for instruction in instructions:
    if instruction.opcode == "UTMALDG":
        print(f"{instruction.offset:#07x}  {instruction.text}")'''),
]

READS_CELLS = [
    markdown("""\
## How many tiles load each byte of B

`gemm.heuristics.b_reads`, the count the stage's rule asks (exercise 16), with stage 16's configs: one per row
of tiles, whatever the split of K or the multicast of A (the figure `16_evict_first` draws two of these)."""),
    code('''\
from lessons.figures import b_read_map

for shape in [SHAPE, (1, 7168, 2048), (64, 7168, 16384), (128, 32768, 512), (4096, 4096, 7168)]:
    grid = b_read_map(*shape)
    config = grid["config"]
    print(f"{str(shape):22s} {config.block_m:4d} x {config.block_n:<4d} tiles: {grid['rows']:3d} rows x "
          f"{grid['columns']:3d} columns, B loaded {grid['b_reads']:2d}x  -> b_eviction={grid['priority']!r}")'''),
]

MEASURED_CELLS = [
    markdown("""\
## Measured: bytes written back, and time

`results/ncu_l2_eviction_64x7168x16384.txt`: ncu after a 256 MiB fill that leaves the L2 dirty, production's config
without the hint and with it, three calls each (`dram__bytes_write.sum`). `results/sweep_l2_eviction_memset.json`
and `_clean.json`: production's config on nine shapes with and without the hint, after each flush; and the ladder's
run at this stage's shape when there is one. No number here is typed in."""),
    code('''\
import re
from lessons import results_store
from lessons.ladder import ladder_file, read_committed
from gemm.testing.records import read_result

path = results_store.find("ncu_l2_eviction_64x7168x16384.txt")
if path is not None:
    written = [float(v) for v in re.findall(r"dram__bytes_write.sum\\s+Mbyte\\s+([0-9.]+)", path.read_text())]
    print(f"{results_store.shown(path)}: MB written back per call, alternating unhinted / hinted:")
    print("  unhinted", written[0::2], " hinted", written[1::2])
for flush in ("memset", "clean"):
    path = results_store.find(f"sweep_l2_eviction_{flush}.json")
    if path is None:
        continue
    times = {}
    for row in read_result(path)["rows"]:  # by what the config does (its description), whatever it was named
        if "A loaded" not in row["config"]:
            hinted = "B loaded evict_first" in row["config"]
            times.setdefault((row["m"], row["n"], row["k"]), {})[hinted] = row["time_us"]
    print(f"\\nafter the {flush} flush ({results_store.shown(path)}): without the hint -> with it")
    for shape, by_hint in times.items():
        before, after = by_hint[False], by_hint[True]
        print(f"  {str(shape):22s}{before:9.2f} us{after:9.2f} us  {before / after - 1:+.1%}")
path = results_store.find(ladder_file(SHAPE))
result = read_committed(path) if path is not None else None
if result is None:
    print("\\nNo ladder run at this shape yet. On a Hopper GPU: python -m lessons ladder --m {} --n {} --k {} "
          "--stages 14-16".format(*SHAPE))
else:
    print(f"\\n{results_store.shown(path)}: {result['device'].get('name', '?')}, {result['date'][:10]}")
    for row in result["rows"]:
        if row.get("status") == "ok":
            print(f"  {row['label']:24s}{row['time_us']:8.1f} us{row['gbps']:8.0f} GB/s")'''),
]

EMULATOR_SHAPE = (27, 136, 640)  # 32-token tiles, a ragged last tile of weight rows, 5 K blocks over 2 CTAs

BREAK_CELLS = [
    markdown(f"""\
## Run it on the CPU, then take the policy away

The emulator has no L2, so the hint cannot change D; what it checks is the instruction's contract: a
`.L2::cache_hint` load's last operand must be a policy that `createpolicy` made. At M, N, K = {EMULATOR_SHAPE} the
stage's kernel runs exactly; then the same PTX with `createpolicy` replaced by a plain `mov` of 0 is refused."""),
    code(f'''\
import re
from gemm.testing.emulated import run_gemm
from ptx.emulate import EmulationError

m, n, k = {EMULATOR_SHAPE!r}
problem = random_problem(m, n, k, np.random.default_rng(0))
reference = reference_gemm(*problem)
config = stage.config(m, n, k)
out = run_gemm(config, *problem)
print(config.describe())
print(f"every element written: {{bool(np.isfinite(out).all())}}, diff = {{calc_diff(out, reference):.1e}}")

text = stage.generate(m, n, k)
made = re.search(r"createpolicy\\.\\S+ (%\\w+), 1\\.0;", text)
print("the policy:", made.group(0))
try:
    run_gemm(config, *problem, ptx=text.replace(made.group(0), f"mov.b64 {{made.group(1)}}, 0;"))
except EmulationError as error:
    print("without it, the emulator refuses line", str(error).split(":")[0].split()[-1], "...",
          str(error)[str(error).index("the last operand"):])'''),
]

SHAPES_GPU = [SHAPE, (1, 7168, 2048), (5, 576, 1152), EMULATOR_SHAPE]  # hinted: 32-, 8-, 8- and 32-token tiles


def cells() -> list[dict]:
    """ptx_notebook at the stage's shape, with its config at two shapes, the counts, the measurements and the
    policy taken away."""
    return ptx_notebook(
        16, INTRO, PTX, ["createpolicy", "L2::cache_hint"],
        SASS, ["UTMALDG", "QGMMA", "STSM"], [],
        CHECK_NOTE_GENERATED, SHAPES_GPU,
        before=[*CONFIG_CELLS, *emitter_cells(EMITTER, ["gemm.kernel.producer.Ring.create_policies",
                                                        "gemm.kernel.producer.Ring.load"])],
        extra=[*opcode_table_cells(16, OPCODES), *LOADS_CELLS, *READS_CELLS, *MEASURED_CELLS, *BREAK_CELLS],
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the stage's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)", shape=SHAPE)


__all__ = ["cells", "SHAPES_GPU"]
