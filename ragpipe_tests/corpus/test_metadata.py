"""Typed document metadata: front matter and BEIR ``metadata`` kept, typed, digested and stored."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.corpus.connectors import read_beir, read_markdown_folder
from ragpipe.corpus.metadata import MetadataValue, metadata_from_json, metadata_json, typed_metadata
from ragpipe.corpus.models import Document, NotKept, corpus_digest
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.snapshot import build_snapshot, read_snapshot, write_snapshot
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import content_id
from ragpipe.spec import SnapshotSpec

HUGO = """---
title: Returns
date: 2024-05-01
lastmod: 2024-05-02T10:00:00+02:00
draft: false
weight: 10
rating: 4.5
tags: [faq, returns]
sizes: [1, 2.5]
params:
  product_id: 42
  region: eu
description:
aliases: []
authors:
  - name: Ann
mixed: [a, 1]
"Last Modified": yesterday
---
# Returns

You can return an item within 30 days.
"""


def _shown(metadata: dict[str, MetadataValue]) -> dict[str, tuple[str, object]]:
    return {k: (v.type_name(), v.as_json()) for k, v in metadata.items()}


def test_hugo_front_matter_is_kept_typed(tmp_path: Path):
    (tmp_path / "returns.md").write_text(HUGO)
    (rec,) = read_markdown_folder(tmp_path)
    assert rec.title == "Returns"
    assert _shown(rec.metadata) == {
        "date": ("date", "2024-05-01"),
        "draft": ("boolean", False),
        "lastmod": ("datetime", "2024-05-02T08:00:00Z"),  # converted to UTC
        "params.product_id": ("integer", 42),
        "params.region": ("string", "eu"),
        "rating": ("number", 4.5),
        "sizes": ("list<number>", [1.0, 2.5]),
        "tags": ("list<string>", ["faq", "returns"]),
        "weight": ("integer", 10),
    }
    assert rec.not_kept == (
        ("authors", "a list holding mappings or lists (metadata lists hold scalars)"),
        ("mixed", "a list mixing integer, string (metadata lists hold one type)"),
        ("Last Modified", "not a field name (a letter or _, then letters, digits, _ . -; at most 128)"),
    )


def test_a_string_that_looks_like_a_date_stays_a_string(tmp_path: Path):
    (tmp_path / "a.md").write_text('---\ndate: "2024-05-01"\nn: "7"\n---\nbody text here\n')
    (rec,) = read_markdown_folder(tmp_path)
    assert _shown(rec.metadata) == {"date": ("string", "2024-05-01"), "n": ("string", "7")}


@pytest.mark.parametrize(
    ("front", "rule"),
    [
        ("score: .nan", "a.md:2 [id=a.md]: metadata 'score': non-finite number nan (metadata numbers must be finite)"),
        ("big: 9007199254740993", "a.md:2 [id=a.md]: metadata 'big': integer 9007199254740993 is outside ±(2^53-1)"),
        ("s: " + "x" * 8193, "a.md:2 [id=a.md]: metadata 's': string of 8193 characters (limit 8192)"),
    ],
)
def test_values_breaking_a_bound_refuse_the_corpus(tmp_path: Path, front: str, rule: str):
    (tmp_path / "a.md").write_text(f"---\n{front}\n---\nbody text here\n")
    with pytest.raises(CorpusError) as info:
        read_markdown_folder(tmp_path)
    assert [p.replace(str(tmp_path) + "/", "") for p in info.value.problems] == [rule]


def test_too_many_keys_and_values_are_refused():
    problems: list[str] = []
    typed_metadata({f"k{i}": i for i in range(257)}, lambda key: "f:1", problems)
    typed_metadata({"tags": list(range(1025))}, lambda key: "f:2", problems)
    assert problems == ["f:1: 257 metadata keys (limit 256)", "f:2: metadata 'tags': list of 1025 values (limit 1024)"]


def test_beir_metadata_is_kept_typed_and_core_fields_are_not_metadata(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    meta = {"access_scopes": ["staff"], "source_role": "faq", "year": 2020, "tags": ["a"], "shop": {"sku": "X1"}}
    path.write_text(json.dumps({"_id": "d1", "text": "t", "metadata": meta}) + "\n")
    (rec,) = read_beir(path)
    assert (rec.access_scopes, rec.source_role) == (("staff",), "faq")
    assert _shown(rec.metadata) == {
        "shop.sku": ("string", "X1"),
        "tags": ("list<string>", ["a"]),
        "year": ("integer", 2020),
    }


def test_a_document_title_key_in_beir_metadata_is_not_kept(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"_id": "d1", "text": "t", "metadata": {"title": "x", "text": "y"}}) + "\n")
    (rec,) = read_beir(path)
    assert rec.metadata == {}
    assert rec.not_kept == (("title", "names a core field"), ("text", "names a core field"))


def _doc(doc_id: str, metadata: dict[str, MetadataValue] | None = None) -> Document:
    return Document(
        document_id=doc_id,
        title="T",
        text="some text",
        content_digest="sha256:" + "0" * 64,
        access_scopes=("public",),
        source_role="primary",
        metadata=metadata or {},
    )


def test_corpus_digest_without_metadata_is_the_digest_it_always_was():
    docs = [_doc("b"), _doc("a")]
    rows = [[d, "sha256:" + "0" * 64, "T", ["public"], "primary"] for d in ("a", "b")]
    legacy = content_id("corpus", 1, {"normalization": "utf8-nfc-lf/v1", "default_scope": "public", "documents": rows})
    assert corpus_digest(docs, "public") == legacy


def test_metadata_is_part_of_the_corpus_digest():
    year = {"year": MetadataValue(type="integer", values=(2020,))}
    other = {"year": MetadataValue(type="integer", values=(2021,))}
    as_text = {"year": MetadataValue(type="string", values=("2020",))}
    digests = {corpus_digest([_doc("a", m)], "public") for m in (None, year, other, as_text)}
    assert len(digests) == 4


def test_snapshot_facts_and_round_trip(tmp_path: Path):
    src = tmp_path / "notes"
    src.mkdir()
    (src / "a.md").write_text("---\nyear: 2020\ntags: [x]\nauthors: [{name: A}]\n---\nbody text of document a here\n")
    (src / "b.md").write_text('---\nyear: "2021"\nauthors: [{name: B}]\n---\nbody text of document b here\n')
    (src / "c.md").write_text("body text of c, no front matter\n")
    records = read_markdown_folder(src)
    documents, summary = build_snapshot(records, "r1", "public", SnapshotSpec())
    assert summary.metadata_fields == {"tags": {"list<string>": 1}, "year": {"integer": 1, "string": 1}}
    assert summary.metadata_not_kept == [
        NotKept(
            key="authors",
            reason="a list holding mappings or lists (metadata lists hold scalars)",
            documents=2,
            first=f"{src}/a.md [id=a.md]",
        )
    ]
    out = tmp_path / "snap"
    out.mkdir()
    write_snapshot(out, documents, summary)
    again, summary_again = read_snapshot(out)
    assert again == documents and summary_again == summary
    assert corpus_digest(again, "public") == summary.corpus_digest


_SCALARS = st.one_of(
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)


@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), _SCALARS | st.lists(_SCALARS)))
def test_typed_metadata_round_trips_through_its_stored_form(raw: dict):
    problems: list[str] = []
    kept, _ = typed_metadata(raw, lambda key: "f", problems)
    if problems:
        return
    stored = json.loads(canonical_bytes(metadata_json(kept)))
    again = metadata_from_json(stored)
    assert again == kept
    assert [type(v) for m in again.values() for v in m.values] == [type(v) for m in kept.values() for v in m.values]


def test_a_docusaurus_mdx_page_is_read_as_markdown_with_its_front_matter(tmp_path: Path):
    page = (
        "---\nsidebar_position: 2\ntags: [guide]\n---\nimport Tabs from '@theme/Tabs';\n\n"
        "# Install\n\n<Tabs>pip install widget</Tabs>\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "install.MDX").write_text(page)
    (rec,) = read_markdown_folder(tmp_path)
    assert (rec.document_id, rec.title) == ("docs/install.MDX", "Install")
    assert rec.text == "import Tabs from '@theme/Tabs';\n\n# Install\n\n<Tabs>pip install widget</Tabs>\n"
    assert _shown(rec.metadata) == {"sidebar_position": ("integer", 2), "tags": ("list<string>", ["guide"])}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"access": {"scopes": ["board"]}}, "f:1: metadata key 'access.scopes' must be spelt exactly 'access_scopes'"),
        ({"source": {"role": "internal"}}, "f:1: metadata key 'source.role' must be spelt exactly 'source_role'"),
        (
            {"permissions": {"scope": "x"}},
            "f:1: metadata key 'permissions.scope' must be spelt exactly 'access_scopes'",
        ),
        ({"a.b": 1, "a": {"b": 2}}, "f:1: metadata key 'a.b' is given twice (flat and nested, or equal after NFC)"),
    ],
    ids=["access.scopes", "source.role", "permissions.scope", "flat-and-nested"],
)
def test_nesting_gets_round_neither_the_security_keys_nor_the_one_value_a_key_has(raw, problem):
    """Found by an adversarial review: nested keys were flattened after the near-miss check."""
    problems: list[str] = []
    kept, _ = typed_metadata(raw, lambda key: "f:1", problems)
    assert len(problems) == 1 and problems[0].startswith(problem)
    assert "access.scopes" not in kept and "source.role" not in kept and "permissions.scope" not in kept


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ({"k": ["integer", False, []]}, "0 value(s) for a single integer"),
        ({"k": ["integer", False, [1, 2]]}, "2 value(s) for a single integer"),
        ({"k": ["date", False, ["not a date"]]}, "'not a date' is not a date value"),
        ({"k": ["boolean", True, [1]]}, "1 is not a boolean value"),
        ({"access_scopes": ["string", False, ["public"]]}, "metadata key 'access_scopes' is not a field name"),
        ({"bad key!": ["string", False, ["x"]]}, "metadata key 'bad key!' is not a field name"),
    ],
)
def test_a_rewritten_metadata_column_is_refused_where_it_is_read(stored, message):
    """Found by an adversarial review: an empty value list verified, then failed every hit."""
    with pytest.raises(ValueError, match=re.escape(message)):
        metadata_from_json(stored)
