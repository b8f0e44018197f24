"""Ranking laws shared by every fusion method: the total order and collapse.

Total order: higher score first, then document ID, chunk ID, representation ID ascending — so
ties never depend on backend order. Collapse keeps the best hit per chunk (or per document) under
that order, ranked 1..n.
"""

from __future__ import annotations

from typing import NamedTuple

from ragpipe.index.hits import Hit


class RankedHit(NamedTuple):
    rank: int
    hit: Hit


class FusedHit(NamedTuple):
    key: str
    chunk_id: str
    document_id: str
    representation_id: str
    score: float
    contributions: dict[str, float]
    channel_ranks: dict[str, int]


def order_key(score: float, document_id: str, chunk_id: str, representation_id: str) -> tuple:
    return (-score, document_id, chunk_id, representation_id)


def hit_key(h: Hit) -> tuple:
    return order_key(h.score, h.document_id, h.chunk_id, h.representation_id)


def collapse(hits: list[Hit], level: str) -> list[RankedHit]:
    """Best hit per chunk (``level='chunk'``) or per document, ranked 1..n by the total order."""
    best: dict[str, Hit] = {}
    for h in sorted(hits, key=hit_key):
        best.setdefault(h.chunk_id if level == "chunk" else h.document_id, h)
    # first occurrences of a sorted list are themselves in sorted order: no second sort
    return [RankedHit(i, h) for i, h in enumerate(best.values(), start=1)]
