"""Channel rankings of a query suite, collected once so fusion variants are evaluated without
searching again (used by ``plan_search``).

A channel ranking depends on the query, the subject, the channel, the collapse level and the
number of units ranked — never on fusion. So for each case ``collect`` runs one real hybrid
``Retriever.query(k=units, trace=True)`` and keeps the trace's channel rankings (after the
policy re-check, exactly what fusion saw). Any plan that differs only in fusion, or in a channel
depth ≤ ``units``, sees a prefix of these rankings (``settled_units/v1`` makes a channel's
ranking exactly the first ``max(depth, k)`` units of its full collapsed ranking). Each query is
embedded once: ``CachedQueryEmbedder`` remembers vectors by text, so further ``Retriever``s
(other collapse levels, the replay check) reuse them.

The on-disk cache (pickle under ``var/``, written by this module only) is operational: it is
keyed by bundle ID, collection plan ID, suite digest and ``units``, and ignored when any differs.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragpipe.evaluation.suite import Case, suite_digest
from ragpipe.index.hits import Hit
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.fusion.order import RankedHit
from ragpipe.retrieval.retriever import Retriever

Rankings = dict[str, list[RankedHit]]  # channel name -> ranked units


class CachedQueryEmbedder:
    """The bundle's query embedder, each distinct text embedded once (the vectors are the
    embedder's own: caching changes no result)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.thread_safe = getattr(inner, "thread_safe", False)
        self._vectors: dict[str, np.ndarray] = {}
        self.embedded = 0

    def embed_query(self, text: str) -> np.ndarray:
        found = self._vectors.get(text)
        if found is None:
            found = self._vectors[text] = self.inner.embed_query(text)
            self.embedded += 1
        return found


@dataclass(frozen=True)
class Collected:
    """Per case: the channel rankings, and the hybrid hits (chunk IDs, scores) the query returned."""

    bundle_id: str
    plan_id: str
    suite_digest: str
    units: int
    rankings: dict[str, Rankings]
    hybrid_hits: dict[str, list[tuple[str, float]]]


def rankings_from_trace(trace: dict) -> Rankings:
    """The trace's per-channel rankings as fusion inputs (``RankedHit`` of a ``Hit``)."""
    return {
        name: [
            RankedHit(r["rank"], Hit(name, r["representation_id"], r["chunk_id"], r["document_id"], r["score"]))
            for r in ranked
        ]
        for name, ranked in trace["channels"].items()
    }


def collect(
    retriever: Retriever, cases: Sequence[Case], units: int, progress: Callable[[int], None] | None = None
) -> Collected:
    """One hybrid query per case with ``k = units`` (so each channel ranks ``units`` units)."""
    rankings: dict[str, Rankings] = {}
    hybrid: dict[str, list[tuple[str, float]]] = {}
    subject = Subject.default()
    for i, case in enumerate(cases, start=1):
        result = retriever.query(case.query, subject, k=units, mode="hybrid", trace=True)
        rankings[case.id] = rankings_from_trace(result.trace)
        hybrid[case.id] = [(str(h["chunk_id"]), float(h["score"])) for h in result.hits]
        if progress is not None:
            progress(i)
    plan_id = retriever.plan.with_channels(("lexical", "vector")).plan_id
    digest = suite_digest(cases)
    return Collected(retriever.bundle_id, plan_id, digest, units, rankings, hybrid)


def load_or_collect(
    path: Path, retriever: Retriever, cases: Sequence[Case], units: int, progress=None
) -> tuple[Collected, bool]:
    """The cached collection at ``path`` when it matches (bundle, plan, suite, units), else a
    fresh one (written to ``path``). Returns (collection, whether it came from the cache)."""
    expected = (
        retriever.bundle_id,
        retriever.plan.with_channels(("lexical", "vector")).plan_id,
        suite_digest(cases),
        units,
    )
    if path.exists():
        with path.open("rb") as f:
            found = pickle.load(f)
        if (
            isinstance(found, Collected)
            and (found.bundle_id, found.plan_id, found.suite_digest, found.units) == expected
        ):
            return found, True
    collected = collect(retriever, cases, units, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        pickle.dump(collected, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)
    return collected, False
