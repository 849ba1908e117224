"""The notebook file format: a cell, a notebook as nbformat 4.5 JSON with stable ids, rendered as nbformat writes
it, and whether a committed notebook is current (its sources, ids and metadata; outputs do not count)."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path


def markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": textwrap.dedent(text).strip()}


def code(text: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": textwrap.dedent(text).strip()}


def notebook(name: str, cells: list[dict]) -> dict:
    """nbformat 4.5 JSON; sources split into lines as Jupyter writes them, ids stable across rebuilds."""
    out = []
    for index, cell in enumerate(cells):
        source = cell["source"].splitlines(keepends=True)
        out.append({**cell, "id": f"{name[:2]}-{index:02d}", "source": source})
    return {
        "cells": out,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "pygments_lexer": "ipython3"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def render(nb: dict) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"  # as nbformat writes it


def strip_outputs(nb: dict) -> dict:
    """``nb`` as this generator writes it: every code cell without outputs and execution count."""
    cells = [{**cell, "outputs": [], "execution_count": None} if cell["cell_type"] == "code" else cell
             for cell in nb["cells"]]
    return {**nb, "cells": cells}


def committed(path: Path) -> dict | None:
    """The notebook at ``path``, None if there is none or it is not JSON."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def is_current(path: Path, nb: dict) -> bool:
    """Whether the notebook at ``path`` is ``nb`` once its outputs are stripped (outputs do not count)."""
    old = committed(path)
    return old is not None and render(strip_outputs(old)) == render(nb)
