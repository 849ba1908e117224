"""``python -m lessons notebooks --execute``: execute the notebooks in place and store their outputs, so the
committed notebooks (and the docs site that renders them) show a real run.

    python -m lessons notebooks --execute                  # every notebook in notebooks/
    python -m lessons notebooks --execute notebooks/05_wgmma.ipynb 08 precision   # some of them
    python -m lessons notebooks --execute --timeout 1200   # seconds per cell (default 600)

The committed outputs come from whichever machine ran this last. On a Hopper GPU machine, from the repository
root, the one command that refreshes them all with GPU outputs (real kernels, correctness checks, timings) is

    python -m lessons notebooks --execute

After editing the cells in lessons/notebooks/: ``python -m lessons notebooks`` rewrites the changed notebooks
without outputs, then this executes them.

Each notebook runs in a fresh interpreter with notebooks/ as working directory, as Jupyter runs it, and the
repository root on PYTHONPATH. With nbclient and ipykernel installed (the ``test`` extra) it runs in a real
Jupyter kernel; without them (a bare GPU machine) a small executor needs no Jupyter: the code cells run with
``exec`` in one namespace, stdout and stderr captured per cell, ``display(obj)`` and a cell's last expression
stored as Jupyter stores them, and the matplotlib figures a cell draws stored as PNG (when matplotlib is there).

What is stored adds no noise of its own: execution counts 1, 2, ... in cell order, no timestamps, the notebook's
and the cells' metadata left as ``python -m lessons notebooks`` wrote them (so its ``--check`` still
passes), consecutive writes to a stream merged, progress-bar carriage returns resolved, figures at 72 DPI (what
the cells print, random inputs and wall times included, differs from run to run). A notebook whose run fails is
not written; the error is printed and the exit status is 1.
"""
from __future__ import annotations

import argparse
import ast
import base64
import builtins
import contextlib
import importlib.util
import io
import json
import linecache
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

from lessons.notebooks import CHECKOUT
from lessons.notebooks.ipynb import render  # the generator's JSON layout, so both commands write the same bytes

NOTEBOOKS = CHECKOUT / "notebooks"
FIGURE_DPI = 72  # matplotlib's default is 100: the figures stay legible and the notebooks' JSON smaller
DEFAULT_TIMEOUT_S = 600  # per cell: a GPU run compiles kernels and times the ladder's shape


# ------------------------------------------------------------------------------------------ notebook files

def resolve(names: list[str]) -> list[Path]:
    """Notebook paths from paths, file names, stems or stage numbers ("05", "precision")."""
    every = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not names:
        return every
    out = []
    for name in names:
        path = Path(name)
        if path.suffix == ".ipynb" and path.exists():
            out.append(path.resolve())
            continue
        hits = [p for p in every if p.stem == name or p.name == name or p.stem.split("_", 1)[0] == name]
        if len(hits) != 1:
            raise SystemExit(f"no single notebook matches {name!r} (in {NOTEBOOKS})")
        out.append(hits[0])
    return out


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def normalize_output(output: dict) -> dict:
    """An output as nbformat writes it: multi-line text split into lines, known keys only."""
    kind = output["output_type"]
    if kind == "stream":
        text = output["text"]
        return {"output_type": kind, "name": output["name"],
                "text": _lines(text) if isinstance(text, str) else list(text)}
    if kind == "error":
        return {"output_type": kind, "ename": output["ename"], "evalue": output["evalue"],
                "traceback": list(output["traceback"])}
    data = {}
    for mime, value in output["data"].items():
        if isinstance(value, str) and (mime.startswith("text/") or mime in ("application/javascript",
                                                                          "image/svg+xml")):
            value = _lines(value)
        elif mime.startswith("image/") and isinstance(value, str):
            value = value.replace("\n", "")  # one base64 string, not lines
        data[mime] = value
    out = {"output_type": kind, "data": data, "metadata": dict(output.get("metadata") or {})}
    if kind == "execute_result":
        out["execution_count"] = output["execution_count"]
    return out


