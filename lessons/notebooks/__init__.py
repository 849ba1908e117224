"""The course notebooks' cells, beside the lessons they teach: ``notebooks/*.ipynb`` are generated from here, so
the notebooks are reviewed as code.

    python -m lessons notebooks                    # (re)write the notebooks whose cells changed (without outputs)
    python -m lessons notebooks --check            # exit 1 if a committed notebook differs from its cells here
    python -m lessons notebooks --execute [05 ...] # run them and store their outputs (all, or these)

One module per notebook: :mod:`.stage_00` ... :mod:`.stage_12` (one per stage of the ladder), :mod:`.precision`,
:mod:`.moe_grouped` and :mod:`.training_recipe` (the topic notebooks), each with ``cells()``. What they share:

* :mod:`.cells`: the setup, device helpers, check and timing cells, the PTX/SASS printers, the Numba-stage and
  PTX-stage notebook shapes, a stage's committed figures;
* :mod:`.generator_stages`: the generator stages' (07+) config, emitter and opcode-table cells, the sweep printer;
* :mod:`.emulator`: a PTX stage run on the CPU emulator, intact and broken (``ptx.emulate.breaks``);
* :mod:`.exercise`: the course exercise that ends every stage notebook, read from ``lessons.exercises``;
* :mod:`.ipynb`: the file format (cells, JSON as nbformat writes it, stable ids, what counts as current).

:mod:`.write` assembles and writes the notebooks; :mod:`.execute` runs them and stores their outputs. Both work on
a checkout of the repository (``notebooks/`` beside ``lessons/``).
"""
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # the repository root, where notebooks/, docs/ and results/ are
