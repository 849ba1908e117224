"""Notebook cells that end each stage notebook (00-18) with the stage's course exercise.

    exercise_cells(n)  -> [markdown, code]: exercise n's objective, prompt and "predict, then check" questions,
                          how to start (copy the skeleton to notebooks/my_exNN.py); then a cell that grades
                          notebooks/my_exNN.py if it exists, else the skeleton (which fails: its holes are unfilled)

The text comes from ``lessons.exercises.exercise(n)`` when the notebook is generated, never retyped here, so the
notebook, the skeleton's docstring and ``python -m lessons grade`` say the same thing (editing an exercise's prompt
makes ``python -m lessons notebooks --check`` ask for the notebook to be regenerated). The grading cell expects the
notebook's setup cell to have run (lessons.notebooks.cells.setup_cell: ``ROOT``, the repository on sys.path); on the CPU
it grades the skeleton in a few seconds. Students' files, notebooks/my_ex*.py, are git-ignored.
"""
from __future__ import annotations

import re

from lessons.exercises import exercise
from lessons.notebooks import CHECKOUT
from lessons.notebooks.ipynb import code, markdown


def _escape(text: str) -> str:
    """Markdown-safe prose: outside `code spans`, * and _ stay literal (32*128*4 is no emphasis), < is no tag."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(part if part.startswith("`") else
                   part.replace("\\", "\\\\").replace("*", r"\*").replace("_", r"\_").replace("<", "&lt;")
                   for part in parts)


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


def exercise_cells(number: int) -> list[dict]:
    """Stage ``number``'s exercise: the prompt from ``lessons.exercises.exercise(number)`` and a grading cell."""
    ex = exercise(number)
    skeleton = ex.skeleton.relative_to(CHECKOUT).as_posix()
    mine = f"notebooks/my_ex{number:02d}.py"
    questions = "\n\n".join(f"{i}. {_escape(question)}\n\n    {_escape(_capitalized(answer))}"
                            for i, (question, answer) in enumerate(ex.questions, 1))
    holes = ", ".join(f"`{hole}`" for hole in ex.holes)
    fence = "~~~"  # the prompt may quote code in backticks; a tilde fence keeps it verbatim
    text = f"""\
## Exercise {number:02d}: {_escape(ex.objective)}

{fence}text
{ex.prompt.strip()}
{fence}

**Predict, then check.** Write your answer down before you run the check.

{questions}

**Start.** From the repository root, copy the skeleton to a file of your own:

```bash
cp {skeleton} {mine}
```

Fill in its holes ({holes}), then run the next cell: it grades `{mine}` (the GPU path on a Hopper GPU, else
the CPU one). From a shell: `python -m lessons grade {number} {mine}`. For instructors:
[docs/course.md](../docs/course.md)."""
    return [
        markdown(text),  # its dedent is a no-op here: the heading starts at column 0
        code(f'''\
# ---- grade your solution, {mine} (or, until you make one, the skeleton) ------------------------
import os
from pathlib import Path

from lessons.exercises import exercise
from lessons.grading.grader import grade, summary

solution = Path(ROOT, "{mine}")
if solution.exists():
    mode = "auto"  # the GPU path on a Hopper GPU, else the CPU one
else:  # nothing of yours yet: the skeleton, to show what a report looks like (it fails: its holes raise)
    solution, mode = exercise({number}).skeleton, "cpu"
report = grade({number}, solution, mode=mode, seeds=1)  # never raises: what goes wrong is a FAIL line
report["solution"] = os.path.relpath(report["solution"], ROOT)  # paths from the repository root
print(summary(report))'''),
    ]
