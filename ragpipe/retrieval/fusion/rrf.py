"""Weighted reciprocal-rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009).

``F(c) = Σ_a w_a / (k + rank_a(c))`` over the channels where ``c`` has a rank (1-based, after
collapse); fused ties use the total order (``order.order_key``) on the fused score.
"""

from __future__ import annotations

import math

from ragpipe.index.hits import Hit
from ragpipe.retrieval.fusion.order import FusedHit, RankedHit, hit_key, order_key


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
