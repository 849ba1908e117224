"""``python -m lessons figures``: write docs/figures/NN_name.png from lessons.figures, so the figures are drawn by
the kernels' own layout code.

    python -m lessons figures             # (re)write every figure and docs/figures/manifest.json
    python -m lessons figures 06_tma_ring_timeline 08_tile_raster    # only these (the manifest is updated)
    python -m lessons figures --check     # exit 1 if a committed figure is missing, extra, edited or stale

No GPU is needed (stage 10's figure assembles and disassembles two cubins on the CPU, ~10 s). Output is
deterministic for one matplotlib/FreeType pair: fixed size and dpi, matplotlib's default style (no matplotlibrc),
no metadata that changes (``Software`` dropped; Agg writes no date).

What ``--check`` verifies, and why not simply bytes: PNG bytes depend on the matplotlib and FreeType versions
(text rasterization, compression), so a byte comparison would fail on a laptop with another matplotlib while
the figures are right. The manifest records the versions the figures were written with and each file's SHA-256.
``--check`` always requires (1) exactly the figures of ``lessons.figures.FIGURES``, no more, no fewer, (2) each
a non-empty PNG whose hash is the manifest's (no hand edits, no stale manifest), and (3) every figure function
still runs. When this machine's matplotlib and FreeType are the manifest's, it also requires (4) that each figure
regenerates to the same bytes, i.e. that no layout function changed without the figures being rewritten; with
other versions it says that this part was skipped.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import matplotlib
from matplotlib import ft2font

from lessons.figures import FIGURES

ROOT = Path(__file__).resolve().parents[2]  # the checkout: the figures are part of its docs
FIGURE_DIR = ROOT / "docs" / "figures"
MANIFEST = FIGURE_DIR / "manifest.json"
DPI = 100
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def versions() -> dict[str, str]:
    return {"matplotlib": matplotlib.__version__, "freetype": ft2font.__freetype_version__}


def render(name: str) -> bytes:
    """The PNG bytes of figure ``name``, drawn with matplotlib's default style."""
    matplotlib.use("Agg")
    with matplotlib.rc_context():
        matplotlib.rcdefaults()  # ignore any matplotlibrc: the same input gives the same pixels
        figure = FIGURES[name]()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(names: list[str]) -> int:
    FIGURE_DIR.mkdir(parents=True, exist_ok=True)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    if manifest.get("versions") not in (None, versions()) and set(names) != set(FIGURES):
        print(f"note: the other figures were written with {manifest['versions']}, these with {versions()}; "
              "rewrite all of them to keep --check's byte comparison meaningful")
    hashes = {k: v for k, v in manifest.get("figures", {}).items() if k[:-4] in FIGURES}
    for name in names:
        data = render(name)
        (FIGURE_DIR / f"{name}.png").write_bytes(data)
        hashes[f"{name}.png"] = sha256(data)
        print(f"wrote docs/figures/{name}.png ({len(data) // 1024} KiB)")
    for stale in sorted(set(p.name for p in FIGURE_DIR.glob("*.png")) - {f"{n}.png" for n in FIGURES}):
        (FIGURE_DIR / stale).unlink()
        print(f"removed docs/figures/{stale} (no such figure in lessons.figures)")
    MANIFEST.write_text(json.dumps({"versions": versions(), "dpi": DPI, "figures": dict(sorted(hashes.items()))},
                                   indent=1) + "\n")
    return 0


def check() -> int:
    problems = []
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else None
    if manifest is None:
        problems.append("docs/figures/manifest.json is missing")
        manifest = {"figures": {}, "versions": None}
    expected = {f"{name}.png" for name in FIGURES}
    present = {p.name for p in FIGURE_DIR.glob("*.png")} if FIGURE_DIR.exists() else set()
    problems += [f"missing: docs/figures/{n}" for n in sorted(expected - present)]
    problems += [f"extra (no figure function draws it): docs/figures/{n}" for n in sorted(present - expected)]
    if set(manifest["figures"]) != expected:
        problems.append("the manifest does not list exactly the figures of lessons.figures.FIGURES")
    same_versions = manifest.get("versions") == versions()
    for name in FIGURES:
        path = FIGURE_DIR / f"{name}.png"
        if not path.exists():
            continue
        data = path.read_bytes()
        if not data.startswith(PNG_SIGNATURE) or len(data) < 1024:
            problems.append(f"not a PNG, or empty: {path.relative_to(ROOT)}")
        if manifest["figures"].get(path.name) != sha256(data):
            problems.append(f"{path.relative_to(ROOT)} differs from the manifest's hash (edited by hand?)")
        fresh = render(name)  # also proves the figure function still runs
        if not fresh.startswith(PNG_SIGNATURE):
            problems.append(f"{name}: the figure function did not produce a PNG")
        elif same_versions and fresh != data:
            problems.append(f"stale: {path.relative_to(ROOT)} is not what lessons.figures.{FIGURES[name].__name__}"
                            "() draws now")
    if not same_versions:
        print(f"note: byte comparison skipped: the figures were written with {manifest.get('versions')}, this is "
              f"{versions()}; checked the set, the hashes and that every figure still draws")
    for problem in problems:
        print(problem)
    if problems:
        print("run: python -m lessons figures")
        return 1
    print(f"{len(FIGURES)} figures up to date")
    return 0

