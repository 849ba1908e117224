"""``python -m lessons``: the command line without a GPU, and the ladder's speed-of-light bounds."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lessons
from gemm.testing.records import three_digits
from lessons import ladder
from lessons.__main__ import main

ROOT = Path(__file__).resolve().parent.parent


def _run(args, timeout=300, **env):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "lessons", *args], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=timeout)


# ------------------------------------------------------------------------------------------ usage

def test_no_arguments_prints_help_listing_the_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "usage: python -m lessons" in out
    for command in ("ladder", "inspect", "diff", "ablate", "figures", "notebooks"):
        assert re.search(rf"^\s+{command}\s+\S", out, re.MULTILINE), f"{command} not listed:\n{out}"


@pytest.mark.parametrize("args", [["inspect", "99"], ["inspect", "x"], ["diff", "6", "21"], ["ablate", "-1"]])
def test_an_unknown_stage_is_a_usage_error_naming_the_stages(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "stages are 0-20" in err and "20 narrow_pair_tiles" in err


def test_ladder_stages_outside_the_ladder_are_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        main(["ladder", "--stages", "0-3"])
    assert "the ladder's stages are 1-20" in capsys.readouterr().err


def test_ablate_a_stage_without_ablations_is_a_clean_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["ablate", "6"])
    assert exit_info.value.code == 2
    assert "lists no ABLATIONS" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ inspect on a CPU

@pytest.mark.parametrize("simulator", ["0", "1"], ids=["in-process", "simulator-on"])
def test_inspect_a_numba_stage_without_gpu(simulator):
    """NVVM compiles Numba's kernel on the CPU: in this process, or in a child when the simulator is on here."""
    result = _run(["inspect", "1"], NUMBA_ENABLE_CUDASIM=simulator)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "kernel naive_kernel" in out and "spill_stores 0" in out and "fma.rn.f32" in out
    assert re.search(r"SASS: \d+ instructions; key opcodes: .*FFMA \d+", out), out
    assert "speed of light" in out and "L1/smem" in out
    assert max(len(line) for line in out.splitlines()) <= ladder.WIDTH