def _resolve_carriage_returns(text: str) -> str:
    """What a terminal shows: in each line, what was written after its last carriage return (progress bars)."""
    lines = text.replace("\r\n", "\n").split("\n")
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines)


def coalesce(outputs: list[dict]) -> list[dict]:
    """Consecutive writes to one stream as one output: a kernel sends them in chunks that depend on timing."""
    out: list[dict] = []
    for output in outputs:
        output = dict(output)
        if output["output_type"] == "stream":
            text = output["text"] if isinstance(output["text"], str) else "".join(output["text"])
            if out and out[-1]["output_type"] == "stream" and out[-1]["name"] == output["name"]:
                out[-1]["text"] += text
                continue
            output["text"] = text
        out.append(output)
    for output in out:
        if output["output_type"] == "stream":
            output["text"] = _resolve_carriage_returns(output["text"])
    return [o for o in out if o["output_type"] != "stream" or o["text"]]


def store(path: Path, original: dict, outputs: list[list[dict]]) -> None:
    """Write ``original`` with the outputs of its code cells (in order) and sequential execution counts."""
    cells, count = [], 0
    code_outputs = iter(outputs)
    for cell in original["cells"]:
        if cell["cell_type"] == "code":
            cell_outputs = [normalize_output(o) for o in coalesce(next(code_outputs))]
            count += 1
            for o in cell_outputs:
                if o["output_type"] == "execute_result":
                    o["execution_count"] = count
            cell = {**cell, "outputs": cell_outputs, "execution_count": count}
        cells.append(cell)
    path.write_text(render({**original, "cells": cells}))


def _errors(outputs: list[list[dict]]) -> list[str]:
    return ["\n".join(o.get("traceback") or [f"{o['ename']}: {o['evalue']}"])
            for cell in outputs for o in cell if o["output_type"] == "error"]


# ------------------------------------------------------------------------------------------ environment

def environment(scratch: Path) -> dict[str, str]:
    """The kernel's environment: repository root on PYTHONPATH, a matplotlibrc with the figure DPI."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [env.get("PYTHONPATH")])])
    rc = scratch / "matplotlibrc"
    rc.write_text(f"figure.dpi: {FIGURE_DPI}\nsavefig.dpi: figure\n")
    env["MATPLOTLIBRC"] = str(rc)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # ipykernel's debugger warns about frozen modules
    return env


def have_jupyter() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("nbclient", "nbformat", "ipykernel"))


# ------------------------------------------------------------------------------------------ nbclient

KERNEL_FIGURE_FORMATTER = """\
def _register_figure_png():
    import io
    from matplotlib.figure import Figure

    def png(figure):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()

    get_ipython().display_formatter.formatters["image/png"].for_type(Figure, png)


