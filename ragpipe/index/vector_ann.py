"""Approximate vector search: candidates from the lance ANN index, ranked by the exact scores.

A bundle whose vector-index spec declares ``ann`` (``ragpipe.spec.HnswSqIndex`` /
``PqIndex``) carries that index in its lance table; a query plan with ``vector_search: {kind:
approximate}`` serves its vector channel through ``ApproximateVectorSearcher``. Only the
*candidate set* is approximate:

1. the visible rows are those exact search would rank (``MemoryVectorSearcher.prepare``: the
   subject's scopes, source roles, metadata selection and excluded documents, from the verified
   tables), checked and validated exactly as exact search checks them;
2. the ANN index is asked for ``refine_factor × k`` candidates (``VectorSearcher.ann_rows``:
   ``nprobes`` IVF partitions, ``ef`` HNSW candidates, the same lancedb prefilter as an exact
   request), and every candidate that is not a visible row is dropped — the store can narrow the
   candidates, never widen them;
3. the candidates are ranked by the project's exact scores (``EXACT_SCORES``) from the verified
   in-memory matrix, by (score descending, row), and the first ``k`` kept
   (``MemoryVectorSearcher.ranked``): the refine step lance would do with float32 distances, done
   with the scores exact search uses. A hit's score has the same bits as exact search gives that
   row; the order of any two hits is the order exact search gives them.

If the index returns fewer candidates than ``min(refine_factor × k, visible rows)`` — a narrow
filter leaves the probed partitions short, or a graph search stops early — the request is answered
by exact search instead, so a search always returns ``min(k, visible rows)`` hits (a channel's
``k`` still means k). So whenever ``refine_factor × k`` reaches the visible rows, the result is
exactly exact search's, whatever the index holds.

What is *not* a pure function of the visible rows, unlike exact search: which candidates the index
returns depends on every row it was built from (hidden rows shape its partitions and graph) and on
its unseeded build. Scores and their order are the verified ones; the membership of the top ``k``
is what ``ann_recall@10`` measures with every evaluation (docs/retrieval.md).

Thread-safe as its parts are: the exact searcher is lock-free, the lance table has one event loop
per thread.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from ragpipe.index.hits import Hit
from ragpipe.index.ivf import ANN_INDEX_TYPES
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.vector_memory import MemoryVectorSearcher


class AnnIndex(Protocol):
    """What the approximate searcher asks of the lance table (``ragpipe.index.vector.VectorSearcher``)."""

    def ann_rows(
        self,
        vector: np.ndarray,
        limit: int,
        where: Prefilter,
        *,
        nprobes: int,
        ef: int,
    ) -> np.ndarray: ...

    def close(self) -> None: ...


class ApproximateVectorSearcher:
    """Approximate search (module docstring) over ``exact``'s verified rows and ``index``'s
    candidates, with the plan's ``nprobes``, ``ef`` and ``refine_factor``; ``kind`` is the bundle's
    ANN kind (``ivf_hnsw_sq`` or ``ivf_pq``)."""

    engine = "memory+ann"  # which engine serves (``ragpipe.retrieval.vector_engine``): in no ID
    approximate = True

    def __init__(
        self,
        exact: MemoryVectorSearcher,
        index: AnnIndex,
        *,
        kind: str,
        nprobes: int,
        ef: int,
        refine_factor: int,
    ):
        if min(nprobes, ef, refine_factor) < 1:
            raise ValueError(f"nprobes, ef and refine_factor must be >= 1, got {nprobes}, {ef}, {refine_factor}")
        self.exact, self.index, self.kind = exact, index, kind
        self.nprobes, self.ef, self.refine_factor = nprobes, ef, refine_factor
        self.why = (
            f"approximate: candidates from the lance {ANN_INDEX_TYPES.get(kind, kind)} index (nprobes {nprobes}, "
            f"ef {ef}, refine_factor {refine_factor}), ranked by {exact.why}"
        )

    @property
    def rows(self):
        return self.exact.rows

    @property
    def dimension(self) -> int:
        return self.exact.dimension

    @property
    def metric(self) -> str:
        return self.exact.metric

    def search(
        self,
        vector: np.ndarray,
        k: int,
        where: Prefilter,
    ) -> list[Hit]:
        """The ``k`` best candidates by exact score among the visible rows the index returns
        (module docstring); the arguments and their errors are exact search's."""
        prepared = self.exact.prepare(vector, k, where)
        if prepared is None:
            return []
        query, visible = prepared
        candidates = self.candidates(query, k, visible, where)
        if candidates.size < min(k * self.refine_factor, visible.size):
            return self.exact.search(vector, k, where)
        return self.exact.ranked(query, candidates, k)

    def candidates(
        self,
        query: np.ndarray,
        k: int,
        visible: np.ndarray,
        where: Prefilter,
    ) -> np.ndarray:
        """The ascending positions of the visible rows (``visible``, ascending) among the index's
        ``refine_factor × k`` candidates for ``query``."""
        found = self.index.ann_rows(
            query,
            k * self.refine_factor,
            where,
            nprobes=self.nprobes,
            ef=self.ef,
        )
        found = np.unique(np.asarray(found, dtype=np.intp))
        # membership by binary search in the sorted ``visible``: O(candidates · log rows), where
        # np.intersect1d would sort every visible row on every search
        at = np.searchsorted(visible, found)
        inside = at < visible.size
        inside[inside] = visible[at[inside]] == found[inside]
        return found[inside]

    def close(self) -> None:
        """Drop the matrix and close the lance table's event loops; later searches raise
        ``RuntimeError``. Call once no search is in flight."""
        self.exact.close()
        self.index.close()


def open_approximate_searcher(
    exact: MemoryVectorSearcher,
    directory: Path,
    *,
    kind: str,
    nprobes: int,
    ef: int,
    refine_factor: int,
    before_lance: Callable[[], None] | None = None,
) -> ApproximateVectorSearcher:
    """The approximate searcher of a bundle whose verified exact searcher is ``exact`` and whose
    lance table (with its ANN index) is in ``directory``; ``before_lance`` runs first (the
    bundle's deferred check of that table, which includes its ANN index)."""
    if before_lance is not None:
        before_lance()
    from ragpipe.index.vector import VectorSearcher  # lancedb: seconds of imports

    index = VectorSearcher(directory, exact.metric, exact.rows)
    if not index.ann_indexed:
        index.close()
        raise ValueError(f"{directory}: the lance table has no ANN index")
    return ApproximateVectorSearcher(exact, index, kind=kind, nprobes=nprobes, ef=ef, refine_factor=refine_factor)
