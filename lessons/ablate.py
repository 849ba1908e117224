"""``python -m lessons ablate 4|5|8|15|20``: a bundled stage, each of its ideas turned off on its own, timed (GPU).

A stage that must bundle ideas lists them as ``ABLATIONS = {label: changes}``; each row is the stage with one
change undone, checked against the float64 reference (NaN-poisoned D, every element written) and timed with the
ladder's one kernel timer (:func:`gemm.testing.timer.bench_kernel`: CUDA-graph replay of (L2 flush; call) pairs), next to
the previous stage and the stage itself, on the same inputs. Writes ``ablation_NN.json``. The changes are:

* for a stage built on the production generator (08, 15, 20): :class:`gemm.kernel.config.KernelConfig` fields;
* for a hand-written PTX stage (04, 05): fields of the stage's ``Options`` (a frozen dataclass whose defaults
  are the stage as taught), which its ``generate(m, n, k, options)`` and ``gemm(..., options=)`` take.

Without a GPU the command says so and shows what it would run: the configs (08), or each variant assembled for
sm_90a on the CPU with its registers, spills and key SASS opcodes (04, 05: LDSM goes to 0 without ldmatrix, ...).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import re
from pathlib import Path

import lessons

TIMING = "CUDA-graph replay of (256 MiB L2 flush; call) pairs minus flushes only; median of 5"
# SASS opcode families worth a column when a variant changes them (lessons.compile_report.KEY_OPCODES)
SASS_COLUMNS = ["HMMA", "QGMMA", "LDSM", "LDS", "STS", "LDGSTS", "LDG", "STG", "BAR"]


def stages_with_ablations() -> list[int]:
    """Stage numbers whose module declares ABLATIONS, found in the source (no stage is imported)."""
    found = []
    for number, name in sorted(lessons.STAGES.items()):
        spec = importlib.util.find_spec(f"lessons.{name}")
        if spec is None or not spec.origin:
            continue
        if re.search(r"^ABLATIONS\s*=", Path(spec.origin).read_text(), re.MULTILINE):
            found.append(number)
    return found


def _ablations(number: int):
    module = lessons.stage(number)
    ablations = getattr(module, "ABLATIONS", None)
    if not ablations:
        listed = ", ".join(f"{n:02d}" for n in stages_with_ablations())
        raise ValueError(f"stage {number} lists no ABLATIONS (it adds one idea); stages with ablations: {listed}")
    return module, ablations


def ablation_configs(number: int, m: int, n: int, k: int) -> dict:
    """A generator stage (08): {row name: KernelConfig}, the previous stage's, the stage's, one per ablation."""
    from gemm.kernel.config import max_stages
    module, ablations = _ablations(number)
    full = module.config(m, n, k)
    configs = {f"stage {number - 1:02d}": lessons.stage(number - 1).config(m, n, k), f"stage {number:02d}": full}
    for label, changes in ablations.items():
        config = full.replace(**changes)
        deepest = changes.get("stages", full.stages)  # an ablation may undo a deeper ring (15); else the stage's
        configs[f"{number:02d} {label}"] = config.replace(stages=min(deepest, max_stages(config, n, k)) or 2)
    return configs


def ablation_options(number: int) -> dict:
    """A hand-written PTX stage (04, 05): {row name: Options}, the stage's defaults, then one per ablation."""
    module, ablations = _ablations(number)
    full = module.Options()
    variants = {f"stage {number:02d}": full}
    for label, changes in ablations.items():
        variants[f"{number:02d} {label}"] = dataclasses.replace(full, **changes)
    return variants


def uses_options(number: int) -> bool:
    return hasattr(lessons.stage(number), "Options")


def ablation_columns(rows: list[dict]):
    """The table's columns (terminal and docs/ladder.md): stage 08's, plus registers, spills and the SASS opcode
    counts that differ between rows when the rows carry them (04, 05); no timing columns for rows never timed."""
    from gemm.testing.bench_configs import CONFIG_COLUMNS
    from gemm.testing.records import Column
    columns = CONFIG_COLUMNS[:2]
    if any("registers" in row for row in rows):
        columns += [Column("registers", "regs"), Column("spill_bytes", "spill B")]
        for name in SASS_COLUMNS:
            counts = {row.get("sass", {}).get(name) for row in rows if "sass" in row}
            if len(counts) > 1:
                columns.append(Column(f"sass_{name}", name))
    if not any("time_us" in row or "status" in row for row in rows):  # assembled on a CPU: nothing timed
        return columns
    return columns + CONFIG_COLUMNS[2:-1] + [Column("vs_stage", "vs the full stage", "{:.2f}x"), CONFIG_COLUMNS[-1]]


def _table_rows(rows: list[dict]) -> list[dict]:
    return [{**row, **{f"sass_{name}": count for name, count in row.get("sass", {}).items()}} for row in rows]


