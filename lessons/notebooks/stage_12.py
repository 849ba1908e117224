"""Notebook 12: split-K over a thread-block cluster, at the stage's decode shape and measured by the run there."""
from __future__ import annotations

import lessons
from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.emulator import BREAK_INTRO, break_setup
from lessons.notebooks.generator_stages import CHECK_NOTE_GENERATED, opcode_table_cells, two_shape_config_cells
from lessons.notebooks.ipynb import code, markdown
from lessons.notebooks.stage_11 import SHAPES_GPU as SHAPES_GPU_11


SHAPE = lessons.stage(12).SHAPE  # where the idea shows (16 x 2112 x 7168); the cells read stage.SHAPE


INTRO = """\
# 12 · Split-K over a thread-block cluster

**The one idea:** where the tiles are fewer than the SMs, let S CTAs share each tile. Stages 07-11 give every
tile to one CTA. At M = 4096 that is hundreds of tiles for 132 SMs; at decode (M = 1-16 tokens) it is a handful:
16 × 2112 × 7168 on stage 11's 256 × 64 tiles is 33 of them, walked by 32 persistent CTAs, so 32 SMs stream all
of B while 100 idle. Decode reads B once and does little else, so its bound is HBM, and one SM cannot pull more
than a small share of HBM's bandwidth: the idle SMs are idle bandwidth. Give each tile a cluster of S CTAs
(`.reqnctapercluster S, 1, 1`) and split its K blocks between them:

* **shares** (`gemm.kernel.config.k_share`): cluster rank r computes K blocks [r·Kb/S, (r+1)·Kb/S) into its own
  FP32 totals, and its producer loads only those (`k_first`, `k_end`, set up in `_Kernel.setup`);
* **exchange** (`_Kernel.gather_partials`): ranks 1.. write their totals into their own idle ring and arrive on
  the cluster barrier; rank 0 waits for that phase, reads each peer's totals through distributed shared memory
  (`mapa` + `ld.shared::cluster.v4`), adds them and runs the epilogue alone;
* **lifetime**: a CTA's shared memory vanishes when it exits, so the peers wait on a second cluster-barrier
  phase that rank 0 completes only after its reads.

**What changed vs 11:** `split_k=S` and, where S > 1, `persistent=False` (one tile per cluster) and
`multicast=1`. S = 2 where twice the tiles still give every CTA an SM (`gemm.kernel.config.widest_split`); not 4:
the driver keeps only 30 clusters of four resident on the H100, so 33 would run in two waves. Where stage 11's
tiles already fill the SMs (the ladder's 4096 × 4096 × 7168) S = 1 and this stage *is* stage 11: this notebook
works, and the stage is measured, at its own shape, `stage.SHAPE`.

What to look for: both K loops bounded by `k_first` and `k_end`; the exchange between cluster-barrier phases and
its SASS; twice the CTAs busy; the measurement against stages 10 and 11; the emulator on two ways to get it wrong.
"""


CONFIG_CELLS = two_shape_config_cells(12, """\
## The config and its change, at two shapes

Stage 11's config plus the fields of `CHANGE` in lessons/12_split_k.py, at the stage's shape and at the ladder's.
At the ladder's the split is 1 and nothing differs: the generated PTX is stage 11's, byte for byte.""", '''
config = stage.config(*SHAPE)
print(f"\\nat {SHAPE}: clusters of {config.cluster_size}, {stage.shared_bytes(*SHAPE)} bytes of shared memory")''')


EMITTER_CELLS = [
    markdown("""\
## The emitter: the shares and `_Kernel.gather_partials`

`k_share` is the rule; `_Kernel.setup` emits it in PTX from `%cluster_ctarank` (S is a power of two: the division
is a shift) and makes `k_end` the bound of both K loops. After the math loop, `gather_partials`: ranks 1.. wait for
the other math warpgroup to finish reading the ring, store their totals into it, four per `st.shared.v4`, and
arrive twice on the cluster barrier; rank 0 waits out the first phase, maps each peer's copy of the same offset
(`mapa`), loads it into the idle wgmma accumulators, adds, and arrives to release the peers."""),
    code('''\
import inspect

from gemm.kernel.config import k_share
from gemm.kernel.generator import _Kernel

print(inspect.getsource(k_share))
setup = inspect.getsource(_Kernel.setup).splitlines()
first = next(i for i, line in enumerate(setup) if "c.split_k > 1" in line)
last = next(i for i in range(first, len(setup)) if "self.k_blocks = k_end" in setup[i])
print("\\n".join(setup[first:last + 1]), end="\\n\\n")
print(inspect.getsource(_Kernel.gather_partials))'''),
]


