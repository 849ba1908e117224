"""Notebook 11: tall 256 x 128 tiles, two 64-row waves per math warpgroup against one B tile, with the measured
result read from the committed ladder run."""
from __future__ import annotations

from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.emulator import BREAK_INTRO, EARLY_READ, PARITY, break_setup
from lessons.notebooks.generator_stages import (CHECK_NOTE_GENERATED, config_cells, emitter_cells,
                                                opcode_table_cells)
from lessons.notebooks.ipynb import code, markdown
from lessons.notebooks.stage_10 import SHAPES_GPU as SHAPES_GPU_10


INTRO = """\
# 11 · Tall tiles: two waves per math warpgroup

**The one idea:** the same B tile can serve twice the rows. Stages 07-10 give each CTA a 128 × 128 tile: math
warpgroup g multiplies its 64 rows of A by the whole B tile, so per K block a CTA pulls 128 rows of A and 128
of B from L2 for 128 × 128 outputs. Stage 08's profile (`results/ncu_08_4096x4096x7168.txt`) found that feed
to be the limit: L2 at 77% of its throughput, the SMs at 75%. Make the tile 256 rows tall and keep two math
warpgroups:

* **two waves per warpgroup**: warpgroup g owns rows 64g + 128w of the 256-row tile for waves w = 0, 1. Per K
  block it issues wave 0's four `wgmma m64n128k32` into its accumulator, waits, promotes them into wave 0's FP32
  totals, then does the same for wave 1 *with the same B descriptor*: B's shared-memory bytes are read by twice
  the rows, and fetched from L2 once for them;
* **the feed per FLOP falls by a quarter**: rows of K fetched per output go from (128 + 128) / (128 × 128) to
  (256 + 128) / (256 × 128), 25% fewer L2 bytes per FLOP; and there are half as many tiles, so half the per-tile
  prologues and epilogues;
* **the cost is registers and ring depth**: each math thread keeps the 64-register partial sum plus two
  64-register totals, 192 of the 232 registers `setmaxnreg` gives it (a 256 × 256 tile would need 384: it cannot
  fit), and a ring stage now holds 256 × 128 + 128 × 128 bytes of operands, so 3 stages fit in shared memory
  where stage 10 had 5.

**What changed vs 10:** `block_m=256`, and with it `stages` 5 → 3, which nothing chose: it is the most that
fits (`gemm.kernel.config.max_stages`). DeepGEMM's large-shape kernels use the same 256 × 128 tile, and the
production heuristics pick it wherever there are enough rows (`gemm.heuristics.choose_blocks`).

What to look for: registers per math thread (64 accumulators + 2 × 64 totals = 192 of 232), the wave loop in the
PTX (two groups of four `wgmma` per K block sharing the B descriptor, the second group's A descriptor 128 rows
further down), the SASS doubling its QGMMA and promotion FFMAs per K block, half the tiles, and the ladder's
measurement of whether the 25% lighter L2 feed per FLOP shows in the time.
"""


CONFIG = """\
## The config and its one change

Stage 10's config plus `block_m=256`. Everything else is stage 10's (the producer warpgroup, `setmaxnreg`
40/232, the persistent grouped walk, the TMA-store epilogue, A multicast to 2-CTA clusters, the FFMA pass),
except the ring depth: `GeneratedStage.config` keeps the previous stage's depth when it fits and otherwise the
most stages the new tiles leave room for, so a second row appears below.
"""


EMITTER = """\
## The emitter: `MathWarpgroups`' wave loop

`__init__` decides the waves: at most two math warpgroups, so a 256-row block gives each
`waves = 256 / (64 × 2) = 2`, 128 rows apart (`wave_rows`), and allocates one partial-sum accumulator but one
totals array per wave. `k_block` builds B's descriptor once, then loops over the waves: the A descriptor moves
`wave × wave_rows` rows down the A tile (and the activation scales as far down A's scales), four `wgmma` per
wave (one per 32-wide K step) against the same B descriptor, wait, promote into that wave's totals. The ring
stage is released after the *last* wave's wait: both waves read it. Stage 10 ran the same code with one wave.
"""


