"""The repository stands on its own: no path outside it, no internal references, docs exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: what a clean clone must never read or point to (the project's own machines only)
OUTSIDE = re.compile(r"\.\./shared|shared/data|shared/checks|METHODS\.md|DESIGN\.md|"
                     r"DPBENCH_SHARED_DATA|/work/")
#: folders and files a user's clone carries (.ci/ may name the CI machine's data folder)
CHECKED = ["dpbench", "tests", "scripts", "conf", "docs", "README.md", "Makefile",
           "pyproject.toml"]
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".md", ".toml", ""}


def _texts():
    for entry in CHECKED:
        path = REPO / entry
        files = [path] if path.is_file() else sorted(path.rglob("*"))
        for file in files:
            if file.is_file() and file.suffix in SUFFIXES and file != Path(__file__):
                yield file, file.read_text(encoding="utf-8", errors="replace")


def test_nothing_points_outside_the_repository():
    hits = [f"{file.relative_to(REPO)}:{n}: {line.strip()}"
            for file, text in _texts()
            for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert hits == []


def test_no_internal_issue_numbers():
    pattern = re.compile(r"\bissues? \d+\b", re.IGNORECASE)
    hits = [f"{file.relative_to(REPO)}:{n}" for file, text in _texts()
            for n, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert hits == []


@pytest.mark.parametrize("root", ["dpbench", "conf", "scripts", "tests"])
def test_docs_pages_named_in_code_exist(root):
    named = {m for file, text in _texts() if file.is_relative_to(REPO / root)
             for m in re.findall(r"docs/[\w-]+\.md", text)}
    assert [page for page in sorted(named) if not (REPO / page).is_file()] == []


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#]+\.md)\)", (REPO / "README.md").read_text())
    assert links and [link for link in links if not (REPO / link).is_file()] == []


def test_every_command_the_docs_name_is_installed():
    """A ``dpbench-*`` command named in the README or docs is a console script of the
    package (not only a module a user would have to know to run with ``python -m``)."""
    project = (REPO / "pyproject.toml").read_text()
    section = project.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = set(re.findall(r"^(dpbench[-a-z]*) = ", section, flags=re.M))
    texts = [(REPO / "README.md").read_text(), *(p.read_text() for p in
                                                 sorted((REPO / "docs").glob("*.md")))]
    named = {m for text in texts for m in re.findall(r"\bdpbench-[a-z]+\b", text)}
    assert named and named <= scripts, sorted(named - scripts)


def test_the_docs_index_lists_every_page_once():
    """docs/index.md names each page of docs/ once (a new page needs its line there), and the
    README links the index."""
    index = (REPO / "docs" / "index.md").read_text()
    linked = re.findall(r"\]\(([\w-]+\.md)\)", index)
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "index.md")
    assert sorted(linked) == pages
    assert "(docs/index.md)" in (REPO / "README.md").read_text()
