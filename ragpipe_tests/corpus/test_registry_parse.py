"""Registering a revision and reading it back parse its bytes once per process, and only those bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.corpus import registry
from ragpipe.corpus.registry import load_revision, read_registered_corpus, register_revision
from ragpipe_tests.conftest import HANDBOOK, write_tree


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources the registry parses: the real parser, each call recorded."""
    seen: list[str] = []
    real = registry.parse_source

    def recording(loaded):
        seen.append(loaded.digest())
        return real(loaded)

    monkeypatch.setattr(registry, "parse_source", recording)
    registry._last_parse.clear()
    return seen


def test_register_then_read_parses_the_corpus_once(tmp_path: Path, parses: list[str]):
    corpus = write_tree(tmp_path / "hb", HANDBOOK)
    record, new = register_revision(tmp_path / "revisions", "hb-1", corpus, "markdown")
    first = read_registered_corpus(load_revision(tmp_path / "revisions", "hb-1"))
    second = read_registered_corpus(record)
    assert new and parses == [record.source_digest]
    assert [r.document_id for r in first] == [r.document_id for r in second] and len(first) == len(HANDBOOK)
    first.pop()  # each caller owns its list
    assert len(read_registered_corpus(record)) == len(HANDBOOK)


def test_changed_bytes_are_parsed_again_and_only_the_last_source_is_kept(tmp_path: Path, parses: list[str]):
    a = write_tree(tmp_path / "a", HANDBOOK)
    b = write_tree(tmp_path / "b", {**HANDBOOK, "extra.md": "# Extra\n\nOne more note about the handbook.\n"})
    ra, _ = register_revision(tmp_path / "revisions", "a-1", a, "markdown")
    rb, _ = register_revision(tmp_path / "revisions", "b-1", b, "markdown")
    read_registered_corpus(ra)
    assert parses == [ra.source_digest, rb.source_digest, ra.source_digest]
    assert list(registry._last_parse) == [("markdown", ra.source_digest)]
