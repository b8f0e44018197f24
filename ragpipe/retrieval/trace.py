"""The query trace: what a query did, in two views.

The *subject* view (``trace=True``) may be shown to the subject who asked: everything in it is
computed from hits the subject may see, plus the plan and the subject's own scopes. It never holds
a count or a statistic of documents outside the subject's scopes — not how many documents the
prefilter hid, not the bundle's document count, not which kind of lexical index (whole bundle or
audience) served the query, which would say whether hidden documents exist.

The *audit* view (``audit=True``) is for operators only: it adds those figures
(``documents_hidden_by_prefilter``, ``dropped_by_recheck``, ``lexical_statistics``). A service
that passes queries through for subjects must never set it on their behalf.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.channels import ChannelRanking
from ragpipe.retrieval.fusion.convex import bounded_sizes
from ragpipe.retrieval.fusion.order import FusedHit
from ragpipe.retrieval.plan import QueryPlan

PREFILTER_STRATEGY = (
    "backend prefilter: tantivy must-clause on access_scope over a lexical index whose BM25 "
    "statistics cover only the documents the subject may see; lancedb where-prefilter "
    "array_has_any(access_scopes); every channel hit re-checked against the policy before fusion"
)


@dataclass(frozen=True)
class AuditFacts:
    """Operator-only figures; they describe documents the subject may not see."""

    documents_hidden_by_prefilter: int
    dropped_by_recheck: int  # channel hits the policy re-check refused (0 unless a backend misbehaves)
    lexical_statistics: dict[str, object] | None


def fused_shown(k: int) -> int:
    """How many fused items a trace lists: the first ``max(k, 20)``."""
    return max(k, 20)


def _normalization_windows(plan: QueryPlan, ranked: Mapping[str, ChannelRanking]) -> dict[str, object]:
    """Score fusion normalises each channel over its first ``depth`` units — under
    ``bounded_convex``, over the scores its window was filled with (``bounded_sizes``: fewer when
    the query could rank fewer units, with ``window: eligible``): say how many."""
    if plan.fusion.kind == "weighted_rrf":
        return {}
    windows = {n: c.depth for n, c in plan.channels.items()}
    if plan.fusion.kind == "bounded_convex":
        channels = {n: r.ranked for n, r in ranked.items()}
        used = bounded_sizes(channels, {n: windows[n] for n in channels}, plan.fusion.window == "eligible")
        windows = {n: used.get(n, depth) for n, depth in windows.items()}
    return {"normalization_windows": windows}


def query_trace(
    plan: QueryPlan,
    policy_id: str,
    subject: Subject,
    k: int,
    ranked: Mapping[str, ChannelRanking],
    fused: list[FusedHit],  # every item passed the re-check
    rerank: dict[str, object],
    timings: dict[str, float],
    audit: AuditFacts | None,
) -> dict[str, object]:
    """The trace of one query: the subject view, plus the audit figures when ``audit`` is given."""
    authorization: dict[str, object] = {
        "view": "audit" if audit else "subject",
        "strategy": PREFILTER_STRATEGY,
        "policy_id": policy_id,
        "subject": subject.as_dict(),
    }
    if audit is not None:
        authorization.update(
            documents_hidden_by_prefilter=audit.documents_hidden_by_prefilter,
            dropped_by_recheck=audit.dropped_by_recheck,
            lexical_statistics=audit.lexical_statistics,
        )
    out: dict[str, object] = {
        "channels": {
            name: [
                {
                    "rank": r.rank,
                    "representation_id": r.hit.representation_id,
                    "chunk_id": r.hit.chunk_id,
                    "document_id": r.hit.document_id,
                    "score": r.hit.score,
                }
                for r in ranking.ranked
            ]
            for name, ranking in ranked.items()
        },
        "depth": {
            "policy": plan.depth_policy.model_dump(mode="json"),
            "channels": {name: ranking.trace() for name, ranking in ranked.items()},
        },
        "collapse": {
            "level": plan.collapse,
            "kept": {name: len(ranking.ranked) for name, ranking in ranked.items()},
            "representation_hits_read": {name: ranking.hits_read for name, ranking in ranked.items()},
        },
        "fusion": {
            **plan.fusion.model_dump(mode="json"),  # kind and its parameters (RRF: k)
            "weights": {n: c.weight for n, c in plan.channels.items()},
            **_normalization_windows(plan, ranked),
            "items": [
                {
                    "chunk_id": f.chunk_id,
                    "document_id": f.document_id,
                    "score": f.score,
                    "contributions": f.contributions,
                    "channel_ranks": f.channel_ranks,
                }
                for f in fused[: fused_shown(k)]
            ],
        },
        "authorization": authorization,
        "reranker": rerank,
        "timings_ms": timings,
    }
    if "vector" in ranked and plan.vector_search.kind == "approximate":
        # the vector channel's candidates came from an ANN index: say so, with its parameters
        out["vector_search"] = {**plan.vector_search.model_dump(mode="json"), "approximate": True}
    return out
