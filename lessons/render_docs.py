"""``python -m lessons docs``: regenerate the results tables in docs/ and the stages' "Measured:" lines from the
committed result files (tables are never typed by hand).

    python -m lessons docs            # rewrite the blocks between the markers
    python -m lessons docs --check    # exit 1 if a doc is out of date with results/

Each block sits between ``<!-- NAME -->`` and ``<!-- /NAME -->`` in a Markdown file; everything outside
the markers is left alone. The table columns are the ones the benchmark commands print. It rewrites a checkout
(docs/ and the stage modules are not installed), from the checkout's results/ (:mod:`lessons.results_store`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import textwrap
from pathlib import Path

from gemm.testing.records import Column, format_table, read_result, three_digits
from lessons import results_store, training_recipe
from lessons.ablate import format_ablation_table
from lessons.ladder import (BOUNDS, CLOCK_NOTE, DOC_COLUMNS, LADDER_SHAPE, UNIT_COLUMNS, home_shape,
                            ladder_file, percent, speed_of_light, unit_rows, with_bounds)


def replace_block(text: str, name: str, content: str) -> str:
    """Replace what lies between <!-- name --> and <!-- /name --> (markers kept)."""
    pattern = re.compile(rf"(<!-- {re.escape(name)} -->\n).*?(<!-- /{re.escape(name)} -->)", re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"markers <!-- {name} --> ... <!-- /{name} --> not found")
    return pattern.sub(lambda match: match.group(1) + content.rstrip("\n") + "\n" + match.group(2), text, count=1)


def describe_device(result: dict) -> str:
    device = result["device"]
    packages = device.get("packages", {})
    clocks = ""
    if device.get("sm_clock_max_mhz"):
        clocks = f", SM clock {device.get('sm_clock_mhz', '?')}/{device['sm_clock_max_mhz']} MHz (now/max)"
    software = ", ".join(f"{name} {packages[name]}" for name in ("torch", "numba-cuda", "cuda-bindings")
                         if packages.get(name))
    return (f"Measured on {device.get('name', 'unknown GPU')} ({device.get('sm_count', '?')} SMs{clocks}), "
            f"driver {device.get('driver_version', '?')}, CUDA runtime {device.get('cuda_runtime', '?')}, "
            f"nvJitLink {device.get('nvjitlink', '?')}, "
            f"{software}; {result['date']}.\nCommand: `{result['command']}`.")


def ladder_block(result: dict, png: Path | None, doc_dir: Path) -> str:
    shape = result.get("shape", {})
    rows = with_bounds(result["rows"], shape, result.get("device", {}).get("name"))
    lines = [f"M={shape.get('m')}, N={shape.get('n')}, K={shape.get('k')}. "
             f"{describe_device(result)}", "", format_table(DOC_COLUMNS, rows, markdown=True)]
    if png is not None and png.exists():
        lines += ["", f"![TFLOP/s per stage]({_relative(png, doc_dir)})"]
    return "\n".join(lines)


def speed_of_light_block() -> str:
    """The hardware table and each stage's bound, from lessons.ladder (UNITS, BOUNDS): never typed by hand."""
    stage_rows = []
    for number in sorted(BOUNDS):
        bound = speed_of_light(number, *LADDER_SHAPE)
        stage_rows.append({"stage": f"{number:02d}", "unit": bound["bound_unit"], "sol": bound["bound_tflops"],
                           "why": bound["why"]})
    stage_columns = [Column("stage", "stage", align="left"), Column("unit", "limit", align="left"),
                     Column("sol", "SOL TFLOP/s", three_digits), Column("why", "why", align="left")]
    m, n, k = LADDER_SHAPE
    return "\n".join([format_table(UNIT_COLUMNS, unit_rows(), markdown=True), "", CLOCK_NOTE, "",
                      f"Each stage's bound at M={m} N={n} K={k} (`lessons.ladder.BOUNDS`; HBM would bind only if "
                      "moving A, B and D once took longer):", "",
                      format_table(stage_columns, stage_rows, markdown=True)])


