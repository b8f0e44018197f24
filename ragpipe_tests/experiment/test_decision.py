"""Gate decisions: each phase alone decisive, ordered phases, laws (hypothesis), statistical sanity."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.experiment.arms import BuildCost, CellOutcome, MetricDecl
from ragpipe.experiment.comparison import compare
from ragpipe.experiment.decision import Check, GateError, decide, outcome
from ragpipe.experiment.gate_policy import PHASES, parse_policy
from ragpipe.experiment.pairing import PairingError, pair
from ragpipe.experiment.statistics import ComparisonSpec
from ragpipe_tests.support.gate_support import arm, coordinates, policy, policy_doc

R = random.Random(7)
BASE = {f"c{i:02d}": round(R.uniform(0.1, 0.7), 6) for i in range(30)}
PROTECTED = {c for i, c in enumerate(sorted(BASE)) if i % 6 == 0}  # 5 cases
TAGS = {c: ("protected",) for c in PROTECTED}
GUARDED = policy_doc(regression={"overall": {"recall@100": 0.02}, "tags": {"protected": {"ndcg@10": 0.02}}})


def shifted(delta) -> dict[str, float]:
    return {c: v + (delta(c) if callable(delta) else delta) for c, v in BASE.items()}


BUILD = BuildCost(material_digest="sha256:" + "d" * 64, vectors=1000, payload_bytes=10_000)


def paired_decision(challenger_values, doc=GUARDED, vectors: int | None = None, **challenger) -> object:
    """A paired decision; ``vectors``: both arms record build figures, the challenger this many
    vectors (the incumbent 1,000)."""
    inc = arm("run-1", BASE, tags=TAGS)
    ch = arm("run-2", challenger_values, tags=TAGS, **challenger)
    if vectors is not None:
        inc = inc.model_copy(update={"build": BUILD})
        ch = ch.model_copy(update={"build": BUILD.model_copy(update={"vectors": vectors})})
    return decide(parse_policy(doc, "p.yaml"), compare(pair(inc, ch)))


def failing_phases(decision) -> set[str]:
    return {c.phase for c in decision.checks if c.verdict == "fail"}


def test_all_phases_pass_the_release_is_eligible():
    d = paired_decision(shifted(0.1))
    assert (d.eligible, d.decisive_phase, d.reasons, failing_phases(d)) == (True, None, (), set())
    assert [c.phase for c in d.checks] == sorted((c.phase for c in d.checks), key=PHASES.index)
    assert [(c.phase, c.name, c.metric, c.slice, c.arm) for c in d.checks] == [
        ("hard", "min", "answer_contract_valid_rate", None, None),
        ("hard", "max", "unauthorized_disclosures", None, None),
        ("coverage", "paired_cells", None, None, None),
        ("coverage", "failed_rate", None, None, "incumbent"),
        ("coverage", "failed_rate", None, None, "challenger"),
        ("coverage", "scored_cases", "ndcg@10", None, None),
        ("target", "improvement", "ndcg@10", None, None),
        ("target", "ci_lower", "ndcg@10", None, None),
        ("regression", "max_loss", "recall@100", "all", None),
        ("regression", "max_loss", "ndcg@10", "tag:protected", None),
        ("cost", "p95_latency_relative", None, None, None),
    ]
    assert (
        d.checks[0].verdict == "skipped"
        and d.checks[0].reason == "hard min answer_contract_valid_rate: not measured by this run"
    )
    assert (d.mode, d.human_apply_required, d.incumbent.run_id, d.challenger.run_id) == (
        "paired",
        True,
        "run-1",
        "run-2",
    )


ALONE = {
    "hard": (dict(disclosures={"c05": 1}), ("hard max unauthorized_disclosures: 1 is not <= 0",)),
    "coverage": (
        dict(failed={("c03", 0): "TimeoutError"}),
        ("coverage failed_rate (challenger): 0.0333333 is not <= 0",),
    ),
    "target": (None, ("target improvement ndcg@10: 0 is not >= 0.01", "target ci_lower ndcg@10: 0 is not > 0")),
    "regression": ("protected-loss", ("regression max_loss ndcg@10 on tag:protected: -0.05 is not >= -0.02",)),
    "cost": (dict(vectors=2500), ("cost build_vectors_relative: 2500 is not <= 2000",)),
}
BUILD_BOUNDED = {**GUARDED, "cost": {**GUARDED["cost"], "max_build_vectors_ratio": 2.0}}


@pytest.mark.parametrize("phase", PHASES)
def test_each_phase_alone_failing_is_decisive(phase):
    extra, reasons = ALONE[phase]
    if extra is None:
        d = paired_decision(dict(BASE))
    elif extra == "protected-loss":
        d = paired_decision(shifted(lambda c: -0.05 if c in PROTECTED else 0.2))
    else:
        d = paired_decision(shifted(0.1), BUILD_BOUNDED, **{"vectors": 1000, **extra})
    assert (d.eligible, d.decisive_phase, failing_phases(d), d.reasons) == (False, phase, {phase}, reasons)


def test_latency_is_advisory_shown_and_never_decisive():
    """Each arm's latencies were taken in its own run: a slower challenger (or none measured) is
    reported, never a reason to refuse — the outcome must not depend on machine load."""
    for challenger in (dict(latency=100.0), dict(latency=1.0)):
        d = paired_decision(shifted(0.1), **challenger)
        assert (d.eligible, d.decisive_phase, d.reasons) == (True, None, ())
    (latency,) = [c for c in paired_decision(shifted(0.1), latency=100.0).checks if c.phase == "cost"]
    assert (latency.name, latency.value, latency.threshold, latency.verdict, latency.reason) == (
        "p95_latency_relative",
        100.0,
        15.0,
        "advisory",
        "cost p95_latency_relative: 100 is not <= 15 (advisory: the arms' latencies were measured at different "
        "times, so they decide nothing)",
    )
    fast = [c for c in paired_decision(shifted(0.1), latency=1.0).checks if c.phase == "cost"]
    assert [c.verdict for c in fast] == ["pass"]


def test_later_phases_never_compensate_an_earlier_failure():
    # A huge improvement and a faster challenger cannot outweigh one disclosure.
    d = paired_decision(shifted(0.25), disclosures={"c00": 1}, latency=1.0)
    assert (d.eligible, d.decisive_phase, failing_phases(d)) == (False, "hard", {"hard"})
    # Several phases fail: the first in the fixed order decides; all failures are listed in order.
    d = paired_decision(dict(BASE), BUILD_BOUNDED, vectors=5000, failed={("c01", 0): "OSError"}, latency=100.0)
    assert (d.decisive_phase, failing_phases(d)) == ("coverage", {"coverage", "target", "cost"})
    assert [r.split(" ")[0] for r in d.reasons] == ["coverage", "target", "target", "cost"]
    assert [c.verdict for c in d.checks if c.phase == "cost"] == ["advisory", "fail"]


BOOTSTRAP = {
    None: ({}, ()),
    "hard": (dict(disclosures={"c02": 3}), ("hard max unauthorized_disclosures: 3 is not <= 0",)),
    "coverage": (dict(failed={("c02", 0): "cancelled"}), ("coverage failed_rate (challenger): 0.0333333 is not <= 0",)),
    "target": (dict(recall=lambda c, v: 0.1), ("target floor recall@100: 0.1 is not >= 0.3",)),
    "cost": (dict(vectors=80), ("cost build_vectors_absolute: 80 is not <= 50",)),
}


@pytest.mark.parametrize("phase", list(BOOTSTRAP), ids=str)
def test_bootstrap_decision_uses_the_absolute_floors(phase):
    extra, reasons = dict(BOOTSTRAP[phase][0]), BOOTSTRAP[phase][1]
    vectors = extra.pop("vectors", 10)
    doc = policy_doc(
        cost={
            "max_p95_latency_ratio": 1.5,
            "latency_slack_ms": 5.0,
            "max_p95_latency_ms": 50.0,
            "max_build_vectors": 50,
        }
    )
    challenger = arm("run-9", shifted(0.2), **extra).model_copy(
        update={"build": BUILD.model_copy(update={"vectors": vectors})}
    )
    d = decide(parse_policy(doc, "p.yaml"), None, challenger)
    assert (d.mode, d.eligible, d.decisive_phase, d.reasons, d.incumbent, d.comparison_id) == (
        "bootstrap",
        phase is None,
        phase,
        reasons,
        None,
        None,
    )
    assert [(c.phase, c.name, c.metric) for c in d.checks] == [
        ("hard", "min", "answer_contract_valid_rate"),
        ("hard", "max", "unauthorized_disclosures"),
        ("coverage", "terminal_cells", None),
        ("coverage", "failed_rate", None),
        ("coverage", "evaluated_cases", None),
        ("target", "floor", "ndcg@10"),
        ("target", "floor", "recall@100"),
        ("cost", "p95_latency_absolute", None),
        ("cost", "build_vectors_absolute", None),
    ]


def test_bootstrap_decision_id_is_pinned():
    d = decide(policy(), None, arm("run-9", {"a": 0.5, "b": 0.75}))
    assert (d.eligible, d.decisive_phase) == (False, "coverage")  # 2 evaluated cases < min_cases 10
    assert d.decision_id == "sha256:75327015fce64642e27efdb8a08b638cc3cba8bd50b7491ad38718b65b72ccb9"
    assert d.as_json()["decision_id"] == d.decision_id


def test_a_decision_that_does_not_fit_the_runs_is_refused():
    inc, ch = arm("run-1", BASE), arm("run-2", shifted(0.1))
    c = compare(pair(inc, ch))
    with pytest.raises(
        GateError,
        match=r"^the policy names metric 'mrr@10', which the run does not measure \(measured: ndcg@10, recall@100, unauthorized_disclosures\)$",
    ):
        decide(policy(regression={"overall": {"mrr@10": 0.01}, "tags": {}}), c)
    with pytest.raises(
        GateError,
        match=r"^the comparison's interval is at 0.9, the policy needs 1 - alpha = 0.95 \(recompute it with that confidence level\)$",
    ):
        decide(policy(), compare(pair(inc, ch), ComparisonSpec(confidence_level=0.9)))
    assert decide(
        policy(target={"metric": "ndcg@10", "min_improvement": 0.01, "evidence": "p_value", "alpha": 0.05}),
        compare(pair(inc, ch), ComparisonSpec(confidence_level=0.9)),
    ).eligible
    with pytest.raises(GateError, match=r"^run run-1 is not the comparison's challenger run-2$"):
        decide(policy(), c, inc)
    assert decide(policy(), c, ch).eligible
    with pytest.raises(GateError, match=r"^a bootstrap decision \(no comparison\) needs the challenger run$"):
        decide(policy(), None)
    wrong = coordinates(
        metrics=(MetricDecl(name="ndcg@10", direction="lower", unit="ratio", k=10),) + coordinates().metrics[1:]
    )
    with pytest.raises(
        GateError,
        match=r"^metric 'ndcg@10' is declared 'lower'-is-better by the run, but ragpipe defines it 'higher'-is-better$",
    ):
        decide(policy(), None, arm("run-9", BASE, coords=wrong))
    broken = arm("run-9", BASE)
    with pytest.raises(PairingError, match=r"^challenger run run-9: cell \('c00', 0\) appears 2 times$"):
        decide(policy(), None, broken.model_copy(update={"cells": broken.cells + broken.cells[:1]}))


PHASE = st.sampled_from(PHASES)
VERDICT = st.sampled_from(("pass", "fail", "skipped"))


def make_check(phase: str, verdict: str) -> Check:
    return Check(phase=phase, name="x", value=1.0, op=">=", threshold=0.0, verdict=verdict)


@given(st.lists(st.tuples(PHASE, VERDICT), max_size=20), st.lists(st.tuples(PHASE, VERDICT), max_size=10))
def test_the_first_failing_phase_decides_and_later_phases_never_compensate(checks, later):
    built = tuple(make_check(p, v) for p, v in sorted(checks, key=lambda pv: PHASES.index(pv[0])))
    eligible, decisive = outcome(built)
    failing = [PHASES.index(p) for p, v in checks if v == "fail"]
    assert (eligible, decisive) == ((True, None) if not failing else (False, PHASES[min(failing)]))
    if decisive is not None:  # any checks of later phases, passing or failing, change nothing
        after = tuple(make_check(p, v) for p, v in later if PHASES.index(p) > PHASES.index(decisive))
        assert outcome(built + after) == (False, decisive)


VALUES = st.lists(st.floats(0.0, 0.9, allow_subnormal=False), min_size=12, max_size=24)


@settings(max_examples=25, deadline=None)
@given(VALUES, st.floats(-0.2, 0.2), st.randoms())
def test_permuting_metric_maps_cells_and_policy_mappings_never_changes_the_decision(values, shift, rnd):
    base = {f"c{i:02d}": v for i, v in enumerate(values)}
    tags = {c: ("t",) for i, c in enumerate(base) if i % 3 == 0}
    inc, ch = (
        arm("run-1", base, tags=tags),
        arm("run-2", {c: min(1.0, max(0.0, v + shift)) for c, v in base.items()}, tags=tags),
    )
    doc = policy_doc(
        regression={
            "overall": {"recall@100": 0.02, "ndcg@10": 0.05},
            "tags": {"t": {"recall@100": 0.01, "ndcg@10": 0.02}},
        }
    )
    reference = decide(parse_policy(doc, "p.yaml"), compare(pair(inc, ch)))

    def permuted(value):
        if isinstance(value, dict):
            items = list(value.items())
            rnd.shuffle(items)
            return {k: permuted(v) for k, v in items}
        return value

    def shuffled(a):
        cells = [CellOutcome(**{**c.model_dump(), "metrics": permuted(c.metrics)}) for c in a.cells]
        rnd.shuffle(cells)
        return a.model_copy(update={"cells": tuple(cells), "tags": permuted(a.tags)})

    # Phases keep their fixed order (the loader enforces it); every mapping inside them is shuffled.
    reordered = {phase: permuted(value) for phase, value in doc.items()}
    again = decide(parse_policy(reordered, "p.yaml"), compare(pair(shuffled(inc), shuffled(ch))))
    assert again == reference and again.decision_id == reference.decision_id


@settings(max_examples=30, deadline=None)
@given(VALUES, st.sampled_from(("ci_lower", "p_value")), st.floats(0.0, 0.05))
def test_an_identical_challenger_is_never_eligible_on_target(values, evidence, min_improvement):
    base = {f"c{i:02d}": v for i, v in enumerate(values)}
    doc = policy_doc(
        target={"metric": "ndcg@10", "min_improvement": min_improvement, "evidence": evidence, "alpha": 0.05}
    )
    d = decide(parse_policy(doc, "p.yaml"), compare(pair(arm("run-1", base), arm("run-2", base))))
    assert (d.eligible, d.decisive_phase) == (False, "target")
    assert [c.verdict for c in d.checks if c.phase == "target"][1] == "fail"  # the evidence check itself


@settings(max_examples=20, deadline=None)
@given(VALUES, st.sampled_from(("ci_lower", "p_value")))
def test_a_planted_large_improvement_is_eligible(values, evidence):
    base = {f"c{i:02d}": v for i, v in enumerate(values)}
    doc = policy_doc(target={"metric": "ndcg@10", "min_improvement": 0.01, "evidence": evidence, "alpha": 0.05})
    d = decide(
        parse_policy(doc, "p.yaml"),
        compare(pair(arm("run-1", base), arm("run-2", {c: v + 0.1 for c, v in base.items()}))),
    )
    assert (d.eligible, d.decisive_phase, d.reasons) == (True, None, ())
