"""Every command in the README's command table, exactly as written, in a fresh copy of the checkout.

Rows whose GPU column says "no" must succeed here (the grade of an untouched skeleton must run and report FAILED,
as the row says). Rows that need a GPU must, on a machine without one, stop with a message that says what is
missing and a non-zero exit, never a traceback; on a Hopper GPU the GPU session runs them (tools/gpu_run.sh).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ROW = re.compile(r"^\| `(?P<command>[^`]+)` \| (?P<what>.*) \| (?P<gpu>[^|]+) \|$")
# What a command may assume beyond a fresh clone, as its row says: a class's submissions folder for --class.
PRECONDITIONS = {"--class submissions/": "mkdir -p submissions && cp lessons/exercises/skeletons/"
                                         "ex06_barrier_parity.py submissions/alice.py"}
EXPECTED_FAILURES = {"python -m lessons grade 6 my_ex06.py": "FAILED"}  # the untouched skeleton, as its row says


def readme_rows() -> list[tuple[str, str]]:
    rows = []
    for line in README.read_text().splitlines():
        match = ROW.match(line.strip())
        if match and match["command"] != "command":
            rows.append((match["command"], match["gpu"].strip()))
    return rows


def _has_hopper() -> bool:
    try:
        from ptx.device import is_hopper
        return is_hopper()
    except Exception:
        return False


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory) -> Path:
    """The tracked files only, as a clone has them (commands that write results/ or docs/ write here)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = tmp_path_factory.mktemp("clone")
    for name in filter(None, files.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def run_in(copy: Path, command: str) -> subprocess.CompletedProcess:
    for needle, setup in PRECONDITIONS.items():
        if needle in command:
            command = f"{setup} && {command}"
    env = dict(os.environ, PYTHONPATH=str(copy), MPLBACKEND="Agg")
    bin_dir = str(Path(sys.executable).parent)  # `python` is the interpreter running the tests
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return subprocess.run(["bash", "-c", command], cwd=copy, env=env, capture_output=True, text=True, timeout=600)


def test_the_table_is_found():
    rows = readme_rows()
    assert len(rows) >= 10, rows
    assert any(gpu.startswith("no") for _, gpu in rows) and any(gpu.startswith("yes") for _, gpu in rows)


@pytest.mark.parametrize("command, gpu", [row for row in readme_rows() if row[1].startswith("no")],
                         ids=[row[0][:60] for row in readme_rows() if row[1].startswith("no")])
def test_a_command_without_gpu_works_as_written(fresh_copy, command, gpu):
    if "figures" in command:
        pytest.importorskip("matplotlib")
    result = run_in(fresh_copy, command)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    expected = next((word for key, word in EXPECTED_FAILURES.items() if command.endswith(key)), None)
    if expected:
        assert result.returncode != 0 and expected in output, output[-3000:]
    else:
        assert result.returncode == 0, output[-3000:]


@pytest.mark.parametrize("command, gpu", [row for row in readme_rows() if row[1].startswith("yes")],
                         ids=[row[0][:60] for row in readme_rows() if row[1].startswith("yes")])
def test_a_gpu_command_without_a_gpu_says_what_is_missing(fresh_copy, command, gpu):
    if _has_hopper():
        pytest.skip("a Hopper GPU is here: the GPU session runs these (tools/gpu_run.sh)")
    result = run_in(fresh_copy, command)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert result.returncode != 0, f"exit 0 although nothing ran:\n{output[-3000:]}"
    assert re.search(r"GPU|compute-sanitizer", output), output[-3000:]
    alternative = re.search(r"\((`[^`]+`): no\)", gpu)  # "yes (`--from-reports`: no)": that form must work
    if alternative:
        flag = alternative[1].strip("`")
        again = run_in(fresh_copy, f"{command} {flag}")
        assert again.returncode == 0 and "Traceback" not in again.stdout + again.stderr, again.stdout + again.stderr