PTX = """\
## The generated PTX

At the stage's shape: the excerpt; every line that sets or reads the shares (the setup, then the math loop's and
the producer's bounds); the exchange, repeated instructions counted (rank 1's stores and two cluster-barrier
phases, then rank 0's phase, `mapa`, loads, adds and arrive); the diff against stage 11, summarised.
"""


PTX_EXTRA = '''


def show_folded(text, first, last, after):
    """The lines from the first containing ``first`` to the first containing ``last`` past the last containing
    ``after``; at most two of each opcode printed (labels, branches and barriers always), the others counted."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    past = max(i for i, line in enumerate(lines) if after in line)
    end = next(i for i in range(past, len(lines)) if last in lines[i])
    seen, hidden = Counter(), Counter()
    for i in range(start, end + 1):
        opcode = (lines[i].split() or [""])[0]
        seen[opcode] += 1
        if seen[opcode] > 2 and not opcode.startswith(("$", "@", "bra", "barrier")):
            hidden[opcode] += 1
            continue
        if hidden:
            print(f"{'':5s}  ... {', '.join(f'{count} x {name}' for name, count in hidden.items())} ...")
            hidden.clear()
        print(f"{i + 1:5d}  {lines[i]}")


print("\\nthe shares: set up, then the bounds of the math loop and of the producer's loop")
for i, line in enumerate(ptx_text.splitlines()):
    if ("%k_first" in line or "%k_end" in line) and not line.lstrip().startswith(".reg"):
        print(f"{i + 1:5d}  {line}")
print("\\nthe exchange:")
show_folded(ptx_text, "setp.eq.u32 %p_rank0", "barrier.cluster.arrive", after="ld.shared::cluster")

from lessons.diff_stages import ptx_diff

signs = [line[:1] for line in ptx_diff(11, 12, *SHAPE) if line[:3] not in ("+++", "---")]
print(f"\\nPTX diff against stage 11 (register numbers ignored): +{signs.count('+')} -{signs.count('-')} lines: the "
      "shares and the exchange above; gone, the persistent tile walk and the multicast's remote releases "
      "(python -m lessons diff 11 12 --m {} --n {} --k {} prints it all)".format(*SHAPE))'''


SASS = """\
## Resources and SASS

The cubin that runs, at the stage's shape (ptxas, then stage 10's FFMA pass). The math is stage 11's; new are
`STS.128` (rank 1's stores), `LD.E.128` (rank 0's `ld.shared::cluster.v4`), FADD and `UCGABAR_ARV` / `_WAIT`.
"""


OPCODES = """\
## What changed in the SASS (`lessons diff 11 12`, at the stage's shape)

STS, LD and FADD come with the exchange. Fewer UTMALDG and SYNCS: stage 11 multicasts A to 2-CTA clusters here
(stage 12's clusters share K instead). More UCGABAR: stage 11's PTX has two cluster-barrier arrives, stage 12's six
(two phases each for rank 1, rank 0 and the producer), and ptxas lays some out on more than one path to an EXIT.
"""


OCCUPANCY_CELLS = [
    markdown("""\
## Tiles, CTAs, SMs: 10, 11 and 12

Counted from the configs at the stage's shape: tiles, CTAs launched (`gemm.kernel.launch.grid`), SMs idle, K blocks
per CTA (`k_share`), rows of zero fill per A box, bytes of B each CTA keeps in flight (ring stages × a B box); then
the speed of light and the bandwidth each busy SM would need to reach it. The figure `12_split_k_cluster`
(`lessons.figures.split_k_cluster`, under Figures below) draws the SMs, the shares and the exchange."""),
    code('''\
from gemm.fp8 import ceil_div
from gemm.heuristics import device_facts
from gemm.kernel.config import k_share, tiles
from gemm.kernel.launch import grid as launch_grid
from lessons.ladder import speed_of_light

m, n, k = SHAPE
sms, k_blocks = device_facts().sm_count, ceil_div(k, 128)
rows = {}
for number in (10, 11, 12):
    c = lessons.stage(number).config(*SHAPE)
    lengths = sorted({end - first for first, end in (k_share(r, c.split_k, k_blocks) for r in range(c.split_k))})
    rows[number] = {"tile, ring stages": f"{c.block_m}x{c.block_n}, {c.stages}", "tiles": tiles(c, m, n),
                    "CTAs per tile (split_k)": c.split_k, "CTAs launched": launch_grid(c, m, n, sms),
                    "K blocks per CTA": "/".join(map(str, lengths)), "A rows of zero fill": c.block_m - m,
                    "B in flight per CTA, KiB": c.stages * c.block_n * 128 // 1024}
    rows[number]["SMs idle"] = sms - min(rows[number]["CTAs launched"], sms)
print(f"{'':28s}" + "".join(f"{f'stage {number}':>14s}" for number in rows))
for field in rows[12]:
    print(f"{field:28s}" + "".join(f"{row[field]!s:>14}" for row in rows.values()))
bound = speed_of_light(12, *SHAPE)
print(f"\\nspeed of light: {bound['bound_us']:.1f} us, {bound['bound_unit']} at {bound['unit_rate']}: {bound['why']}")
for number, row in rows.items():
    busy = min(row["CTAs launched"], sms)
    print(f"stage {number}: each of {busy} SMs would have to pull "
          f"{gemm_bytes(m, n, k) / bound['bound_us'] / 1e3 / busy:.0f} GB/s")'''),
]


