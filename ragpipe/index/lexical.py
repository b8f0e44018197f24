"""The tantivy BM25 index: the only module that imports tantivy.

One tantivy document per representation: ``text`` analysed with the spec's tokenizer; IDs,
``access_scope`` (one term per scope) and ``source_role`` as raw, untokenised terms so a query can
carry an exact must-clause on them (authorization prefilter inside the backend); and ``row``, the
representation's row in ``representations.parquet``, as a u64 fast field, so a search resolves its
hits by column lookup instead of fetching stored documents.

BM25's IDF and average field length are statistics of the whole index: a prefilter removes hidden
documents from the results but not from those statistics. So the index is written as one segment
per *scope group* (documents sharing one access-scope set; layout in ``ragpipe.index.segments``),
and a subject who may see only some groups is served by a view listing exactly their segments,
whose statistics — tantivy sums them over the listed segments — are those of an index built from
the authorized rows alone.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import tantivy

from ragpipe.index.hits import Hit
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexRow, RowScopes
from ragpipe.index.segments import (
    ScopeGroupError,
    Scopes,
    SegmentView,
    compose_groups,
    file_stem,
    layout_problems,
    read_meta,
    read_scope_groups,
    scope_set,
    show_scopes,
)
from ragpipe.index.selection import Selection
from ragpipe.spec import LexicalIndexSpec

_WORD = re.compile(r"\w+", re.UNICODE)
_MAX_FILTERS = 1024  # one scope filter per distinct scope set; bounded
_COLUMN_ROWS = 65_536  # stored documents read per batch of columns (``read_lexical_table``)
LEXICAL_ROWS_SCHEMA = pa.schema(
    [
        ("row", pa.uint64()),
        *((name, pa.string()) for name in ("representation_id", "chunk_id", "document_id", "kind", "source_role")),
        ("access_scopes", pa.list_(pa.string())),
    ]
)


def lexical_schema(spec: LexicalIndexSpec) -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("text", stored=False, tokenizer_name=spec.tokenizer)
    for name in ("representation_id", "chunk_id", "document_id", "kind", "source_role"):
        builder.add_text_field(name, stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_text_field("access_scope", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("row", stored=True, fast=True)
    return builder.build()


def _write_rows(index: tantivy.Index, rows: Sequence[IndexRow], positions: Sequence[int], heap_mb: int) -> None:
    # One indexing thread and one commit: one segment (unless the rows outgrow the heap), documents
    # in input order, and segment files that depend only on the input.
    writer = index.writer(heap_size=heap_mb * 1024 * 1024, num_threads=1)
    for position, row in zip(positions, rows, strict=True):
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


def build_lexical_index(directory: Path, rows: list[IndexRow], spec: LexicalIndexSpec, heap_mb: int = 128) -> int:
    """Write the scope-grouped tantivy index of ``rows`` into the empty folder ``directory``; returns
    its document count. Each group is built as its own index (rows in bundle order) in a
    sub-folder, then its segments move into ``directory`` (``segments.compose_groups``)."""
    schema = lexical_schema(spec)
    by_group: dict[Scopes, list[int]] = {}
    for position, row in enumerate(rows):
        by_group.setdefault(scope_set(row.access_scopes), []).append(position)
    parts = []
    for n, scopes in enumerate(sorted(by_group)):
        part = directory / f".group-{n}"
        part.mkdir()
        positions = by_group[scopes]
        _write_rows(tantivy.Index(schema, path=str(part)), [rows[i] for i in positions], positions, heap_mb)
        parts.append((scopes, part))
    empty = None
    if not parts:  # an empty corpus: the schema comes from an empty index
        empty = directory / ".empty"
        empty.mkdir()
        tantivy.Index(schema, path=str(empty))
    compose_groups(directory, parts, empty)
    return lexical_doc_count(directory)


def _open(directory: Path) -> tantivy.Index:
    index = tantivy.Index.open(str(directory))
    # Indexes here never change: no reloads (tantivy-py still starts its meta.json watcher thread,
    # which then triggers nothing).
    index.config_reader(reload_policy="manual")
    index.reload()
    return index


def lexical_doc_count(directory: Path) -> int:
    return _open(directory).searcher().num_docs


def query_terms(text: str) -> list[str]:
    """Plain lower-case words of the query: no field prefixes, operators or syntax survive, so
    query text can never address the ``access_scope`` field or change the query structure."""
    return [w.lower() for w in _WORD.findall(text)]


def _order(hit: Hit) -> tuple:
    # ragpipe's total order (retrieval/fusion/order.py), which the index layer may not import.
    return (-hit.score, hit.document_id, hit.chunk_id, hit.representation_id)


class LexicalSearcher:
    """BM25 search over one tantivy index (or view) with the scope filter inside the query.

    ``rows`` gives (representation_id, chunk_id, document_id) for every row of the bundle's
    ``representations.parquet``; the index's ``row`` field points into it. Safe to share between
    threads: tantivy searches are, and the filter cache is locked."""

    def __init__(
        self,
        index: tantivy.Index,
        rows: Sequence[tuple[str, str, str]],
        directory: Path,
        view: SegmentView | None = None,
    ):
        self.rows = rows
        self.index = index
        self.directory = directory  # the scope-grouped index folder (a view's source, for a view)
        self.view = view
        self.schema = index.schema
        self.searcher = index.searcher()
        self._filters: OrderedDict[tuple[str, tuple[str, ...]], tantivy.Query] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, directory: Path, rows: Sequence[tuple[str, str, str]]) -> LexicalSearcher:
        return cls(_open(directory), rows, directory)

    @classmethod
    def open_view(
        cls, directory: Path, meta: dict, segment_ids: Sequence[str], rows: Sequence[tuple[str, str, str]]
    ) -> LexicalSearcher:
        """A searcher over exactly ``segment_ids`` of the index in ``directory`` (``meta`` is its
        parsed ``meta.json``): a ``SegmentView`` folder, removed by ``close()``."""
        view = SegmentView(directory, meta, segment_ids)
        try:
            return cls(_open(view.path), rows, directory, view)
        except BaseException:
            view.close()
            raise

    def close(self) -> None:
        """Remove a view's folder. Searches keep working: tantivy has mapped every file already."""
        if self.view is not None:
            self.view.close()

    @property
    def num_docs(self) -> int:
        return self.searcher.num_docs

    def search(
        self,
        text: str,
        k: int,
        where: Prefilter,
    ) -> list[Hit]:
        """The ``k`` best hits under ragpipe's total order (score, then IDs). Hits tying with the
        k-th score are all fetched before the cut, so which of them are returned never depends
        on tantivy's document addresses (which differ between a view and a rebuilt index).
        ``where`` (``index.prefilter``) is applied as zero-score clauses, so BM25 scores are those of
        the unfiltered view; excluded documents are a must-not clause, so deepening a
        document-level ranking never re-reads the rows of documents already ranked."""
        terms = query_terms(text)
        if not terms or k < 1 or where.admits_nothing:
            return []
        text_query = self.index.parse_query(" ".join(terms), ["text"])
        clauses = [(tantivy.Occur.Must, text_query), (tantivy.Occur.Must, self._filter("access_scope", where.scopes))]
        if where.source_roles:
            clauses.append((tantivy.Occur.Must, self._filter("source_role", where.source_roles)))
        selection = where.selection
        if selection is not None and not selection.everything:
            clauses.append(selection.compiled("tantivy", lambda: self._selection_clause(selection)))
        if where.exclude_documents:
            excluded = tantivy.Query.term_set_query(self.schema, "document_id", sorted(where.exclude_documents))
            clauses.append((tantivy.Occur.MustNot, excluded))
        query = tantivy.Query.boolean_query(clauses)
        limit = k + 1
        while True:
            found = self.searcher.search(query, limit=limit, count=False).hits
            if len(found) < limit or found[-1][0] != found[k - 1][0]:
                break
            limit *= 2
        positions = self.searcher.fast_field_values("row", [address for _, address in found])
        rows = self.rows
        hits = [Hit("lexical", *rows[position], score) for (score, _), position in zip(found, positions)]
        if len(hits) > k:
            hits.sort(key=_order)
            del hits[k:]
        return hits

    def _selection_clause(self, selection: Selection) -> tuple[tantivy.Occur, tantivy.Query]:
        """A must clause admitting ``selection``'s documents, or a must-not clause on the others
        when they are fewer; zero score either way."""
        if selection.by_exclusion:
            others = tantivy.Query.term_set_query(self.schema, "document_id", sorted(selection.others))
            return tantivy.Occur.MustNot, others
        admitted = tantivy.Query.term_set_query(self.schema, "document_id", sorted(selection.documents))
        return tantivy.Occur.Must, tantivy.Query.const_score_query(admitted, 0.0)

    def _filter(self, field: str, values: tuple[str, ...]) -> tantivy.Query:
        """Must-clause on ``field`` (``access_scope`` or ``source_role``) with zero score: filters
        without changing BM25 scores. A disjunction of term queries, not a term-set query: the term
        set builds a bitset of the whole index per search (~0.3 ms on SciFact), the term postings
        are merely intersected."""
        key = (field, values)
        with self._lock:
            query = self._filters.get(key)
            if query is not None:
                self._filters.move_to_end(key)
                return query
            terms = [tantivy.Query.term_query(self.schema, field, v) for v in values]
            either = (
                terms[0] if len(terms) == 1 else tantivy.Query.boolean_query([(tantivy.Occur.Should, t) for t in terms])
            )
            query = self._filters[key] = tantivy.Query.const_score_query(either, 0.0)
            if len(self._filters) > _MAX_FILTERS:
                self._filters.popitem(last=False)
            return query


