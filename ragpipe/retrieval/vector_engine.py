"""Which engine serves a bundle's vectors, and why, in words.

Exact vector search is defined by the project (``ragpipe.index.vector_memory``: the same scores
on every CPU) and computed in memory from the bundle's verified vectors; lancedb stays the store of
record. What an operator needs is to *see* what serves and from where, so the searcher carries a
sentence saying so (``VectorEngine``): in the build summary, ``ragpipe bundle inspect`` and the
server's ``/readyz``. Operational: in no ID.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragpipe.bundle.verify import VerifiedBundle
from ragpipe.index.rows import IndexRow
from ragpipe.index.vector_memory import open_vector_searcher


@dataclass(frozen=True)
class VectorEngine:
    """The engine serving a bundle's vectors (``memory``) and one line saying how and from where."""

    engine: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"engine": self.engine, "why": self.why}


def open_bundle_vectors(
    bundle: VerifiedBundle,
    rows: Sequence[IndexRow],
    *,
    before_lance: Callable[[], None] | None = None,
):
    """The vector searcher of ``bundle`` (None when it has no vector index) over its index
    ``rows``; ``before_lance`` runs before its lance table is read (a bundle without
    ``vectors.arrow``). The searcher's ``engine`` and ``why`` say what serves and how."""
    sem = bundle.manifest.semantic
    if not sem.has_vector_index:
        return None
    return open_vector_searcher(
        bundle.path / "vector",
        sem.specs["vector_index"].spec["metric"],
        [(r.representation_id, r.chunk_id, r.document_id) for r in rows],
        row_scopes=[r.access_scopes for r in rows],
        row_roles=[r.source_role for r in rows],
        embeddings_digest=bundle.manifest.material.embeddings_digest,
        vectors=bundle.tables.vectors,
        before_lance=before_lance,
    )


def engine_of(searcher) -> VectorEngine | None:
    """The ``VectorEngine`` of a searcher ``open_bundle_vectors`` returned (None for None)."""
    return None if searcher is None else VectorEngine(searcher.engine, searcher.why)


def bundle_vector_engine(bundle: VerifiedBundle) -> VectorEngine | None:
    """What serves ``bundle``'s vectors, and how (opening them, as a query would)."""
    from ragpipe.bundle.verify import check_vector_table
    from ragpipe.index.rows import index_rows

    rows = index_rows(bundle.tables.documents, bundle.tables.representations)
    searcher = open_bundle_vectors(bundle, rows, before_lance=lambda: check_vector_table(bundle))
    try:
        return engine_of(searcher)
    finally:
        if searcher is not None:
            searcher.close()
