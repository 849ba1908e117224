"""The docs site (mkdocs.yml) builds in strict mode: every page in the nav, every link between pages resolves,
the notebooks render with their committed outputs, and the images the pages and notebooks show are in the site.

Needs the ``docs`` extra (mkdocs-material, mkdocs-jupyter; the ``test`` extra has them too).
"""
from __future__ import annotations

import importlib.util
import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
NEEDED = {"mkdocs": "mkdocs", "material": "mkdocs-material", "mkdocs_jupyter": "mkdocs-jupyter"}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    missing = [package for module, package in NEEDED.items() if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (python -m pip install -e \".[docs]\")")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    return out


def _local_references(html: str) -> list[str]:
    """The relative src/href targets of a page (no external links, anchors or data: URIs)."""
    refs = re.findall(r"""\s(?:src|href)=["']([^"']+)["']""", html)
    return [r for r in refs if not re.match(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#|//)", r)]


def _exists(site: Path, page: Path, ref: str) -> bool:
    folder = posixpath.dirname(page.relative_to(site).as_posix())
    path = posixpath.normpath(posixpath.join(folder, unquote(ref.split("#")[0].split("?")[0])))
    if path.startswith("../"):
        return False  # outside the site
    target = site / path
    return target.is_file() or (target / "index.html").is_file()


def test_site_has_the_pages(site):
    for page in ("index.html", "guide/index.html", "ladder/index.html", "benchmarks/index.html",
                 "deepgemm/index.html", "figures/index.html"):
        assert (site / page).is_file(), f"{page} missing from the site"
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in notebooks:
        assert (site / "notebooks" / path.stem / "index.html").is_file(), f"notebook {path.name} not rendered"


def test_notebook_pages_show_their_outputs_and_figures(site):
    page = site / "notebooks" / "01_naive" / "index.html"
    html = page.read_text()
    assert "Naive" in html
    figures = re.findall(r'src="([^"]*01_naive_thread_map\.png)"', html)
    assert figures, "the notebook's figure link is gone from its page"
    assert all(_exists(site, page, f) for f in figures), f"figure links do not resolve in the site: {figures}"
    assert "jp-OutputArea" in html and "diff" in html, "the notebook's committed outputs are not rendered"
    precision = (site / "notebooks" / "precision" / "index.html").read_text()
    assert "data:image/png;base64," in precision, "a figure output of the precision notebook is not rendered"


def test_every_local_reference_resolves(site):
    broken = []
    pages = [site / "index.html", *site.glob("*/index.html"), *site.glob("notebooks/*/index.html")]
    for page in pages:
        for ref in _local_references(page.read_text()):
            if not _exists(site, page, ref):
                broken.append(f"{page.relative_to(site)}: {ref}")
    assert not broken, "\n".join(broken)
    assert (site / "results" / "ladder.png").is_file() and (site / "figures" / "08_tile_raster.png").is_file()
