"""Every stage notebook executes top to bottom without a cell error: on a CPU with Numba's simulator and
the PTX only assembled; on a Hopper GPU through its real paths, correctness checks and timings included.

Notebooks run in a fresh kernel with the repository root as working directory and on PYTHONPATH. With
nbclient and ipykernel installed (the ``test`` extra) they run in a real Jupyter kernel; without them the
code cells are run in order as one script in a fresh interpreter, so a bare GPU machine still checks them.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lessons
from lessons.__main__ import main
from lessons.notebooks import write as notebook_writer
from lessons.notebooks.ipynb import render

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
TOPIC_NOTEBOOKS = [NOTEBOOK_DIR / "precision.ipynb",  # not a stage: the numerics of FP8 scaling and promotion
                   NOTEBOOK_DIR / "moe_grouped.ipynb",  # not a stage: MoE grouped GEMMs, their layouts and walks
                   NOTEBOOK_DIR / "training_recipe.ipynb"]  # not a stage: forward, dgrad and wgrad in FP8
CELL_TIMEOUT_S = 600  # a GPU run compiles kernels and times the ladder shape; the CPU run takes seconds


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _stage_of(path: Path) -> int:
    return int(path.name[:2])


def _skip_if_stage_missing(path: Path) -> None:
    number = _stage_of(path)
    if number not in lessons.available_stages():
        pytest.skip(f"lessons/{lessons.STAGES[number]} does not exist yet")


def _have_jupyter() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("nbclient", "nbformat", "ipykernel"))


def _use_this_interpreter_as_python3(kernels_root: Path, monkeypatch) -> None:
    """Put a "python3" kernelspec running sys.executable first on JUPYTER_PATH.

    Otherwise a "python3" kernel registered in the user's home (searched before the environment's own)
    could run the notebooks in some other Python, without this checkout's dependencies.
    """
    spec_dir = kernels_root / "kernels" / "python3"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (tests)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(filter(None, [str(kernels_root),
                                                                     os.environ.get("JUPYTER_PATH")])))


def _run_with_nbclient(path: Path) -> None:
    import nbclient
    import nbformat
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(ROOT)}})
    client.execute(env=_environment())


def _run_as_script(path: Path) -> None:
    cells = json.loads(path.read_text())["cells"]
    script = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_environment(), capture_output=True,
                            text=True, timeout=CELL_TIMEOUT_S * len(cells))
    assert result.returncode == 0, f"{path.name} failed:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"


def test_one_notebook_per_stage():
    assert [_stage_of(p) for p in NOTEBOOKS] == sorted(lessons.STAGES)
    for path in NOTEBOOKS:
        assert path.stem == lessons.STAGES[_stage_of(path)], f"{path.name} is not named after its stage"


def test_notebooks_are_valid_nbformat():
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS + TOPIC_NOTEBOOKS:
        nbformat.validate(nbformat.read(path, as_version=4))


def test_notebooks_match_their_generator(capsys):
    assert main(["notebooks", "--check"]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("path", NOTEBOOKS + TOPIC_NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS + TOPIC_NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    if path in NOTEBOOKS:
        _skip_if_stage_missing(path)
    if _have_jupyter():
        _use_this_interpreter_as_python3(tmp_path, monkeypatch)
        _run_with_nbclient(path)
    else:
        _run_as_script(path)


# ------------------------------------------------------------------------------ cells that print arithmetic

def _code_cell(name: str, marker: str) -> str:
    cells = json.loads((NOTEBOOK_DIR / f"{name}.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code" and marker in "".join(c["source"])]
    assert len(sources) == 1, f"{name}: one code cell with {marker!r} expected"
    return sources[0]


def _exec_cell(source: str, namespace: dict, capsys) -> str:
    exec(compile(source, "<cell>", "exec"), namespace)
    return capsys.readouterr().out


def test_notebook_06_shared_memory_plan_adds_up(capsys):
    """Each printed total is the sum of the terms printed beside it."""
    out = _exec_cell(_code_cell("06_tma_pipeline", "stage.Plan("), {"stage": lessons.stage(6)}, capsys)
    sums = re.findall(r"(\d+) stages x (\d+) B \(A (\d+) \+ B (\d+) \+ A's scales (\d+)\) \+ \d+ x (\d+) B mbarriers "
                      r"\+ (\d+) B alignment slack = (\d+) B", out)
    assert len(sums) == 3, out
    for stages, stage_bytes, a, b, scales, barrier, slack, total in (map(int, s) for s in sums):
        assert stage_bytes == a + b + scales and stages * (stage_bytes + barrier) + slack == total


def test_timing_cells_say_what_the_first_stage_is_compared_with(capsys):
    """The committed-results line has a number or a sentence where the speedup goes, never "-x"."""
    if not (ROOT / "results" / "ladder.json").exists():
        pytest.skip("no results/ladder.json")
    for name in ("01_naive", "02_smem_tiling"):
        out = _exec_cell(_code_cell(name, "committed_summary("), {"is_hopper": lambda: False}, capsys)
        assert "-x" not in out and "speed of light" in out, out
        if name == "01_naive":
            assert "no stage before it" in out, out


# ------------------------------------------------------------------------------ committed outputs

@pytest.mark.parametrize("path", NOTEBOOKS + TOPIC_NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS + TOPIC_NOTEBOOKS])
def test_notebook_is_committed_with_the_outputs_of_a_clean_run(path):
    """Outputs stored by one run of every cell in order (execution counts 1, 2, ...), none of them an error."""
    rerun = f"run: python -m lessons notebooks --execute {path.relative_to(ROOT)}"
    code = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert any(c["outputs"] for c in code), f"{path.name} has no outputs; {rerun}"
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1)), \
        f"{path.name}: its outputs are not from one run of every cell in order; {rerun}"
    errors = [f"{c['id']}: {o['ename']}: {o['evalue']}" for c in code for o in c["outputs"]
              if o["output_type"] == "error"]
    assert not errors, f"{path.name} has error outputs ({'; '.join(errors)}); {rerun}"


def test_regenerating_keeps_outputs_of_unchanged_notebooks(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(notebook_writer, "NOTEBOOKS", tmp_path)
    built = notebook_writer.build()
    for name, nb in built.items():
        (tmp_path / f"{name}.ipynb").write_text(render(nb))
    executed = json.loads(render(built["01_naive"]))
    for count, cell in enumerate((c for c in executed["cells"] if c["cell_type"] == "code"), 1):
        cell["execution_count"] = count
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [f"cell {count}\n"]}]
    (tmp_path / "01_naive.ipynb").write_text(render(executed))
    edited = json.loads(render(built["02_smem_tiling"]))
    edited["cells"][0]["source"] = ["# an edit by hand\n"]
    edited["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["stale\n"]}]
    (tmp_path / "02_smem_tiling.ipynb").write_text(render(edited))

    assert main(["notebooks", "--check"]) == 1  # the edited source counts; outputs do not
    assert "02_smem_tiling.ipynb" in capsys.readouterr().out
    assert main(["notebooks"]) == 0
    assert json.loads((tmp_path / "01_naive.ipynb").read_text()) == executed  # outputs kept
    assert (tmp_path / "02_smem_tiling.ipynb").read_text() == render(built["02_smem_tiling"])
    assert main(["notebooks", "--check"]) == 0


TOY_NOTEBOOK = [
    ("code", "import os, sys\nprint('cwd', os.path.basename(os.getcwd()))\nprint('to stderr', file=sys.stderr)"),
    ("markdown", "# not run"),
    ("code", "x = 6 * 7\ndisplay(x)\nx + 1"),
    ("code", "def helper():\n    return 'no output'"),
    ("code", "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.show()\nprint('after the figure')"),
]


def _toy(path: Path, cells) -> None:
    path.write_text(json.dumps({
        "cells": [{"cell_type": kind, "id": f"toy-{i}", "metadata": {}, "source": source,
                   **({"execution_count": None, "outputs": []} if kind == "code" else {})}
                  for i, (kind, source) in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5}))


def test_executor_without_jupyter_stores_what_jupyter_would(tmp_path):
    """The fallback a bare GPU machine uses: streams, display(), the last expression, figures, cwd, errors."""
    pytest.importorskip("matplotlib")
    folder = tmp_path / "notebooks"
    folder.mkdir()
    good, bad = folder / "good.ipynb", folder / "bad.ipynb"
    _toy(good, TOY_NOTEBOOK)
    _toy(bad, [("code", "print('before')"), ("code", "1 / 0"), ("code", "print('never')")])
    bad_text = bad.read_text()
    result = subprocess.run([sys.executable, "-m", "lessons", "notebooks", "--engine", "exec", "--timeout", "120",
                             "--execute", str(good), str(bad)], cwd=ROOT, env=_environment(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 1 and "ZeroDivisionError" in result.stderr, result.stdout + result.stderr
    assert bad.read_text() == bad_text, "a notebook whose run failed must not be written"

    code = [c for c in json.loads(good.read_text())["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == [1, 2, 3, 4]
    streams = {o["name"]: "".join(o["text"]) for o in code[0]["outputs"]}
    assert streams == {"stdout": "cwd notebooks\n", "stderr": "to stderr\n"}
    kinds = [(o["output_type"], o["data"]["text/plain"]) for o in code[1]["outputs"]]
    assert kinds == [("display_data", ["42"]), ("execute_result", ["43"])]
    assert code[1]["outputs"][1]["execution_count"] == 2
    assert code[2]["outputs"] == []
    figure, printed = code[3]["outputs"]
    assert figure["output_type"] == "display_data" and figure["data"]["image/png"].startswith("iVBORw0KGgo")
    assert "".join(printed["text"]) == "after the figure\n"


@pytest.mark.parametrize("engine", ["nbclient", "exec"])
def test_a_figure_drawn_without_pyplot_is_stored_as_png(tmp_path, engine):
    """The course's figures are matplotlib Figures made without pyplot (lessons.figures); display(figure) must
    store a PNG under either engine (a Jupyter kernel registers no PNG formatter for them on its own)."""
    pytest.importorskip("matplotlib")
    if engine == "nbclient":
        for module in ("nbclient", "nbformat", "ipykernel"):
            pytest.importorskip(module)
    folder = tmp_path / "notebooks"
    folder.mkdir()
    toy = folder / "figure.ipynb"
    _toy(toy, [("code", "from matplotlib.figure import Figure\nfigure = Figure(figsize=(2, 1))\n"
                        "figure.subplots().plot([0, 1], [1, 0])\ndisplay(figure)")])
    result = subprocess.run([sys.executable, "-m", "lessons", "notebooks", "--engine", engine, "--timeout", "120",
                             "--execute", str(toy)], cwd=ROOT, env=_environment(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (output,) = [o for c in json.loads(toy.read_text())["cells"] for o in c["outputs"]]
    assert output["output_type"] == "display_data" and output["data"]["image/png"].startswith("iVBORw0KGgo"), output


# ------------------------------------------------------------------------------ the course exercise

@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stage_notebook_ends_with_its_exercise(path):
    """The last two cells: exercise N's prompt (naming its skeleton) and a cell that grades the student's copy,
    whose committed output is a report: the skeleton's FAILED, or the grade of a notebooks/my_exNN.py."""
    from lessons.exercises import exercise
    number = _stage_of(path)
    *_, prompt, grading = json.loads(path.read_text())["cells"]
    prompt_text, grading_text = "".join(prompt["source"]), "".join(grading["source"])
    skeleton = exercise(number).skeleton.relative_to(ROOT).as_posix()
    assert prompt["cell_type"] == "markdown" and prompt_text.startswith(f"## Exercise {number:02d}:"), prompt_text
    assert skeleton in prompt_text and f"notebooks/my_ex{number:02d}.py" in prompt_text, prompt_text
    assert grading["cell_type"] == "code" and f"grade({number}, " in grading_text, grading_text
    printed = "".join("".join(o.get("text", "")) for o in grading["outputs"] if o["output_type"] == "stream")
    rerun = f"run: python -m lessons notebooks --execute {path.relative_to(ROOT)}"
    graded = printed.partition("\n")[0]  # "grading stage NN (name): <the file>"
    assert graded.endswith(f"notebooks/my_ex{number:02d}.py") or (
        graded.endswith(f": {skeleton}") and printed.rstrip().endswith("FAILED")), \
        f"{path.name}: the grading cell's output is not a report on the skeleton (FAILED) or a my_ex file; " \
        f"{rerun}\n{printed}"
