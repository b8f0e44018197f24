"""The rows both indexes store: IDs plus the authorization fields needed for prefiltering."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ragpipe.corpus.models import Document
from ragpipe.representations.derive import Representation


@dataclass(frozen=True)
class IndexRow:
    representation_id: str
    chunk_id: str
    document_id: str
    kind: str
    text: str
    access_scopes: tuple[str, ...]
    source_role: str

    def with_text(self, text: str) -> IndexRow:
        return IndexRow(
            self.representation_id,
            self.chunk_id,
            self.document_id,
            self.kind,
            text,
            self.access_scopes,
            self.source_role,
        )


def index_rows(documents: list[Document], reps: list[Representation]) -> list[IndexRow]:
    docs = {d.document_id: d for d in documents}
    return [
        IndexRow(
            representation_id=str(r.representation_id),
            chunk_id=str(r.chunk_id),
            document_id=str(r.document_id),
            kind=r.kind,
            text=r.text,
            access_scopes=docs[r.document_id].access_scopes,
            source_role=docs[r.document_id].source_role,
        )
        for r in reps
    ]


SLICE_ROWS = 65_536  # rows of an Arrow column turned into Python objects at a time


class RowScopes(Sequence[tuple[str, ...]]):
    """Every bundle row's access scopes, compactly: the distinct scope tuples (``groups``, as the
    documents hold them) and, per row, the position of its own among them (``index``, int32) — a
    million rows cost 4 MB, not a million tuples. A read-only sequence of tuples all the same."""

    def __init__(self, groups: Sequence[tuple[str, ...]], index: np.ndarray):
        self.groups = tuple(tuple(g) for g in groups)
        self.index = np.asarray(index, dtype=np.int32)
        self.index.setflags(write=False)

    @classmethod
    def of(cls, row_scopes: Sequence[Sequence[str]]) -> RowScopes:
        """``row_scopes`` (row ``i``'s scopes at ``i``) as ``RowScopes`` (itself if it is one)."""
        if isinstance(row_scopes, RowScopes):
            return row_scopes
        position: dict[tuple[str, ...], int] = {}
        index = np.fromiter(
            (position.setdefault(tuple(s), len(position)) for s in row_scopes), dtype=np.int32, count=len(row_scopes)
        )
        return cls(list(position), index)

    @classmethod
    def of_arrow(cls, column: pa.Array | pa.ChunkedArray) -> RowScopes:
        """``of`` a ``list<string>`` column, converted to Python a slice at a time."""
        position: dict[tuple[str, ...], int] = {}
        index = np.empty(len(column), dtype=np.int32)
        for start in range(0, len(column), SLICE_ROWS):
            part = column.slice(start, SLICE_ROWS).to_pylist()
            index[start : start + len(part)] = [position.setdefault(tuple(s), len(position)) for s in part]
        return cls(list(position), index)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self.groups[g] for g in self.index[i].tolist()]
        return self.groups[self.index[i]]

    def __iter__(self):
        groups = self.groups
        return (groups[g] for g in self.index.tolist())

    def scopes(self) -> set[str]:
        """Every scope some row has."""
        used = np.unique(self.index)
        return {s for g in used.tolist() for s in self.groups[g]}

    def rows_with(self, scope: str) -> np.ndarray:
        """The positions (ascending) of the rows that have ``scope``."""
        having = np.array([scope in g for g in self.groups], dtype=bool)
        return np.flatnonzero(having[self.index]) if len(self.groups) else np.empty(0, dtype=np.intp)

    def scope_mismatch(self, scope: str, found: np.ndarray) -> tuple[list[int], list[int]] | None:
        """What an index's answer for ``scope`` (``found``: the row positions it matched, in any
        order) gets wrong, as (rows it matched that lack the scope, rows it missed that have it) —
        at most five of each, ascending — or ``None`` when it matched exactly the rows with it."""
        actual = np.sort(np.asarray(found, dtype=np.int64))
        wanted = self.rows_with(scope)
        if np.array_equal(actual, wanted):
            return None
        return np.setdiff1d(actual, wanted)[:5].tolist(), np.setdiff1d(wanted, actual)[:5].tolist()


INDEX_FIELDS = ("representation_id", "chunk_id", "document_id", "kind", "source_role")


@dataclass(frozen=True)
class IndexColumns:
    """The rows both indexes must hold, as columns (row ``i`` is representation ``i``): the IDs,
    kind and source role as Arrow string arrays, the access scopes as ``RowScopes`` — what
    ``index_rows`` gives, without a Python object per row."""

    representation_id: pa.Array
    chunk_id: pa.Array
    document_id: pa.Array
    kind: pa.Array
    source_role: pa.Array
    scopes: RowScopes
    # per row, the position of its document in the documents table it was built from (if known)
    document_at: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.scopes)

    def column(self, name: str) -> pa.Array:
        return getattr(self, name)

    def id_tuples(self, document_ids: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
        """(representation_id, chunk_id, document_id) per row: what searchers resolve hits to.
        ``document_ids``: the documents table's IDs (as ``document_at`` indexes them), whose
        strings the rows then share instead of holding one more per row."""
        if document_ids is not None and self.document_at is not None:
            documents = [document_ids[at] for at in self.document_at.tolist()]
        else:
            documents = self.document_id.to_pylist()
        return list(zip(self.representation_id.to_pylist(), self.chunk_id.to_pylist(), documents, strict=True))

    def rows(self, start: int = 0, stop: int | None = None) -> list[IndexRow]:
        """Rows ``start:stop`` as ``IndexRow`` (``text`` empty: the indexes' checks never read it)."""
        stop = len(self) if stop is None else stop
        fields = [self.column(name).slice(start, stop - start).to_pylist() for name in INDEX_FIELDS]
        scopes = self.scopes[start:stop]
        return [
            IndexRow(rid, cid, did, kind, "", tuple(sc), role)
            for rid, cid, did, kind, role, sc in zip(*fields, scopes, strict=True)
        ]


def index_columns(documents: pa.Table, representations: pa.Table) -> IndexColumns:
    """``IndexColumns`` of a bundle from its Arrow tables: ``documents`` with ``document_id``,
    ``access_scopes`` and ``source_role``, ``representations`` with ``representation_id``,
    ``chunk_id``, ``document_id`` and ``kind`` (``KeyError`` naming a representation whose
    document is not in ``documents``, as ``index_rows`` raises)."""
    ids = documents.column("document_id").combine_chunks()
    at = pc.index_in(representations.column("document_id"), value_set=ids)
    if at.null_count:
        missing = representations.column("document_id").filter(pc.is_null(at))[0].as_py()
        raise KeyError(missing)
    at_rows = at.to_numpy(zero_copy_only=False)
    # a document's scopes as the documents hold them; one group per distinct scope tuple
    doc_scopes = RowScopes.of_arrow(documents.column("access_scopes"))
    return IndexColumns(
        representation_id=representations.column("representation_id").combine_chunks(),
        chunk_id=representations.column("chunk_id").combine_chunks(),
        document_id=representations.column("document_id").combine_chunks(),
        kind=representations.column("kind").combine_chunks(),
        source_role=documents.column("source_role").combine_chunks().take(pa.array(at_rows)),
        scopes=RowScopes(doc_scopes.groups, doc_scopes.index[at_rows]),
        document_at=at_rows,
    )
