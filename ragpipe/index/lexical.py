"""The tantivy BM25 index: the only module that imports tantivy.

One tantivy document per representation: ``text`` analysed with the spec's tokenizer; IDs,
``access_scope`` (one term per scope) and ``source_role`` as raw, untokenised terms so a query can
carry an exact must-clause on them (authorization prefilter inside the backend); and ``row``, the
representation's row in ``representations.parquet``, as a u64 fast field, so a search resolves its
hits by column lookup instead of fetching stored documents.
"""

from __future__ import annotations

import re
from pathlib import Path

import tantivy

from ragpipe.index.rows import IndexRow
from ragpipe.retrieval.fusion import Hit

_WORD = re.compile(r"\w+", re.UNICODE)
from ragpipe.pipeline_spec import LexicalIndexSpec


def lexical_schema(spec: LexicalIndexSpec) -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("text", stored=False, tokenizer_name=spec.tokenizer)
    for name in ("representation_id", "chunk_id", "document_id", "kind", "source_role"):
        builder.add_text_field(name, stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("access_scope", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("row", stored=True, fast=True)
    return builder.build()


def build_lexical_index(directory: Path, rows: list[IndexRow], spec: LexicalIndexSpec, heap_mb: int = 128) -> int:
    """Write a tantivy index of ``rows`` into the empty folder ``directory``; returns its doc count."""
    index = tantivy.Index(lexical_schema(spec), path=str(directory))
    # One indexing thread: one segment, and a document order that depends only on the input.
    writer = index.writer(heap_size=heap_mb * 1024 * 1024, num_threads=1)
    for position, row in enumerate(rows):
        doc = tantivy.Document()
        doc.add_unsigned("row", position)
        doc.add_text("text", row.text)
        doc.add_text("representation_id", row.representation_id)
        doc.add_text("chunk_id", row.chunk_id)
        doc.add_text("document_id", row.document_id)
        doc.add_text("kind", row.kind)
        doc.add_text("source_role", row.source_role)
        for scope in row.access_scopes:
            doc.add_text("access_scope", scope)
        writer.add_document(doc)
    writer.commit()
    writer.wait_merging_threads()
    return lexical_doc_count(directory)


def lexical_doc_count(directory: Path) -> int:
    index = tantivy.Index.open(str(directory))
    index.reload()
    return index.searcher().num_docs


def query_terms(text: str) -> list[str]:
    """Plain lower-case words of the query: no field prefixes, operators or syntax survive, so
    query text can never address the ``access_scope`` field or change the query structure."""
    return [w.lower() for w in _WORD.findall(text)]


class LexicalSearcher:
    """BM25 search over one bundle's tantivy index with the scope filter inside the query.

    ``rows`` gives (representation_id, chunk_id, document_id) per index row, in the order the
    index was built (the bundle's ``representations.parquet``)."""

    def __init__(self, directory: Path, rows: list[tuple[str, str, str]]):
        self.rows = rows
        self.index = tantivy.Index.open(str(directory))
        self.index.reload()
        self.schema = self.index.schema
        self.searcher = self.index.searcher()

    def search(self, text: str, k: int, scopes: tuple[str, ...]) -> list[Hit]:
        terms = query_terms(text)
        if not terms or not scopes:
            return []
        text_query = self.index.parse_query(" ".join(terms), ["text"])
        # Must-clause on the scope field with zero score: filters without changing BM25 scores.
        scope_filter = tantivy.Query.const_score_query(
            tantivy.Query.term_set_query(self.schema, "access_scope", list(scopes)), 0.0
        )
        query = tantivy.Query.boolean_query([(tantivy.Occur.Must, text_query), (tantivy.Occur.Must, scope_filter)])
        found = self.searcher.search(query, limit=k, count=False).hits
        positions = self.searcher.fast_field_values("row", [address for _, address in found])
        hits = []
        for (score, _), position in zip(found, positions):
            rep_id, chunk_id, doc_id = self.rows[position]
            hits.append(Hit("lexical", rep_id, chunk_id, doc_id, float(score)))
        return hits
