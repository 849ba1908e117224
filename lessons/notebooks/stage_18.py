"""Notebook 18: split-K partials pushed with st.async, at the stage's decode shape: the config at two shapes, the
two exchanges' emitters, the messages and the inbox wait in PTX and SASS, the SASS counted against stage 17's, the
paired runs, and the pushed exchange on the emulator with the count and the scope taken wrong."""
from __future__ import annotations

import lessons
from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.generator_stages import CHECK_NOTE_GENERATED, opcode_table_cells, two_shape_config_cells
from lessons.notebooks.ipynb import code, markdown

SHAPE = lessons.stage(18).SHAPE  # where the idea shows (16 x 2112 x 7168); the cells read stage.SHAPE

INTRO = """\
# 18 · Split-K partials pushed with st.async

**The one idea:** where a split's peers hand their totals to rank 0, send them instead of having rank 0 fetch them.
Stage 12's exchange is a pull: ranks 1.. store their FP32 totals in their own shared memory and arrive on the
cluster barrier; rank 0 waits for that phase, reads each peer's totals over distributed shared memory and arrives
on a second phase, which the peers wait for before they exit. Two cluster-wide release/acquire round trips sit
between the last K block and the store of D.

The push: rank 0 keeps an inbox in its own shared memory, one slot per peer. Each peer sends its totals there with
`st.async`, whose bytes complete on rank 0's inbox mbarrier, and exits. Rank 0 counts bytes, not messages: at the
start its thread 0 arrives on that barrier announcing every peer's bytes (`mbarrier.arrive.expect_tx`; exercise
18: how many), and after its K loop rank 0 waits for the phase at cluster scope (`try_wait.parity.acquire.cluster`),
then adds from its own shared memory. One cluster phase is left, at the start: a peer waits on it before its first
message, so no message reaches a barrier that rank 0 has not initialised and armed.

**What changed vs 17:** `split_k_push=True` wherever stage 17 splits K (production's rule). At the ladder's shape
nothing splits, and this stage *is* stage 17: this notebook works, and the stage is measured, at `stage.SHAPE`.

What to look for: `st.async` and the cluster-scope wait in the PTX; in the SASS, 8 cluster-barrier arrives and 8
waits become one of each, 18 MEMBARs become 2, and STAS appears; the inbox in rank 0's shared memory; +2 to +7% in
runs paired round by round.
"""

CONFIG_CELLS = two_shape_config_cells(18, """\
## The config and its change, at two shapes

Stage 17's config plus `split_k_push`, at the stage's shape and at the ladder's, where nothing splits and nothing
differs. Then what the inbox costs: (S - 1) tiles of FP32 totals in rank 0's shared memory, from the plan the
kernel is built from (`gemm.kernel.config.SharedPlan`).""", '''

from gemm.kernel.config import SharedPlan

for shape in (SHAPE, (64, 2112, 7168)):
    for number in (17, 18):
        config = lessons.stage(number).config(*shape)
        plan = SharedPlan(config, *shape[1:])
        print(f"{str(shape):18s} stage {number}: {config.stages:2d} stages, {plan.shared_bytes:7,d} bytes of shared "
              f"memory, inbox {plan.inbox_bytes:6,d} bytes at {plan.inbox_region if plan.inbox_bytes else '-'}")''')

EMITTER_CELLS = [
    markdown("""\
## The emitters: the push, and the gather it replaces

`_Kernel.setup` (its lines that name the inbox): thread 0 inits the inbox barrier and, in rank 0, arrives on it
with the bytes it expects; then every thread arrives on the start's cluster phase. `_Kernel.push_partials`: a
peer waits for that phase, maps its slot of rank 0's inbox and the inbox barrier into the cluster's window
(`mapa`), sends its totals four at a time (`st.async`) and branches past the epilogue; rank 0's math threads wait
for the barrier's phase, then add the inbox into their totals. `_Kernel.gather_partials` below them is stage 17's
exchange."""),
    code('''\
import inspect

from gemm.kernel.generator import _Kernel

setup = inspect.getsource(_Kernel.setup).splitlines()
named = [i for i, line in enumerate(setup) if "inbox" in line or "split_k_push" in line]
print("\\n".join(setup[named[0]:named[-1] + 2]), end="\\n\\n")  # from the inbox's first line past its last
print(inspect.getsource(_Kernel.push_partials))
print(inspect.getsource(_Kernel.gather_partials))'''),
]

