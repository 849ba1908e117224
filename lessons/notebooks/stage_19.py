"""Notebook 19: rank 0 two K blocks ahead, at the stage's shape (stage 18's 256 x 64 tiles over pairs): the config at
two shapes, the shares'
emitter, the shares in PTX, the SASS counted against stage 18's, the paired runs, and the shares on the emulator
with the lead taken wrong."""
from __future__ import annotations

import lessons
from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.generator_stages import CHECK_NOTE_GENERATED, opcode_table_cells, two_shape_config_cells
from lessons.notebooks.ipynb import code, markdown

SHAPE = lessons.stage(19).SHAPE  # where the idea shows (64 x 2112 x 7168); the cells read stage.SHAPE

INTRO = """\
# 19 · Rank 0 two K blocks ahead

**The one idea:** in a split, give the CTA that waits the most work. Stage 18's peers push their FP32 totals into
rank 0's inbox and exit; rank 0, after its own K loop, waits for those bytes, adds them and stores D. With even
K shares every CTA ends its K loop at about the same time, so the exchange starts only then, and rank 0 waits for
all of it. Where the K blocks do not divide evenly it is worse: 56 over three are 18, 19, 19, and rank 0, the one
that waits, ends first.

The lead: rank 0 takes E = Kb // S + 2 K blocks (never so many that a peer is left none), and the peers share the
rest evenly (`gemm.kernel.config.k_share` with its `lead`; exercise 19). The peers end first, their messages cross
the cluster while rank 0 multiplies its last blocks, whose stages its ring has mostly loaded already, and rank 0's
wait finds the inbox full.

**What changed vs 18:** `split_k_lead=2` wherever stage 18 splits K, but for swapped tiles split over a pair
(production's rule, `gemm.heuristics.split_lead`: their 4 KiB of partials cross quickly, and a lead measured no
gain there). So at stage 18's decode shape, 16 x 2112 x 7168, this stage *is* stage 18, and at the ladder's shape
nothing splits; this notebook works, and the stage is measured, at `stage.SHAPE`: stage 18's 256 x 64 tiles over
pairs, whose 64 KiB of partials take longest to cross.

What to look for: a few integer instructions at the start of the PTX (the shares), nothing else; the K blocks each
CTA runs; +3.0 to +6.3% on the stage's tiles in runs paired round by round, and where a lead does not pay.
"""

CONFIG_CELLS = two_shape_config_cells(19, """\
## The config and its change, at two shapes

Stage 18's config plus `split_k_lead`, at the stage's shape and at the ladder's, where nothing splits and nothing
differs. Then the K blocks each rank computes, even and with the lead: the stage's 256 x 64 tiles over two here,
and at 16 x 2112 x 7168 the stages' swapped pairs (no lead) and production's split of those tiles over three.""", '''

from gemm.kernel.config import k_share
from gemm.heuristics import choose_config

DECODE = (16, 2112, 7168)
for where, name, config in ((SHAPE, "stage 18", lessons.stage(18).config(*SHAPE)),
                            (SHAPE, "stage 19", stage.config(*SHAPE)),
                            (DECODE, "stage 19", stage.config(*DECODE)),
                            (DECODE, "production", choose_config(*DECODE))):
    blocks = -(-where[2] // 128)
    shares = [k_share(rank, config.split_k, blocks, config.split_k_lead) for rank in range(config.split_k)]
    print(f"{str(where):17s} {name:10s} {config.block_m}x{config.block_n} over {config.split_k}, lead "
          f"{config.split_k_lead}: "
          + ", ".join(f"rank {rank} [{first}, {end}) = {end - first}" for rank, (first, end) in enumerate(shares)))''')

EMITTER_CELLS = [
    markdown("""\
## The emitter

`_Kernel._lead_shares`: E and R = Kb - E are compile-time constants, so each CTA computes its share from its
cluster rank with two multiplies, two divisions by the constant S - 1 (none when S = 2), two adds and a `selp`
that gives rank 0 the first E blocks. The rule it computes is `k_share`'s, below it."""),
    code('''\
import inspect

from gemm.kernel.config import k_share, lead_share_end
from gemm.kernel.generator import _Kernel

print(inspect.getsource(_Kernel._lead_shares))
print(inspect.getsource(k_share))
print(inspect.getsource(lead_share_end))'''),
]

PTX = """\
## The generated PTX

At the stage's shape: the shares at the start, right after the cluster rank is read; then the K loop's bounds."""

PTX_EXTRA = '''

from lessons.diff_stages import ptx_diff

signs = [line[:1] for line in ptx_diff(18, 19, *SHAPE) if line[:3] not in ("+++", "---")]
print(f"PTX diff against stage 18 (register numbers ignored): +{signs.count('+')} -{signs.count('-')} lines "
      "(python -m lessons diff 18 19 --m {} --n {} --k {} prints it all)".format(*SHAPE))'''

SASS = """\
## Resources and SASS

The cubin that runs, at the stage's shape (ptxas, then stage 10's FFMA pass): the same messages and barriers as
stage 18's; the shares are computed on the uniform datapath (the rank is the same for every thread), and the
`USEL` is rank 0's choice of its first block."""

