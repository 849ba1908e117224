"""Notebook 10: the FFMA interleave pass over the machine code, with the measured gain or loss."""
from __future__ import annotations

from lessons.notebooks.generator_stages import SWEEP_HELPER, generated_notebook
from lessons.notebooks.ipynb import code, markdown
from lessons.notebooks.stage_09 import SHAPES_GPU as SHAPES_GPU_09


INTRO = """\
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


CONFIG = """\
## The config and its one change

Stage 09's config plus a post-pass. `gemm.kernel.launch.cubin` assembles the PTX and then applies each name in
`post_passes` (here DeepGEMM's rule); `stage.cubin(m, n, k)` is that cubin, and it is what `stage.gemm` loads.
"""


EMITTER = """\
## The "emitter": a pass over the cubin

Nothing in the generator changed. The pass, `interleave_ffma`: disassemble once, find the runs, choose the
FFMAs, patch their encodings, then `verify_patch` disassembles the new image and compares it with the old one
instruction by instruction and byte by byte. The rule, `_select_deepgemm`, is a dozen lines.
"""


PTX = """\
## The generated PTX

Stage 09's text: the promotion is a scale product (`mul.f32`) and one `fma.rn.f32` per accumulator, which
ptxas turns into the FFMAs the pass edits. The diff against stage 09 is empty: the pass works below PTX.
"""


PTX_EXTRA = '''

from lessons.diff_stages import ptx_diff

print("\\nPTX diff against stage 09 (instructions, register numbers ignored):", ptx_diff(9, 10, *SHAPE) or "none")'''


SASS = """\
## Resources and SASS

The cubin that runs: stage 09's PTX assembled by ptxas, then the pass (`stage.cubin`). Registers and opcode
counts are stage 09's, necessarily: the pass changes no instruction, only two bits of some. nvdisasm prints the
reuse flag (`.reuse` on an operand) but not the yield bit; `is_yield` reads it from the encoding.
"""


OPCODES = """\
## What changed in the SASS (`lessons diff 9 10`)

Every family's count is stage 09's. The one row that can move is the last, "FFMA yield": the FFMAs whose
yield bit is on.
"""


FIGURE_CELLS = [
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


FFMA_COMMAND = ('python -m gemm bench configs bench production "production:post_passes=(\'ffma_deepgemm\',)" '
                '"production:post_passes=(\'ffma_every_other\',)" --json results/ffma_pass.json')


MEASURED_CELLS = [
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
(`python -m gemm bench configs M,N,K ...`), not a conclusion. The counts earlier say what to expect. On the
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


NUMERICS_CELLS = [
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


SHAPES_GPU = SHAPES_GPU_09


CHECK_NOTE = """\
## Is it right?

On a Hopper GPU: stage 09's checks (fresh operands, NaN-poisoned output, `diff` against the float64 reference on
ragged shapes), and for each shape the same inputs through stage 09 and stage 10, whose outputs must be equal
bit for bit: the pass changes scheduling, not arithmetic. Without a GPU this cell only says so.
"""


CHECK_CODE = f'''\
if is_hopper():
    for m, n, k in {SHAPES_GPU!r}:
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


def cells() -> list[dict]:
    return generated_notebook(
        10, intro=INTRO, config_note=CONFIG, emitter_note=EMITTER,
        emitters=["ptx.passes.interleave_ffma", "ptx.passes._select_deepgemm"],
        ptx_note=PTX, keywords=["mul.f32 %scale", "fma.rn.f32"], ptx_extra=PTX_EXTRA,
        sass_note=SASS, key_opcodes=["FFMA", "QGMMA", "UTMALDG", "UCGABAR_ARV"], sass_opcodes=["FFMA"],
        opcodes_note=OPCODES, figures=FIGURE_CELLS, extra=MEASURED_CELLS, shapes_gpu=SHAPES_GPU,
        check_note=CHECK_NOTE, check_code=CHECK_CODE, emulator=NUMERICS_CELLS,
        cubin_code="stage.cubin(*SHAPE)",
        assembler="stage 09's PTX through standalone ptxas, then ptx.passes.interleave_ffma")
