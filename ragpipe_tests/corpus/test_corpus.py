"""Connectors, normalisation, registration and bad input (each with its exact message)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from ragpipe.corpus.connectors import read_beir, read_markdown_folder, source_digest
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.records import SourceRecord
from ragpipe.corpus.registry import RevisionError, list_revisions, read_registered_corpus, register_revision
from ragpipe.corpus.snapshot import build_snapshot
from ragpipe.spec import SnapshotSpec
from ragpipe_tests.support.corpora import write_beir, write_tree

GOOD = b'{"_id": "d1", "title": "T", "text": "Some text that is long enough."}\n'

BAD_BEIR = [
    ("invalid_utf8", GOOD + b'{"_id": "d2", "text": "caf\xe9 au lait is good"}\n', r"{f}:2: invalid UTF-8 at byte 26"),
    ("malformed_json", GOOD + b'{"_id": "d2", "text": \n', r"{f}:2: malformed JSON: Expecting value at column 23"),
    ("not_object", GOOD + b'["d2", "text"]\n', r"{f}:2: expected a JSON object, got list"),
    ("missing_id", GOOD + b'{"text": "no id here at all, sadly"}\n', r"{f}:2: missing or empty '_id'"),
    ("duplicate_id", GOOD + GOOD, r"{f}:2 \[id=d1\]: duplicate document ID \(first seen on line 1\)"),
    ("missing_text", GOOD + b'{"_id": "d2", "title": "x"}\n', r"{f}:2 \[id=d2\]: missing 'text' \(must be a string\)"),
    ("empty_text", GOOD + b'{"_id": "d2", "text": "   "}\n', r"{f}:2 \[id=d2\]: empty 'text'"),
    ("blank_line", GOOD + b"\n" + GOOD.replace(b"d1", b"d3"), r"{f}:2: empty line"),
    (
        "unknown_field",
        GOOD + b'{"_id": "d2", "text": "long enough text", "body": 1}\n',
        r"{f}:2 \[id=d2\]: unknown field\(s\) body",
    ),
    (
        "bad_scopes",
        GOOD + b'{"_id": "d2", "text": "long enough text", "metadata": {"access_scopes": "staff"}}\n',
        r"{f}:2 \[id=d2\]: access_scopes must be a non-empty list of strings",
    ),
    (
        "bad_scope_name",
        GOOD + b'{"_id": "d2", "text": "long enough text", "metadata": {"access_scopes": ["a b"]}}\n',
        r"{f}:2 \[id=d2\]: invalid access scope 'a b'",
    ),
    (
        "title_not_string",
        GOOD + b'{"_id": "d2", "title": 7, "text": "long enough text"}\n',
        r"{f}:2 \[id=d2\]: 'title' must be a string",
    ),
    ("empty_file", b"", r"{f}: corpus has no documents"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD_BEIR, ids=[b[0] for b in BAD_BEIR])
def test_bad_beir_input_is_refused_with_location(tmp_path: Path, name: str, content: bytes, message: str):
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(content)
    with pytest.raises(CorpusError) as info:
        read_beir(path)
    assert re.search(message.format(f=re.escape(str(path))), str(info.value)), str(info.value)


BAD_MARKDOWN = [
    (
        "near_miss_key",
        {"a.md": "---\ntitle: A\nAccess-Scopes: [public]\n---\nbody text here\n"},
        r"a\.md:3 \[id=a\.md\]: metadata key 'Access-Scopes' must be spelt exactly 'access_scopes'",
    ),
    (
        "unclosed",
        {"a.md": "---\ntitle: A\nbody text here\n"},
        r"a\.md:1 \[id=a\.md\]: front matter opened with '---' is never closed",
    ),
    ("not_mapping", {"a.md": "---\n- x\n---\nbody\n"}, r"a\.md:1 \[id=a\.md\]: front matter must be a mapping"),
    ("empty_body", {"a.md": "---\ntitle: A\n---\n\n  \n"}, r"a\.md \[id=a\.md\]: empty text"),
    ("bad_utf8", {"a.md": None}, r"a\.md \[id=a\.md\]: invalid UTF-8 at byte 2"),
    ("no_files", {"x.bin": "binary"}, r"no Markdown or text files found"),
]


@pytest.mark.parametrize(("name", "files", "message"), BAD_MARKDOWN, ids=[b[0] for b in BAD_MARKDOWN])
def test_bad_markdown_input_is_refused_with_location(tmp_path: Path, name: str, files: dict, message: str):
    root = tmp_path / name
    root.mkdir()
    for rel, text in files.items():
        (root / rel).write_bytes(b"ab\xff\xfe" if text is None else text.encode())
    with pytest.raises(CorpusError, match=message):
        read_markdown_folder(root)


def test_all_problems_are_reported_together(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(GOOD + b"{oops\n" + GOOD)
    with pytest.raises(CorpusError) as info:
        read_beir(path)
    assert [p.split(": ", 1)[1] for p in info.value.problems] == [
        "malformed JSON: Expecting property name enclosed in double quotes at column 2",
        "duplicate document ID (first seen on line 1)",
    ]


def test_beir_gzip_metadata_and_normalisation(tmp_path: Path):
    raw = (
        '{"_id": "a", "title": "Cafe\\u0301", "text": "line one\\r\\nline two\\rline three", '
        '"metadata": {"access_scopes": ["staff", "public", "staff"], "source_role": "faq", "url": "x"}}\n'
    )
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(raw.encode()))
    (rec,) = read_beir(path)
    assert rec.title == "Café" and len(rec.title) == 4  # NFC
    assert rec.text == "line one\nline two\nline three"
    assert rec.access_scopes == ("public", "staff")
    assert rec.source_role == "faq"
    assert {k: v.as_json() for k, v in rec.metadata.items()} == {"url": "x"}


def test_markdown_folder_ids_titles_scopes(handbook: Path):
    records = {r.document_id: r for r in read_markdown_folder(handbook)}
    assert sorted(records) == ["guide/intro.md", "guide/ops.md", "notes/short.md", "notes/ünïcode.txt"]
    assert records["guide/intro.md"].title == "Introduction"
    assert records["guide/intro.md"].text.startswith("# Introduction\n")
    assert records["guide/ops.md"].title == "Operations"  # from the first heading
    assert records["guide/ops.md"].access_scopes == ("staff",)
    assert records["guide/ops.md"].source_role == "runbook"
    assert records["notes/ünïcode.txt"].title == "ünïcode"
    assert "\r" not in records["notes/ünïcode.txt"].text


def test_snapshot_default_scope_and_exclusions_are_recorded(handbook: Path):
    docs, summary = build_snapshot(read_markdown_folder(handbook), "r1", "internal", SnapshotSpec(min_text_chars=20))
    assert [d.document_id for d in docs] == ["guide/intro.md", "guide/ops.md", "notes/ünïcode.txt"]
    assert {d.document_id: d.access_scopes for d in docs}["guide/intro.md"] == ("internal",)
    assert {d.document_id: d.access_scopes for d in docs}["guide/ops.md"] == ("staff",)
    assert [(e.document_id, e.reason) for e in summary.excluded] == [
        ("notes/short.md", "text shorter than min_text_chars=20")
    ]
    assert summary.default_scope == "internal"
    # the default scope is part of the corpus digest
    _, other = build_snapshot(read_markdown_folder(handbook), "r1", "public", SnapshotSpec(min_text_chars=20))
    assert other.corpus_digest != summary.corpus_digest


def test_no_default_scope_refuses_unscoped_documents_naming_them(tmp_path: Path, handbook: Path):
    registry = tmp_path / "reg"
    with pytest.raises(RevisionError) as refused:
        register_revision(registry, "v1", handbook, "markdown", None)
    assert str(refused.value) == (
        f"{handbook.resolve()}: 3 documents declare no access_scopes: 'guide/intro.md' (guide/intro.md), "
        "'notes/short.md' (notes/short.md), 'notes/ünïcode.txt' (notes/ünïcode.txt); declare them, or give the "
        "revision a default scope (ragpipe build --default-scope SCOPE, default_scope in the sources file)"
    )
    assert not registry.exists()
    # a registered revision is built again without the flag: its recorded default applies
    record, _ = register_revision(registry, "v0", handbook, "markdown", "staff")
    assert register_revision(registry, "v0", handbook, "markdown", None) == (record, False)
    # a fourth unscoped document is counted, not listed
    (handbook / "guide" / "more.md").write_text("# More\n\nAnother document without a scope.\n")
    with pytest.raises(
        RevisionError, match=r": 4 documents declare no access_scopes: .*\(notes/short.md\) and 1 more;"
    ):
        register_revision(registry, "v1", handbook, "markdown", None)
    # the snapshot refuses the same corpus too: no caller can publish a guessed scope
    with pytest.raises(CorpusError, match=r"^invalid corpus:\n  revision 'v1': 4 documents declare no access_scopes"):
        build_snapshot(read_markdown_folder(handbook), "v1", None, SnapshotSpec(min_text_chars=1))


def test_a_corpus_whose_documents_all_declare_scopes_needs_no_default(tmp_path: Path):
    scoped = write_tree(tmp_path / "md", {"a.md": "---\naccess_scopes: [staff]\n---\nStaff only text here.\n"})
    record, new = register_revision(tmp_path / "reg", "v1", scoped, "markdown", None)
    assert new and record.default_scope is None
    docs, summary = build_snapshot(read_registered_corpus(record), "v1", None, SnapshotSpec(min_text_chars=1))
    assert [(d.document_id, d.access_scopes) for d in docs] == [("a.md", ("staff",))]
    assert summary.default_scope is None
    # "no default" is recorded: it is another revision than the same bytes with a default
    _, public = build_snapshot(read_registered_corpus(record), "v1", "public", SnapshotSpec(min_text_chars=1))
    assert public.corpus_digest != summary.corpus_digest
    with pytest.raises(RevisionError, match=r"already registered with different content \(.*, no default scope\)"):
        register_revision(tmp_path / "reg", "v1", scoped, "markdown", "public")


def test_an_empty_scope_declaration_never_becomes_the_default():
    empty = SourceRecord("d1", "T", "Some text that is long enough.", (), "primary", "c.jsonl:1")
    with pytest.raises(CorpusError, match=r"c.jsonl:1 \[id=d1\]: access_scopes is empty"):
        build_snapshot([empty], "r1", "public", SnapshotSpec(min_text_chars=1))


def test_registration_is_immutable(tmp_path: Path, handbook: Path):
    registry = tmp_path / "reg"
    record, new = register_revision(registry, "v1", handbook, "markdown", "public")
    assert new and record.source_digest == source_digest(handbook, "markdown")
    assert register_revision(registry, "v1", handbook, "markdown", "public") == (record, False)
    with pytest.raises(RevisionError, match="already registered with different content"):
        register_revision(registry, "v1", handbook, "markdown", default_scope="staff")
    (handbook / "guide" / "intro.md").write_text("# Changed\n\nNew content, long enough.\n")
    with pytest.raises(RevisionError, match="changed since registration"):
        read_registered_corpus(record)
    with pytest.raises(RevisionError, match="invalid revision key"):
        register_revision(registry, "../evil", handbook, "markdown", "public")
    assert list_revisions(registry) == ["v1"]


def test_bad_corpus_registers_nothing(tmp_path: Path):
    path = write_beir(tmp_path / "c.jsonl", [{"_id": "a", "text": "fine text here"}, {"_id": "a", "text": "dup"}])
    registry = tmp_path / "reg"
    with pytest.raises(CorpusError, match="duplicate document ID"):
        register_revision(registry, "v1", path, "beir", "public")
    assert list_revisions(registry) == []
    md = write_tree(
        tmp_path / "md", {"a.md": "ok text that is long\n", "b.md": "---\naccess_scopes: null\n---\nhidden\n"}
    )
    with pytest.raises(CorpusError, match="access_scopes must be a non-empty list of strings, got null"):
        register_revision(registry, "v1", md, "markdown", "public")
    assert list_revisions(registry) == []
