"""ANN recall in the experiment envelope: an arm-only metric. An exact incumbent and an approximate
challenger pair (the challenger alone declares ``ann_recall@10``); a policy bounds it under
``hard`` and refuses it as a target or a regression limit, which compare cases between arms."""

from __future__ import annotations

import pytest

from ragpipe.experiment.arms import MetricDecl
from ragpipe.experiment.comparison import compare
from ragpipe.experiment.decision import decide
from ragpipe.experiment.gate_policy import PolicyError, parse_policy
from ragpipe.experiment.pairing import PairingError, coordinates_id, pair
from ragpipe_tests.support.gate_support import METRICS, arm, coordinates, policy_doc

ANN = MetricDecl(name="ann_recall@10", direction="higher", unit="ratio", k=10, measure="ragpipe:ann_recall@10")
CASES = {f"c{i:02d}": 0.5 + i / 100 for i in range(12)}


def approximate_arm(run_id: str, recall: float):
    base = arm(run_id, CASES, coords=coordinates(metrics=(*METRICS, ANN)))
    cells = tuple(c.model_copy(update={"metrics": {**c.metrics, "ann_recall@10": recall}}) for c in base.cells)
    return base.model_copy(update={"cells": cells})


def test_an_exact_incumbent_pairs_with_an_approximate_challenger():
    incumbent = arm("run-1", CASES)
    pairing = pair(incumbent, approximate_arm("run-2", 0.9))
    assert pairing.coordinates == incumbent.coordinates  # what both declare alike
    assert pairing.certificate.coordinates_id == coordinates_id(coordinates())
    assert "ann_recall@10" not in compare(pairing).slices["all"].metrics
    both = pair(approximate_arm("run-3", 0.9), approximate_arm("run-4", 0.8))
    assert both.coordinates.metric("ann_recall@10") == ANN  # declared by both: compared like the rest
    other = coordinates(metrics=(*METRICS[:2], ANN))  # a paired metric missing is still refused
    with pytest.raises(PairingError, match="runs differ in metrics at position 2"):
        pair(incumbent, arm("run-5", CASES, coords=other))


def test_the_challenger_recall_is_bounded_under_hard():
    policy = parse_policy(
        policy_doc(hard={"unauthorized_disclosures": {"max": 0}, "ann_recall@10": {"min": 0.95}}), "p.yaml"
    )
    incumbent = arm("run-1", CASES)
    for recall, verdict in ((0.9375, "fail"), (0.96875, "pass")):  # dyadic: their means are exact
        challenger = approximate_arm("run-2", recall)
        decision = decide(policy, compare(pair(incumbent, challenger)), challenger)
        (check,) = [c for c in decision.checks if c.metric == "ann_recall@10"]
        assert (check.phase, check.verdict, check.value) == ("hard", verdict, recall)
        assert (decision.decisive_phase == "hard") == (verdict == "fail")


@pytest.mark.parametrize(
    ("phases", "where"),
    [
        (
            {"target": {"metric": "ann_recall@10", "min_improvement": 0.01, "evidence": "ci_lower", "alpha": 0.05}},
            "target.metric",
        ),
        ({"regression": {"overall": {"ann_recall@10": 0.01}, "tags": {}}}, "regression.overall.ann_recall@10"),
    ],
)
def test_ann_recall_is_no_paired_metric(phases, where):
    with pytest.raises(PolicyError) as err:
        parse_policy(policy_doc(**phases), "p.yaml")
    assert str(err.value) == (
        f"p.yaml:1: {where}: ann_recall@10 describes one arm's index, not a paired measurement of the cases: "
        "bound it under hard (or bootstrap_floors)"
    )