def bench_block(result: dict, png: Path | None, doc_dir: Path) -> str:
    """The same-run peer table (python -m gemm bench dense): every contender's TFLOP/s per shape, the ratios, the
    summary and the host time per call."""
    from gemm.testing.bench_peers import columns, contender_names, describe_summary, table_rows
    names = contender_names(result["rows"])
    table = format_table(columns(names, result["rows"]), table_rows(result["rows"], names), markdown=True)
    lines = [describe_device(result), "", table]
    if result.get("summary"):
        lines += ["", describe_summary(result["summary"]) + "."]
    overhead = result.get("host_overhead")
    if overhead:
        from gemm.testing.bench_host import describe_overhead
        lines += ["", describe_overhead(overhead)]
    if png is not None and png.exists():
        lines += ["", f"![TFLOP/s per shape, every contender in the same run]({_relative(png, doc_dir)})"]
    return "\n".join(lines)


def flush_block(result: dict) -> str:
    """``python -m gemm bench flush``: ours and the memory floor after each L2 flush (gemm.testing.bench_flush)."""
    from gemm.testing.bench_flush import COLUMNS, flat_row
    return "\n".join([describe_device(result), "", format_table(COLUMNS, [flat_row(r) for r in result["rows"]],
                                                                markdown=True)])


def ablation_block(result: dict) -> str:
    """A ``python -m lessons ablate N`` result: its rows in the columns the command prints (lessons.ablate)."""
    shape = result.get("shape", {})
    return "\n".join([f"M={shape.get('m')}, N={shape.get('n')}, K={shape.get('k')}. {describe_device(result)}", "",
                      format_ablation_table(result["rows"], markdown=True)])


ABLATION_MARKER = re.compile(r"<!-- (ablation_(\d\d)) -->")


def ablation_blocks(results: Path, docs: Path) -> dict[str, str]:
    """Every ``ablation_NN`` block: from results/ablation_NN.json, or, for a marker in a doc whose stage has not
    been measured yet, the note saying which command makes it."""
    blocks = {}
    for doc in sorted(docs.glob("*.md")):
        for name, number in ABLATION_MARKER.findall(doc.read_text()):
            blocks[name] = _missing(f"python -m lessons ablate {int(number)}", f"{name}.json")
    for ablation in sorted(results.glob("ablation_*.json")):
        blocks[ablation.stem] = ablation_block(read_result(ablation))
    return blocks


def sweep_block(result: dict) -> str:
    """A config sweep's result (``python -m gemm bench configs``): one row per shape, TFLOP/s of each config and its ratio
    to the first."""
    names = result.get("configs") or sorted({r["name"] for r in result["rows"]})
    shapes = sorted({(r["m"], r["n"], r["k"]) for r in result["rows"]}, key=lambda s: (s[0], s[1], s[2]))
    by = {(r["m"], r["n"], r["k"], r["name"]): r for r in result["rows"]}
    clocked = any(r.get("sm_mhz") is not None for r in result["rows"])  # bench configs --clocks
    header = "| M | N | K | " + " | ".join(f"`{name}` TFLOP/s" for name in names) + " | " + \
        " | ".join(f"`{name}` vs first" for name in names[1:]) + \
        "".join(f" | `{name}` SM MHz / W" for name in names if clocked) + " |"
    lines = [describe_device(result), "", header, "|" + "---:|" * ((3 + 2 * len(names) - 1) + clocked * len(names))]
    for m, n, k in shapes:
        rows = [by.get((m, n, k, name), {}) for name in names]
        tflops = [f"{r['tflops']:.0f}" if "tflops" in r else "-" for r in rows]
        ratios = [_vs_first(r) for r in rows[1:]]
        clocks = [_clock_text(r) for r in rows] if clocked else []
        lines.append(f"| {m} | {n} | {k} | " + " | ".join(tflops + ratios + clocks) + " |")
    return "\n".join(lines)