_register_figure_png()
del _register_figure_png
"""


def run_nbclient(path: Path, timeout: int, env: dict[str, str], scratch: Path) -> list[list[dict]]:
    """Run ``path`` in a Jupyter kernel of this interpreter; the outputs of each code cell."""
    import nbclient
    import nbformat
    from nbclient.exceptions import CellExecutionError

    # A "python3" kernelspec running sys.executable first on JUPYTER_PATH: a "python3" kernel registered in the
    # user's home could otherwise run the notebook in another Python, without this checkout's dependencies.
    spec = scratch / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python"}))
    # The figures are drawn without pyplot, so IPython's inline backend never registers its PNG formatter for
    # them and display(figure) would store text only: a startup file of a scratch IPython profile registers one.
    startup = scratch / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True, exist_ok=True)
    (startup / "00-figures-as-png.py").write_text(KERNEL_FIGURE_FORMATTER)
    saved = dict(os.environ)
    os.environ.update(env, JUPYTER_PATH=os.pathsep.join(filter(None, [str(scratch), env.get("JUPYTER_PATH")])),
                      IPYTHONDIR=str(scratch / "ipython"))
    try:
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=timeout, allow_errors=False,
                                         record_timing=False, resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
        except CellExecutionError:
            pass  # the error is in the cell's outputs: reported by the caller
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return [[dict(o) for o in cell.get("outputs", [])] for cell in nb.cells if cell.cell_type == "code"]


# ------------------------------------------------------------------------------------------ no Jupyter

class _Cell:
    """The outputs of the cell being run, in order; consecutive writes to one stream merged as Jupyter does."""

    def __init__(self):
        self.outputs: list[dict] = []

    def write(self, name: str, text: str) -> None:
        if not text:
            return
        if self.outputs and self.outputs[-1]["output_type"] == "stream" and self.outputs[-1]["name"] == name:
            self.outputs[-1]["text"] += text
        else:
            self.outputs.append({"output_type": "stream", "name": name, "text": text})

    def data(self, kind: str, data: dict, metadata: dict | None = None) -> None:
        self.outputs.append({"output_type": kind, "data": data, "metadata": metadata or {}})


class _Stream(io.TextIOBase):
    def __init__(self, cell: _Cell, name: str):
        self.cell, self.name = cell, name

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.cell.write(self.name, text)
        return len(text)

    @property
    def encoding(self) -> str:
        return "utf-8"


def _figure_png(figure) -> dict:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    width, height = (figure.get_size_inches() * figure.dpi).astype(int)
    return {"image/png": base64.b64encode(buffer.getvalue()).decode("ascii"),
            "text/plain": f"<Figure size {width}x{height} with {len(figure.axes)} Axes>"}


def _mime_bundle(obj) -> dict:
    """What Jupyter stores for ``obj``: a figure as PNG, rich reprs where the object has them, its repr."""
    if type(obj).__module__.startswith("matplotlib") and hasattr(obj, "savefig"):
        return _figure_png(obj)
    data = {}
    for method, mime in (("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"),
                         ("_repr_png_", "image/png"), ("_repr_svg_", "image/svg+xml"), ("_repr_latex_", "text/latex")):
        value = getattr(obj, method, None)
        value = value() if callable(value) else None
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii")
        if value is not None:
            data[mime] = value
    data["text/plain"] = repr(obj)
    return data


class _Executor:
    """Jupyter's behaviour, enough for these notebooks, in this interpreter."""

    def __init__(self, path: Path, timeout: int):
        self.path, self.timeout = path, timeout
        self.cell = _Cell()
        self.namespace = {"__name__": "__main__", "__builtins__": builtins}

    # ---- displays and figures
    def display(self, *objs, **_kwargs) -> None:
        for obj in objs:
            self.cell.data("display_data", _mime_bundle(obj))

    def flush_figures(self) -> None:
        """Every open matplotlib figure as a PNG output, then closed (the inline backend's end of cell)."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        for number in pyplot.get_fignums():
            self.cell.data("display_data", _figure_png(pyplot.figure(number)))
        pyplot.close("all")

    def install_backend(self) -> None:
        """A matplotlib backend whose show() stores the figures, selected before any cell imports pyplot."""
        if importlib.util.find_spec("matplotlib") is None:
            return
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        backend = types.ModuleType("_notebook_backend")
        backend.FigureCanvas = FigureCanvasAgg
        backend.show = lambda *args, **kwargs: self.flush_figures()
        sys.modules[backend.__name__] = backend
        import matplotlib
        matplotlib.use(f"module://{backend.__name__}")

    # ---- cells
    def _timeout(self, signum, frame):
        raise TimeoutError(f"cell ran past --timeout {self.timeout} s")

    def run_cell(self, source: str, number: int) -> list[dict]:
        self.cell = _Cell()
        filename = f"<cell {number}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        stdout, stderr = _Stream(self.cell, "stdout"), _Stream(self.cell, "stderr")
        alarm = hasattr(signal, "SIGALRM")
        if alarm:
            signal.signal(signal.SIGALRM, self._timeout)
            signal.alarm(self.timeout)
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                tree = ast.parse(source, filename)
                last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
                exec(compile(tree, filename, "exec"), self.namespace)
                if last is not None:
                    value = eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace)
                    if value is not None and not (type(value).__module__.startswith("matplotlib")):
                        self.cell.outputs.append({"output_type": "execute_result", "data": _mime_bundle(value),
                                                  "metadata": {}, "execution_count": number})
                self.flush_figures()
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - SystemExit ends a cell with an error too
            frames = traceback.extract_tb(error.__traceback__)
            ours = next((i for i, f in enumerate(frames) if f.filename.startswith("<cell")), 0)
            lines = ["".join(traceback.format_list(frames[ours:]))]
            self.cell.outputs.append({"output_type": "error", "ename": type(error).__name__,
                                      "evalue": str(error),
                                      "traceback": ["Traceback (most recent call last):", *lines,
                                                    *traceback.format_exception_only(type(error), error)]})
        finally:
            if alarm:
                signal.alarm(0)
        return self.cell.outputs

    def run(self) -> list[list[dict]]:
        nb = json.loads(self.path.read_text())
        os.chdir(self.path.parent)  # as Jupyter starts a notebook's kernel
        sys.path.insert(0, "")
        sys.argv = [str(self.path)]
        self.install_backend()
        builtins.display = self.display  # IPython makes display() a builtin
        outputs = []
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            if outputs and any(o["output_type"] == "error" for o in outputs[-1]):
                outputs.append([])  # Jupyter stops at the first error
                continue
            outputs.append(self.run_cell("".join(cell["source"]), len(outputs) + 1))
        return outputs


def run_fallback(path: Path, timeout: int, env: dict[str, str]) -> list[list[dict]]:
    """Run ``path`` in a fresh interpreter (this module with --one); the outputs of each code cell."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        cells = sum(c["cell_type"] == "code" for c in json.loads(path.read_text())["cells"])
        proc = subprocess.run([sys.executable, "-m", "lessons.notebooks.execute", "--one", str(path),
                               "--result", result.name, "--timeout", str(timeout)], env=env, cwd=path.parent,
                              timeout=timeout * max(cells, 1) + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"the executor for {path.name} exited with status {proc.returncode}")
        return json.loads(Path(result.name).read_text())