PTX = """\
## The generated PTX

The key instructions, then one K block of the math loop: B's descriptor once; per wave the A descriptor (wave
1's 16384 bytes, 128 rows of 128 bytes, further down), the activation scales (wave 1's 512 bytes further down
the scale tile), four `wgmma` reusing `%bdesc`, commit and wait, and the promotion (64 FFMAs, shown folded).
The release comes between wave 1's wait and its promotion. Then the diff against stage 10, summarised.
"""


PTX_EXTRA = '''


def show_k_block(text, width=118):
    """The math loop's K block: from B's descriptor to the end of the second wave's promotion, FFMAs folded."""
    lines = text.splitlines()
    mma = [i for i, line in enumerate(lines) if "wgmma.mma_async" in line]
    start = max(i for i in range(mma[0]) if "cvt.u64.u32 %bdesc" in lines[i]) - 3
    last_promotion = next(i for i in range(mma[-1], len(lines)) if "fma.rn.f32" in lines[i])
    end = next(i for i in range(last_promotion, len(lines)) if "fma.rn.f32" not in lines[i])
    i = start
    while i < end:
        if "fma.rn.f32" in lines[i]:
            j = next(j for j in range(i, len(lines)) if "fma.rn.f32" not in lines[j])
            print(f"{'':5s}  ... {j - i} x fma.rn.f32: the promotion into this wave's totals ...")
            i = j
            continue
        line = lines[i] if len(lines[i]) <= width else lines[i][:width] + " ..."
        print(f"{i + 1:5d}  {line}")
        i += 1
    operands = [lines[i].split("}, ", 1)[1].split(",")[:2] for i in mma]
    print(f"\\n{len(mma)} wgmma in the K block, {len(mma) // 4} waves of 4; the first of each wave reads:")
    for wave, first in enumerate(range(0, len(mma), 4)):
        a_desc, b_desc = (x.strip() for x in operands[first])
        print(f"    wave {wave}: A descriptor {a_desc}, B descriptor {b_desc}")
    print("(the next three K steps of a wave add 2, 4, 6 to both: 32 bytes, in the descriptors' 16-byte units)")


print("\\none K block of the math loop:")
show_k_block(ptx_text)

from lessons.diff_stages import ptx_diff

changed = ptx_diff(10, 11, *SHAPE)
added = sum(line.startswith("+") and not line.startswith("+++") for line in changed)
removed = sum(line.startswith("-") and not line.startswith("---") for line in changed)
totals = sum(line.startswith("+mov.f32 %tot") for line in changed)
print(f"\\nPTX diff against stage 10 (register numbers ignored): +{added} -{removed} lines, of which +{totals} "
      f"zero a second wave's totals; the rest: shared-memory offsets of a 3-stage ring of taller tiles, 256-row "
      f"tile arithmetic in the scheduler, the second wave's K-block body and its epilogue "
      f"(python -m lessons diff 10 11 prints it all)")'''


SASS = """\
## Resources and SASS

The cubin that runs: the generated PTX through ptxas, then stage 10's FFMA pass. QGMMA is 4 per K block in
stage 10 and 8 here, the same `m64n128k32` twice; the promotion FFMAs double with it (one per accumulator, per
wave), and so do the epilogue's F2FP conversions and `stmatrix` stores (STSM): each wave stores its own 128 rows.
The TMA loads (UTMALDG) do not change: per K block one box of A (now 256 rows), one of B, one of A's scales.
"""


OPCODES = """\
## What changed in the SASS (`lessons diff 10 11`)

The math doubles per K block (QGMMA, FFMA), the epilogue doubles per tile (F2FP, STSM); the loads do not. Fewer
SYNCS: the code per ring stage (the barriers' initialisation, the producer's final drain) is unrolled, and the
ring has 3 stages instead of 5.
"""


