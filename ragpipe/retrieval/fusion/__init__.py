"""Fusion of collapsed channel rankings: one method per module, chosen by the plan.

``order``: the total order and collapse every method shares; ``rrf``: weighted reciprocal-rank
fusion; ``convex``: score-normalised convex combination (plain or bounded). ``fuse`` is the one dispatch the query
path and the plan-search benchmark both use.
"""

from __future__ import annotations

from collections.abc import Mapping

from ragpipe.retrieval.fusion.convex import normalized_convex
from ragpipe.retrieval.fusion.order import FusedHit, RankedHit
from ragpipe.retrieval.fusion.rrf import weighted_rrf
from ragpipe.retrieval.plan import QueryPlan


def fuse(plan: QueryPlan, channels: Mapping[str, list[RankedHit]]) -> list[FusedHit]:
    """The plan's fusion of collapsed channel rankings (one per channel of ``plan``): the one
    dispatch the query path and ``benchmarks.plan_search`` both use."""
    weights = {name: plan.channels[name].weight for name in channels}
    if plan.fusion.kind == "weighted_rrf":
        return weighted_rrf(dict(channels), weights, plan.fusion.k, plan.collapse)
    windows = {name: plan.channels[name].depth for name in channels}
    bounded = plan.fusion.kind == "bounded_convex"
    eligible = bounded and plan.fusion.window == "eligible"
    return normalized_convex(
        channels, weights, windows, plan.fusion.normalization, plan.collapse, bounded=bounded, eligible=eligible
    )