def _clock_text(row: dict) -> str:
    """A config's median SM clock and board power over its rounds (bench configs --clocks), "1714 / 706"."""
    mhz, watts = row.get("sm_mhz"), row.get("power_w")
    return " / ".join("-" if value is None else f"{value:.0f}" for value in (mhz, watts)) \
        if (mhz, watts) != (None, None) else "-"


def _vs_first(row: dict) -> str:
    """A config's speed against the first: round by round (median, low-high) where the sweep kept its rounds,
    else the ratio of the two bests."""
    from gemm.testing.bench_configs import paired_text
    paired = row.get("vs_first_paired")
    if paired:
        return paired_text(paired, "x")
    return f"{row['vs_first']:.2f}x" if "vs_first" in row else "-"  # absent: a config that did not apply


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()


def _missing(command: str, name: str) -> str:
    return (f"_No result yet: run `{command}` on a Hopper GPU, commit `results/{name}`, "
            "then `python -m lessons docs`._")


H200_LADDER = "ladder_h200.json"  # python -m lessons ladder on an H200 (--out elsewhere, then copied here)


def measured_stages(result: dict, *, ok_only: bool = True) -> set[int]:
    """The stages whose "Measured:" line ``result`` (a ladder run) gives: an ok row at the stage's home shape
    (``ok_only=False``: any row, a failed one included)."""
    shape = _shape(result)
    return {row["stage"] for row in result["rows"] if isinstance(row.get("stage"), int)
            and (row.get("status") == "ok" or not ok_only) and home_shape(row["stage"]) == shape}


def _shape(result: dict) -> tuple[int, int, int]:
    shape = result["shape"]
    return tuple(shape[key] for key in ("m", "n", "k")) if isinstance(shape, dict) else tuple(shape)


def measured_lines(result: dict, lessons_dir: Path, *, source: str | None = None,
                   skip: set[int] = frozenset()) -> dict[Path, str]:
    """Each ladder stage's docstring paragraph "Measured: ..." rewritten from the ladder result: TFLOP/s, the speedup
    over the stage before, and the share of its speed of light (lessons.ladder) and of the FP8 peak. ``source``: the
    result's file name where it is not :func:`lessons.ladder.ladder_file`'s; ``skip``: stages another run gives."""
    m, n, k = _shape(result)
    rendered = {}
    source, command = source or ladder_file((m, n, k)), result["command"]
    wanted = measured_stages(result) - set(skip)
    for row in with_bounds(result["rows"], (m, n, k), result.get("device", {}).get("name")):
        number = row.get("stage")
        if number not in wanted:
            continue  # each stage's line comes from the run at its home shape
        matches = sorted(lessons_dir.glob(f"{number:02d}_*.py"))
        if not matches:
            continue
        speedup = row.get("speedup")
        versus = f", {speedup:.2f}x stage {number - 1:02d}" if isinstance(speedup, (int, float)) else ""
        bound = (f"; {percent(row['pct_bound'])} of its speed of light ({row['bound_unit']}, "
                 f"{three_digits(row['bound_tflops'])} TFLOP/s), {percent(row['pct_fp8'])} of the FP8 peak"
                 if "pct_bound" in row else "")
        line = (f"Measured: {three_digits(row['tflops'])} TFLOP/s at M={m} N={n} K={k} on {result['device']['name']}"
                f"{versus}{bound} (results/{source}, `{command}`).")
        paragraph = textwrap.fill(line, 116, break_on_hyphens=False)
        text = matches[0].read_text()
        # the paragraph: the "Measured:" line and the non-blank lines after it, up to the docstring's end
        new = re.sub(r'^Measured:.*(?:\n(?!""")[^\n]+)*', lambda _: paragraph, text, count=1, flags=re.MULTILINE)
        if new != text:
            rendered[matches[0]] = new
    return rendered