OPCODES = """\
## What changed in the SASS (`lessons diff 18 19`, at the stage's shape)

The key families, then the uniform-datapath ones the shares use (`USEL`, `UISETP`, `USHF`), `ISETP`, and the
messages and cluster barrier of stage 18, unchanged: as many instructions as stage 18's, arranged differently."""

MEASURED_CELLS = [
    markdown("""\
## Measured: round by round

`results/sweep_split_k_lead_256x64.json`: the stage's own tiles (production's config with stage 18's 256 x 64 tiles
and 3 stages), even shares against leads of 1, 2 and 4, 8 rounds in alternating order after a warm-up pass, on an
H200 after the memset flush. `results/sweep_split_k_lead_memset.json` (8 rounds) and `_clean.json` (6):
production's own configs the same way, after each flush. `results/sweep_split_k_lead_pairs_memset.json`: swapped
tiles forced over pairs, where a lead does not pay. Each row: a lead's speed over even shares (the even time over
the lead's, > 1: the lead is faster), median and range over the rounds, and how many rounds it was ahead. The
configs are told apart by their description, since production itself has since taken the lead. No number here is typed in."""),
    code('''\
import re
from statistics import median

from lessons import results_store
from gemm.testing.records import read_result

for name in ("256x64", "memset", "clean", "pairs_memset"):
    path = results_store.find(f"sweep_split_k_lead_{name}.json")
    if path is None:
        print(f"sweep_split_k_lead_{name}.json: not in this checkout")
        continue
    result = read_result(path)
    print(f"{results_store.shown(path)} ({result['device'].get('name', '?')}, {result['date'][:10]}, "
          f"{result.get('flush', 'memset')} flush):")
    by_shape = {}
    for row in result["rows"]:
        found = re.search(r"rank 0 takes (?:up to )?(\\d+) more", row["config"])
        by_shape.setdefault((row["m"], row["n"], row["k"]), {})[int(found.group(1)) if found else 0] = row
    for shape, rows in by_shape.items():
        even = rows[0]
        cells = []
        for lead in sorted(lead for lead in rows if lead):
            ratios = [e / l for e, l in zip(even["round_us"], rows[lead]["round_us"])]  # round by round
            ahead = sum(ratio > 1 for ratio in ratios)
            cells.append(f"lead {lead} {median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}, "
                         f"{ahead}/{len(ratios)})")
        print(f"  {str(shape):18s} " + "; ".join(cells))'''),
]

EMULATOR_SHAPE = (100, 136, 1280)  # the stage's 256 x 64 tiles over a pair, ragged M and N, 10 K blocks as 7 and 3

EMULATOR_CELLS = [
    markdown(f"""\
## Run the shares on the CPU, then get them wrong

At M, N, K = {EMULATOR_SHAPE} the stage's 256 x 64 tiles split over a pair, its ring cut to two stages: rank 0
takes 7 of the 10 K blocks and its peer 3, exact under several random schedules. Then the same PTX with rank 0's
share end moved by one block (the peer's share no longer meets it): the emulator's answer is wrong, by a K block
counted twice or left out."""),
    code(f'''\
from gemm.kernel import generate
from gemm.testing.emulated import run_gemm

m, n, k = {EMULATOR_SHAPE!r}
problem = random_problem(m, n, k, np.random.default_rng(0))
reference = reference_gemm(*problem)
config = stage.config(m, n, k).replace(stages=2)
print(config.describe())
for seed in (None, 1, 2):
    out = run_gemm(config, *problem, sm_count=4, seed=seed)
    print(f"schedule {{seed}}: every element written: {{bool(np.isfinite(out).all())}}, "
          f"diff = {{calc_diff(out, reference):.1e}}")

text = generate(config, n, k)
ends = [line for line in text.splitlines() if line.strip().startswith("add.u32 %k_end")]
print("\\nrank 0's share ends at:", ends[0].strip())
for moved in (-1, +1):
    end = int(ends[0].rstrip(";").split(",")[-1])
    broken = text.replace(ends[0], ends[0].replace(f", {{end}};", f", {{end + moved}};"))
    out = run_gemm(config, *problem, sm_count=4, ptx=broken)
    print(f"rank 0's end moved by {{moved:+d}}: diff = {{calc_diff(out, reference):.1e}}")'''),
]

SHAPES_GPU = [SHAPE, (100, 2112, 7168), (128, 4096, 7168), EMULATOR_SHAPE]  # 256 x 64 tiles over pairs, with the lead


def cells() -> list[dict]:
    """ptx_notebook at the stage's shape, with its config at two shapes, the emitter, the counts, the paired runs
    and the emulator."""
    return ptx_notebook(
        19, INTRO, PTX, ["k_end", "k_first", "peer_index", "selp"],
        SASS, ["STAS", "UCGABAR_ARV", "USEL", "QGMMA"], ["USEL"],
        CHECK_NOTE_GENERATED, SHAPES_GPU,
        before=[*CONFIG_CELLS, *EMITTER_CELLS],
        extra=[*opcode_table_cells(19, OPCODES, ("USEL", "UISETP", "USHF", "ISETP", "STAS", "UCGABAR_ARV")),
               *MEASURED_CELLS, *EMULATOR_CELLS],
        ptx_extra=PTX_EXTRA,
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the stage's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)", shape=SHAPE)


__all__ = ["cells", "SHAPES_GPU"]
