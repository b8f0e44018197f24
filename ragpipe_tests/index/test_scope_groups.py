"""The scope-grouped layout of the lexical index and its verification."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import tantivy

from ragpipe.index import segments as segments_module
from ragpipe.index.lexical import LexicalSearcher, _write_rows, lexical_schema, read_lexical_rows, verify_scope_groups
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexRow
from ragpipe.index.segments import file_stem, read_meta, read_scope_groups
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.retrieval.authz import Subject
from ragpipe_tests.retrieval.test_audience import (
    SCOPE_SETS,
    SPEC,
    audiences,
    authorized_only,
    corpus,
    open_index,
    triples,
)

# --- layout -----------------------------------------------------------------------------------


def test_build_writes_one_segment_per_scope_group_and_nothing_else(tmp_path: Path):
    rows = corpus(3)
    directory = tmp_path / "lexical"
    open_index(directory, rows)
    groups = read_scope_groups(directory)
    meta = read_meta(directory)
    assert [g.scopes for g in groups] == sorted(SCOPE_SETS)
    assert [g.rows for g in groups] == [sum(1 for r in rows if r.access_scopes == s) for s in sorted(SCOPE_SETS)]
    assert [len(g.segment_ids) for g in groups] == [1] * 5
    assert [s["segment_id"] for s in meta["segments"]] == [g.segment_ids[0] for g in groups]
    assert [s["max_doc"] for s in meta["segments"]] == [g.rows for g in groups]
    expected = {"meta.json", "scope_groups.json", ".tantivy-meta.lock"} | {
        f"{file_stem(g.segment_ids[0])}.{ext}"
        for g in groups
        for ext in ("fast", "fieldnorm", "idx", "pos", "store", "term")
    }
    assert {p.name for p in directory.iterdir()} == expected
    assert (directory / ".tantivy-meta.lock").read_bytes() == b""
    # every document of a segment carries its group's scopes; rows keep bundle order inside it
    assert verify_scope_groups(directory, [r.access_scopes for r in rows]) == []
    assert [r["representation_id"] for r in read_lexical_rows(directory)] == [r.representation_id for r in rows]
    # identical inputs, byte-identical folder (content-addressed segment IDs)
    again = tmp_path / "again"
    open_index(again, rows)
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {p.name: p.read_bytes() for p in directory.iterdir()}


def test_opening_the_index_adds_no_file(tmp_path: Path):
    rows = corpus(4)
    directory = tmp_path / "lexical"
    searcher = open_index(directory, rows)
    before = sorted(p.name for p in directory.iterdir())
    searcher.search("aspirin", 5, Prefilter(("public",)))
    LexicalSearcher.open(directory, triples(rows)).search("heart", 5, Prefilter(("staff",)))
    assert sorted(p.name for p in directory.iterdir()) == before


def test_empty_corpus_gives_a_valid_empty_index(tmp_path: Path):
    directory = tmp_path / "lexical"
    searcher = open_index(directory, [])
    assert searcher.num_docs == 0 and searcher.search("aspirin", 5, Prefilter(("public",))) == []
    assert read_meta(directory)["segments"] == []
    assert (directory / "scope_groups.json").read_bytes() == b'{"format":"ragpipe/lexical-scope-groups/v1","groups":[]}'
    assert sorted(p.name for p in directory.iterdir()) == [".tantivy-meta.lock", "meta.json", "scope_groups.json"]
    assert verify_scope_groups(directory, []) == []


def test_a_group_outgrowing_the_writer_heap_spans_segments_and_stays_exact(tmp_path: Path):
    rng = random.Random(5)
    vocab = ["".join(rng.choices("abcdefghijklmnop", k=rng.randint(3, 9))) for _ in range(5000)]
    rows = [
        IndexRow(
            f"r{i:04}",
            f"c{i:04}",
            f"d{i:04}",
            "raw",
            " ".join(rng.choices(vocab, k=150)),
            ("public",) if i % 7 else ("staff",),
            "body",
        )
        for i in range(6000)
    ]
    bundle = open_index(tmp_path / "lexical", rows, heap_mb=16)
    public = next(g for g in read_scope_groups(tmp_path / "lexical") if g.scopes == ("public",))
    assert len(public.segment_ids) >= 2
    assert verify_scope_groups(tmp_path / "lexical", [r.access_scopes for r in rows]) == []
    searcher, stats = audiences(bundle, rows).searcher_for(Subject("p", ("public",)))
    assert stats.index == "audience" and stats.rows == public.rows
    reference = authorized_only(tmp_path / "ref", rows, ("public",))
    for query in (" ".join(vocab[:3]), vocab[10], " ".join(vocab[100:110])):
        assert searcher.search(query, 50, Prefilter(("public",))) == reference.search(query, 50, Prefilter(("public",)))


# --- verification -----------------------------------------------------------------------------


def rewrite_sidecar(directory: Path, edit) -> None:
    data = json.loads((directory / "scope_groups.json").read_bytes())
    edit(data["groups"])
    (directory / "scope_groups.json").write_bytes(canonical_bytes(data))


@pytest.fixture
def two_groups(tmp_path: Path):
    rows = [
        IndexRow(
            f"r{i}", f"c{i}", f"d{i}", "raw", f"aspirin stroke {i}", ("staff",) if i in (1, 4) else ("public",), "body"
        )
        for i in range(6)
    ]
    directory = tmp_path / "lexical"
    open_index(directory, rows)
    public, staff = read_scope_groups(directory)
    return directory, rows, public.segment_ids[0], staff.segment_ids[0]


def test_verify_accepts_the_built_index(two_groups):
    directory, rows, _, _ = two_groups
    assert verify_scope_groups(directory, [r.access_scopes for r in rows]) == []


def test_verify_catches_a_segment_moved_to_another_group(two_groups):
    directory, rows, public, staff = two_groups

    def move(groups):
        groups[0]["segment_ids"] = sorted([public, staff])
        groups[0]["rows"] = 6
        del groups[1]

    rewrite_sidecar(directory, move)
    assert verify_scope_groups(directory, [r.access_scopes for r in rows]) == [
        f'lexical/{file_stem(staff)}.store: 2 row(s) store access scopes other than their group\'s ["public"] (first: row 1 stores ["staff"])'
    ]


def test_verify_catches_rows_whose_documents_have_other_scopes(two_groups):
    directory, rows, public, _ = two_groups
    documents = [("public",), ("staff",), ("secret",), ("public",), ("staff",), ("hr", "public")]
    assert verify_scope_groups(directory, documents) == [
        f'lexical/{file_stem(public)}.store: 2 row(s) belong to documents outside group ["public"] (first: row 2, document scopes ["secret"])'
    ]


def test_verify_catches_a_stored_row_whose_scopes_differ_from_its_segment_s(tmp_path: Path):
    """A forged segment mixing scopes, declared as one group with consistent counts."""
    rows = [
        IndexRow(f"r{i}", f"c{i}", f"d{i}", "raw", "aspirin", ("staff",) if i == 2 else ("public",), "body")
        for i in range(4)
    ]
    directory = tmp_path / "lexical"
    directory.mkdir()
    part = directory / ".part"
    part.mkdir()
    _write_rows(tantivy.Index(lexical_schema(SPEC), path=str(part)), rows, range(4), 16)
    (group,) = segments_module.compose_groups(directory, [(("public",), part)], None)
    assert verify_scope_groups(directory, [("public",)] * 4) == [
        f'lexical/{file_stem(group.segment_ids[0])}.store: 1 row(s) store access scopes other than their group\'s ["public"] (first: row 2 stores ["staff"])'
    ]


def test_verify_catches_missing_and_unlisted_segments(two_groups):
    directory, rows, public, staff = two_groups
    scopes = [r.access_scopes for r in rows]
    meta = read_meta(directory)
    (directory / "meta.json").write_text(
        json.dumps({**meta, "segments": [s for s in meta["segments"] if s["segment_id"] != staff]})
    )
    assert verify_scope_groups(directory, scopes) == [
        f'lexical/scope_groups.json: segment {staff} of group ["staff"] is not in meta.json',
        'lexical/scope_groups.json: group ["staff"] declares 2 rows, its segments hold 0',
    ]
    rewrite_sidecar(directory, lambda groups: groups.pop(1))  # hide the group as well: rows go missing
    assert verify_scope_groups(directory, scopes) == [
        "lexical: 2 bundle row(s) are stored in no segment (first: row 1)"
    ]
    (directory / "meta.json").write_text(json.dumps(meta))  # the segment is back, but in no group
    assert verify_scope_groups(directory, scopes) == [f"lexical/meta.json: segment {staff} belongs to no scope group"]


def test_verify_catches_wrong_counts_duplicates_and_bad_sidecars(two_groups):
    directory, rows, public, staff = two_groups
    scopes = [r.access_scopes for r in rows]
    original = (directory / "scope_groups.json").read_bytes()
    rewrite_sidecar(directory, lambda groups: groups[1].update(rows=3))
    assert verify_scope_groups(directory, scopes) == [
        'lexical/scope_groups.json: group ["staff"] declares 3 rows, its segments hold 2'
    ]
    rewrite_sidecar(directory, lambda groups: groups[1].update(rows=2, segment_ids=[staff, public]))
    assert verify_scope_groups(directory, scopes) == [
        f'lexical/scope_groups.json: segment {public} is listed in groups ["public"] and ["staff"]',
        'lexical/scope_groups.json: group ["staff"] declares 2 rows, its segments hold 6',
    ]
    (directory / "scope_groups.json").write_text(json.dumps(json.loads(original), indent=2))
    assert verify_scope_groups(directory, scopes) == ["lexical/scope_groups.json: not in canonical form (RFC 8785)"]
    (directory / "scope_groups.json").write_bytes(original.replace(b"/v1", b"/v2"))
    assert verify_scope_groups(directory, scopes) == [
        "lexical/scope_groups.json: format: Input should be 'ragpipe/lexical-scope-groups/v1'"
    ]
    unsorted = json.loads(original)
    unsorted["groups"].reverse()
    (directory / "scope_groups.json").write_bytes(canonical_bytes(unsorted))
    assert verify_scope_groups(directory, scopes) == [
        "lexical/scope_groups.json: groups must be sorted by scopes, each scope set once"
    ]
    (directory / "scope_groups.json").unlink()
    assert verify_scope_groups(directory, scopes) == [
        "lexical/scope_groups.json: missing (a lexical index without scope groups; rebuild the bundle)"
    ]


def test_verify_catches_rows_stored_twice(tmp_path: Path):
    rows = [IndexRow(f"r{i}", f"c{i}", f"d{i}", "raw", "aspirin", ("public",), "body") for i in range(3)]
    directory = tmp_path / "lexical"
    directory.mkdir()
    parts = []
    for n, scopes in enumerate([("public",), ("staff",)]):
        part = directory / f".part{n}"
        part.mkdir()
        forged = [
            IndexRow(r.representation_id, r.chunk_id, r.document_id, "raw", "aspirin", scopes, "body") for r in rows[:2]
        ]
        _write_rows(tantivy.Index(lexical_schema(SPEC), path=str(part)), forged, range(2), 16)
        parts.append((scopes, part))
    public, staff = segments_module.compose_groups(directory, parts, None)
    assert verify_scope_groups(directory, [("public",)] * 3) == [
        f"lexical/{file_stem(staff.segment_ids[0])}.store: row 0 is also stored in segment {public.segment_ids[0]}",
        f"lexical/{file_stem(staff.segment_ids[0])}.store: row 1 is also stored in segment {public.segment_ids[0]}",
        f'lexical/{file_stem(staff.segment_ids[0])}.store: 2 row(s) belong to documents outside group ["staff"] (first: row 0, document scopes ["public"])',
        "lexical: 1 bundle row(s) are stored in no segment (first: row 2)",
    ]
