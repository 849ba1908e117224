"""Cells of the generator stages (07+). Each is the previous stage's KernelConfig plus one change, so their
notebooks show the change three ways (config fields, the emitter's source, the PTX/SASS it produced) before
running it; stages whose worth is a measurement (09, 10) print a sweep from the committed results/ file."""
from __future__ import annotations

from lessons.notebooks.cells import ptx_notebook
from lessons.notebooks.emulator import break_it_cells, emulator_cells
from lessons.notebooks.ipynb import code, markdown


LADDER_SHAPE = (4096, 4096, 7168)


SPAN_HELPER = '''


def show_span(text, first, last, nth=0, after=0, width=118):
    """The lines from the nth one containing ``first`` (nth=-1: the last) to the next one containing ``last``."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if first in line]
    ends = [i for i in range(starts[nth], len(lines)) if last in lines[i]] if starts else []
    if not ends:  # the generator's text moved on: say which marker, not an IndexError
        raise ValueError(f"no {first!r} ... {last!r} span in this PTX: update the markers in lessons/notebooks/")
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


def two_shape_config_cells(number: int, note: str, extra: str = "") -> list[dict]:
    """A decode stage's config at its own shape (``stage.SHAPE``) and at the ladder's, where it changes nothing and
    its PTX is the previous stage's byte for byte; ``extra``: code appended to the cell."""
    return [
        markdown(note),
        code(f'''\
from lessons.diff_stages import config_changes

SHAPE, LADDER_SHAPE = stage.SHAPE, {LADDER_SHAPE!r}
for shape in (SHAPE, LADDER_SHAPE):
    print(f"M, N, K = {{shape}}: stage {number}:", stage.config(*shape).describe())
    changes = config_changes({number - 1}, {number}, *shape)
    for field, before, after in changes:
        print(f"  {{field:14s}} {{before!r:>10}} -> {{after!r}}")
    if not changes:
        same = stage.generate(*shape) == lessons.stage({number - 1}).generate(*shape)
        print(f"  no field differs from stage {number - 1}; the PTX is stage {number - 1}'s, byte for byte: {{same}}")'''
             + extra),
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


def measured_against_production_cells(number: int, field: str, files: tuple[str, ...], note: str) -> list[dict]:
    """The stage and the one before it from results/ladder.json, then each of ``files`` (``python -m gemm bench
    configs`` results naming ``production`` and ``production:<field>=False``) through :data:`SWEEP_HELPER`'s
    ``show_sweep``: the production config with the stage's field on against off, per shape and over all."""
    without = f"production:{field}=False"
    command = f"python -m gemm bench configs SHAPES production {without} --rounds=4"
    return [
        markdown(note),
        code(f'''\
from lessons.ladder import read_committed

result = read_committed()
if result is None:
    print("No results/ladder.json yet. On a Hopper GPU: python -m lessons ladder")
else:
    rows = {{r.get("stage"): r for r in result["rows"] if r.get("status") == "ok" and r.get("tflops")}}
    for number in ({number - 1}, {number}):
        if number in rows:
            print(f"stage {{number}}: {{rows[number]['tflops']:7.0f}} TFLOP/s")
    if {number - 1} in rows and {number} in rows:
        print(f"stage {number} / stage {number - 1}: {{rows[{number}]['tflops'] / rows[{number - 1}]['tflops']:.3f}}x")
''' + SWEEP_HELPER + "".join(f"\n\n_ = show_sweep({name!r}, {command!r}, ratios=[('production', {without!r})])"
                               for name in files)),
    ]


CHECK_NOTE_GENERATED = """\
## Is it right?

On a Hopper GPU: fresh random operands, NaN-poisoned output, `diff` against the float64 reference (a correct
kernel lands near 1e-6, the BF16 rounding of the output; the pass mark is 1e-3), on ragged shapes: M not a
multiple of the block, N = 2112, N = 2111 (no 16-byte rows: stage 08 keeps the staged epilogue there), and for
stage 08 a shape with more tiles than SMs, so each CTA walks several tiles and the ring's parities and the
deferred store wait cross tile boundaries. The config is chosen per shape (`stage.config(m, n, k)`), as the
ladder does. Without a GPU this cell only says so.
"""



LADDER_AND_ABLATION = '''\
from lessons import results_store
from lessons.ladder import ladder_file, read_committed
from gemm.testing.records import read_result

path = results_store.find(ladder_file(SHAPE))
result = read_committed(path) if path is not None else None
if result is None:
    print("No run yet. On a Hopper GPU: python -m lessons ladder --m {} --n {} --k {} --stages 10-NN".format(*SHAPE))
else:
    print(f"{results_store.shown(path)}: {result['device'].get('name', '?')}, {result['date'][:10]}")
    rows = {row["label"]: row for row in result["rows"] if row.get("status") == "ok"}
    for label, row in rows.items():
        print(f"  {label:24s}{row['time_us']:8.1f} us{row['gbps']:8.0f} GB/s")
    ours = next((row for row in rows.values() if row.get("stage") == NN), None)
    for other in (PREVIOUS, 10, None):
        row = next((r for r in rows.values() if r.get("stage") == other and (other or r.get("kind") == "peer")),
                   None)
        if ours and row:
            print(f"stage NN over {'cuBLAS' if other is None else f'stage {other}'}: "
                  f"{row['time_us'] / ours['time_us']:.2f}x")
path = results_store.find("ablation_NN.json")
if path is not None:
    ablation = read_result(path)
    print(f"\\n{results_store.shown(path)}: {ablation['device'].get('name', '?')}, {ablation['date'][:10]}")
    for row in ablation["rows"]:
        if row.get("time_us"):
            print(f"  {row['name']:WIDTHs}{row['time_us']:8.1f} us   {row.get('vs_stage', 0):.2f}x the full stage")'''


def ladder_and_ablation_cells(number: int, note: str, name_width: int = 34) -> list[dict]:
    """The run at the stage's shape (``ladder_file(SHAPE)``: stages 10-``number`` and cuBLAS) and its ablation
    (``ablation_NN.json``), read from the committed results: the stage over the one before, stage 10 and cuBLAS,
    then each ablation row as a share of the full stage. ``name_width``: the ablation labels' column."""
    source = (LADDER_AND_ABLATION.replace("PREVIOUS", str(number - 1)).replace("NN", f"{number:02d}")
              .replace("WIDTH", str(name_width)))
    return [markdown(note), code(source)]


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


SWEEP_HELPER = '''\
import json
from pathlib import Path
from statistics import median

NOISE = 0.01  # this notebook's threshold for "faster" or "slower"; a choice, not a measured noise figure


def show_sweep(name, command, ratios=None):
    """A ``python -m gemm bench configs`` result: TFLOP/s per shape and config, then each ratio (config, baseline) per shape
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