RESOURCE_CELLS = [
    markdown("""\
## Registers, shared memory, tiles: 10 against 11

`lessons.compile_report.ptx_report` is what `python -m lessons inspect` prints: each stage assembled for
sm_90a, ptxas's report per kernel, the dynamic shared memory the launch asks for. ptxas reports the *launch*
allocation of a `setmaxnreg` kernel (every thread of 384 gets the same count), so it reads the same for both
stages; what the math threads get is the `setmaxnreg` value, and what they must hold is counted below from the
config: the partial-sum accumulator (block_n / 2 registers per thread) plus one totals array per wave. Then the
ring: bytes per stage, stages, and the most stages that fit; then the tiles and the L2 feed."""),
    code('''\
from gemm.kernel.config import SHARED_LIMIT, SharedPlan, max_stages, tiles
from gemm.kernel.launch import grid as launch_grid
from gemm.heuristics import device_facts
from lessons.compile_report import ptx_report

m, n, k = SHAPE
sms = device_facts().sm_count
print(f"{'':44s}{'stage 10':>12s}{'stage 11':>12s}")
rows = {}
for number in (10, 11):
    module, c = lessons.stage(number), lessons.stage(number).config(*SHAPE)
    report, plan = ptx_report(module, *SHAPE), SharedPlan(c, n, k)
    (kernel,) = report["kernels"].values()
    waves = c.block_m // (64 * min(c.block_m // 64, 2))
    held = c.block_n // 2 * (1 + waves)  # the partial sum + one totals array per wave, FP32, per math thread
    ctas = launch_grid(c, m, n, sms)
    rows[number] = {
        "tile (block_m x block_n)": f"{c.block_m}x{c.block_n}",
        "waves per math warpgroup": waves,
        "registers, ptxas (launch allocation)": kernel["registers"],
        "spilled bytes": kernel["spill_stores"] + kernel["spill_loads"],
        "registers per math thread (setmaxnreg)": c.registers[1],
        "accumulator + totals registers held": held,
        "left for addresses, scales, descriptors": c.registers[1] - held,
        "bytes per ring stage (A + B + A's scales)": plan.stage_bytes,
        "ring stages": c.stages,
        "most stages that fit": max_stages(c, n, k),
        "dynamic shared memory, bytes": report["dynamic_shared_bytes"],
        "tiles at the ladder's shape": tiles(c, m, n),
        "tiles per CTA (persistent grid)": f"{tiles(c, m, n) / ctas:.2f} on {ctas}",
        "L2 rows of K per output (x 1e-3)": f"{1e3 * (c.block_m + c.block_n) / (c.block_m * c.block_n):.3f}",
        "QGMMA / FFMA in the SASS": f"{report['opcodes']['QGMMA']} / {report['opcodes']['FFMA']}",
    }
for field in rows[10]:
    print(f"{field:44s}{rows[10][field]!s:>12}{rows[11][field]!s:>12}")
print(f"\\nshared memory per block: at most {SHARED_LIMIT} bytes. L2 feed per FLOP, 11 / 10: "
      f"{float(rows[11]['L2 rows of K per output (x 1e-3)']) / float(rows[10]['L2 rows of K per output (x 1e-3)']):.2f}")'''),
]


LADDER_COMMAND = "python -m lessons ladder"


