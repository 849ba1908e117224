"""lessons.results_store: a checkout reads and writes its results/; an installed package reads the files shipped
with it (importlib.resources) and writes to a user directory, whose measured files it reads first."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from lessons import results_store

ROOT = Path(__file__).resolve().parent.parent


def test_a_checkout_reads_and_writes_its_results_folder():
    assert results_store.checkout_dir() == ROOT / "results"
    assert results_store.write_dir() == results_store.committed_dir() == ROOT / "results"
    assert results_store.find("ladder.json") == ROOT / "results" / "ladder.json"
    assert results_store.find("grading/04_reference.json") == ROOT / "results" / "grading" / "04_reference.json"
    assert results_store.find("no_such_result.json") is None
    assert results_store.shown(ROOT / "results" / "ladder.json") == "results/ladder.json"


def test_the_user_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(results_store.RESULTS_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert results_store.user_dir() == tmp_path / "mine"
    monkeypatch.delenv(results_store.RESULTS_ENV)
    assert results_store.user_dir() == tmp_path / "xdg" / "fp8-ladder" / "results"
    monkeypatch.setenv("XDG_DATA_HOME", "")  # set but empty: the XDG default
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert results_store.user_dir() == tmp_path / "home" / ".local" / "share" / "fp8-ladder" / "results"


def test_without_a_checkout_writes_go_to_the_user_directory(monkeypatch, tmp_path):
    monkeypatch.setattr(results_store, "REPOSITORY", tmp_path)  # no pyproject.toml, no results/: not a checkout
    monkeypatch.setenv(results_store.RESULTS_ENV, str(tmp_path / "mine"))
    assert results_store.checkout_dir() is None
    assert results_store.write_dir() == tmp_path / "mine"


INSTALLED_PROBE = """
import json, sys
from lessons import results_store
print(json.dumps({"checkout": str(results_store.checkout_dir()), "write": str(results_store.write_dir()),
                  "ladder": str(results_store.find("ladder.json")),
                  "report": str(results_store.find("grading/04_reference.json")),
                  "missing": str(results_store.find("missing.json"))}))
"""


def test_an_installed_package_reads_its_shipped_results_and_prefers_measured_ones(tmp_path):
    """A fake site-packages (lessons/ with results/ inside, as the wheel lays it out), run from another folder."""
    site = tmp_path / "site"
    (site / "lessons" / "results" / "grading").mkdir(parents=True)
    (site / "lessons" / "__init__.py").write_text("")
    shutil.copy(ROOT / "lessons" / "results_store.py", site / "lessons" / "results_store.py")
    (site / "lessons" / "results" / "ladder.json").write_text('{"shipped": true}')
    (site / "lessons" / "results" / "grading" / "04_reference.json").write_text("{}")
    user, elsewhere = tmp_path / "user", tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", results_store.RESULTS_ENV)}

    def probe(**extra) -> dict:
        done = subprocess.run([sys.executable, "-c", INSTALLED_PROBE], cwd=elsewhere, capture_output=True, text=True,
                              env={**env, "PYTHONPATH": str(site), **extra}, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    shipped = site / "lessons" / "results"
    found = probe(XDG_DATA_HOME=str(user))
    assert found["checkout"] == "None" and found["write"] == str(user / "fp8-ladder" / "results")
    assert found["ladder"] == str(shipped / "ladder.json")
    assert found["report"] == str(shipped / "grading" / "04_reference.json") and found["missing"] == "None"

    measured = user / "fp8-ladder" / "results"
    measured.mkdir(parents=True)
    (measured / "ladder.json").write_text('{"measured": true}')
    found = probe(XDG_DATA_HOME=str(user))
    assert found["ladder"] == str(measured / "ladder.json")  # the user's own run first
    assert found["report"] == str(shipped / "grading" / "04_reference.json")  # the rest still shipped
    assert probe(**{results_store.RESULTS_ENV: str(tmp_path / "nowhere")})["ladder"] == str(shipped / "ladder.json")


def _fake_checkout(root: Path) -> Path:
    """A checkout with the committed grading reports and no grading.json yet."""
    (root / "pyproject.toml").write_text("")
    shutil.copytree(ROOT / "results" / "grading", root / "results" / "grading")
    return root / "results"


def test_calibrate_from_reports_writes_the_thresholds_beside_the_reports(monkeypatch, tmp_path, capsys):
    from lessons.__main__ import main
    results = _fake_checkout(tmp_path)
    monkeypatch.setattr(results_store, "REPOSITORY", tmp_path)
    assert main(["calibrate", "--from-reports"]) == 0
    written = json.loads((results / "grading.json").read_text())
    committed = json.loads((ROOT / "results" / "grading.json").read_text())
    assert written["stages"] == committed["stages"]  # the committed thresholds follow from the committed reports
    assert "python -m lessons calibrate" in written["about"] and "wrote results/grading.json" in capsys.readouterr().out


def test_the_docs_command_needs_a_checkout(monkeypatch, tmp_path, capsys):
    from lessons.__main__ import main
    monkeypatch.setattr(results_store, "REPOSITORY", tmp_path)
    assert main(["docs", "--check"]) == 2
    assert "no checkout here" in capsys.readouterr().out
