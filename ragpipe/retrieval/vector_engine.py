"""Which engine serves a bundle's vectors, and why, in words.

Exact vector search is defined by the project (``ragpipe.index.vector_memory``: the same scores
on every CPU) and computed in memory from the bundle's verified vectors; lancedb stays the store of
record. A query plan with ``vector_search: {kind: approximate}`` on a bundle with an ANN index is
served by ``ragpipe.index.vector_ann`` instead: candidates from that index, ranked by the same
exact scores (``engine`` ``memory+ann``). What an operator needs is to *see* what serves and from
where, so the searcher carries a sentence saying so (``VectorEngine``): in the build summary,
``ragpipe bundle inspect`` and the server's ``/readyz``. Operational: in no ID.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragpipe.bundle.verify import VerifiedBundle
from ragpipe.index.vector_memory import open_vector_searcher
from ragpipe.retrieval.plan import ApproximateVectorSearchPlan, VectorSearchPlan
from ragpipe.retrieval.results import QueryError
from ragpipe.spec import RECORDED, VectorIndexSpec


@dataclass(frozen=True)
class VectorEngine:
    """The engine serving a bundle's vectors (``memory``) and one line saying how and from where."""

    engine: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"engine": self.engine, "why": self.why}


def ann_spec(bundle: VerifiedBundle):
    """The ANN index the bundle's vector-index spec declares (None: none, or no vector index)."""
    sem = bundle.manifest.semantic
    if not sem.has_vector_index:
        return None
    return VectorIndexSpec.model_validate(sem.specs["vector_index"].spec, context=RECORDED).ann


def vector_search_refusal(
    bundle: VerifiedBundle, vector_search: VectorSearchPlan | ApproximateVectorSearchPlan
) -> str | None:
    """Why ``bundle`` cannot serve ``vector_search`` (one line), or None: approximate search needs
    the bundle's ANN index."""
    if vector_search.kind == "approximate" and bundle.manifest.semantic.has_vector_index and ann_spec(bundle) is None:
        return (
            f"the query plan asks for approximate vector search (vector_search.kind: approximate), but bundle "
            f"{bundle.bundle_id} has no ANN index (its vector-index spec declares no ann)"
        )
    return None


def check_vector_search(bundle: VerifiedBundle, vector_search: VectorSearchPlan | ApproximateVectorSearchPlan) -> None:
    """Refuse (``QueryError``, ``vector_search_refusal``'s line) what the bundle cannot serve."""
    refusal = vector_search_refusal(bundle, vector_search)
    if refusal is not None:
        raise QueryError(refusal)


def open_bundle_vectors(
    bundle: VerifiedBundle,
    rows: Sequence[tuple[str, str, str]],
    row_scopes: Sequence[Sequence[str]],
    row_roles: Sequence[str],
    *,
    before_lance: Callable[[], None] | None = None,
    vector_search: VectorSearchPlan | ApproximateVectorSearchPlan | None = None,
):
    """The vector searcher of ``bundle`` (None when it has no vector index) over its index rows:
    ``rows`` (representation_id, chunk_id, document_id), each row's access scopes and its
    document's source role; ``before_lance`` runs before its lance table is read (a bundle without
    ``vectors.arrow``, or an approximate searcher, which queries the table's ANN index).
    ``vector_search``: the plan's; approximate search needs the bundle's ANN index
    (``check_vector_search``), exact search (the default) never reads it. The searcher's
    ``engine`` and ``why`` say what serves and how."""
    sem = bundle.manifest.semantic
    if not sem.has_vector_index:
        return None
    if vector_search is not None:
        check_vector_search(bundle, vector_search)
    exact = open_vector_searcher(
        bundle.path / "vector",
        sem.specs["vector_index"].spec["metric"],
        rows,
        row_scopes=row_scopes,
        row_roles=row_roles,
        embeddings_digest=bundle.manifest.material.embeddings_digest,
        vectors=bundle.tables.vectors,
        before_lance=before_lance,
    )
    if vector_search is None or vector_search.kind != "approximate":
        return exact
    from ragpipe.index.vector_ann import open_approximate_searcher

    try:
        return open_approximate_searcher(
            exact,
            bundle.path / "vector",
            kind=ann_spec(bundle).kind,  # type: ignore[union-attr]
            nprobes=vector_search.nprobes,
            ef=vector_search.ef,
            refine_factor=vector_search.refine_factor,
            before_lance=before_lance,
        )
    except BaseException:
        exact.close()
        raise


def engine_of(searcher) -> VectorEngine | None:
    """The ``VectorEngine`` of a searcher ``open_bundle_vectors`` returned (None for None)."""
    return None if searcher is None else VectorEngine(searcher.engine, searcher.why)


def bundle_vector_engine(bundle: VerifiedBundle) -> VectorEngine | None:
    """What serves ``bundle``'s vectors, and how (opening them, as a query would)."""
    from ragpipe.bundle.tables import DOCUMENTS, REPRESENTATIONS
    from ragpipe.bundle.verify import check_vector_table
    from ragpipe.index.rows import index_columns

    tables = bundle.tables
    columns = index_columns(
        tables.table(DOCUMENTS, ["document_id", "access_scopes", "source_role"]),
        tables.table(REPRESENTATIONS, ["representation_id", "chunk_id", "document_id", "kind"]),
    )
    searcher = open_bundle_vectors(
        bundle,
        columns.id_tuples(),
        columns.scopes,
        columns.source_role.to_pylist(),
        before_lance=lambda: check_vector_table(bundle),
    )
    try:
        return engine_of(searcher)
    finally:
        if searcher is not None:
            searcher.close()
