"""Score-normalised convex fusion: ``F(c) = Σ_a (w_a / W) · n_a(s_a(c))``.

Reciprocal-rank fusion throws the channels' scores away: a channel whose 1st and 50th hits are
nearly indistinguishable counts as much as one whose 1st hit stands far above the rest. Convex
combination of normalised scores (Bruch, Gai & Ingber, "An Analysis of Fusion Functions for
Hybrid Retrieval", ACM TOIS 2023) keeps that information. Contract:

* ``W`` is the sum of the weights of every channel passed (the plan's channels), so the
  coefficients ``w_a / W`` sum to 1 and depend on no data.
* ``n_a`` is an increasing affine map fixed per query and channel from the scores of the
  channel's first ``window_a`` units (the plan's channel ``depth``: the statistics do not change
  with the query's ``k``):
  ``min_max``: ``(s − min) / (max − min)``; ``z_score``: ``(s − mean) / std`` (population std).
  A window whose scores are all equal carries no ordering information: ``n_a ≡ 0``.
* An item a channel did not return scores at most that channel's lowest returned score, so it
  is given exactly that score (the tightest bound known) — never 0 on an unnormalised scale, which
  would rank it above returned items on scales with negative values. A channel that returned
  nothing contributes nothing.
* Every normalised value and fused score is finite, or ``ValueError`` names the channel.
* Order: fused score descending, then the item's best rank in any channel, then document ID,
  chunk ID, representation ID of its representative hit: its best-ranked channel hit, ties by
  document, chunk, representation ID — never by raw score, whose scales differ between channels.
  With one channel the fused order is exactly that channel's order (normalisation is increasing),
  and scaling a channel's scores by a positive factor changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ragpipe.index.hits import Hit
from ragpipe.retrieval.fusion.order import FusedHit, RankedHit

Normalizer = Callable[[float], float]


def affine(ranked: list[RankedHit], window: int, normalization: str) -> Normalizer:
    """The increasing map ``n`` for one channel's ranking (best first), from its first ``window``
    units; the zero map when the window's scores are all equal."""
    if window < 1:
        raise ValueError(f"normalisation window must be >= 1, got {window}")
    scores = [r.hit.score for r in ranked[:window]]
    if normalization == "min_max":
        low, high = min(scores), max(scores)
        centre, scale = low, high - low
    elif normalization == "z_score":
        centre = math.fsum(scores) / len(scores)
        scale = math.sqrt(
            math.fsum((s - centre) * (s - centre) for s in scores) / len(scores)
        )  # d*d: inf, not OverflowError
    else:
        raise ValueError(f"unknown score normalisation {normalization!r} (min_max, z_score)")
    if not math.isfinite(scale) or not math.isfinite(centre):
        raise ValueError(f"scores overflow the {normalization} normalisation (centre {centre!r}, scale {scale!r})")
    if scale == 0:
        return lambda s: 0.0
    return lambda s: (s - centre) / scale


def normalized_convex(
    channels: Mapping[str, list[RankedHit]],
    weights: Mapping[str, float],
    windows: Mapping[str, int],
    normalization: str,
    level: str,
) -> list[FusedHit]:
    """Fuse collapsed channel rankings (see module docstring). ``windows``: units per channel
    whose scores fix its normalisation (the plan's channel depth)."""
    for name in channels:
        w = weights[name]
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"channel {name!r} weight must be finite and > 0, got {w!r}")
    total = math.fsum(weights[name] for name in channels)
    contributions: dict[str, dict[str, float]] = {}
    ranks: dict[str, dict[str, int]] = {}
    rep: dict[str, Hit] = {}
    floors: dict[str, float] = {}
    for name in sorted(channels):
        ranked = channels[name]
        if not ranked:
            continue  # a channel with no hits shifts every item equally: it contributes nothing
        n = affine(ranked, windows[name], normalization)
        coefficient = weights[name] / total
        floors[name] = _finite(coefficient * n(ranked[-1].hit.score), f"channel {name!r}")
        for r in ranked:
            h = r.hit
            key = h.chunk_id if level == "chunk" else h.document_id
            contributions.setdefault(key, {})[name] = _finite(coefficient * n(h.score), f"channel {name!r}")
            ranks.setdefault(key, {})[name] = r.rank
            current = rep.get(key)
            if current is None or (r.rank, _ids(h)) < (ranks[key][current.channel], _ids(current)):
                rep[key] = h
    fused = []
    for key, seen in contributions.items():
        # unseen channels: the channel's lowest returned score; name order like weighted_rrf
        contrib = {name: seen.get(name, floors[name]) for name in sorted(floors)}
        h = rep[key]
        score = _finite(math.fsum(contrib.values()), f"the sum for {key!r}")
        fused.append(FusedHit(key, h.chunk_id, h.document_id, h.representation_id, score, contrib, ranks[key]))
    return sorted(
        fused, key=lambda f: (-f.score, min(f.channel_ranks.values()), f.document_id, f.chunk_id, f.representation_id)
    )


def _ids(h: Hit) -> tuple[str, str, str]:
    return (h.document_id, h.chunk_id, h.representation_id)


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"fusion: {name} gives a non-finite normalised score {value!r}")
    return value