def format_ablation_table(rows: list[dict], *, markdown: bool = False) -> str:
    from gemm.testing.records import format_table
    return format_table(ablation_columns(rows), _table_rows(rows), markdown=markdown)


def assembled(module, m: int, n: int, k: int, options) -> dict:
    """Registers, spilled bytes and key SASS opcode counts of one variant, assembled for sm_90a (no GPU)."""
    from lessons.compile_report import key_opcode_counts
    from ptx.compile import compile_ptx
    from ptx.sass import disassemble, opcode_counts
    cubin = compile_ptx(module.generate(m, n, k, options))
    resources = cubin.resources[module.KERNEL]
    counts = key_opcode_counts(opcode_counts(disassemble(cubin)))
    return {"registers": resources.registers,
            "spill_bytes": (resources.spill_stores or 0) + (resources.spill_loads or 0),
            "shared_bytes": options.shared_bytes, "sass": {name: counts[name] for name in SASS_COLUMNS}}


def _option_rows_without_gpu(number: int, m: int, n: int, k: int) -> list[dict]:
    module = lessons.stage(number)
    rows = []
    for name, options in ablation_options(number).items():
        rows.append({"name": name, "config": options.describe(), **assembled(module, m, n, k, options)})
    return rows


def time_options(number: int, m: int, n: int, k: int, rng=None) -> list[dict]:
    """Check then time the previous stage, the stage and each ablated variant on one problem (GPU)."""
    import numpy as np

    from gemm.testing.problems import reference_rows
    from gemm.testing.problems import flops, gemm_bytes, random_problem
    from gemm.testing.problems import checked_run, device_problem
    from gemm.testing.timer import bench_kernel
    module = lessons.stage(number)
    previous = lessons.stage(number - 1)
    rng = rng or np.random.default_rng()
    host = random_problem(m, n, k, rng)
    reference = reference_rows(*host, rng)
    problem = device_problem(*host)
    before = previous.Options().describe() if hasattr(previous, "Options") else \
        f"{getattr(previous, 'KIND', '?')}: {getattr(previous, 'IDEA', '')}"
    entries = [(f"stage {number - 1:02d}", previous.gemm, {"config": before})]
    for name, options in ablation_options(number).items():
        entries.append((name, functools.partial(module.gemm, options=options),
                        {"config": options.describe(), **assembled(module, m, n, k, options)}))
    rows = []
    for name, run, facts in entries:
        row = {"name": name, **facts}
        try:
            check = checked_run(run, problem, reference)
            timing = bench_kernel(lambda stream: run(problem.a, problem.sa, problem.b, problem.sb, problem.d,
                                                     stream=stream))
            row.update(time_us=timing.median_us, min_us=timing.min_us, tflops=timing.tflops(flops(m, n, k)),
                       gbps=timing.gbps(gemm_bytes(m, n, k)), diff=check["diff"], unwritten=check["unwritten"],
                       status="ok" if check["correct"] else "WRONG")
        except Exception as error:  # one broken variant must not cost the others' rows
            row.update(status="failed", error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
        rows.append(row)
        print(f"{name}: {row['status']}" + (f" {row['tflops']:.0f} TFLOP/s" if "tflops" in row else ""), flush=True)
    return rows


def ablate(number: int, m: int, n: int, k: int, out: Path) -> int:
    from ptx.device import is_hopper
    options = uses_options(number)
    if options:
        _ablations(number)
    else:
        configs = ablation_configs(number, m, n, k)
    if not is_hopper():
        if options:
            print(f"ablations are timings: they need a Hopper GPU. The variants that would run, assembled for "
                  f"sm_90a at M={m} N={n} K={k} (spill B: bytes spilled + refilled; SASS: opcodes in the kernel):")
            print(format_ablation_table(_option_rows_without_gpu(number, m, n, k)))
        else:
            print("ablations are timings: they need a Hopper GPU. The configs that would run:")
            for name, config in configs.items():
                print(f"  {name}: {config.describe()}")
        return 2  # nothing was timed: a script that asked for an ablation must not take this for one
    from gemm.testing.records import command_line, device_info, write_result
    if options:
        rows = time_options(number, m, n, k)
    else:
        from gemm.testing.bench_configs import time_configs
        rows = time_configs(m, n, k, configs)
    base = next(r for r in rows if r["name"] == f"stage {number:02d}")
    for row in rows:
        if row.get("time_us") and base.get("time_us"):
            row["vs_stage"] = base["time_us"] / row["time_us"]
    print(f"M={m} N={n} K={k}")
    print(format_ablation_table(rows))
    out.mkdir(parents=True, exist_ok=True)
    write_result(out / f"ablation_{number:02d}.json", command=command_line("lessons"), rows=rows,
                 device=device_info(), shape={"m": m, "n": n, "k": k}, timing=TIMING)
    return 0 if all(r["status"] == "ok" for r in rows) else 1