MEASURED_CELLS = [
    markdown(f"""\
## Measured: the ladder's run

`results/ladder.json` is the committed run of `{LADDER_COMMAND}` on a Hopper GPU: every stage and cuBLAS at
M = 4096, N = 4096, K = 7168, each checked against the float64 reference and timed with the one kernel timer.
The cell prints stages 10 and 11 and cuBLAS from it, and the ratios; where the file or stage 11's row is
missing it prints the command that writes them. No number here is typed in."""),
    code(f'''\
from lessons.ladder import read_committed

COMMAND = {LADDER_COMMAND!r}
result = read_committed()
if result is None:
    print(f"No results/ladder.json yet. On a Hopper GPU this writes it:\\n    {{COMMAND}}")
else:
    shape = result["shape"]
    print(f"results/ladder.json: {{result['device'].get('name', '?')}}, {{result['date'][:10]}}, "
          f"M={{shape['m']}} N={{shape['n']}} K={{shape['k']}}; {{result.get('timing', '')}}")
    if (shape["m"], shape["n"], shape["k"]) != SHAPE:
        print(f"(not the ladder's shape {{SHAPE}}: the run was made with other arguments)")
    found = {{"stage 10": next((r for r in result["rows"] if r.get("stage") == 10), None),
             "stage 11": next((r for r in result["rows"] if r.get("stage") == 11), None),
             "cuBLAS": next((r for r in result["rows"] if r.get("kind") == "peer"), None)}}
    timed = {{name: row for name, row in found.items() if row and row.get("status") == "ok" and row.get("tflops")}}
    print(f"\\n{{'':10s}}{{'time (us)':>12s}}{{'TFLOP/s':>10s}}")
    for name, row in found.items():
        if name in timed:
            print(f"{{name:10s}}{{row['time_us']:12.1f}}{{row['tflops']:10.1f}}")
        else:
            print(f"{{name:10s}}  {{'not in this run' if row is None else row.get('status', 'no time')}}")
    print()
    for a, b in (("stage 11", "stage 10"), ("stage 11", "cuBLAS"), ("stage 10", "cuBLAS")):
        if a in timed and b in timed:
            print(f"{{a}} / {{b}}: {{timed[a]['tflops'] / timed[b]['tflops']:.3f}}x (TFLOP/s)")
    if "stage 11" not in timed:
        print(f"stage 11 has no time in this run yet. On a Hopper GPU this adds it:\\n    {{COMMAND}}")

from gemm.heuristics import choose_config
print(f"\\nthe production heuristics' config at {{SHAPE}}: {{choose_config(*SHAPE).describe()}}")'''),
    markdown("""\
## Reading the result

Stage 11 changes what each byte fetched from L2 is worth, not how fast the tensor cores multiply: the table
above says the feed per FLOP falls to 0.75 of stage 10's and the tiles halve, at the price of a 3-deep ring
instead of 5 and 40 free registers per math thread instead of 104, with nothing spilled. So read the measured
ratio 11 / 10 against stage 08's profile. If L2 was what held the tensor cores back (77% of its throughput, as
the profile found), the ratio should be above 1, and the gap to cuBLAS (11 / cuBLAS) the thing to compare with
10 / cuBLAS. A ratio near 1 would say the feed was not the limit at this shape, and one below 1 that the
shallower ring now exposes load latency the deeper one hid; in either case, the ring depth and the profile of
stage 11 (`ncu`, as for stage 08) are where to look next, not this notebook's arithmetic. One run is one
measurement: a ratio within a percent or two of 1 is not a result either way. The production heuristics' choice
at this shape, printed above, is the same 256 × 128 tile, which DeepGEMM also chose for large shapes."""),
]


EMULATOR_SHAPE = (700, 256, 2048)  # 3 m blocks, the last one ragged inside wave 1; 16 K blocks wrap the 3-stage ring
EMULATOR_SMS = 4  # CTAs standing in for SMs (2-CTA clusters: even)


EMULATOR_CELLS = [
    markdown(f"""\
## Run the PTX on the CPU: `ptx.emulate.run_stage`

`ptx.emulate` executes the PTX text this stage generates, instruction by instruction, on NumPy: no GPU, no
CUDA driver. Here it runs stage 09's machinery (2-CTA clusters, multicast TMA, remote releases) with tiles of
256 rows: each math warpgroup's two waves use one accumulator in turn, and the ring has 3 stages. The shape,
M = {EMULATOR_SHAPE[0]}, gives 3 row blocks of 256, the last holding 188 rows: wave 0 of it is full and wave 1
has 60 rows, so the clamped loads and masked stores of a partly empty second wave run too. 16 K blocks wrap the
ring five times. A correct kernel ends `COMPLETED` and matches the float64 reference to the BF16 rounding of
its output (about 1e-6)."""),
    code(f'''\
# ---- the generated PTX, executed on the CPU: D and a report of the run -----------------------------------
import numpy as np

from gemm.fp8 import calc_diff
from gemm.testing.problems import random_problem, reference_gemm
from ptx.emulate import run_stage

m, n, k = {EMULATOR_SHAPE!r}
a, sa, b, sb = random_problem(m, n, k, np.random.default_rng(0))
out, report = run_stage(stage, a, sa, b, sb, sm_count={EMULATOR_SMS})
print(report)
assert report.ok, report.error
diff = calc_diff(out, reference_gemm(a, sa, b, sb))
print(f"every element written: {{bool(np.isfinite(out).all())}}, diff against the float64 reference = {{diff:.1e}}")
assert np.isfinite(out).all() and diff < 1e-3, "the emulated kernel disagrees with the float64 reference"'''),
]