def ablation_lines(results: Path, lessons_dir: Path, rendered: dict[Path, str]) -> dict[Path, str]:
    """A stage docstring's paragraph "Ablations measured: ..." rewritten from results/ablation_NN.json: each
    variant's speed as a share of the full stage's. Stages without the paragraph, or without a result, are left
    alone; ``rendered`` holds texts already rewritten (the "Measured:" line), which this one continues from."""
    updated = {}
    for path in sorted(results.glob("ablation_*.json")):
        number = int(path.stem.split("_")[1])
        matches = sorted(lessons_dir.glob(f"{number:02d}_*.py"))
        if not matches:
            continue
        text = rendered.get(matches[0], matches[0].read_text())
        if not re.search(r"^Ablations measured:", text, re.MULTILINE):
            continue
        result = read_result(path)
        shape, prefix = result.get("shape", {}), f"{number:02d} "
        parts = []
        for row in result["rows"]:
            if not row["name"].startswith(prefix):
                continue
            label = row["name"][len(prefix):]
            if row.get("status") == "ok" and isinstance(row.get("vs_stage"), (int, float)):
                parts.append(f"{label} {row['vs_stage']:.2f}x ({three_digits(row['tflops'])} TFLOP/s)")
            else:
                parts.append(f"{label}: {row.get('status', 'not run')}")
        full = next((r for r in result["rows"] if r["name"] == f"stage {number:02d}"), {})
        speed = f"{three_digits(full['tflops'])} TFLOP/s" if full.get("tflops") else "not timed"
        command = result.get("command") or f"python -m lessons ablate {number}"  # its shape, where not the ladder's
        line = (f"Ablations measured: the full stage, {speed} at M={shape.get('m')} N={shape.get('n')} "
                f"K={shape.get('k')} on {result['device'].get('name', 'a GPU')}; with one idea off, its speed as a "
                f"share of that: {'; '.join(parts)} (results/{path.name}, `{command}`).")
        paragraph = textwrap.fill(line, 116, break_on_hyphens=False)
        new = re.sub(r'^Ablations measured:.*(?:\n(?!""")[^\n]+)*', lambda _: paragraph, text, count=1,
                     flags=re.MULTILINE)
        if new != text:
            updated[matches[0]] = new
    return updated


def grouped_block(result: dict) -> str:
    """The MoE grouped GEMMs' table (gemm bench grouped): ours and our dense GEMM at the same M."""
    from gemm.testing.bench_grouped import GROUPED_COLUMNS
    lines = [describe_device(result), "", format_table(GROUPED_COLUMNS, result["rows"], markdown=True)]
    if result.get("reference_note"):
        lines += ["", result["reference_note"]]
    return "\n".join(lines)


def wgrad_block(result: dict) -> str:
    """The weight-gradient GEMMs beside DeepGEMM (gemm bench wgrad): TFLOP/s per contender and the ratio."""
    peers = sorted({name for row in result["rows"] for name in row.get("tflops", {}) if name.startswith("deepgemm")})
    columns = ([Column("shape", "M x N x K (tokens)", "{}"), Column("ours", "ours TFLOP/s", "{:.0f}")] +
               [Column(name, f"{name} TFLOP/s", "{:.0f}") for name in peers] +
               [Column("ratio", "ours / DeepGEMM", "{:.3f}"), Column("status", "check", "{}")])
    rows = []
    for row in result["rows"]:
        failed = [name for name in row.get("errors", {}) if name.startswith("deepgemm")]
        rows.append({"shape": (f"k-grouped G={row['groups']} " if "groups" in row else "") +
                     f"{row['M']}x{row['N']}x{row['K']}",
                     **{name: row.get("tflops", {}).get(name, float("nan")) for name in ["ours"] + peers},
                     "ratio": row.get("ours_vs_best_deepgemm", float("nan")),
                     "status": row["status"] + (f"; {', '.join(failed)}: wrong output" if failed else "")})
    summary = result.get("summary", {})
    lines = [describe_device(result), "", format_table(columns, rows, markdown=True)]
    if "geomean_ours_vs_deepgemm" in summary:
        lines += ["", f"ours / DeepGEMM: geomean {summary['geomean_ours_vs_deepgemm']:.3f} over "
                      f"{summary['compared']} shapes, {summary['at_or_above']} at or above 1.0, lowest "
                      f"{summary['lowest']:.3f}, highest {summary['highest']:.3f}."]
    return "\n".join(lines)


