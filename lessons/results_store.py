"""Where result files are read and written: the one place that knows a checkout from an installed package.

The committed results (the ladder's GPU run, the grader's thresholds and the runs they were set from) live in the
repository's ``results/``; the docs draw from there, and a wheel ships the JSON files as package data
(pyproject.toml maps ``results/`` to ``lessons/results/``).

* In a checkout (``pyproject.toml`` beside the packages), reads and writes both use the checkout's ``results/``:
  what a GPU run writes is what gets committed.
* In an installed package, reads go through :mod:`importlib.resources` (the files shipped in the wheel) and writes
  go to a user directory (:func:`user_dir`); a file measured there is read in preference to the committed one.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

RESULTS_ENV = "FP8LADDER_RESULTS_DIR"  # where an installed package writes (and first reads) results
REPOSITORY = Path(__file__).resolve().parent.parent  # a checkout's root; site-packages in an installed package


def checkout_dir() -> Path | None:
    """The checkout's ``results/`` when the packages run from a checkout (editable install or PYTHONPATH), else
    None."""
    results = REPOSITORY / "results"
    return results if (REPOSITORY / "pyproject.toml").is_file() and results.is_dir() else None


def user_dir() -> Path:
    """Where an installed package writes: ``$FP8LADDER_RESULTS_DIR``, else ``$XDG_DATA_HOME/fp8-ladder/results``,
    else ``~/.local/share/fp8-ladder/results`` (the XDG default)."""
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV]).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "fp8-ladder" / "results"


def committed_dir() -> Path | None:
    """The committed results: the checkout's ``results/``, else the copy shipped in the package (None when neither
    exists, e.g. a source tree without results)."""
    checkout = checkout_dir()
    if checkout is not None:
        return checkout
    shipped = resources.files("lessons").joinpath("results")
    # a wheel installs on a filesystem, where resources hands out real paths; a zip import has no results to read
    return Path(str(shipped)) if shipped.is_dir() else None


def write_dir() -> Path:
    """Where a run writes its results: the checkout's ``results/``, else :func:`user_dir`. Not created here."""
    return checkout_dir() or user_dir()


def find(name: str) -> Path | None:
    """The result file ``name`` to read (``"ladder.json"``, ``"grading/04_reference.json"``): one measured into
    :func:`write_dir`, else the committed one; None when there is neither."""
    for folder in (write_dir(), committed_dir()):
        if folder is not None and (folder / name).is_file():
            return folder / name
    return None


def shown(path: Path) -> str:
    """A result path as a reader knows it: ``results/ladder.json`` in a checkout, the full path otherwise."""
    try:
        return Path(path).resolve().relative_to(REPOSITORY).as_posix() if checkout_dir() else str(path)
    except ValueError:
        return str(path)
