"""ANN recall: the evidence, measured with every evaluation, that approximate vector search finds
what exact search finds.

A run whose query plan searches vectors approximately (``vector_search.kind: approximate``) in a
mode with a vector channel declares the metric ``ann_recall@10`` (``ann_metric_specs``; its spec
ID changes accordingly, an exact plan's does not). Each completed cell then measures, for the
case's query, subject, source roles and metadata filter, the approximate searcher's top 10 rows
and exact search's top 10 on the same query vector (``Retriever.ann_comparison``) and records
``ann_recall@10 = recall_of(approximate, exact)`` (``ragpipe.index.hits``): the share of exact
search's top 10 representations the approximate top 10 holds — 1.0 when the subject sees no row.
It is a mean over evaluated cases like every ratio (higher is better, in [0, 1]), so a gate
policy can bound it (``hard: {ann_recall@10: {min: 0.95, if_measured: true}}``, docs/gates.md).

Both lists go into the cell's trace (stages ``ann_approximate`` and ``ann_exact``: rank,
representation, chunk, document and exact score), so the run verifier recomputes the value from
the trace like every other metric (``ragpipe.evaluation.recompute``) and refuses a record that
differs. ``check_ann_rows`` also refuses two lists no search could have produced: ranks other
than 1..n, a list longer than 10, lists of different lengths (approximate search returns
``min(10, visible rows)`` rows, as exact search does), an ID listed twice, a row scored
differently in the two lists, or an approximate row ranked above exact search's row of the same
rank (the i-th best of a subset is never better than the i-th best of the whole).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ragpipe.evaluation.metrics import MetricSpec
from ragpipe.index.hits import recall_of

ANN_RECALL_K = 10
ANN_RECALL = f"ann_recall@{ANN_RECALL_K}"
APPROXIMATE_STAGE = "ann_approximate"
EXACT_STAGE = "ann_exact"
ANN_STAGES = (APPROXIMATE_STAGE, EXACT_STAGE)


def ann_metric_specs() -> tuple[MetricSpec, ...]:
    return (
        MetricSpec(
            name=ANN_RECALL,
            measure=f"ragpipe:{ANN_RECALL}",
            direction="higher",
            unit="ratio",
            k=ANN_RECALL_K,
            range=(0.0, 1.0),
        ),
    )


def measures_ann(metrics: Sequence[MetricSpec]) -> bool:
    """Whether a run declaring ``metrics`` measures ANN recall."""
    return any(m.name == ANN_RECALL for m in metrics)


def ann_recall(approximate_ids: Sequence[str], exact_ids: Sequence[str]) -> dict[str, float]:
    """The cell's ANN metric from the two lists of representation IDs."""
    return {ANN_RECALL: recall_of(approximate_ids, exact_ids)}


def check_ann_rows(
    approximate: Mapping[str, list[Any]], exact: Mapping[str, list[Any]], vector_units: int = 0
) -> str | None:
    """Why the trace's two lists (columns ``rank``, ``representation_id``, ``score``, each by
    rank) cannot be the lists of one comparison (module docstring); None when they can.
    ``vector_units``: the rows the cell's vector channel ranked — each stands for at least one
    visible representation, so with ``ANN_RECALL_K`` or more of them exact search's list is full."""
    for name, rows in ((APPROXIMATE_STAGE, approximate), (EXACT_STAGE, exact)):
        n = len(rows["rank"])
        if rows["rank"] != list(range(1, n + 1)):
            return f"the trace's {name} rows are not ranked 1..{n}"
        if n > ANN_RECALL_K:
            return f"the trace lists {n} {name} rows, more than {ANN_RECALL_K}"
        ids = rows["representation_id"]
        if any(not isinstance(i, str) for i in ids) or len(set(ids)) != n:
            return f"the trace's {name} rows do not name {n} distinct representations"
        if any(not isinstance(s, float) or not math.isfinite(s) for s in rows["score"]):
            return f"the trace's {name} rows lack a finite score"
    if vector_units >= ANN_RECALL_K and len(exact["rank"]) != ANN_RECALL_K:
        return (
            f"the trace lists {len(exact['rank'])} {EXACT_STAGE} rows, but its vector channel ranked "
            f"{vector_units} units: exact search returns {ANN_RECALL_K}"
        )
    if len(approximate["rank"]) != len(exact["rank"]):
        return (
            f"the trace lists {len(approximate['rank'])} {APPROXIMATE_STAGE} rows and {len(exact['rank'])} "
            f"{EXACT_STAGE} rows; both searches return min({ANN_RECALL_K}, visible rows)"
        )
    scored = dict(zip(exact["representation_id"], exact["score"]))
    for rank, (rep, score) in enumerate(zip(approximate["representation_id"], approximate["score"]), start=1):
        if rep in scored and scored[rep] != score:
            return f"representation {rep!r} has score {score!r} in the {APPROXIMATE_STAGE} rows, {scored[rep]!r} in the {EXACT_STAGE} rows"
        if score > exact["score"][rank - 1]:
            return (
                f"{APPROXIMATE_STAGE} row {rank} scores above {EXACT_STAGE} row {rank}, which exact search cannot give"
            )
    return None
