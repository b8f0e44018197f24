"""The README and docs/ name only files that exist, `make` targets that exist, and no design file outside the repo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ragpipe_tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Entries at the repository root that a doc may name paths under. Runtime folders (var/, $RAGPIPE_HOME,
# bundles/, work/ …) are not in the repository and are not checked.
ROOTS = {
    "ragpipe",
    "ragpipe_tests",
    "docs",
    "data",
    "deploy",
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


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_reference_to_the_design_file_outside_the_repository(doc: Path):
    # The design guide lives in the shared project folder, not here (docs/architecture.md says so in words).
    hits = [
        n for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1) if re.search(r"\bDESIGN\b", line)
    ]
    assert hits == [], f"{doc.name} lines {hits} refer to DESIGN.md, which is not in the repository"


def test_make_targets_named_in_docs_exist():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    named = {(doc.name, t) for doc in DOCS for t in MAKE_TARGET.findall(doc.read_text(encoding="utf-8"))}
    assert {("README.md", "demo"), ("README.md", "test")} <= named
    assert sorted((d, t) for d, t in named if t not in targets) == []