BREAK_SETUP = break_setup(EMULATOR_SHAPE, EMULATOR_SMS)


WAVE_OFFSET = ("""\
### Both waves on the same rows of A

The second wave's A descriptor starts `wave_rows` = 128 rows, 16384 bytes, below the first's: one `add.u32`
in the K block. `drop_wave_offset` below deletes it, so wave 1 multiplies wave 0's rows of A by B again, while
everything else, its activation scales, its totals, where its epilogue stores, still belongs to rows 128-255.
Every address stays inside the tile and every barrier is kept, so the run completes, and the rows of the
second wave are wrong: row 128 + r of each tile gets row r's products with row 128 + r's scales. The rows of the
first wave are right. That split is the signature to look for.""", '''\
import re


def drop_wave_offset(ptx):
    """Delete the 128-row offset of the second wave's A tile address (the add right after the warpgroup's)."""
    edited, count = re.subn(r"(add\\.u32 (%\\w+), %a_tile\\w*, %wg_a\\w*;\\n)\\s*add\\.u32 \\2, \\2, 16384;\\n",
                            r"\\1", ptx, count=1)
    if not count:
        raise ValueError("no second-wave A offset in this PTX: update the pattern in lessons/notebooks/stage_11.py")
    return edited


out, report = break_it(drop_wave_offset)
assert report.ok and show_wrong(out) > 0.1
rows = np.arange(m) % 256 >= 128  # the second wave's rows of each 256-row tile
for name, band in (("wave 0 rows", ~rows), ("wave 1 rows", rows)):
    print(f"{name}: diff = {calc_diff(out[band], reference[band]):.1e}")
assert calc_diff(out[~rows], reference[~rows]) < 1e-3 < calc_diff(out[rows], reference[rows])''')


def break_cells() -> list[dict]:
    """Stage 09's breaks that still apply, then the one this stage's change makes possible."""
    cells = [markdown(BREAK_INTRO), code(BREAK_SETUP)]
    for text, source in (PARITY, EARLY_READ, WAVE_OFFSET):
        cells += [markdown(text), code(source)]
    return cells


SHAPES_GPU = SHAPES_GPU_10 + [(700, 2112, 512)]  # a last row block whose second wave is partly out of range


def cells() -> list[dict]:
    """Like generator_stages.generated_notebook, with this stage's own emulator shape and breaks."""
    return ptx_notebook(
        11, INTRO, PTX,
        ["wgmma.fence", "wgmma.commit_group", "wgmma.wait_group", "mov.f32 %tot"],
        SASS, ["QGMMA", "FFMA", "F2FP", "STSM", "UTMALDG", "SYNCS", "USETMAXREG"], ["QGMMA"],
        CHECK_NOTE_GENERATED, SHAPES_GPU,
        before=[*config_cells(11, CONFIG),
                *emitter_cells(EMITTER, ["gemm.kernel.math_warpgroups.MathWarpgroups.__init__",
                                         "gemm.kernel.math_warpgroups.MathWarpgroups.k_block"])],
        extra=[*opcode_table_cells(11, OPCODES), *RESOURCE_CELLS, *MEASURED_CELLS, *EMULATOR_CELLS,
               *break_cells()],
        ptx_extra=PTX_EXTRA,
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the ladder's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)")


__all__ = ["cells", "SHAPES_GPU"]
