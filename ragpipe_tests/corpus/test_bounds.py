"""Corpus bounds: one line per violation, nothing registered, no chunk of an oversized document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragpipe.corpus.bounds import CorpusBounds
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.registry import list_revisions, register_revision


def _beir(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


def _refusal(tmp_path: Path, source: Path, fmt: str, bounds: CorpusBounds) -> list[str]:
    with pytest.raises(CorpusError) as info:
        register_revision(tmp_path / "reg", "r1", source, fmt, "public", bounds=bounds)
    assert list_revisions(tmp_path / "reg") == []
    return info.value.problems


def test_each_bound_broken_is_one_line_and_nothing_is_registered(tmp_path: Path):
    source = _beir(tmp_path / "c.jsonl", ["é" * 60, "short text", "x" * 100])
    problems = _refusal(tmp_path, source, "beir", CorpusBounds(document_bytes=100, documents=2, corpus_bytes=200))
    assert problems == [
        f"{source}:1 [id=d0]: document text is 120 bytes (limit 100 bytes: --max-document-bytes)",
        f"{source}: 3 documents (limit 2: --max-documents)",
        f"{source}: the documents' text is 230 bytes (limit 200 bytes: --max-corpus-bytes)",
    ]


def test_within_the_bounds_registers(tmp_path: Path):
    source = _beir(tmp_path / "c.jsonl", ["x" * 100])
    record, new = register_revision(tmp_path / "reg", "r1", source, "beir", "public", bounds=CorpusBounds(100, 1, 100))
    assert new and record.revision == "r1"


def test_past_twenty_oversized_documents_the_rest_are_counted(tmp_path: Path):
    source = _beir(tmp_path / "c.jsonl", ["y" * 11] * 25)
    problems = _refusal(tmp_path, source, "beir", CorpusBounds(document_bytes=10))
    assert len(problems) == 21
    assert problems[-1] == f"{source}: … and 5 more documents over --max-document-bytes"


def test_a_markdown_document_over_the_bound_is_refused(tmp_path: Path):
    root = tmp_path / "notes"
    root.mkdir()
    (root / "big.md").write_bytes(b"a" * (8 * 1024 * 1024 + 1))
    (root / "ok.md").write_text("a small note with enough text\n")
    problems = _refusal(tmp_path, root, "markdown", CorpusBounds())
    assert problems == [
        f"{root / 'big.md'} [id=big.md]: document text is 8,388,609 bytes (limit 8,388,608 bytes: --max-document-bytes)"
    ]


def test_metadata_counts_with_the_text(tmp_path: Path):
    """Found by an adversarial review: 4 bytes of text with 64M characters of metadata passed."""
    source = tmp_path / "c.jsonl"
    source.write_text(json.dumps({"_id": "d0", "text": "tiny", "metadata": {"blob": "x" * 2000}}) + "\n")
    problems = _refusal(tmp_path, source, "beir", CorpusBounds(document_bytes=1024))
    assert problems == [
        f"{source}:1 [id=d0]: document text and metadata are 2,034 bytes (limit 1,024 bytes: --max-document-bytes)"
    ]


def test_a_gzip_corpus_is_inflated_in_bounded_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Found by an adversarial review: a 305 KB .gz was inflated whole (633 MB) before any bound."""
    import gzip

    from ragpipe.corpus import beir
    from ragpipe.corpus.connectors import read_beir

    line = json.dumps({"_id": "d", "text": "x" * 1000}) + "\n"
    two = tmp_path / "two.jsonl.gz"  # two gzip members, as `cat a.gz b.gz` makes
    two.write_bytes(gzip.compress(line.encode()) + gzip.compress(line.replace('"d"', '"e"').encode()))
    assert [r.document_id for r in read_beir(two)] == ["d", "e"]
    monkeypatch.setattr(beir, "MAX_INFLATED_BYTES", 1500)
    with pytest.raises(CorpusError) as info:
        read_beir(two)
    assert info.value.problems == [f"{two}: inflates to more than 1,500 bytes (refused unread)"]
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(line.encode())[:-12])
    monkeypatch.setattr(beir, "MAX_INFLATED_BYTES", 10**6)
    with pytest.raises(CorpusError) as info:
        read_beir(cut)
    assert info.value.problems == [
        f"{cut}: cannot read corpus file: compressed file ended before the end-of-stream marker"
    ]