def test_inspect_stage_00_prints_its_ptx_and_shape():
    result = _run(["inspect", "0", "--m", "256", "--k", "1024"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cvt.rn.f16x2.e4m3x2" in result.stdout and "(shape 256x1024)" in result.stdout
    assert "speed of light" not in result.stdout  # not a GEMM: no ladder bound


def test_numba_names_are_demangled():
    from lessons.compile_report import _python_name
    mangled = "_ZN7lessons19_03_register_tiling22register_tiling_kernelB3v13B104cw51cXTLSUwv1sDUaKthqaNgoKmjgEhasCBDC"
    assert _python_name(mangled) == "register_tiling_kernel"
    assert _python_name("fp8_gemm_tma") == "fp8_gemm_tma"


# ------------------------------------------------------------------------------------------ speed of light

def test_unit_table_reproduces_the_h100_sxm_spec_values():
    rates = {key: unit.rate for key, unit in ladder.UNITS.items()}
    assert rates["ffma"] == pytest.approx(67e12, rel=0.01)  # 132 x 128 FMA x 2 x 1.98 GHz
    assert rates["smem"] == pytest.approx(132 * 128 * 1.98e9)
    assert rates["hmma"] == pytest.approx(989.4e12, rel=0.001)
    assert rates["qgmma"] == pytest.approx(1979e12, rel=0.001)
    assert rates["hbm"] == 3.35e12
    assert ladder.FP8_PEAK is ladder.UNITS["qgmma"]


def test_every_gemm_stage_has_a_bound_and_the_mma_sync_stage_is_bound_by_fp16():
    shape = ladder.LADDER_SHAPE
    units = {number: ladder.speed_of_light(number, *shape)["bound_unit"] for number in lessons.GEMM_STAGES}
    assert units == {1: "L1/smem", 2: "L1/smem", 3: "FP32 FFMA", 4: "FP16 HMMA",
                     **{number: "FP8 QGMMA" for number in range(5, 21)}}
    assert ladder.speed_of_light(0, *shape) is None
    # decode-sized M: moving the operands takes longer than the math
    assert ladder.speed_of_light(6, 64, 7168, 16384)["bound_unit"] == "HBM3"


def _docstring(number: int) -> str:
    path = next((ROOT / "lessons").glob(f"{number:02d}_*.py"))
    return ast.get_docstring(ast.parse(path.read_text()))


@pytest.mark.parametrize("number", lessons.GEMM_STAGES)
def test_each_stage_docstring_derives_the_bound_the_ladder_uses(number):
    """The story is told once, in the docstring: its speed-of-light paragraph states the number lessons.ladder uses."""
    text = _docstring(number)
    paragraphs = [p for p in text.split("\n\n") if p.startswith("Speed of light:")]
    assert len(paragraphs) == 1, f"stage {number:02d}: one 'Speed of light:' paragraph expected"
    bound = ladder.speed_of_light(number, *ladder.home_shape(number))  # where the stage is measured
    flat = " ".join(paragraphs[0].split()).replace(",", "")
    assert three_digits(bound["bound_tflops"]).replace(",", "") in flat, (number, bound, flat)
    assert re.search(rf"\b[Ss]tage {number - 1:02d}\b", text), "no word on what changed vs the stage before"
    assert re.search(r"^Measured: .* TFLOP/s", text, re.MULTILINE)


def test_docstrings_point_at_stages_that_exist():
    """No stale forward references: every "stage NN" a stage's docstring names is in this checkout."""
    known = set(lessons.available_stages())
    for number in lessons.STAGES:
        for named in re.findall(r"\b[Ss]tages? (\d\d)\b", _docstring(number)):
            assert int(named) in known, f"stage {number:02d} names stage {named}, which does not exist"


def test_committed_ladder_table_fits_120_columns_and_shows_the_bounds():
    result = ladder.read_committed()
    if result is None:
        pytest.skip("no results/ladder.json")
    text = ladder.committed_table()
    assert max(len(line) for line in text.splitlines()) <= ladder.WIDTH, text
    rows = {line[:2]: line for line in text.splitlines() if line[:2].isdigit()}
    assert "L1/smem" in rows["01"] and "FP32 FFMA" in rows["03"] and "FP16 HMMA" in rows["04"]
    assert "FP8 QGMMA" in rows["08"] and re.search(r"\d+%\s+\d+%", rows["08"])
    assert "1.83 GHz" in text and "1.98 GHz" in text  # each rate's clock is stated


def test_cpu_tables_fit_120_columns_with_every_opcode_family():
    """The no-GPU ladder's two tables, filled with the widest values they can hold."""
    opcodes = {op: 999 for op in ladder.OPCODE_FAMILIES}
    rows = [{"label": ladder._label(number), "kind": "numba", "diff": 1.2e-6, "registers": 255, "spills": 0,
             "shared_bytes": 232448, "opcodes": opcodes, "status": "failed (import)"} for number in lessons.GEMM_STAGES]
    text = ladder.cpu_tables(rows)
    assert max(len(line) for line in text.splitlines()) <= ladder.WIDTH, text


def test_committed_summary_names_the_previous_stage_or_says_there_is_none():
    if ladder.read_committed() is None:
        pytest.skip("no results/ladder.json")
    first, later = (" ".join(ladder.committed_summary(number).split()) for number in (1, 2))
    assert "-x" not in first and "no stage before it" in first
    assert re.search(r"\d+\.\d\dx stage 01", later) and "of its speed of light" in later


# ------------------------------------------------------------------------------------------ figures, notebooks

def test_figures_help_and_an_unknown_figure_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["figures", "--help"])
    assert exit_info.value.code == 0 and "docs/figures" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit) as exit_info:
        main(["figures", "no_such_figure"])
    assert exit_info.value.code == 2 and "08_tile_raster" in capsys.readouterr().err


def test_figures_check_passes_on_the_committed_figures(capsys):
    pytest.importorskip("matplotlib")
    assert main(["figures", "--check"]) == 0
    assert "figures up to date" in capsys.readouterr().out


def test_notebooks_help_check_and_one_mode_at_a_time(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["notebooks", "--help"])
    assert exit_info.value.code == 0 and "--execute" in capsys.readouterr().out
    assert main(["notebooks", "--check"]) == 0
    assert "every notebook is current" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["notebooks", "--check", "--execute", "05"])
    assert exit_info.value.code == 2 and "not allowed with" in capsys.readouterr().err
