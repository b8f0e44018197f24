"""The set digests verification computes while it streams a bundle's tables are the definitions'
(``corpus_digest``, ``chunk_set_digest``, ``representation_set_digest``), bit for bit: rows in
any order, the same ID twice (a forged table), text that RFC 8785 escapes."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.bundle.set_digests import CorpusDigest, SortedSetDigest
from ragpipe.chunking.models import chunk_set_digest_of_rows
from ragpipe.corpus.metadata import MetadataValue
from ragpipe.corpus.models import NORMALIZATION, Document, corpus_digest, corpus_digest_row
from ragpipe.kernel.ids import ContentDigest, DocumentId, bytes_digest
from ragpipe.representations.derive import representation_set_digest_of_rows

# a few IDs, so that draws repeat them; text with quotes, backslashes, controls and non-ASCII
IDS = st.sampled_from([f"sha256:{hashlib.sha256(bytes([i])).hexdigest()}" for i in range(6)])
TEXT = st.text(alphabet=st.sampled_from(list('ab "\\\n\té€😀') + ["\u2028"]), max_size=12)
CHUNK_ROWS = st.lists(
    st.tuples(
        IDS, TEXT, st.integers(0, 3), st.integers(0, 2**40), st.integers(0, 2**40), IDS, st.lists(TEXT, max_size=2)
    ),
    max_size=25,
)
REP_ROWS = st.lists(st.tuples(IDS, IDS, st.sampled_from(["raw", "title_breadcrumb"]), IDS), max_size=25)


def _streamed(kind: str, rows: list[list]) -> str:
    digest = SortedSetDigest(kind, 1)
    for row in rows:
        digest.add(row)
    return digest.digest()


@settings(max_examples=200, deadline=None)
@given(CHUNK_ROWS)
def test_chunk_set_digest_streamed_is_the_definition(rows):
    rows = [list(r[:6]) + [list(r[6])] for r in rows]
    assert _streamed("chunk-set", rows) == chunk_set_digest_of_rows([list(r) for r in rows])


@settings(max_examples=200, deadline=None)
@given(REP_ROWS)
def test_representation_set_digest_streamed_is_the_definition(rows):
    rows = [list(r) for r in rows]
    assert _streamed("representation-set", rows) == representation_set_digest_of_rows([list(r) for r in rows])


def _document(document_id: str, text: str, title: str, scopes: tuple[str, ...], metadata: bool) -> Document:
    return Document(
        document_id=DocumentId(document_id),
        title=title,
        text=text,
        content_digest=ContentDigest(bytes_digest(text.encode())),
        access_scopes=scopes,
        source_role="primary",
        metadata={"year": MetadataValue(type="integer", many=False, values=(2020,))} if metadata else {},
        pages=((0, 1), (3, 2)) if metadata else (),
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.text(alphabet=st.sampled_from(list('ab "\\é ')), min_size=1, max_size=6), unique=True, max_size=12),
    st.sampled_from([None, "public"]),
    st.data(),
)
def test_corpus_digest_streamed_in_id_order_is_the_definition(ids, default_scope, data):
    documents = [
        _document(
            i,
            data.draw(TEXT),
            data.draw(TEXT),
            data.draw(st.sampled_from([("public",), ("a", "b")])),
            data.draw(st.booleans()),
        )
        for i in sorted(ids)
    ]
    streamed = CorpusDigest(NORMALIZATION, default_scope)
    for d in documents:
        streamed.add(corpus_digest_row(d))
    assert streamed.digest() == corpus_digest(list(reversed(documents)), default_scope)
