"""Ranking metrics computed by ``ir_measures`` (trec_eval semantics), with declared semantics.

Contract:

* A ranking is first collapsed to the case's target level (``collapse``): chunk hits become
  document IDs at ``document`` level, keeping each target's first (best) occurrence, so the list
  is duplicate-free, as trec_eval requires.
* ``score_cases`` hands ``ir_measures`` the judgments (qrels: grades are ints, a target is
  relevant iff grade >= 1, trec_eval's ``relevance_level``) and the ranking as a run whose
  scores are ``n - rank``: strictly decreasing, so trec_eval's re-sort by score (ties broken by
  document ID) can never reorder it — rank order is what counts, and ties cannot arise.
* nDCG uses trec_eval's ``ndcg_cut`` (linear gains = grade, log2 discount, ideal from all judged
  grades); recall, precision and success are trec_eval's ``recall_k``, ``P_k`` (always / k),
  ``success_k``; MRR@k is ``ir_measures``' ``RR@k`` (the MS MARCO provider: reciprocal rank of
  the first relevant target within the top k, 0 if none).
* A case with an empty ranking scores 0 on every measure, as ``trec_eval -c`` counts a query
  without results (``ir_measures`` alone would drop it).
* ``aggregate`` averages (or sums, for counts) only the cases that carry a value and reports how
  many (``n``); with no case the value is ``None``, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import ir_measures
from pydantic import BaseModel, ConfigDict

__all__ = [
    "DEFAULT_CUTOFFS",
    "MetricSpec",
    "MetricValue",
    "aggregate",
    "collapse",
    "default_metric_specs",
    "score_cases",
]

Direction = Literal["higher", "lower"]

# family -> (ir_measures measure template, default cutoff)
FAMILIES: dict[str, tuple[str, int]] = {
    "ndcg": ("nDCG@{k}", 10),
    "recall": ("R@{k}", 100),
    "mrr": ("RR@{k}", 10),
    "precision": ("P@{k}", 10),
    "hit": ("Success@{k}", 10),
    # The share of a case's relevant targets inside the top k a reader (answer step) is given:
    # trec_eval recall_k at the context cutoff, next to recall@100's candidate-pool view.
    "relevant_recall": ("R@{k}", 10),
}
DEFAULT_CUTOFFS: dict[str, int] = {family: k for family, (_, k) in FAMILIES.items()}


class MetricSpec(BaseModel):
    """A metric's declared semantics. ``measure`` is an ``ir_measures`` measure string for ranking
    metrics, or ``ragpipe:<name>`` for the safety / answer metrics computed in ``safety.py``.
    ``aggregate`` is how per-case values combine (``mean`` or ``sum`` for counts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    measure: str
    direction: Direction
    unit: str
    k: int | None
    range: tuple[float, float | None]
    aggregate: Literal["mean", "sum"] = "mean"

    @property
    def is_ranking(self) -> bool:
        return not self.measure.startswith("ragpipe:")


def default_metric_specs(cutoffs: Mapping[str, int] | None = None) -> tuple[MetricSpec, ...]:
    """The ranking metrics of every evaluation run, in a fixed order. ``cutoffs`` overrides the
    cutoff of a family (``ndcg``, ``recall``, ``mrr``, ``precision``, ``hit``, ``relevant_recall``)."""
    chosen = dict(DEFAULT_CUTOFFS)
    for family, k in (cutoffs or {}).items():
        if family not in FAMILIES:
            raise ValueError(f"unknown metric family {family!r} (known: {', '.join(FAMILIES)})")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"cutoff of {family!r} must be a positive integer, got {k!r}")
        chosen[family] = k
    return tuple(
        MetricSpec(
            name=f"{family}@{chosen[family]}",
            measure=template.format(k=chosen[family]),
            direction="higher",
            unit="ratio",
            k=chosen[family],
            range=(0.0, 1.0),
        )
        for family, (template, _) in FAMILIES.items()
    )


def collapse(ranking: Sequence[tuple[str, str]], level: Literal["document", "chunk"]) -> list[str]:
    """``[(document_id, chunk_id), ...]`` best first -> duplicate-free target IDs at ``level``,
    each at its first occurrence (a document ranks where its best chunk ranked)."""
    if level not in ("document", "chunk"):
        raise ValueError(f"unknown target level {level!r}")
    index = 0 if level == "document" else 1
    return list(dict.fromkeys(pair[index] for pair in ranking))


def _measures(specs: Sequence[MetricSpec]) -> dict[str, object]:
    out = {}
    for spec in specs:
        if not spec.is_ranking:
            raise ValueError(f"metric {spec.name!r} ({spec.measure}) is not a ranking measure")
        out[spec.name] = ir_measures.parse_measure(spec.measure)
    return out