def read_lexical_rows(directory: Path) -> list[dict[str, object]]:
    """Every stored tantivy document as ``{row, representation_id, chunk_id, document_id, kind,
    source_role, access_scopes}`` in ``row`` order: what bundle verification cross-checks."""
    searcher = _open(directory).searcher()
    found = searcher.search(tantivy.Query.all_query(), limit=max(1, searcher.num_docs), count=False).hits
    return sorted((_row_record(searcher.doc(address).to_dict()) for _, address in found), key=lambda r: r["row"])


def read_lexical_table(directory: Path) -> pa.Table:
    """``read_lexical_rows`` as one Arrow table (``row``, the IDs, ``kind``, ``source_role``,
    ``access_scopes``), sorted by ``row``: the same records without a Python dict per row,
    converted to columns every ``_COLUMN_ROWS`` documents."""
    searcher = _open(directory).searcher()
    found = searcher.search(tantivy.Query.all_query(), limit=max(1, searcher.num_docs), count=False).hits
    batches: list[pa.RecordBatch] = []
    for start in range(0, len(found), _COLUMN_ROWS):
        records = [_row_record(searcher.doc(address).to_dict()) for _, address in found[start : start + _COLUMN_ROWS]]
        batches.append(pa.RecordBatch.from_pylist(records, schema=LEXICAL_ROWS_SCHEMA))
    del found
    table = pa.Table.from_batches(batches, schema=LEXICAL_ROWS_SCHEMA)
    return table.sort_by("row")