MEASURED_CELLS = [
    markdown("""\
## Measured: the run at the stage's shape

`results/ladder_16x2112x7168.json` (`lessons.ladder.ladder_file`): stages 10-12 and cuBLAS on a Hopper GPU, checked
against the float64 reference and timed with the one kernel timer. The cell prints their times, GB/s, shares of the
HBM bound and speedups from it, or the command that writes it. No number here is typed in."""),
    code('''\
from lessons import results_store
from lessons.ladder import ladder_file, percent, read_committed, with_bounds

NAME, COMMAND = ladder_file(SHAPE), "python -m lessons ladder --m {} --n {} --k {} --stages 10-12".format(*SHAPE)
path = results_store.find(NAME)
result = read_committed(path) if path is not None else None
if result is None:
    print(f"No results/{NAME} yet. On a Hopper GPU this writes it:\\n    {COMMAND}")
else:
    print(f"{results_store.shown(path)}: {result['device'].get('name', '?')}, {result['date'][:10]}; "
          f"{result['timing']}")
    rows = with_bounds(result["rows"], result["shape"])
    found = {**{f"stage {s}": next((r for r in rows if r.get("stage") == s), None) for s in (10, 11, 12)},
             "cuBLAS": next((r for r in rows if r.get("kind") == "peer"), None)}
    timed = {name: row for name, row in found.items() if row and row.get("status") == "ok" and row.get("tflops")}
    print(f"\\n{'':10s}{'time (us)':>12s}{'GB/s':>10s}{'of the HBM bound':>18s}")
    for name, row in found.items():
        print(f"{name:10s}" + (f"{row['time_us']:12.1f}{row['gbps']:10.0f}{percent(row['pct_bound']):>18s}"
                               if name in timed else f"  no time in this run: {COMMAND}"))
    for other in ("stage 11", "stage 10", "cuBLAS"):
        if "stage 12" in timed and other in timed:
            print(f"stage 12 over {other}: {timed[other]['time_us'] / timed['stage 12']['time_us']:.2f}x "
                  "(above 1: stage 12 is faster)")'''),
    markdown("""\
## Reading the result

The work is reading B once: read GB/s against HBM's 3.35 TB/s. Stage 12 over stage 11 is the split alone (the
same tiles and ring, twice the SMs pulling B, plus the exchange and the cluster barriers): above 1, short of 2.
Stage 12 against stage 10 and cuBLAS is what the split does not fix: stage 11's tall tiles are a prefill idea. At
M = 16 a 256-row A box is mostly TMA zero fill and leaves room for half of stage 10's ring, so each CTA keeps half
as much of B in flight (the table above); the split doubles the CTAs, not that. The production heuristics give
decode a deeper ring, this split and, at M <= 32, tiles turned around: the weight's rows as wgmma's 64-row side and
8-32 token rows as its N, so nothing is zero-filled (docs/benchmarks.md, "Decode: wide tiles, and K split over a
cluster" and "Swap AB"). One run is one measurement."""),
]


EMULATOR_SHAPE = (20, 200, 1408)  # one 256-row tile row, 4 tiles (the last 8 wide); 11 K blocks: shares of 5 and 6


EMULATOR_CELLS = [
    markdown(f"""\
## Run the PTX on the CPU: `ptx.emulate.run_stage`

`ptx.emulate` executes this stage's PTX on NumPy, clusters of 2 CTAs and their `barrier.cluster` phases included,
`ld.shared::cluster` reading the peer's shared memory (an error if it has exited). M, N, K = {EMULATOR_SHAPE}: 4
tiles of 256 × 64 (the last 8 wide, rows past M zero-filled) and 11 K blocks, shares of 5 and 6, each wrapping the
4-stage ring. A correct kernel ends `COMPLETED` and matches the float64 reference to about 1e-6."""),
    code(f'''\
from ptx.emulate import run_stage

m, n, k = {EMULATOR_SHAPE!r}
a, sa, b, sb = random_problem(m, n, k, np.random.default_rng(0))
out, report = run_stage(stage, a, sa, b, sb)  # one CTA per tile and rank: no persistent grid to size
print(report)
assert report.ok, report.error
diff = calc_diff(out, reference_gemm(a, sa, b, sb))
print(f"every element written: {{bool(np.isfinite(out).all())}}, diff against the float64 reference = {{diff:.1e}}")
assert np.isfinite(out).all() and diff < 1e-3, "the emulated kernel disagrees with the float64 reference"'''),
]