# Measures whose value at cutoff k reads only the ranking's top k, and the parameters that keep
# it so (``judged_only``, for one, drops unjudged targets *before* the cutoff: not here).
_PREFIX_MEASURES = frozenset({"nDCG", "R", "P", "RR", "Success"})
_PREFIX_PARAMS = frozenset({"cutoff", "rel", "gains", "dcg"})


def _scored_depth(measures: Iterable[object]) -> int | None:
    """How deep a ranking can matter: the largest cutoff when every measure is a cutoff measure
    of ``_PREFIX_MEASURES`` with only ``_PREFIX_PARAMS``, else None (the whole ranking). Handing
    ``ir_measures`` only that prefix changes no value and costs a third of the time at k = 1000
    (docs/benchmarks.md)."""
    cutoffs = []
    for m in measures:
        params = dict(getattr(m, "params", {}))
        if getattr(m, "NAME", None) not in _PREFIX_MEASURES or not set(params) <= _PREFIX_PARAMS:
            return None
        cutoffs.append(params.get("cutoff"))
    if not cutoffs or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in cutoffs):
        return None
    return max(cutoffs)


def score_cases(
    judged: Mapping[str, Mapping[str, int]],
    ranked: Mapping[str, Sequence[str]],
    specs: Sequence[MetricSpec],
) -> dict[str, dict[str, float]]:
    """Per case ID -> metric name -> value, computed by ``ir_measures``.

    ``judged`` and ``ranked`` must have the same case IDs; each ranking must be duplicate-free
    (collapse it first) and each case must have a judgment of grade >= 1 (otherwise its metrics
    are undefined: the caller skips such cases, see ``suite.check_against_bundle``).
    """
    if set(judged) != set(ranked):
        extra = sorted(set(ranked) ^ set(judged))
        raise ValueError(f"cases judged and ranked differ: {extra[0]!r}")
    qrels: dict[str, dict[str, int]] = {}
    for case_id, grades in judged.items():
        if not any(g >= 1 for g in grades.values()):
            raise ValueError(f"case {case_id!r} has no judgment of grade >= 1")
        qrels[case_id] = {t: int(g) for t, g in grades.items()}
    measures = _measures(specs)
    depth = _scored_depth(measures.values())
    run: dict[str, dict[str, float]] = {}
    for case_id, ranking in ranked.items():
        if len(set(ranking)) != len(ranking):
            dup = next(t for i, t in enumerate(ranking) if t in ranking[:i])
            raise ValueError(f"ranking of case {case_id!r} lists {dup!r} twice (collapse it first)")
        top = ranking[:depth] if depth is not None else ranking
        run[case_id] = {t: float(len(top) - i) for i, t in enumerate(top)}
    names = {str(m): [n for n, mm in measures.items() if mm == m] for m in measures.values()}
    out: dict[str, dict[str, float]] = {c: {} for c in judged}
    nonempty = {c: r for c, r in run.items() if r}
    if nonempty:
        for metric in ir_measures.iter_calc(list(set(measures.values())), qrels, nonempty):
            for name in names[str(metric.measure)]:
                out[metric.query_id][name] = float(metric.value)
    for case_id, values in out.items():
        for name in measures:
            if case_id not in nonempty:
                values[name] = 0.0  # trec_eval -c: a query without results scores 0
            elif name not in values or not math.isfinite(values[name]):
                raise RuntimeError(f"ir_measures returned no finite {name} for case {case_id!r}")
    return {c: {n: out[c][n] for n in measures} for c in sorted(out)}


@dataclass(frozen=True)
class MetricValue:
    """An aggregate: ``value`` over ``n`` cases (``None`` when ``n`` is 0)."""

    value: float | None
    direction: Direction
    unit: str
    k: int | None
    n: int

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "direction": self.direction, "unit": self.unit, "k": self.k, "n": self.n}


def aggregate(
    per_case: Mapping[str, Mapping[str, float | None]], specs: Sequence[MetricSpec]
) -> dict[str, MetricValue]:
    """Metric name -> aggregate over the cases carrying a (non-None) value, in ``specs`` order."""
    out = {}
    for spec in specs:
        values = [v[spec.name] for _, v in sorted(per_case.items()) if v.get(spec.name) is not None]
        if any(not math.isfinite(x) for x in values):
            raise ValueError(f"metric {spec.name!r} has a non-finite case value")
        total = math.fsum(values)
        value = None if not values else (total if spec.aggregate == "sum" else total / len(values))
        out[spec.name] = MetricValue(value, spec.direction, spec.unit, spec.k, len(values))
    return out
