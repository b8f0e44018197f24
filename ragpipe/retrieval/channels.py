"""Channel depth: each channel ranks exactly the top ``u`` distinct units of its full ranking.

A backend returns *representation* hits, and several representations share a chunk (and many
chunks a document), so "the top ``n`` hits" holds fewer than ``n`` distinct units after collapse.
``rank_channel`` asks its backend for hits until the top ``u`` units — chunks or documents, per the
plan's ``collapse`` — are *settled*, under the plan's ``depth_policy`` (``settled_units/v1``):

* a request for ``r`` hits that returns ``r`` hits holds every hit scoring strictly above the
  lowest score returned (the *boundary*); a unit whose best hit is above the boundary is settled —
  its best hit is known, and every unit not seen ranks at or below it. Units at the boundary may
  have tied hits the backend did not return, so they are not settled yet;
* a request that returns fewer hits than asked (or asks for the whole index) has returned every
  hit the backend has for the query: every unit seen is settled;
* the first request asks for ``request_multiple × u`` hits; while fewer than ``u`` units are
  settled, the channel asks again ``growth`` times deeper — except at document level on a backend
  that can exclude documents: there it excludes the settled documents and asks for
  ``request_multiple ×`` the missing count (``growth`` times deeper only when a round settled
  nothing, to get past a tie), so a document with thousands of matching chunks is read once, not
  in full.

The result is the first ``u`` units of the collapsed full ranking under the total order
(``fusion.order_key``) — whatever the request sizes and however the backend orders ties.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from ragpipe.index.hits import Hit
from ragpipe.index.lexical import LexicalSearcher
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.vector_memory import MemoryVectorSearcher
from ragpipe.retrieval.fusion.order import RankedHit, hit_key
from ragpipe.retrieval.plan import DepthPolicy


class ChannelBackend(Protocol):
    """One channel's search for one query, as requests of ``depth`` representation hits."""

    @property
    def size(self) -> int:
        """An upper bound on the hits any request can return (the rows of the index)."""
        ...

    @property
    def excludes_documents(self) -> bool:
        """Whether ``search`` honours ``exclude_documents`` (as a prefilter, before the top)."""
        ...

    def search(self, depth: int, exclude_documents: Collection[str]) -> list[Hit]: ...


@dataclass(frozen=True)
class Round:
    requested: int
    returned: int
    excluded_documents: int
    settled: int  # units settled after this round

    def as_dict(self) -> dict[str, int]:
        return {
            "requested": self.requested,
            "returned": self.returned,
            "excluded_documents": self.excluded_documents,
            "settled": self.settled,
        }


@dataclass(frozen=True)
class ChannelRanking:
    ranked: list[RankedHit]  # the top ``units`` settled units, ranks 1..n
    units: int  # units asked for: max(channel depth, k)
    rounds: tuple[Round, ...]
    complete: bool  # the backend returned every hit it has for the query

    @property
    def hits_read(self) -> int:
        return sum(r.returned for r in self.rounds)

    def trace(self) -> dict[str, object]:
        return {
            "units": self.units,
            "ranked": len(self.ranked),
            "complete": self.complete,
            "rounds": [r.as_dict() for r in self.rounds],
        }


def unit_of(hit: Hit, level: str) -> str:
    return hit.chunk_id if level == "chunk" else hit.document_id


def rank_channel(backend: ChannelBackend, units: int, level: str, policy: DepthPolicy) -> ChannelRanking:
    """The top ``units`` distinct units (``level``: chunk or document) of ``backend``'s ranking,
    each represented by its best hit, ranked 1..n by the total order (see module docstring)."""
    if units < 1:
        raise ValueError(f"units must be >= 1, got {units}")
    best: dict[str, Hit] = {}
    excluding = level == "document" and backend.excludes_documents
    excluded: frozenset[str] = frozenset()
    request = min(policy.request_multiple * units, backend.size)
    rounds: list[Round] = []
    settled_before = 0
    while True:
        hits = backend.search(request, excluded) if request > 0 else []
        for h in hits:
            key = unit_of(h, level)
            current = best.get(key)
            if current is None or hit_key(h) < hit_key(current):
                best[key] = h
        complete = len(hits) < request or request >= backend.size
        settled = _settled(best, hits, complete)
        rounds.append(Round(request, len(hits), len(excluded), len(settled)))
        if complete or len(settled) >= units:
            break
        if excluding:
            excluded = frozenset(settled)
            progressed = len(settled) > settled_before
            request = policy.request_multiple * (units - len(settled)) if progressed else request * policy.growth
        else:
            request *= policy.growth
        request = min(request, backend.size)
        settled_before = len(settled)
    top = sorted(settled.values(), key=hit_key)[:units]
    return ChannelRanking([RankedHit(i, h) for i, h in enumerate(top, start=1)], units, tuple(rounds), complete)


def recheck(ranked: dict[str, ChannelRanking], visible: Callable[[str], bool]) -> tuple[dict[str, ChannelRanking], int]:
    """Defence in depth: drop (and count) channel hits on documents ``visible`` refuses, before
    they reach fusion; ranks are renumbered. Backends prefilter, so this drops nothing unless one
    misbehaves."""
    checked: dict[str, ChannelRanking] = {}
    dropped = 0
    for name, ranking in ranked.items():
        keep = [r.hit for r in ranking.ranked if visible(r.hit.document_id)]
        dropped += len(ranking.ranked) - len(keep)
        if len(keep) < len(ranking.ranked):
            ranking = replace(ranking, ranked=[RankedHit(i, h) for i, h in enumerate(keep, start=1)])
        checked[name] = ranking
    return checked, dropped


def _settled(best: dict[str, Hit], last: Sequence[Hit], complete: bool) -> dict[str, Hit]:
    """The units whose best hit is final: all of them once the backend is exhausted, else those
    scoring strictly above the last request's lowest score. Boundaries never rise from one round
    to the next (a later request is deeper, or excludes only documents settled above the earlier
    boundary), so a unit once settled stays settled."""
    if complete:
        return best
    boundary = min(h.score for h in last)
    return {key: h for key, h in best.items() if h.score > boundary}


# ``where``: the subject's scopes, source roles and metadata selection (``ragpipe.index.prefilter``),
# to which each request adds the documents it excludes.
# ``size`` of both backends: the rows the subject may see (an upper bound on any request's hits
# that does not depend on hidden rows, so the trace's request sizes reveal nothing about them).


class LexicalBackend:
    """The lexical channel for one query; at document level, ranked documents are excluded with a
    must-not clause, so deepening never re-reads a large document's rows (docs/benchmarks.md)."""

    excludes_documents = True

    def __init__(self, searcher: LexicalSearcher, text: str, where: Prefilter, size: int):
        self.searcher, self.text, self.where, self.size = searcher, text, where, size

    def search(self, depth: int, exclude_documents: Collection[str]) -> list[Hit]:
        return self.searcher.search(self.text, depth, self.where.excluding(exclude_documents))


class VectorBackend:
    """The vector channel for one (already embedded) query; excludes documents in the prefilter."""

    excludes_documents = True

    def __init__(self, searcher: MemoryVectorSearcher, vector: np.ndarray, where: Prefilter, size: int):
        self.searcher, self.vector, self.where, self.size = searcher, vector, where, size

    def search(self, depth: int, exclude_documents: Collection[str]) -> list[Hit]:
        return self.searcher.search(self.vector, depth, self.where.excluding(exclude_documents))