# ------------------------------------------------------------------------------------------ main

def execute(names: list[str], timeout: int = DEFAULT_TIMEOUT_S, engine: str = "auto") -> int:
    """Run the notebooks ``names`` (paths, names or stage numbers; none: all of notebooks/) and store their
    outputs. ``engine``: nbclient (a Jupyter kernel), exec (no Jupyter needed), auto (nbclient when installed)."""
    if engine == "auto":
        engine = "nbclient" if have_jupyter() else "exec"
    failed = []
    for path in resolve(names):
        original = json.loads(path.read_text())
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:
            env = environment(Path(scratch))
            if engine == "nbclient":
                outputs = run_nbclient(path, timeout, env, Path(scratch))
            else:
                outputs = run_fallback(path, timeout, env)
        errors = _errors(outputs)
        name = path.relative_to(CHECKOUT) if path.is_relative_to(CHECKOUT) else path
        if errors:
            failed.append(path.name)
            print(f"FAILED {name} ({engine}, {time.perf_counter() - start:.0f} s), not written:\n{errors[0]}",
                  file=sys.stderr, flush=True)
            continue
        store(path, original, outputs)
        print(f"executed {name} ({engine}, {time.perf_counter() - start:.0f} s)", flush=True)
    if failed:
        print("failed:", ", ".join(failed), file=sys.stderr)
        return 1
    return 0


def _worker(argv: list[str]) -> int:
    """run_fallback's fresh interpreter, not a command of its own: run one notebook in this process and write the
    outputs of its code cells as JSON."""
    parser = argparse.ArgumentParser(prog="python -m lessons.notebooks.execute", description=_worker.__doc__)
    parser.add_argument("--one", type=Path, required=True, help="the notebook")
    parser.add_argument("--result", type=Path, required=True, help="where its outputs go")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="seconds per cell")
    args = parser.parse_args(argv)
    args.result.write_text(json.dumps(_Executor(args.one, args.timeout).run()))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
