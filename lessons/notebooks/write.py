"""``python -m lessons notebooks [--check]``: write notebooks/*.ipynb from the cell lists of lessons.notebooks, so the
notebooks are reviewed as code.

    python -m lessons notebooks           # (re)write every notebook whose cells changed
    python -m lessons notebooks --check   # exit 1 if a committed notebook differs from what its cells say

One notebook per stage: the one idea (markdown), the kernel (Numba source, or an excerpt of the generated
PTX with its resource report and SASS opcode counts), a correctness check against the float64 reference,
and a timing cell; every stage notebook ends with the stage's course exercise (lessons.notebooks.exercise: the
prompt from lessons/exercises and a cell that grades the student's copy). Generator stages (07+) also show their
one config change, the emitter that implements it, the SASS opcode table against the previous stage, figures
drawn from the kernel's own layout functions, and a cell for the CPU emulator; stages whose worth is a
measurement (09-12) print it from the committed results/ file, never from numbers written here. Every cell
runs without a GPU: Numba kernels fall back to the CUDA simulator on tiny shapes, PTX is assembled and
disassembled on the CPU, and GPU-only work prints what it would need (a missing results/ file prints the command
that writes it).
Notebooks are written with stable cell ids, so diffs stay readable. Their outputs come from a run,
``python -m lessons notebooks --execute``, and are committed: --check compares sources, ids and metadata with the
outputs stripped, and rewriting a notebook whose sources did not change keeps its outputs (a changed one is written
without outputs, to be executed again).
"""
from __future__ import annotations

from pathlib import Path

import lessons
from lessons.notebooks import (CHECKOUT, moe_grouped, precision, stage_00, stage_01, stage_02, stage_03, stage_04,
                               stage_05, stage_06, stage_07, stage_08, stage_09, stage_10, stage_11, stage_12,
                               stage_13, stage_14, stage_15, stage_16, stage_17, stage_18, stage_19,
                               stage_20, training_recipe)
from lessons.notebooks.cells import figure_cells
from lessons.notebooks.emulator import break_it_cells, emulator_cells
from lessons.notebooks.exercise import exercise_cells
from lessons.notebooks.ipynb import is_current, notebook, render

NOTEBOOKS = CHECKOUT / "notebooks"
STAGE_NOTEBOOKS = (stage_00, stage_01, stage_02, stage_03, stage_04, stage_05, stage_06, stage_07, stage_08, stage_09,
                   stage_10, stage_11, stage_12, stage_13, stage_14, stage_15, stage_16,
                   stage_17, stage_18, stage_19, stage_20)  # in stage order: lessons.STAGES


def build() -> dict[str, dict]:
    """Every notebook, by name: the stage notebooks (each stage's cells, its figures and, for the hand-written PTX
    stages, the emulator runs before the timing; its exercise last), then the topic notebooks."""
    books = {lessons.STAGES[number]: module.cells() for number, module in enumerate(STAGE_NOTEBOOKS)}
    for name, cells in books.items():
        number = int(name[:2])
        figures = figure_cells(number)
        timing = 2 if number else 0  # stages 01+ end with the timing note and cell
        if number in (4, 5, 6):  # hand-written PTX: run it in the emulator too, then break it
            figures += [*emulator_cells(number), *break_it_cells(number)]
        cells[len(cells) - timing:len(cells) - timing] = figures
        cells += exercise_cells(number)  # every stage notebook ends with its course exercise
    books["precision"] = precision.cells()
    books["moe_grouped"] = moe_grouped.cells()
    books["training_recipe"] = training_recipe.cells()
    return {name: notebook(name, cells) for name, cells in books.items()}


def _shown(path: Path) -> str:
    return str(path.relative_to(CHECKOUT) if path.is_relative_to(CHECKOUT) else path)


def write(check: bool = False) -> int:
    """Write the notebooks whose sources changed (``check``: write nothing, exit status 1 if any did)."""
    stale = []
    for name, nb in build().items():
        path = NOTEBOOKS / f"{name}.ipynb"
        if is_current(path, nb):
            continue  # sources unchanged: the committed outputs stay
        stale.append(path.name)
        if not check:
            NOTEBOOKS.mkdir(exist_ok=True)
            path.write_text(render(nb))
            print(f"wrote {_shown(path)} (without outputs)")
    if stale and check:
        print("out of date (run python -m lessons notebooks):", ", ".join(stale))
        return 1
    if stale:
        print("execute them to store their outputs: python -m lessons notebooks --execute",
              " ".join(f"notebooks/{name}" for name in stale))
    else:
        print("every notebook is current (outputs kept)")
    return 0