def grading_block(grading: dict) -> str:
    """The grader's per-stage thresholds (results/grading.json, python -m lessons calibrate) and the shares of the
    speed-of-light bound the stage's own code reached in the run they were set from."""
    lines = ["| stage | threshold (share of the bound) | the stage's own code | measured on |", "|---|---|---|---|"]
    for stage, entry in grading["stages"].items():
        measured = entry.get("measured") or {}
        threshold = entry.get("perf_threshold")
        shares = ", ".join(f"{pct:.1f}% at {shape}" for shape, pct in (measured.get("pct_bound") or {}).items())
        where = ", ".join(str(x) for x in (measured.get("device"), (measured.get("date") or "")[:10]) if x)
        if isinstance(threshold, dict):
            threshold = ", ".join(f"{100 * share:.0f}% at {shape}" for shape, share in threshold.items())
        elif threshold is not None:
            threshold = f"{100 * threshold:.0f}% at every shape"
        lines.append(f"| {stage} | {threshold or 'not graded'} | "
                     f"{shares or measured.get('note') or entry.get('note') or '–'} | {where or '–'} |")
    rules = sorted({(entry.get("measured") or {}).get("rule") for entry in grading["stages"].values()} - {None})
    if rules:
        lines += ["", "Rule: " + "; ".join(rules) + "."]
    return "\n".join(lines)


