"""Refresh or experiment: the kind from identities, non-inferiority, and a suite that grows and
shrinks with the corpus (new and lost coverage)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.evaluation.suite import MISSING_TARGETS, NO_POSITIVE_JUDGMENT
from ragpipe.experiment.change import Change, ChangeBasis, change_text, classify
from ragpipe.experiment.comparison import compare
from ragpipe.experiment.decision import SCHEMA, SCHEMA_V1, Decision, GateError, decide
from ragpipe.experiment.gate_policy import PolicyError, parse_policy
from ragpipe.experiment.gating import gate_runs
from ragpipe.experiment.pairing import PairingError, pair
from ragpipe.experiment.statistics import ComparisonSpec
from ragpipe_tests.support.gate_support import arm, policy, policy_doc

INCUMBENT = "sha256:" + "a" * 64
R = random.Random(11)
BASE = {f"c{i:02d}": round(R.uniform(0.3, 0.8), 6) for i in range(30)}
REFRESH = Change(kind="refresh", incumbent_release=INCUMBENT)
EXPERIMENT = Change(kind="experiment", incumbent_release=INCUMBENT, differs=("stage_specs.chunks",))


def basis(**changes) -> ChangeBasis:
    base = dict(
        stage_specs={"chunks": "sha256:" + "1" * 64, "embeddings": "sha256:" + "2" * 64},
        default_scope="public",
        query_plan_id="sha256:" + "3" * 64,
        answer_plan_id="sha256:" + "4" * 64,
        authorization_policy_id="sha256:" + "5" * 64,
    )
    return ChangeBasis(**{**base, **changes})


# -- the kind, from identities ---------------------------------------------------------------


def test_equal_bases_are_a_refresh_and_any_difference_an_experiment_naming_it():
    assert classify(basis(), basis(), INCUMBENT) == REFRESH
    chunker = basis(stage_specs={"chunks": "sha256:" + "9" * 64, "embeddings": "sha256:" + "2" * 64})
    assert classify(chunker, basis(), INCUMBENT) == EXPERIMENT
    lexical_only = basis(stage_specs={"chunks": "sha256:" + "1" * 64})
    assert classify(lexical_only, basis(), INCUMBENT).differs == ("stage_specs.embeddings",)
    both = classify(basis(query_plan_id="sha256:" + "8" * 64, default_scope=None), basis(), INCUMBENT)
    assert both.differs == ("default_scope", "query_plan_id")
    assert classify(basis(), None, None) == Change(kind="bootstrap", incumbent_release=None)
    assert change_text(both) == f"experiment (default_scope, query_plan_id differ) against {INCUMBENT}"
    assert change_text(None) == "unknown (the decision predates change kinds)"
    with pytest.raises(ValueError, match="go together"):
        classify(basis(), basis(), None)


FIELDS = ("default_scope", "query_plan_id", "answer_plan_id", "authorization_policy_id")


@settings(max_examples=60, deadline=None)
@given(st.sets(st.sampled_from(FIELDS + ("chunks", "embeddings"))))
def test_the_kind_is_a_refresh_exactly_when_nothing_but_the_corpus_differs(changed):
    """Law: classify lists exactly the changed parts, whichever side they are changed on."""
    stages = {"chunks": "sha256:" + "1" * 64, "embeddings": "sha256:" + "2" * 64}
    edits = {f: "sha256:" + "7" * 64 for f in FIELDS if f in changed}
    other = basis(stage_specs={s: ("sha256:" + "6" * 64 if s in changed else v) for s, v in stages.items()}, **edits)
    want = tuple(f for f in ("stage_specs.chunks", "stage_specs.embeddings") if f.split(".")[1] in changed)
    want += tuple(f for f in FIELDS if f in changed)
    for a, b in ((other, basis()), (basis(), other)):
        got = classify(a, b, INCUMBENT)
        assert got.differs == want
        assert got.kind == ("refresh" if not changed else "experiment")


# -- non-inferiority ---------------------------------------------------------------------------


def decision_on(challenger_values, change, doc=None, **challenger) -> Decision:
    inc, ch = arm("run-1", BASE), arm("run-2", challenger_values, **challenger)
    made, _ = gate_runs(policy(**(doc or {})), ch, inc, ComparisonSpec(), change)
    return made


def test_a_refresh_that_is_not_worse_is_eligible_where_an_experiment_must_improve():
    same = decision_on(BASE, REFRESH)
    assert (same.eligible, same.schema_, same.change) == (True, SCHEMA, REFRESH)
    (target,) = [c for c in same.checks if c.phase == "target"]
    assert (target.name, target.op, target.threshold, target.verdict) == ("non_inferiority", ">=", -0.01, "pass")
    assert target.value == 0.0  # identical cases: every delta 0, the interval [0, 0]
    experiment = decision_on(BASE, EXPERIMENT)
    assert (experiment.eligible, experiment.decisive_phase) == (False, "target")
    assert experiment.reasons[0] == "target improvement ndcg@10: 0 is not >= 0.01"


def test_a_refresh_clearly_worse_than_the_margin_is_refused_naming_the_rule():
    worse = decision_on({c: v - 0.05 for c, v in BASE.items()}, REFRESH)
    assert (worse.eligible, worse.decisive_phase) == (False, "target")
    assert worse.reasons[0].startswith("target non_inferiority ndcg@10: -0.05 is not >= -0.01")


def test_the_margin_is_the_policy_field_and_a_wider_one_lets_a_small_loss_through():
    slightly = {c: v - 0.005 for c, v in BASE.items()}
    assert decision_on(slightly, REFRESH).eligible
    assert not decision_on(slightly, REFRESH, {"refresh": {"margin": 0.001}}).eligible
    keeps_recall = {"recall": lambda c, v: BASE[c]}  # the regression phase bounds recall@100 loss at 0.02
    lower = {c: v - 0.03 for c, v in BASE.items()}
    assert decision_on(lower, REFRESH, {"refresh": {"margin": 0.05}}, **keeps_recall).eligible
    assert decision_on(lower, REFRESH, **keeps_recall).decisive_phase == "target"


def test_a_v1_decision_is_made_as_before_and_keeps_its_schema():
    v1 = decision_on(BASE, None)
    assert (v1.schema_, v1.change) == (SCHEMA_V1, None)
    assert "change" not in v1.model_dump(mode="json", by_alias=True)
    assert [c.name for c in v1.checks if c.phase == "target"] == ["improvement", "ci_lower"]
    with pytest.raises(ValueError, match="records its change"):
        Decision.model_validate({**v1.model_dump(mode="json", by_alias=True), "schema": SCHEMA})


def test_the_change_must_fit_the_decision():
    inc, ch = arm("run-1", BASE), arm("run-2", BASE)
    with pytest.raises(GateError, match="refresh needs a comparison"):
        decide(policy(), None, ch, REFRESH)
    with pytest.raises(GateError, match="bootstrap decision has no comparison"):
        decide(policy(), compare(pair(inc, ch)), ch, Change(kind="bootstrap", incumbent_release=None))
    with pytest.raises(ValueError, match="a refresh names the incumbent release it was made against"):
        Change(kind="refresh", incumbent_release=None)
    with pytest.raises(ValueError, match="a refresh differs from its incumbent in nothing but the corpus"):
        Change(kind="refresh", incumbent_release=INCUMBENT, differs=("query_plan_id",))
    with pytest.raises(ValueError, match="an experiment names what differs"):
        Change(kind="experiment", incumbent_release=INCUMBENT)
    with pytest.raises(ValueError, match="a bootstrap has no incumbent release"):
        Change(kind="bootstrap", incumbent_release=INCUMBENT)


# -- a suite that grows and shrinks with the corpus ---------------------------------------------


def grown(incumbent_skips: dict[str, str], challenger_skips: dict[str, str], missing=None):
    """Incumbent and challenger over the 30 cases of BASE, each skipping some."""
    inc = arm("run-1", {c: v for c, v in BASE.items() if c not in incumbent_skips}, skipped=incumbent_skips)
    ch = arm("run-2", {c: v for c, v in BASE.items() if c not in challenger_skips}, skipped=challenger_skips)
    return inc, ch.model_copy(update={"missing": missing or {}})


def test_new_and_lost_coverage_are_listed_not_errors_and_paired_cases_stay_exact():
    inc, ch = grown({"c03": MISSING_TARGETS}, {"c07": MISSING_TARGETS}, {"c07": ("doc-9", "doc-4")})
    with pytest.raises(PairingError, match="case 'c03' differs: skipped \\(missing_judged_targets\\) by the incumbent"):
        pair(inc, ch)  # exact pairing (v1) refuses, as before
    p = pair(inc, ch, coverage_change=True)
    assert p.certificate.new_coverage == (("c03", MISSING_TARGETS),)
    assert p.certificate.lost_coverage == (("c07", ("doc-4", "doc-9")),)
    assert [k[0] for k in p.certificate.cells] == sorted(set(BASE) - {"c03", "c07"})
    assert p.certificate.skipped == ()
    made = decide(policy(), compare(p), ch, REFRESH)
    lost = next(c for c in made.checks if c.name == "lost_coverage")
    assert (lost.value, lost.threshold, lost.verdict) == (pytest.approx(1 / 28), 0.1, "pass")
    paired = next(c for c in made.checks if c.name == "paired_cells")
    assert (paired.value, paired.threshold, paired.verdict) == (28.0, 28.0, "pass")
    floors = [(c.metric, c.value, c.verdict) for c in made.checks if c.name == "new_coverage_floor"]
    assert floors == [("ndcg@10", BASE["c03"], "pass"), ("recall@100", BASE["c03"], "pass")]
    assert made.eligible


def test_other_skip_differences_are_still_refused():
    inc, ch = grown({"c03": NO_POSITIVE_JUDGMENT}, {})
    with pytest.raises(PairingError, match="case 'c03' differs: skipped \\(no_positive_judgment\\) by the incumbent"):
        pair(inc, ch, coverage_change=True)
    # a case judging only a grade-0 document the challenger adds: missing in the incumbent, without
    # a relevant judgment in the challenger — skipped by both, for reasons the corpus decides
    inc, ch = grown({"c03": MISSING_TARGETS}, {"c03": NO_POSITIVE_JUDGMENT})
    with pytest.raises(PairingError, match="case 'c03' differs"):
        pair(inc, ch)  # exact pairing (v1) still refuses
    both = pair(inc, ch, coverage_change=True).certificate
    assert (both.skipped, both.new_coverage, both.lost_coverage) == ((("c03", MISSING_TARGETS),), (), ())
    assert "c03" not in {case for case, _ in both.cells}
    inc, ch = grown({}, {})
    short = ch.model_copy(update={"cells": ch.cells[1:]})
    with pytest.raises(PairingError, match="challenger run run-2: cell \\('c00', 0\\) is missing"):
        pair(inc, short, coverage_change=True)


def test_lost_coverage_above_the_bound_blocks_naming_the_removed_documents():
    gone = {f"c{i:02d}": MISSING_TARGETS for i in range(6)}
    missing = {c: (f"doc-{c}",) for c in gone}
    inc, ch = grown({}, gone, missing)
    made, comparison = gate_runs(policy(), ch, inc, ComparisonSpec(), REFRESH)
    assert (made.eligible, made.decisive_phase) == (False, "coverage")
    assert made.reasons[0] == (
        "coverage lost_coverage: 0.25 is not <= 0.1 (6 of 24 paired cases lost: their judged documents "
        "doc-c00, doc-c01, doc-c02, doc-c03, doc-c04, doc-c05 are not in the challenger)"
    )
    assert [case for case, _ in comparison.certificate.lost_coverage] == sorted(gone)
    allowed = gate_runs(
        policy(coverage={"max_failed_rate": 0.0, "min_cases": 10, "max_lost_rate": 0.3}),
        ch,
        inc,
        ComparisonSpec(),
        REFRESH,
    )[0]
    assert allowed.eligible


def test_new_coverage_must_reach_its_floors():
    inc, ch = grown({"c03": MISSING_TARGETS, "c04": MISSING_TARGETS}, {})
    low = ch.model_copy(
        update={
            "cells": tuple(
                c.model_copy(update={"metrics": {**c.metrics, "ndcg@10": 0.1}}) if c.case_id in ("c03", "c04") else c
                for c in ch.cells
            )
        }
    )
    made, comparison = gate_runs(policy(), low, inc, ComparisonSpec(), REFRESH)
    assert comparison.new_coverage.evaluated_cases == 2
    assert (made.eligible, made.decisive_phase) == (False, "target")
    assert made.reasons == ("target new_coverage_floor ndcg@10: 0.1 is not >= 0.3",)
    own = policy(coverage={"max_failed_rate": 0.0, "min_cases": 10, "new_coverage_floors": {"ndcg@10": 0.05}})
    assert gate_runs(own, low, inc, ComparisonSpec(), REFRESH)[0].eligible


def test_a_comparison_without_coverage_change_keeps_its_id():
    inc, ch = arm("run-1", BASE), arm("run-2", BASE)
    v1, v2 = compare(pair(inc, ch)), compare(pair(inc, ch, coverage_change=True))
    assert v1.comparison_id == v2.comparison_id
    assert "new_coverage" not in v1.body() and "new_coverage" not in v1.body()["certificate"]


# -- the policy fields ---------------------------------------------------------------------------


def test_refresh_and_coverage_fields_at_their_defaults_leave_the_policy_id_alone():
    plain = policy()
    spelled = policy(refresh={"margin": 0.01}, coverage={"max_failed_rate": 0.0, "min_cases": 10, "max_lost_rate": 0.1})
    assert spelled.policy_id == plain.policy_id
    assert policy(refresh={"margin": 0.02}).policy_id != plain.policy_id
    assert plain.floors_of_new_coverage == plain.bootstrap_floors


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"refresh": {"margin": -0.1}}, "test-policy.yaml:1: refresh.margin: must be >= 0, got -0.1"),
        ({"refresh": {"margin": True}}, "test-policy.yaml:1: refresh.margin: must be a number, got True"),
        ({"refresh": {"slack": 1}}, "test-policy.yaml:1: refresh.slack: unknown key (allowed: margin)"),
        (
            {"refresh": {"margin": 5}},
            "test-policy.yaml:1: refresh.margin: contradictory bound: a change of 5 exceeds the range width 1 of ndcg@10",
        ),
        (
            {"coverage": {"max_failed_rate": 0.0, "min_cases": 1, "max_lost_rate": 2}},
            "test-policy.yaml:1: coverage.max_lost_rate: must be <= 1, got 2",
        ),
        (
            {"coverage": {"max_failed_rate": 0.0, "min_cases": 1, "new_coverage_floors": {"ndcg@10": 3}}},
            "test-policy.yaml:1: coverage.new_coverage_floors.ndcg@10: contradictory bound: 3 is outside the range [0, 1] of ndcg@10",
        ),
    ],
)
def test_bad_refresh_fields_are_refused_in_one_line(edit, message):
    with pytest.raises(PolicyError) as err:
        parse_policy(policy_doc(**edit), "test-policy.yaml")
    assert str(err.value) == message


def test_every_case_new_coverage_loses_nothing_and_is_refused_for_want_of_paired_cases():
    inc, ch = grown({c: MISSING_TARGETS for c in BASE}, {})
    made, comparison = gate_runs(policy(), ch, inc, ComparisonSpec(), REFRESH)
    assert len(comparison.certificate.new_coverage) == 30 and comparison.certificate.cells == ()
    lost = next(c for c in made.checks if c.name == "lost_coverage")
    assert (lost.value, lost.verdict) == (0.0, "pass")  # nothing was lost
    assert (made.eligible, made.decisive_phase) == (False, "coverage")
    assert made.reasons[:2] == (
        "coverage failed_rate (incumbent): the arm has no cell",
        "coverage scored_cases ndcg@10: 0 is not >= 10",
    )