PTX = """\
## The generated PTX

At the stage's shape: the start's relaxed arrive, the peer's wait and messages, rank 0's `expect_tx` and its wait
at cluster scope."""

PTX_EXTRA = '''

from lessons.diff_stages import ptx_diff

for generated, number in ((lessons.stage(17).generate(*SHAPE), 17), (ptx_text, 18)):
    lines = [line.strip() for line in generated.splitlines() if not line.strip().startswith(".reg")]
    counts = {op: sum(op in line for line in lines) for op in
              ("barrier.cluster.arrive", "barrier.cluster.wait", "ld.shared::cluster", "st.async", "expect_tx")}
    print(f"stage {number}:", ", ".join(f"{count} x {op}" for op, count in counts.items()))
signs = [line[:1] for line in ptx_diff(17, 18, *SHAPE) if line[:3] not in ("+++", "---")]
print(f"PTX diff against stage 17 (register numbers ignored): +{signs.count('+')} -{signs.count('-')} lines "
      "(python -m lessons diff 17 18 --m {} --n {} --k {} prints it all)".format(*SHAPE))'''

SASS = """\
## Resources and SASS

The cubin that runs, at the stage's shape (ptxas, then stage 10's FFMA pass): the messages are `STAS`, and one
`UCGABAR_ARV` / `UCGABAR_WAIT` pair is left (the start's phase)."""

OPCODES = """\
## What changed in the SASS (`lessons diff 17 18`, at the stage's shape)

The key families, then the cluster barrier's: `UCGABAR_ARV` / `_WAIT` (barrier.cluster.arrive / wait), the
`MEMBAR`s ptxas puts around them, `CCTL` (cache invalidates: the cluster-scope acquires), `STAS` (the messages)
and `LD` (rank 0's reads over DSMEM, gone)."""

MEASURED_CELLS = [
    markdown("""\
## Measured: round by round

`results/sweep_split_k_push_memset.json` and `_clean.json`: production's config (its decode tiles split over three
CTAs, not two as this stage does) with the gathered and the pushed exchange, 8 rounds in alternating order after a
warm-up pass, on an H200, after each flush; there rank 0 armed its inbox barrier after the K loop.
`results/sweep_split_k_push_start_memset.json`: the same after the memset, with the barrier armed at the start, as
this stage's kernel does. Each row: the gathered time over the pushed one (> 1: the push is
faster), median and range over the rounds, how many rounds the push was ahead, and its GB/s. The configs are told
apart by what they do (their description), since production itself has since changed to the push. No number here
is typed in."""),
    code('''\
from statistics import median

from lessons import results_store
from gemm.testing.records import read_result

for name, flush, armed in (("memset", "memset", "after the K loop"), ("clean", "clean", "after the K loop"),
                           ("start_memset", "memset", "at the start")):
    path = results_store.find(f"sweep_split_k_push_{name}.json")
    if path is None:
        print(f"sweep_split_k_push_{name}.json: not in this checkout")
        continue
    result = read_result(path)
    print(f"after the {flush} flush, inbox armed {armed} ({results_store.shown(path)}, "
          f"{result['device'].get('name', '?')}, {result['date'][:10]}):")
    by_shape = {}
    for row in result["rows"]:
        by_shape.setdefault((row["m"], row["n"], row["k"]), {})["partials pushed" in row["config"]] = row
    for shape, rows in by_shape.items():
        gathered, pushed = rows[False], rows[True]
        ratios = [g / p for g, p in zip(gathered["round_us"], pushed["round_us"])]  # round by round
        ahead = sum(ratio > 1 for ratio in ratios)
        print(f"  {str(shape):18s} {median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}), ahead in {ahead} "
              f"of {len(ratios)}; {gathered['gbps']:,.0f} -> {pushed['gbps']:,.0f} GB/s")'''),
]

