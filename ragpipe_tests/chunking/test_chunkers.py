"""Chunkers: exact byte spans, stable IDs, heading paths; verification catches any drift."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.chunking.chunkers import (
    MarkdownHeadingChunker,
    SlidingWindowChunker,
    make_chunker,
    verify_chunks,
    window_spans,
)
from ragpipe.chunking.models import make_chunk_id
from ragpipe.corpus.models import Document
from ragpipe.kernel.ids import ContentDigest, DocumentId, SpecId, bytes_digest, content_id
from ragpipe.representations.derive import breadcrumb_text, derive_representations
from ragpipe.spec import ChunkerSpec

SPEC_ID = SpecId(content_id("test-spec", 1, {"n": 1}))


def doc(text: str, doc_id: str = "d", title: str = "Title") -> Document:
    return Document(
        document_id=DocumentId(doc_id),
        title=title,
        text=text,
        content_digest=ContentDigest(bytes_digest(text.encode())),
        access_scopes=("public",),
        source_role="primary",
    )


MARKDOWN = """Preamble line.

# Guide

Intro text.

## Install

Run make.
```
# not a heading inside a fence
```

### Details

Deep.

## Use

Query it.
"""


def test_markdown_sections_and_heading_paths():
    chunker = MarkdownHeadingChunker(ChunkerSpec(max_bytes=400, overlap_bytes=50), SPEC_ID)
    d = doc(MARKDOWN)
    chunks = chunker.chunk(d)
    assert [c.heading_path for c in chunks] == [
        (),
        ("Guide",),
        ("Guide", "Install"),
        ("Guide", "Install", "Details"),
        ("Guide", "Use"),
    ]
    assert chunks[2].text == "## Install\n\nRun make.\n```\n# not a heading inside a fence\n```\n\n"
    assert [c.ordinal for c in chunks] == [0, 1, 2, 3, 4]
    assert verify_chunks([d], chunks) == []
    assert "".join(c.text for c in chunks) == MARKDOWN  # sections tile the document


def test_sliding_window_overlaps_and_cuts_at_words():
    text = " ".join(f"word{i:03d}" for i in range(200))  # 1599 bytes
    chunks = SlidingWindowChunker(ChunkerSpec(kind="sliding_window", max_bytes=300, overlap_bytes=60), SPEC_ID).chunk(
        doc(text)
    )
    assert len(chunks) == 7
    for a, b in zip(chunks, chunks[1:]):
        assert b.byte_start < a.byte_end  # overlap
        assert a.byte_end - b.byte_start <= 60
        assert text[b.byte_start - 1] == " "  # starts at a word
    assert all(c.byte_end - c.byte_start <= 300 for c in chunks)
    assert chunks[-1].byte_end == len(text)


def test_chunk_ids_depend_on_document_spec_and_span():
    d = doc("x" * 10)
    base = make_chunk_id(d.document_id, d.content_digest, SPEC_ID, 0, 5)
    assert base == make_chunk_id(DocumentId("d"), d.content_digest, SPEC_ID, 0, 5)
    assert base != make_chunk_id(DocumentId("e"), d.content_digest, SPEC_ID, 0, 5)
    assert base != make_chunk_id(d.document_id, d.content_digest, SPEC_ID, 0, 6)
    assert base != make_chunk_id(d.document_id, d.content_digest, SpecId(content_id("test-spec", 1, {"n": 2})), 0, 5)
    # golden: the chunk ID encoding is persisted
    assert (
        base
        == "sha256:"
        + __import__("hashlib")
        .sha256(
            b"ragpipe/chunk/v1\0"
            + (
                '{"chunker_spec_id":"%s","document_digest":"%s","document_id":"d","span":[0,5]}'
                % (SPEC_ID, d.content_digest)
            ).encode()
        )
        .hexdigest()
    )


def test_verification_names_every_kind_of_drift():
    d = doc("Alpha beta gamma delta epsilon zeta eta theta.")
    (c,) = make_chunker(ChunkerSpec(), SPEC_ID).chunk(d)
    wrong_text = c.model_copy(update={"text": c.text.upper()})
    wrong_span = c.model_copy(update={"byte_end": 999})
    wrong_id = c.model_copy(
        update={"byte_start": 1, "text": c.text[1:], "digest": ContentDigest(bytes_digest(c.text[1:].encode()))}
    )
    problems = verify_chunks([d], [wrong_text, wrong_span, wrong_id])
    assert [p.split("): ", 1)[1] for p in problems] == [
        "text differs from document bytes [0, 46)",
        "digest does not match text",
        "duplicate chunk ID",
        "span [0, 999) outside document of 46 bytes",
        "duplicate chunk ID",
        "chunk ID does not derive from document digest, spec and span",
    ]


def test_representations_point_to_their_chunk():
    d = doc(MARKDOWN, title="Handbook")
    chunks = MarkdownHeadingChunker(ChunkerSpec(), SPEC_ID).chunk(d)
    reps = derive_representations([d], chunks, ("raw", "title_breadcrumb"), SPEC_ID)
    assert len(reps) == 2 * len(chunks)
    by_chunk = {c.chunk_id: c for c in chunks}
    for r in reps:
        parent = by_chunk[r.chunk_id]
        assert r.document_id == parent.document_id
        assert r.text == (
            parent.text if r.kind == "raw" else breadcrumb_text("Handbook", parent.heading_path, parent.text)
        )
    assert reps[7].text.startswith("Handbook > Guide > Install > Details\n\n### Details")
    assert len({r.representation_id for r in reps}) == len(reps)


texts = st.lists(
    st.sampled_from(list("ab cé日\n#.!") + ["word ", "\n# H\n", "\n## Sub\n", "```\n", "Sentence. "]),
    min_size=1,
    max_size=600,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(
    text=texts,
    max_bytes=st.integers(64, 700),
    overlap=st.integers(0, 31),
    kind=st.sampled_from(["markdown_heading", "sliding_window"]),
)
def test_chunks_are_exact_spans_for_any_text(text, max_bytes, overlap, kind):
    d = doc(text)
    data = text.encode()
    chunks = make_chunker(ChunkerSpec(kind=kind, max_bytes=max_bytes, overlap_bytes=overlap), SPEC_ID).chunk(d)
    assert verify_chunks([d], chunks) == []
    for c in chunks:
        assert data[c.byte_start : c.byte_end] == c.text.encode()
        assert c.byte_end - c.byte_start <= max_bytes
        assert c.text.strip()
    # every non-whitespace byte is covered by some chunk
    covered = bytearray(len(data))
    for c in chunks:
        covered[c.byte_start : c.byte_end] = b"\1" * (c.byte_end - c.byte_start)
    assert all(covered[i] or chr(data[i]).isspace() for i in range(len(data)) if data[i] < 128)


@given(st.integers(1, 5000), st.integers(64, 2000), st.integers(0, 31))
def test_window_spans_terminate_and_cover(n, max_bytes, overlap):
    data = b"x" * n
    spans = window_spans(data, 0, n, max_bytes, overlap)
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(s < e for s, e in spans)
    assert all(b[0] <= a[1] for a, b in zip(spans, spans[1:]))
