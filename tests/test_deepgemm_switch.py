"""DeepGEMM's own tests through the switch: every test function of DeepGEMM's tests/test_core.py (releases 2504 and
2507) against this library, through the ``deep_gemm`` shim in tests/deepgemm_switch (re-exports of ``gemm``).

``gpu``: each function in a process of its own, cwd the release's tests/ folder, PYTHONPATH the shim and the repo root
only (the release's own ``deep_gemm`` must not be imported), set up as DeepGEMM's ``__main__`` sets up (TF32 on, torch
and random seeded with 0). The functions are read from the file (``def test_``). The releases come from
$DEEPGEMM_PEERS (a folder holding deepgemm-2504/ and deepgemm-2507/), else /tmp/peers, else deepgemm-v1.tgz
(.peers/ or shared/peers/ at the repo root, or ../shared/peers/) unpacked into a temporary folder:

    DEEPGEMM_PEERS=/tmp/peers python -m pytest -m gpu tests/test_deepgemm_switch.py

Without a GPU: the shim's source exports every name the two releases' test_core.py take from ``deep_gemm``, and
nothing but re-exports.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "tests" / "deepgemm_switch"
RELEASES = ("deepgemm-2504", "deepgemm-2507")
ARCHIVE = "deepgemm-v1.tgz"
ARCHIVES = (ROOT / ".peers" / ARCHIVE, ROOT / "shared" / "peers" / ARCHIVE, ROOT.parent / "shared" / "peers" / ARCHIVE)
DEFAULT_PEERS = Path("/tmp/peers")
FUNCTION_TIMEOUT_S = 300
OUTPUT_TAIL_CHARS = 6000

# What the two releases' tests/test_core.py take from deep_gemm, by module (read from 2504 = 4499c4c, 2507 = 03d0be3):
# ``deep_gemm.X`` and ``from deep_gemm import X`` in both, ``from deep_gemm.jit_kernels.utils import X`` in 2507;
# the wgrad GEMMs are 2507's.
TEST_CORE_IMPORTS = {
    "deep_gemm": {"bench_kineto", "calc_diff", "ceil_div", "get_col_major_tma_aligned_tensor",
                  "gemm_fp8_fp8_bf16_nt", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous",
                  "m_grouped_gemm_fp8_fp8_bf16_nt_masked", "wgrad_gemm_fp8_fp8_fp32_nt",
                  "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt"},
    "deep_gemm.jit_kernels.utils": {"get_m_alignment_for_contiguous_layout"},
}
SHIM_FILES = {
    "deep_gemm": SHIM / "deep_gemm" / "__init__.py",
    "deep_gemm.jit_kernels": SHIM / "deep_gemm" / "jit_kernels" / "__init__.py",
    "deep_gemm.jit_kernels.utils": SHIM / "deep_gemm" / "jit_kernels" / "utils.py",
}


# ------------------------------------------------------------------------------------------- the releases

def _peers_folder() -> Path | None:
    """$DEEPGEMM_PEERS as given (a release missing there skips, naming the path), else /tmp/peers if it holds both."""
    configured = os.environ.get("DEEPGEMM_PEERS")
    if configured:
        return Path(configured)
    if all(_test_core_path(DEFAULT_PEERS, release).is_file() for release in RELEASES):
        return DEFAULT_PEERS
    return None


def _archive() -> Path | None:
    return next((path for path in ARCHIVES if path.is_file()), None)


def _test_core_path(peers: Path, release: str) -> Path:
    return peers / release / "tests" / "test_core.py"


def _test_core_source(release: str) -> tuple[str | None, str]:
    """(the release's test_core.py, or None) and where it was looked for."""
    peers = _peers_folder()
    if peers is not None:
        path = _test_core_path(peers, release)
        return (path.read_text() if path.is_file() else None), str(path)
    archive = _archive()
    if archive is None:
        return None, (f"$DEEPGEMM_PEERS, {DEFAULT_PEERS} or {ARCHIVE} in "
                      + ", ".join(str(path.parent) for path in ARCHIVES))
    member = f"{release}/tests/test_core.py"
    with tarfile.open(archive) as tar:
        try:
            return tar.extractfile(member).read().decode(), f"{archive}:{member}"
        except KeyError:
            return None, f"{archive}:{member}"


def _test_functions(source: str) -> list[str]:
    """The module-level ``def test_*`` of a test file, in file order."""
    return [node.name for node in ast.parse(source).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def _cases() -> list:
    cases = []
    for release in RELEASES:
        source, where = _test_core_source(release)
        if source is None:
            cases.append(pytest.param(release, None, id=f"{release}-not-found",
                                      marks=pytest.mark.skip(reason=f"no DeepGEMM {release} test_core.py: {where}")))
            continue
        cases += [pytest.param(release, name, id=f"{release}-{name}") for name in _test_functions(source)]
    return cases


@pytest.fixture(scope="session")
def deepgemm_peers(tmp_path_factory) -> Path:
    """The folder holding the releases: found, or unpacked from the archive once per session."""
    peers = _peers_folder()
    if peers is not None:
        return peers
    archive = _archive()
    if archive is None:
        pytest.skip("no DeepGEMM releases: set DEEPGEMM_PEERS, or unpack deepgemm-v1.tgz into /tmp/peers")
    peers = tmp_path_factory.mktemp("deepgemm_peers")
    with tarfile.open(archive) as tar:
        tar.extractall(peers, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return peers


# --------------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("release, function", _cases())
def test_deepgemm_test_core_passes_through_the_switch(release, function, deepgemm_peers):
    program = "; ".join([
        "import random, torch",
        "torch.backends.cuda.matmul.allow_tf32 = True",
        "torch.backends.cudnn.allow_tf32 = True",
        "torch.manual_seed(0)",
        "random.seed(0)",
        "import deep_gemm",
        f"assert deep_gemm.__file__.startswith({str(SHIM)!r}), 'not the shim: ' + deep_gemm.__file__",
        "import test_core",
        f"test_core.{function}()",
    ])
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SHIM), str(ROOT)]))
    try:
        done = subprocess.run([sys.executable, "-c", program], cwd=deepgemm_peers / release / "tests",
                              env=environment, capture_output=True, text=True, timeout=FUNCTION_TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode(errors="replace") + (expired.stderr or b"").decode(errors="replace")
        pytest.fail(f"{release} test_core.{function}() ran past {FUNCTION_TIMEOUT_S} s:\n"
                    f"{output[-OUTPUT_TAIL_CHARS:]}")
    output = done.stdout + done.stderr
    print(output)  # DeepGEMM's performance lines, shown with -s
    assert done.returncode == 0, (f"{release} test_core.{function}() exited {done.returncode}:\n"
                                  f"{output[-OUTPUT_TAIL_CHARS:]}")


# --------------------------------------------------------------------------------------------------- CPU

def _shim_source(module: str) -> ast.Module:
    return ast.parse(SHIM_FILES[module].read_text())


def _imported_names(tree: ast.Module) -> set[str]:
    return {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def _exported_names(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


@pytest.mark.parametrize("module", sorted(TEST_CORE_IMPORTS))
def test_the_shim_exports_what_deepgemms_tests_import(module):
    tree = _shim_source(module)
    missing = TEST_CORE_IMPORTS[module] - _imported_names(tree)
    assert not missing, f"{SHIM_FILES[module]} does not import {sorted(missing)}"
    unlisted = TEST_CORE_IMPORTS[module] - _exported_names(tree)
    assert not unlisted, f"{SHIM_FILES[module]}: {sorted(unlisted)} not in __all__"


@pytest.mark.parametrize("module", sorted(SHIM_FILES))
def test_the_shim_is_re_exports_only(module):
    """A docstring, imports and ``__all__``: any logic belongs in ``gemm``, where its own tests see it."""
    tree = _shim_source(module)
    for index, node in enumerate(tree.body):
        docstring = index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        names_all = isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]
        assert docstring or names_all or isinstance(node, (ast.Import, ast.ImportFrom)), \
            f"{SHIM_FILES[module]}:{node.lineno}: not a re-export"
    imported_from = {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and not node.level}
    assert imported_from <= {"gemm", "gemm.testing.timer"}, imported_from
    assert _exported_names(tree) <= _imported_names(tree), "__all__ names something not imported"


def test_the_list_is_what_the_releases_import():
    """TEST_CORE_IMPORTS against the releases' files, where they can be read (a new name there fails here)."""
    used: dict[str, set[str]] = {}
    for release in RELEASES:
        source, where = _test_core_source(release)
        if source is None:
            pytest.skip(f"no DeepGEMM {release} test_core.py: {where}")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "deep_gemm":
                used.setdefault(node.module, set()).update(alias.name for alias in node.names)
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "deep_gemm" and not node.attr.startswith("__")):
                used.setdefault("deep_gemm", set()).add(node.attr)
    assert used == TEST_CORE_IMPORTS