EMULATOR_SHAPE = (27, 136, 640)  # 32-token tiles, a ragged last tile of weight rows, 5 K blocks over 3 CTAs

EMULATOR_CELLS = [
    markdown(f"""\
## Run the push on the CPU, then get it wrong

At M, N, K = {EMULATOR_SHAPE} the stage's tiles split over three CTAs (production's decode split; the stage splits
over two), its ring cut to two stages: two peers push into rank 0's inbox, exact under several random schedules.
Then the same PTX with rank 0's `expect_tx` one peer's bytes short, or 16 bytes over (exercise 18's count taken
wrong), and with the inbox wait at try_wait's default `.acquire.cta` scope: the emulator names each."""),
    code(f'''\
from gemm.kernel import generate
from gemm.kernel.config import SharedPlan
from gemm.testing.emulated import run_gemm
from ptx.emulate import EmulationError

m, n, k = {EMULATOR_SHAPE!r}
problem = random_problem(m, n, k, np.random.default_rng(0))
reference = reference_gemm(*problem)
config = stage.config(m, n, k).replace(split_k=3, stages=2)
print(config.describe())
for seed in (None, 1, 2, 3):
    out = run_gemm(config, *problem, sm_count=4, seed=seed)
    print(f"schedule {{seed}}: every element written: {{bool(np.isfinite(out).all())}}, "
          f"diff = {{calc_diff(out, reference):.1e}}")

plan = SharedPlan(config, n, k)
text = generate(config, n, k)
arrive = next(line for line in text.splitlines() if "expect_tx" in line and "[%inbox_bar" in line)
print("\\nrank 0's arrive:", arrive.strip())
wrong = {{"one peer's bytes short": plan.inbox_bytes - plan.partials_bytes, "16 bytes over": plan.inbox_bytes + 16}}
for what, count in wrong.items():
    broken = text.replace(arrive, arrive.replace(f", {{plan.inbox_bytes}};", f", {{count}};"))
    for seed in (None, 1):
        try:
            run_gemm(config, *problem, sm_count=4, seed=seed, ptx=broken)
            print(f"{{what}}, schedule {{seed}}: ran")
        except EmulationError as error:
            print(f"{{what}}, schedule {{seed}}: {{str(error)[:150]}} ...")
try:
    run_gemm(config, *problem, sm_count=4,
             ptx=text.replace("try_wait.parity.acquire.cluster.", "try_wait.parity."))
except EmulationError as error:
    message = str(error)
    print("\\nthe CTA-scoped wait:", message[message.index("the phase it waits for"):][:260], "...")'''),
]

SHAPES_GPU = [SHAPE, (5, 576, 1152), (64, 2112, 7168), EMULATOR_SHAPE]  # pushed: 16-, 8- and 32-token, 256 x 64


def cells() -> list[dict]:
    """ptx_notebook at the stage's shape, with its config at two shapes, the emitters, the counts, the paired runs
    and the emulator."""
    return ptx_notebook(
        18, INTRO, PTX, ["st.async", "expect_tx", "barrier.cluster", "acquire.cluster"],
        SASS, ["STAS", "UCGABAR_ARV", "UCGABAR_WAIT", "MEMBAR", "SYNCS", "QGMMA"], ["STAS", "UCGABAR_ARV"],
        CHECK_NOTE_GENERATED, SHAPES_GPU,
        before=[*CONFIG_CELLS, *EMITTER_CELLS],
        extra=[*opcode_table_cells(18, OPCODES, ("UCGABAR_ARV", "UCGABAR_WAIT", "MEMBAR", "CCTL", "STAS", "LD")),
               *MEASURED_CELLS, *EMULATOR_CELLS],
        ptx_extra=PTX_EXTRA,
        ptx_comment="The config is generated for (N, K); M is a kernel parameter. This is the stage's shape.",
        assembler="stage 10's path: standalone ptxas (setmaxnreg), then ptx.passes.interleave_ffma",
        cubin_code="stage.cubin(*SHAPE)", shape=SHAPE)


__all__ = ["cells", "SHAPES_GPU"]
