"""Registering a revision and reading it back parse its bytes once per process, and only those bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.corpus import registry
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import load_revision, read_registered_corpus, register_revision
from ragpipe_tests.support.corpora import HANDBOOK, write_tree


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
    record, new = register_revision(tmp_path / "revisions", "hb-1", corpus, "markdown", "public")
    first = read_registered_corpus(load_revision(tmp_path / "revisions", "hb-1"))
    second = read_registered_corpus(record)
    assert new and parses == [record.source_digest]
    assert [r.document_id for r in first] == [r.document_id for r in second] and len(first) == len(HANDBOOK)
    first.pop()  # each caller owns its list
    assert len(read_registered_corpus(record)) == len(HANDBOOK)


def test_changed_bytes_are_parsed_again_and_only_the_last_source_is_kept(tmp_path: Path, parses: list[str]):
    a = write_tree(tmp_path / "a", HANDBOOK)
    b = write_tree(tmp_path / "b", {**HANDBOOK, "extra.md": "# Extra\n\nOne more note about the handbook.\n"})
    ra, _ = register_revision(tmp_path / "revisions", "a-1", a, "markdown", "public")
    rb, _ = register_revision(tmp_path / "revisions", "b-1", b, "markdown", "public")
    read_registered_corpus(ra)
    assert parses == [ra.source_digest, rb.source_digest, ra.source_digest]
    assert list(registry._last_parse) == [("markdown", str(a), ra.source_digest)]


def test_equal_bytes_at_another_path_are_parsed_there(tmp_path: Path, parses: list[str]):
    """Exclusions name their location: a copy of a tree is parsed again, not served from the first."""
    files = {**HANDBOOK, "notes/short.md": "tiny\n"}
    a, b = write_tree(tmp_path / "a", files), write_tree(tmp_path / "b", files)
    ra, _ = register_revision(tmp_path / "revisions", "a-1", a, "markdown", "public")
    rb, _ = register_revision(tmp_path / "revisions", "b-1", b, "markdown", "public")
    assert ra.source_digest == rb.source_digest and parses == [ra.source_digest, rb.source_digest]
    in_b, in_a = read_registered_corpus(rb), read_registered_corpus(ra)
    assert [r.document_id for r in in_b] == [r.document_id for r in in_a]
    assert all(r.location.startswith(str(b)) for r in in_b) and all(r.location.startswith(str(a)) for r in in_a)
    assert len(parses) == 3  # b was the last parsed (served from memory); a is parsed again at its own path


def test_a_tree_with_problems_is_refused_even_after_a_clean_parse_of_it(tmp_path: Path, parses: list[str]):
    """Walk problems (a file name that is not UTF-8) are not part of the digest: never from memory."""
    corpus = write_tree(tmp_path / "hb", HANDBOOK)
    register_revision(tmp_path / "revisions", "hb-1", corpus, "markdown", "public")
    (corpus / "notes").joinpath(b"bad\xff.md".decode("utf-8", "surrogateescape")).write_text("# Bad\n\nA note.\n")
    with pytest.raises(CorpusError) as exc:
        register_revision(tmp_path / "revisions", "hb-2", corpus, "markdown", "public")
    assert "not valid UTF-8" in str(exc.value)
    assert not (tmp_path / "revisions" / "hb-2.json").exists()
