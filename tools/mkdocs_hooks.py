"""mkdocs hooks (mkdocs.yml: ``hooks:``): put files that live outside docs/ into the site, and make links
written for the repository resolve in the site.

The notebooks live in notebooks/ and docs pages show plots from results/, so that both read well on GitHub and
in Jupyter, where relative links walk the repository (``../results/ladder.png`` from docs/, ``../docs/figures/``
from notebooks/). The site mirrors the repository with docs/ as its root:

    docs/X            -> X
    notebooks/N.ipynb -> notebooks/N.ipynb (rendered by mkdocs-jupyter as notebooks/N/)
    results/F.png     -> results/F.png

A relative link is resolved in the repository from the file it is written in and mapped to its site path;
in a docs page it is rewritten before mkdocs validates it (so ``mkdocs build --strict`` fails on a link to a
file the site lacks); in a notebook, whose HTML comes from nbconvert and is not validated by mkdocs, it is
rewritten in the rendered HTML and a link to a missing file is logged as a warning (strict fails on it too).
"""
from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.fp8_ladder")

ROOT = Path(__file__).resolve().parent.parent
EXTRA = {  # repository folder -> the files of it that the site carries (site path = repository path)
    "notebooks": "*.ipynb",
    "results": "*.png",
}
_MD_LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")  # ](target) or ](target "title")
_HTML_LINK = re.compile(r"""(\s(?:src|href)=)(["'])([^"']+)\2""")


def _is_relative(url: str) -> bool:
    return not re.match(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|#|/|\{)", url)


def _site_path(repo_path: str) -> str | None:
    """The site path of a repository path ("docs/guide.md" -> "guide.md"), None if the site does not carry it."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    folder = repo_path.split("/", 1)[0]
    if folder in EXTRA and Path(repo_path).match(EXTRA[folder]) and (ROOT / repo_path).is_file():
        return repo_path
    return None


def _repo_dir(file: File) -> str:
    """The repository folder a site file was written in: docs pages in docs/, the extra files where they are."""
    src = Path(file.abs_src_path).resolve()
    return src.parent.relative_to(ROOT).as_posix()


def _map(url: str, repo_dir: str) -> tuple[str | None, str]:
    """(the site path of the url's target, None if the site does not carry it; its "#fragment" part)."""
    path, sep, fragment = url.partition("#")
    return _site_path(posixpath.normpath(posixpath.join(repo_dir, path))), sep + fragment


@event_priority(100)  # before mkdocs-jupyter's on_files wraps the notebooks as pages
def on_files(files: Files, config) -> Files:
    for folder, pattern in EXTRA.items():
        for path in sorted((ROOT / folder).glob(pattern)):
            files.append(File(f"{folder}/{path.name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """docs pages: ``../results/x.png`` -> ``results/x.png``, ``../notebooks/n.ipynb`` -> ``notebooks/n.ipynb``."""
    repo_dir = _repo_dir(page.file)
    site_dir = posixpath.dirname(page.file.src_uri)

    def fix(match: re.Match) -> str:
        url = match.group(2)
        if not url.startswith("../"):
            return match.group(0)  # a link inside docs/: mkdocs resolves and validates it as written
        target, fragment = _map(url, repo_dir)
        if target is None:
            return match.group(0)  # left as written: mkdocs reports it as not found
        return match.group(1) + posixpath.relpath(target, site_dir or ".") + fragment + match.group(3)

    return _MD_LINK.sub(fix, markdown)


def on_page_content(html: str, page, config, files) -> str:
    """Notebook pages: relative src/href attributes of the rendered HTML mapped to site paths."""
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    repo_dir = _repo_dir(page.file)

    def fix(match: re.Match) -> str:
        url = match.group(3)
        if not _is_relative(url) or url.startswith("data:"):
            return match.group(0)
        target, fragment = _map(url, repo_dir)
        file = files.get_file_from_path(target) if target is not None else None
        if file is None:
            log.warning("Notebook '%s' links '%s', which is not a file of the site", page.file.src_uri, url)
            return match.group(0)
        return match.group(1) + match.group(2) + file.url_relative_to(page.file) + fragment + match.group(2)

    return _HTML_LINK.sub(fix, html)
