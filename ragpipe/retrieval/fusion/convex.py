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

**Bounded** (``bounded_convex``, with ``eligible`` windows the checked-in fusion) differs in two
ways, both about what a channel says outside its window. (1) The window is ``window_a`` scores: a
channel that
returned fewer units has no more hits, and the rest of its window is its floor (``bounded_window``:
0 for the lexical channel — BM25 gives a document matching no query term exactly 0 — else its
lowest score). Without this, a lexical channel that matched two documents is z-scored over two
scores (+1, −1), and the document matching every rare query term counts no more than the vector
channel's fifth hit. The price: a lone lexical match z-scores to √(window − 1) (≈ 9.95 at depth
100), whatever its BM25 score — the channel depth weighs a short lexical list. With ``eligible``
windows (``population``) the filling stops at the number of units the query could rank, when a
channel that scores every eligible unit (the vector channel) shows it by returning fewer than its
window: on a corpus of 40 documents the lexical window is the corpus's 40 BM25 scores, not 100, and
the vector window its 40 scores, unpadded. The first rule (``depth`` windows) padded both to the
depth there, and a lone match's weight then varied with how many of 40 documents matched: an
add-only refresh of a small living corpus failed non-inferiority under it (docs/retrieval.md).
When the query could rank at least the vector channel's depth — the units the subject may see,
after source roles, ``--where`` filters and document collapse — the two rules are the same
function; a channel of a different depth than the vector channel's is filled to its own depth
then (the count is unknown past the vector window). (2) Below its
window a channel has no further say: an item it ranks below ``window_a``, or did not return, gets
the floor, and that rank neither picks the item's representative nor breaks a tie before an item
inside a window. So every item inside some channel's window has the same fused score, order and
representative however deep the channels were read (a query's ``k``), and comes before every item
inside none. Known gap: the lexical floor is 0 only when the channel returned fewer units than its
window; a lexical channel exhausted at exactly ``window`` units keeps its lowest score as the floor
(the fusion is not told whether a full list was complete). Measured on suites beside SciFact train
(``benchmarks/fusion_bench.py``, docs/retrieval.md "Fusion"), both cut the loss against the
better channel where one channel is far weaker.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ragpipe.index.hits import Hit
from ragpipe.retrieval.fusion.order import FusedHit, RankedHit

Normalizer = Callable[[float], float]
# The score of a unit a channel did not return, where one is known: tantivy's BM25 idf is > 0, so a
# document matching any query term scores > 0 and one matching none scores exactly 0.
EXHAUSTED_SCORE = {"lexical": 0.0}
# Channels that score every unit the subject may see (exact vector search; approximate search
# answers exactly whenever its index answers short): one that returned fewer units than its window
# returned them all. Opt-in, so a future sparse or thresholded channel is never taken for one.
COMPLETE_CHANNELS = frozenset({"vector"})


def affine(ranked: list[RankedHit], window: int, normalization: str) -> Normalizer:
    """The increasing map ``n`` for one channel's ranking (best first), from its first ``window``
    units; the zero map when the window's scores are all equal."""
    if window < 1:
        raise ValueError(f"normalisation window must be >= 1, got {window}")
    return affine_of([r.hit.score for r in ranked[:window]], normalization)


def affine_of(scores: list[float], normalization: str) -> Normalizer:
    """The increasing map ``n`` fixed by ``scores`` (a window's, non-empty)."""
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


def population(channels: Mapping[str, list[RankedHit]], windows: Mapping[str, int]) -> int | None:
    """How many units the query could rank at all, when a channel shows it: a channel of
    ``COMPLETE_CHANNELS`` that returned fewer units than its window has returned them all
    (``settled_units/v1`` stops short only when the backend is exhausted). ``None`` when no channel
    shows it (none is complete, or each filled its window). It does not depend on how deep the
    channels were read: a reading at least a window deep is short only when the eligible units are
    fewer than the window.

    Known gap: a vector row whose cosine score is not finite (a zero vector: the build checks
    vectors are finite, not that they have a norm) is never returned, so the count is one short for
    each — the lexical window then has one zero too few."""
    short = [len(r) for name, r in channels.items() if name in COMPLETE_CHANNELS and 0 < len(r) < windows[name]]
    return max(short) if short else None


def bounded_sizes(
    channels: Mapping[str, list[RankedHit]], windows: Mapping[str, int], eligible: bool
) -> dict[str, int]:
    """How many scores fix each non-empty channel's normalisation under ``bounded_convex`` (what
    ``bounded_window`` fills; the trace reports it)."""
    units = population(channels, windows) if eligible else None
    return {name: len(bounded_window(name, r, windows[name], units)[0]) for name, r in channels.items() if r}


def bounded_window(
    name: str, ranked: list[RankedHit], window: int, units: int | None = None
) -> tuple[list[float], float]:
    """``bounded_convex``'s window of one channel: its scores over ``window`` units (fewer when the
    query could rank only ``units``, see ``population``), and its floor.

    The first ``window`` units' scores; a channel that returned fewer units has no more hits
    (``settled_units/v1`` stops short of a channel's depth only when the backend is exhausted), so
    the rest of its window is the floor: for the lexical channel the smaller of 0 and its lowest
    score (a document tantivy did not return matches no query term, and BM25 gives it 0), for any
    other its lowest returned score (no bound is known). Otherwise the floor is the window's
    lowest score. The window is filled only up to ``units`` (never below what the channel
    returned): a corpus of 40 documents has 40 BM25 scores, not ``window``. A channel that
    returned ``units`` units or more is not filled at all, and its floor (a bound for units it did
    not return) may lie below its window."""
    if window < 1:
        raise ValueError(f"normalisation window must be >= 1, got {window}")
    scores = [r.hit.score for r in ranked[:window]]
    if len(scores) < window:
        floor = min(EXHAUSTED_SCORE.get(name, scores[-1]), scores[-1])
        size = window if units is None else min(window, max(units, len(scores)))
        return scores + [floor] * (size - len(scores)), floor
    return scores, scores[-1]


def normalized_convex(
    channels: Mapping[str, list[RankedHit]],
    weights: Mapping[str, float],
    windows: Mapping[str, int],
    normalization: str,
    level: str,
    *,
    bounded: bool = False,
    eligible: bool = False,
) -> list[FusedHit]:
    """Fuse collapsed channel rankings (see module docstring). ``windows``: units per channel
    whose scores fix its normalisation (the plan's channel depth). ``bounded``: each channel has a
    say over its window only (``bounded_convex``; module docstring, "Bounded"); ``eligible``: a
    bounded window is filled only up to the units the query could rank (``population``)."""
    for name in channels:
        w = weights[name]
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"channel {name!r} weight must be finite and > 0, got {w!r}")
    total = math.fsum(weights[name] for name in channels)
    contributions: dict[str, dict[str, float]] = {}
    ranks: dict[str, dict[str, int]] = {}
    # An item's standing: its best rank among the channels where it is inside the window, before
    # any rank below a window (bounded). A rank below a window is seen only by a deeper reading,
    # so it must not pick the representative or break a tie of items that are inside a window.
    standing: dict[str, tuple[tuple[int, int], tuple[str, str, str], Hit]] = {}
    floors: dict[str, float] = {}
    units = population(channels, windows) if bounded and eligible else None
    for name in sorted(channels):
        ranked = channels[name]
        if not ranked:
            continue  # a channel with no hits shifts every item equally: it contributes nothing
        if bounded:
            scores, floor = bounded_window(name, ranked, windows[name], units)
            n, say = affine_of(scores, normalization), len(scores)
        else:
            n, floor, say = affine(ranked, windows[name], normalization), ranked[-1].hit.score, len(ranked)
        coefficient = weights[name] / total
        floors[name] = _finite(coefficient * n(floor), f"channel {name!r}")
        for r in ranked:
            h = r.hit
            key = h.chunk_id if level == "chunk" else h.document_id
            inside = r.rank <= say  # bounded: below its window a channel has no further say
            if inside:
                contributions.setdefault(key, {})[name] = _finite(coefficient * n(h.score), f"channel {name!r}")
            else:
                contributions.setdefault(key, {})
            ranks.setdefault(key, {})[name] = r.rank
            candidate = ((0 if inside else 1, r.rank), _ids(h), h)
            if key not in standing or candidate[:2] < standing[key][:2]:
                standing[key] = candidate
    fused = []
    for key, seen in contributions.items():
        # unseen channels: the channel's lowest returned score; name order like weighted_rrf
        contrib = {name: seen.get(name, floors[name]) for name in sorted(floors)}
        h = standing[key][2]
        score = _finite(math.fsum(contrib.values()), f"the sum for {key!r}")
        fused.append(FusedHit(key, h.chunk_id, h.document_id, h.representation_id, score, contrib, ranks[key]))
    return sorted(fused, key=lambda f: (-f.score, standing[f.key][0], f.document_id, f.chunk_id, f.representation_id))


def _ids(h: Hit) -> tuple[str, str, str]:
    return (h.document_id, h.chunk_id, h.representation_id)


def _finite(value: float, name: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"fusion: {name} gives a non-finite normalised score {value!r}")
    return value
