"""Ranking laws: the total order, collapse, and weighted reciprocal-rank fusion.

Total order: higher score first, then document ID, chunk ID, representation ID ascending — so
ties never depend on backend order. Collapse keeps the best hit per chunk (or per document) under
that order. Weighted RRF: ``F(c) = Σ_a w_a / (k + rank_a(c))`` over the channels where ``c`` has a
rank (1-based, after collapse); fused ties use the same order on the fused score.
"""

from __future__ import annotations

import math
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


def weighted_rrf(
    channels: dict[str, list[RankedHit]], weights: dict[str, float], k: float, level: str
) -> list[FusedHit]:
    """Fuse collapsed channel rankings. The representative hit of an item is its best-ranked
    channel hit (ties: the order key), so hydration is independent of channel order."""
    if not (math.isfinite(k) and k > 0):
        raise ValueError(f"fusion k must be finite and > 0, got {k!r}")
    acc: dict[str, dict[str, float]] = {}
    ranks: dict[str, dict[str, int]] = {}
    rep: dict[str, Hit] = {}
    for name in sorted(channels):
        w = weights[name]
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"channel {name!r} weight must be finite and > 0, got {w!r}")
        for ranked in channels[name]:
            h = ranked.hit
            key = h.chunk_id if level == "chunk" else h.document_id
            acc.setdefault(key, {})[name] = w / (k + ranked.rank)
            ranks.setdefault(key, {})[name] = ranked.rank
            current = rep.get(key)
            if current is None or (ranked.rank, hit_key(h)) < (ranks[key][current.channel], hit_key(current)):
                rep[key] = h
    # channels were visited in name order, so contributions and ranks are already name-ordered
    fused = [
        FusedHit(key, h.chunk_id, h.document_id, h.representation_id, math.fsum(contrib.values()), contrib, ranks[key])
        for key, contrib in acc.items()
        for h in (rep[key],)
    ]
    return sorted(fused, key=lambda f: order_key(f.score, f.document_id, f.chunk_id, f.representation_id))
