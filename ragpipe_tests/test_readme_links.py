"""The README and docs/ name only files that exist, `make` targets that exist, and no design file outside the repo."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from ragpipe_tests.support.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Entries at the repository root that a doc may name paths under. Runtime folders (var/, $RAGPIPE_HOME,
# bundles/, work/ …) are not in the repository and are not checked.
ROOTS = {
    "ragpipe",
    "ragpipe_tests",
    "docs",
    "data",
    "deploy",
    "benchmarks",
    "dagster.yaml",
    ".ci",
    "definitions.py",
    "workspace.yaml",
    "pyproject.toml",
    "Makefile",
    "README.md",
}
PATH_TOKEN = re.compile(r"(?<![\w$./<>{}-])((?:[\w.-]+/)+[\w.*-]*|[\w.-]+\.(?:md|py|yaml|toml))(?![\w/])")
# Written like paths but not paths: domain-separation tags of IDs ("ragpipe/bundle/v2") and run tag
# keys ("ragpipe/attempt"). A package folder is named with its slash ("ragpipe/defs/") or a file in it.
NOT_PATHS = re.compile(r"^ragpipe/[\w-]+/v\d+$|^ragpipe/\w+$")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
MAKE_TARGET = re.compile(r"(?:^|`)make ([a-z][\w-]*)", re.MULTILINE)


def repo_paths(text: str) -> set[str]:
    """Tokens of ``text`` that name a path under one of the repository's root entries."""
    found = set()
    for match in PATH_TOKEN.finditer(text):
        token = match.group(1).rstrip(".")
        if token.split("/")[0] in ROOTS and not NOT_PATHS.match(token):
            found.add(token)
    return found


def exists(token: str) -> bool:
    return any(REPO.glob(token.rstrip("/"))) if "*" in token else (REPO / token).exists()


def test_the_path_scanner_finds_paths_and_ignores_the_rest():
    text = (
        "See `docs/trust.md`, [ops](docs/operations.md), ragpipe/kernel/ids.py: `ragpipe/bundle/v2`, var/ragpipe/bundles/, "
        "$RAGPIPE_HOME/work/, texts/s, tag `ragpipe/attempt`, `ragpipe/defs/`, `definitions.py`."
    )
    assert repo_paths(text) == {
        "docs/trust.md",
        "docs/operations.md",
        "ragpipe/kernel/ids.py",
        "ragpipe/defs/",
        "definitions.py",
    }


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_named_repository_paths_exist(doc: Path):
    assert sorted(p for p in repo_paths(doc.read_text(encoding="utf-8")) if not exists(p)) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc: Path):
    targets = [
        t for t in MD_LINK.findall(doc.read_text(encoding="utf-8")) if "://" not in t and not t.startswith("mailto:")
    ]
    assert sorted(t for t in targets if not (doc.parent / t).exists()) == []


# Docs, docstrings and comments speak of the product: no tracker issue numbers and no design file
# outside the repository (docs/architecture.md is the project's own architecture).
OUTSIDE_REFERENCE = re.compile(r"\bDESIGN\b|design guide|\b[Ii]ssues?[ -]#?[0-9]|\(#[0-9]+\)")
SOURCES = [
    *DOCS,
    *sorted(p for root in ("ragpipe", "ragpipe_tests", "benchmarks") for p in (REPO / root).rglob("*.py")),
]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_issue_numbers_and_no_design_file_outside_the_repository(path: Path):
    if path == Path(__file__).resolve():
        return  # this file names the patterns it looks for
    lines = path.read_text(encoding="utf-8").splitlines()
    hits = [n for n, line in enumerate(lines, 1) if OUTSIDE_REFERENCE.search(line)]
    assert hits == [], f"{path.name} lines {hits} cite an issue number or a design file outside the repository"


def test_the_reference_pattern_finds_what_it_forbids():
    found = [
        s
        for s in (
            "see DESIGN.md §4",
            "the design guide",
            "issue 9's report",
            "Issues 9–11",
            "(#12)",
            "issue #3",
            "an issue-9 run",
        )
        if OUTSIDE_REFERENCE.search(s)
    ]
    assert len(found) == 7
    assert not OUTSIDE_REFERENCE.search("an issue with the index; tissue 9 samples")


def test_make_targets_named_in_docs_exist():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    named = {(doc.name, t) for doc in DOCS for t in MAKE_TARGET.findall(doc.read_text(encoding="utf-8"))}
    assert {("README.md", "demo"), ("README.md", "test")} <= named
    assert sorted((d, t) for d, t in named if t not in targets) == []


def test_the_readme_layout_lists_each_unit_once_in_floor_order_and_every_top_level_entry():
    from ragpipe_tests.test_boundaries import FLOORS, LAYERS, WINGS

    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    lines = [line for line in block.splitlines() if line.strip()]
    # each unit under the heading of its wing (docs/architecture.md's table), the wings in order
    heading, placed = None, []
    for line in lines:
        if line.startswith("# "):
            heading = line[2:]
        elif line.startswith("ragpipe/"):
            placed.append((heading, line.split()[0].removeprefix("ragpipe/").rstrip("/").removesuffix(".py")))
    assert [(w, u) for w, u in placed if u in FLOORS] == LAYERS
    assert [line[2:] for line in lines if line.startswith("# ")][: len(WINGS)] == list(WINGS)
    entries = [line.split()[0] for line in lines if not line.startswith("# ")]
    assert len(entries) == len(set(entries)), "an entry is listed twice"
    units = [e.removeprefix("ragpipe/").rstrip("/").removesuffix(".py") for e in entries if e.startswith("ragpipe/")]
    assert [u for u in units if u in FLOORS] == list(FLOORS)
    assert set(units) - set(FLOORS) == {"specs"}
    listed = {e.rstrip("/") for e in entries if not e.startswith("ragpipe/")} | {"ragpipe"}
    tracked = {
        p.split("/")[0]
        for p in subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    }
    assert tracked - listed - {".gitignore", "README.md"} == set()


def test_the_docs_index_lists_every_page_once():
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    linked = re.findall(r"\]\(([\w-]+\.md)\)", index)
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md")
    assert sorted(linked) == pages