def _row_record(stored: dict) -> dict[str, object]:
    return {
        "row": stored["row"][0],
        **{name: stored[name][0] for name in ("representation_id", "chunk_id", "document_id", "kind", "source_role")},
        "access_scopes": tuple(stored.get("access_scope", ())),
    }


def verify_scope_groups(directory: Path, row_scopes: Sequence[Sequence[str]]) -> list[str]:
    """Problems with the scope groups of the index in ``directory`` (empty when fine), given the
    access scopes of every bundle row's document (``row_scopes[row]``): the sidecar parses and is
    canonical; it lists every segment of ``meta.json`` exactly once with its row count; every
    stored document of a segment has exactly its group's scopes, as does the document of its
    row; and the segments partition the rows ``0..len(row_scopes)-1``."""
    name = directory.name
    try:
        groups, meta = read_scope_groups(directory), read_meta(directory)
    except ScopeGroupError as exc:
        return [str(exc)]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{name}/meta.json: unreadable ({exc})"]
    problems = layout_problems(directory, groups, meta)
    if problems:
        return problems
    searcher = _open(directory).searcher()
    if searcher.num_segments != len(meta["segments"]):
        return [
            f"{name}/meta.json: tantivy opened {searcher.num_segments} segments, meta.json lists {len(meta['segments'])}"
        ]
    group_of = {sid: g.scopes for g in groups for sid in g.segment_ids}
    rows = RowScopes.of(row_scopes)
    # each row's scope group: the sorted, distinct scopes of its document (one per distinct tuple)
    expected = RowScopes([scope_set(g) for g in rows.groups], rows.index)
    home = np.full(len(rows), -1, dtype=np.int64)  # per row: the ordinal of the segment storing it
    sids = [entry["segment_id"] for entry in meta["segments"]]
    for ordinal, entry in enumerate(meta["segments"]):
        sid = entry["segment_id"]
        problems += _segment_problems(
            searcher, ordinal, entry["max_doc"], f"{name}/{file_stem(sid)}.store", group_of[sid], expected, home, sids
        )
    missing = np.flatnonzero(home < 0)
    if missing.size:
        problems.append(f"{name}: {missing.size} bundle row(s) are stored in no segment (first: row {int(missing[0])})")
    return problems


def _segment_problems(
    searcher: tantivy.Searcher,
    ordinal: int,
    max_doc: int,
    where: str,
    scopes: Scopes,
    expected: RowScopes,
    home: np.ndarray,
    sids: list[str],
) -> list[str]:
    stored_wrong, document_wrong, problems = [], [], []
    for doc in range(max_doc):
        record = _row_record(searcher.doc(tantivy.DocAddress(ordinal, doc)).to_dict())
        row, stored = record["row"], scope_set(record["access_scopes"])
        if not 0 <= row < len(expected):
            problems.append(f"{where}: row {row} is outside the bundle's {len(expected)} rows")
            continue
        if home[row] >= 0:
            problems.append(f"{where}: row {row} is also stored in segment {sids[home[row]]}")
        else:
            home[row] = ordinal
        if stored != scopes:
            stored_wrong.append((row, stored))
        elif expected[row] != scopes:
            document_wrong.append((row, expected[row]))
    group = show_scopes(scopes)
    if stored_wrong:
        row, stored = stored_wrong[0]
        problems.append(
            f"{where}: {len(stored_wrong)} row(s) store access scopes other than their group's {group} (first: row {row} stores {show_scopes(stored)})"
        )
    if document_wrong:
        row, document = document_wrong[0]
        problems.append(
            f"{where}: {len(document_wrong)} row(s) belong to documents outside group {group} (first: row {row}, document scopes {show_scopes(document)})"
        )
    return problems