BREAK_SETUP = break_setup(EMULATOR_SHAPE, None) + '''


def k_blocks_product(first, end):
    """The float64 product over K blocks [first, end) only: what a CTA's share contributes to D."""
    a, sa, b, sb, columns = *problem, slice(128 * first, 128 * end)
    return reference_gemm(a[:, columns], sa[:, first:end], b[:, columns], sb[:, first:end])'''


NO_EXCHANGE = ("""\
### Rank 0 skips the exchange

`skip_exchange` adds two lines: after its first cluster-barrier phase, rank 0 branches over its `mapa`, loads and
adds. Every barrier phase is kept, so nothing hangs; rank 1 stores its totals and nobody adds them. D is exactly
rank 0's share, the product over K blocks 0-4 alone: the last line checks it.""", '''\
def skip_exchange(ptx):
    """Rank 0 branches from its first cluster-barrier phase over its mapa, loads and adds, to its arrive."""
    lines = ptx.splitlines(keepends=True)
    mapa = next(i for i, line in enumerate(lines) if "mapa.shared::cluster" in line)
    arrive = next(i for i in range(mapa, len(lines)) if "barrier.cluster.arrive" in lines[i])
    lines[arrive:arrive] = ["$exchange_skipped:\\n"]
    lines[mapa:mapa] = ["    bra $exchange_skipped;\\n"]
    return "".join(lines)


out, report = break_it(skip_exchange)
assert report.ok and show_wrong(out) > 0.1
first, end = k_share(0, 2, k // 128)
print(f"D against rank 0's share alone, K blocks {first}-{end - 1}: "
      f"diff = {calc_diff(out, k_blocks_product(first, end)):.1e}")''')


OVERLAP = ("""\
### Shares that overlap

The seam `gemm.kernel.seams.Seams(k_share=...)` replaces the generator's shares with a Python function (exercise
12's hole), kept as a `.const` table. `overlapping` starts rank 1 one block early, so K block 4 is in both shares.
Each CTA loads what it multiplies and the exchange is intact: the run completes, and every element of D counts
block 4 twice. The last line checks it: D = the reference + block 4's product.""", '''\
from gemm.kernel.seams import Seams
from gemm.testing.emulated import run_gemm


def overlapping(rank, split_k, k_blocks):
    """The generator's shares, but each rank after the first starts one block early."""
    first, end = k_share(rank, split_k, k_blocks)
    return max(first - 1, 0), end


print("shares:", [overlapping(rank, 2, k // 128) for rank in range(2)], "of", k // 128, "K blocks")
out = run_gemm(stage.config(m, n, k), *problem, seams=Seams(k_share=overlapping))
assert show_wrong(out) > 1e-3
twice = overlapping(1, 2, k // 128)[0]
print(f"D against the reference + block {twice}'s product: diff = "
      f"{calc_diff(out, reference + k_blocks_product(twice, twice + 1)):.1e}")''')


# the two ways this stage's split goes wrong: a tile missing a peer's totals, a K block counted twice
BREAK_CELLS = [markdown(BREAK_INTRO + "\nThe second changes the generator's answer through its seam, not the text."),
               code(BREAK_SETUP), markdown(NO_EXCHANGE[0]), code(NO_EXCHANGE[1]),
               markdown(OVERLAP[0]), code(OVERLAP[1])]


SHAPES_GPU = SHAPES_GPU_11 + [SHAPE, (5, 576, 1152), EMULATOR_SHAPE]  # split over 2: the stage's, ragged ones


def cells() -> list[dict]:
    """ptx_notebook at the stage's shape, with its config at two shapes, its own emulator shape and breaks."""
    return ptx_notebook(
        12, INTRO, PTX,
        ["%cluster_ctarank", "st.shared.v4", "barrier.cluster", "mapa", "ld.shared::cluster"],
        SASS, ["QGMMA", "FADD", "STS", "LD", "UCGABAR_ARV", "UCGABAR_WAIT", "UTMALDG"], ["STS", "LD"],
        CHECK_NOTE_GENERATED, SHAPES_GPU,
        before=[*CONFIG_CELLS, *EMITTER_CELLS],
        extra=[*opcode_table_cells(12, OPCODES, ("LD", "UCGABAR_ARV", "UCGABAR_WAIT", "EXIT")), *OCCUPANCY_CELLS,
               *MEASURED_CELLS, *EMULATOR_CELLS, *BREAK_CELLS],
        ptx_extra=PTX_EXTRA,
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the stage's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)", shape=SHAPE)


__all__ = ["cells", "SHAPES_GPU"]
