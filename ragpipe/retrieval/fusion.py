"""Ranking laws: the total order, collapse, and weighted reciprocal-rank fusion.

Total order: higher score first, then document ID, chunk ID, representation ID ascending — so
ties never depend on backend order. Collapse keeps the best hit per chunk (or per document) under
that order. Weighted RRF: ``F(c) = Σ_a w_a / (k + rank_a(c))`` over the channels where ``c`` has a
rank (1-based, after collapse); fused ties use the same order on the fused score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hit:
    """One channel hit on a representation."""

    channel: str
    representation_id: str
    chunk_id: str
    document_id: str
    score: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.score):
            raise ValueError(f"non-finite {self.channel} score {self.score!r} for {self.representation_id}")


@dataclass(frozen=True)
class RankedHit:
    rank: int
    hit: Hit


@dataclass(frozen=True)
class FusedHit:
    key: str
    chunk_id: str
    document_id: str
    representation_id: str
    score: float
    contributions: dict[str, float] = field(default_factory=dict)
    channel_ranks: dict[str, int] = field(default_factory=dict)


def order_key(score: float, document_id: str, chunk_id: str, representation_id: str) -> tuple:
    return (-score, document_id, chunk_id, representation_id)


def hit_key(h: Hit) -> tuple:
    return order_key(h.score, h.document_id, h.chunk_id, h.representation_id)


def collapse(hits: list[Hit], level: str) -> list[RankedHit]:
    """Best hit per chunk (``level='chunk'``) or per document, ranked 1..n by the total order."""
    best: dict[str, Hit] = {}
    for h in sorted(hits, key=hit_key):
        best.setdefault(h.chunk_id if level == "chunk" else h.document_id, h)
    return [RankedHit(rank=i, hit=h) for i, h in enumerate(sorted(best.values(), key=hit_key), start=1)]


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
    fused = [
        FusedHit(
            key=key,
            chunk_id=rep[key].chunk_id,
            document_id=rep[key].document_id,
            representation_id=rep[key].representation_id,
            score=math.fsum(contrib.values()),
            contributions=dict(sorted(contrib.items())),
            channel_ranks=dict(sorted(ranks[key].items())),
        )
        for key, contrib in acc.items()
    ]
    return sorted(fused, key=lambda f: order_key(f.score, f.document_id, f.chunk_id, f.representation_id))
