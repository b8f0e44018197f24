"""The metrics a gate policy may name, with the direction and range each one declares.

Names are the evaluation report's: the ranking families ``ndcg``, ``recall``, ``mrr``, ``precision``, ``hit``
and ``relevant_recall`` at any positive cutoff (``ndcg@10``), the safety count
``unauthorized_disclosures``, the answer rates, ``ann_recall@10`` (runs of an approximate query
plan) and the judge's (``answer_label``, the label rates, ``required_fact_recall``,
``groundedness_rate``, ``judge_failure_rate``: judged runs). A policy naming anything else is refused at load (a typo must not silently disable a
check); a run declaring a known metric with another direction is refused at decision time.

``ARM_ONLY`` metrics describe how one arm serves — the recall of its ANN index against exact
search — not a paired measurement of the cases: one arm may declare them when the other does not
(an exact incumbent and an approximate challenger still pair), so a policy bounds them under
``hard`` or ``bootstrap_floors`` (read from the challenger alone), never as a target or a
regression limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ragpipe.evaluation.judging import judge_metric_specs

Direction = Literal["higher", "lower"]

RANKING_FAMILIES = ("ndcg", "recall", "mrr", "precision", "hit", "relevant_recall")
_RANKING = re.compile(r"^(" + "|".join(RANKING_FAMILIES) + r")@([1-9][0-9]{0,4})\Z")


@dataclass(frozen=True)
class KnownMetric:
    """``lo``/``hi``: the metric's range (``hi`` None when unbounded)."""

    name: str
    direction: Direction
    lo: float
    hi: float | None


NAMED: dict[str, KnownMetric] = {
    m.name: m
    for m in (
        KnownMetric("unauthorized_disclosures", "lower", 0.0, None),
        KnownMetric("answer_contract_valid_rate", "higher", 0.0, 1.0),
        KnownMetric("abstention_rate", "lower", 0.0, 1.0),
        KnownMetric("correct_abstention_rate", "higher", 0.0, 1.0),
        KnownMetric("citation_precision", "higher", 0.0, 1.0),
        KnownMetric("ann_recall@10", "higher", 0.0, 1.0),
        # a judged run's answer quality (``ragpipe.evaluation.judging``)
        *(KnownMetric(m.name, m.direction, m.range[0], m.range[1]) for m in judge_metric_specs()),
    )
}
ARM_ONLY = frozenset({"ann_recall@10"})

KNOWN_NAMES = "ndcg@K, recall@K, mrr@K, precision@K, hit@K, relevant_recall@K, " + ", ".join(NAMED)


def known_metric(name: str) -> KnownMetric | None:
    """The catalogue entry of ``name``, or None when ragpipe defines no such metric."""
    if name in NAMED:
        return NAMED[name]
    if _RANKING.match(name):
        return KnownMetric(name, "higher", 0.0, 1.0)
    return None