def render(results: Path, docs: Path, lessons: Path | None = None) -> dict[Path, str]:
    """The new text of every doc in ``docs`` that holds a results block."""
    ladder_json, bench_json = results / "ladder.json", results / "gemm_bench.json"
    blocks = {
        "speed_of_light": speed_of_light_block(),
        "ladder_results": ladder_block(read_result(ladder_json), results / "ladder.png", docs)
        if ladder_json.exists() else _missing("python -m lessons ladder", "ladder.json"),
        "gemm_bench_results": bench_block(read_result(bench_json), results / "gemm_bench.png", docs)
        if bench_json.exists() else _missing("python -m gemm bench dense", "gemm_bench.json"),
    }
    # the same bench after the clean flush; on an H200 after either flush
    for name in ("gemm_bench_clean_l2", "gemm_bench_h200", "gemm_bench_h200_clean_l2"):
        other_json = results / f"{name}.json"
        if other_json.exists():
            blocks[f"{name}_results"] = bench_block(read_result(other_json), other_json.with_suffix(".png"), docs)
    flush_json = results / "l2_flush.json"
    if flush_json.exists():
        blocks["l2_flush"] = flush_block(read_result(flush_json))
    blocks.update(ablation_blocks(results, docs))
    grouped_json = results / "grouped_bench.json"
    blocks["grouped_bench_results"] = grouped_block(read_result(grouped_json)) if grouped_json.exists() else \
        _missing("python -m gemm bench grouped", "grouped_bench.json")
    wgrad_json = results / "wgrad.json"
    blocks["wgrad_results"] = wgrad_block(read_result(wgrad_json)) if wgrad_json.exists() else \
        _missing("python -m gemm bench wgrad --deepgemm deepgemm-2507=FOLDER", "wgrad.json")
    grading_json = results / "grading.json"
    if grading_json.exists():
        blocks["grading_thresholds"] = grading_block(json.loads(grading_json.read_text()))
    training_json = results / training_recipe.RESULT_NAME
    blocks["training_precision"] = training_recipe.markdown_block(read_result(training_json)) \
        if training_json.exists() else (f"_No result yet: run `{training_recipe.COMMAND}` (CPU, seconds), commit "
                                         f"`results/{training_recipe.RESULT_NAME}`, then `python -m lessons docs`._")
    for sweep in (results / "ffma_pass.json", results / "multicast.json", results / "pdl_back_to_back.json",
                  results / "uniform_offsets.json", results / "pdl_clean_flush.json", results / "early_poll.json",
                  results / "early_poll_reversed.json", results / "sweep_l2_eviction_memset.json",
                  results / "sweep_l2_eviction_clean.json", results / "sweep_overlap_epilogue.json",
                  results / "sweep_overlap_peeled_recheck.json", results / "sweep_aa_paired.json",
                  results / "sweep_overlap_paired.json", results / "sweep_even_waves_paired.json",
                  results / "sweep_even_waves_clocks.json", results / "sweep_even_waves_k.json",
                  results / "sweep_raster_even.json", results / "sweep_multicast_b.json",
                  results / "sweep_split_k_push_memset.json", results / "sweep_split_k_push_clean.json",
                  results / "sweep_split_k_push_start_memset.json", results / "sweep_decode_ring_depth.json",
                  results / "sweep_split_k_lead_memset.json", results / "sweep_split_k_lead_clean.json",
                  results / "sweep_256x128_vs_128x192.json", results / "sweep_split_k_lead_pairs_memset.json",
                  results / "sweep_split_k_lead_256x64.json",
                  results / "sweep_split_k_lead_swapped_pairs.json",
                  results / "sweep_compute_bound_extras.json"):
        if sweep.exists():
            blocks[sweep.stem] = sweep_block(read_result(sweep))
    other_ladders = sorted(results.glob("ladder_*x*x*.json"))  # runs at a stage's own shape (ladder_file)
    for path in other_ladders:
        blocks[f"ladder_results_{path.stem.removeprefix('ladder_')}"] = ladder_block(
            read_result(path), path.with_suffix(".png"), docs)
    rendered = {}
    if lessons is not None:
        for path in ([ladder_json] if ladder_json.exists() else []) + other_ladders:
            rendered.update(measured_lines(read_result(path), lessons))
        # a stage newer than the reference run (results/ladder.json, H100) takes its line from the H200 ladder; a
        # stage the reference ran, even one that failed there, does not (the H200 would hide the failure)
        h200_json = results / H200_LADDER
        if h200_json.exists():
            covered = measured_stages(read_result(ladder_json), ok_only=False) if ladder_json.exists() else set()
            rendered.update(measured_lines(read_result(h200_json), lessons, source=H200_LADDER, skip=covered))
    if lessons is not None:
        rendered.update(ablation_lines(results, lessons, rendered))
    for doc in sorted(docs.glob("*.md")):
        text = original = doc.read_text()
        for name, content in blocks.items():
            if f"<!-- {name} -->" in text:
                text = replace_block(text, name, content)
        if text is not original:
            rendered[doc] = text
    return rendered


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, default=None, help="result files to draw from (default: the "
                        "checkout's results/)")
    parser.add_argument("--docs", type=Path, default=None, help="Markdown files to rewrite (default: the checkout's "
                        "docs/)")
    parser.add_argument("--lessons", type=Path, default=None,
                        help="folder of stage modules whose 'Measured:' line to rewrite (default: lessons/ "
                             "when --results is the default)")
    parser.add_argument("--check", action="store_true", help="only report docs that are out of date (exit 1)")


def run(args) -> int:
    """``python -m lessons docs``: the parsed arguments -> exit code (1: ``--check`` found stale docs)."""
    checkout = results_store.checkout_dir()
    if checkout is None and (args.results is None or args.docs is None):
        print("python -m lessons docs: no checkout here (an installed package has no docs/ to rewrite): run it in the "
              "repository, or give --results and --docs")
        return 2
    repository = results_store.REPOSITORY
    results = args.results or checkout
    docs = args.docs or repository / "docs"
    lessons = args.lessons or (repository / "lessons" if args.results is None else None)
    stale = []
    for doc, text in render(results, docs, lessons).items():
        if doc.read_text() != text:
            stale.append(doc)
            if not args.check:
                doc.write_text(text)
    verb = "out of date" if args.check else "updated"
    print(f"{verb}: {', '.join(map(str, stale))}" if stale else "docs up to date")
    return 1 if (args.check and stale) else 0
