"""The coverage bound on provisional cases (``coverage.max_provisional_cases``): how it loads
(line-numbered refusals, the policy ID), and how the decision reads ``ArmSummary.provisional``
from synthetic arms (a real run folder: ``test_arm_source.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.experiment.arms import summarize
from ragpipe.experiment.comparison import compare
from ragpipe.experiment.decision import decide
from ragpipe.experiment.gate_policy import PolicyError, load_policy, parse_policy
from ragpipe.experiment.pairing import pair
from ragpipe_tests.experiment.test_gate_policy import BASE, GOLDEN_ID, write
from ragpipe_tests.support.gate_support import arm, policy_doc

COVERAGE_LINE = "  min_cases: 10\n"
CASES = {f"c{i:02d}": 0.3 + i / 100 for i in range(20)}
BETTER = {c: v + 0.1 for c, v in CASES.items()}


def with_bound(line: str) -> str:
    assert BASE.count(COVERAGE_LINE) == 1
    return BASE.replace(COVERAGE_LINE, COVERAGE_LINE + line)


def bounded(bound: int | None) -> dict:
    doc = policy_doc()
    if bound is not None:
        doc["coverage"] = {**doc["coverage"], "max_provisional_cases": bound}
    return doc


def test_the_bound_loads_and_enters_the_policy_id_only_when_set(tmp_path: Path):
    zero = load_policy(write(tmp_path, with_bound("  max_provisional_cases: 0\n")))
    assert zero.coverage.max_provisional_cases == 0 and zero.policy_id != GOLDEN_ID
    two = load_policy(write(tmp_path, with_bound("  max_provisional_cases: 2\n")))
    assert two.policy_id not in (GOLDEN_ID, zero.policy_id)
    unset = load_policy(write(tmp_path, with_bound("  max_provisional_cases: null\n")))
    assert unset.coverage.max_provisional_cases is None and unset.policy_id == GOLDEN_ID
    assert load_policy(write(tmp_path, BASE)).policy_id == GOLDEN_ID
    assert "max_provisional_cases" not in unset.model_dump(mode="json", by_alias=True)["coverage"]


@pytest.mark.parametrize("value", ["-1", "1.5", "true", "'0'"])
def test_a_bound_that_is_not_a_count_is_refused_with_its_line(tmp_path: Path, value: str):
    path = write(tmp_path, with_bound(f"  max_provisional_cases: {value}\n"))
    shown = {"-1": "-1", "1.5": "1.5", "true": "True", "'0'": "'0'"}[value]
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert str(err.value) == (
        f"{path}:9: coverage.max_provisional_cases: must be an integer >= 0 (a count of cases), got {shown}"
    )


def provisional_checks(decision) -> list:
    return [c for c in decision.checks if c.name == "provisional_cases"]


def test_a_suite_with_one_provisional_case_is_refused_at_coverage_under_a_zero_bound():
    incumbent = arm("run-1", CASES, provisional=("c07",))
    challenger = arm("run-2", BETTER, provisional=("c07",))
    comparison = compare(pair(incumbent, challenger))
    assert comparison.challenger.provisional == comparison.incumbent.provisional == 1

    refused = decide(parse_policy(bounded(0), "p.yaml"), comparison)
    assert (refused.eligible, refused.decisive_phase) == (False, "coverage")
    (bound,) = provisional_checks(refused)
    assert (bound.phase, bound.value, bound.op, bound.threshold, bound.verdict) == (
        "coverage",
        1.0,
        "<=",
        0.0,
        "fail",
    )
    assert refused.reasons == (
        "coverage provisional_cases: 1 is not <= 0 (the suite holds 1 provisional case, not yet adjudicated "
        "by a person; max_provisional_cases is 0)",
    )
    assert [c.name for c in refused.checks if c.phase == "coverage"][-1] == "provisional_cases"

    unset = decide(parse_policy(bounded(None), "p.yaml"), comparison)
    assert (unset.eligible, unset.decisive_phase, provisional_checks(unset)) == (True, None, [])
    allowed = decide(parse_policy(bounded(1), "p.yaml"), comparison)
    assert allowed.eligible and [c.verdict for c in provisional_checks(allowed)] == ["pass"]


def test_bootstrap_reads_the_bound_too_and_names_the_count():
    challenger = arm("run-2", BETTER, provisional=("c01", "c07", "c09"))
    refused = decide(parse_policy(bounded(2), "p.yaml"), None, challenger)
    assert (refused.eligible, refused.decisive_phase) == (False, "coverage")
    assert refused.reasons == (
        "coverage provisional_cases: 3 is not <= 2 (the suite holds 3 provisional cases, not yet adjudicated "
        "by a person; max_provisional_cases is 2)",
    )
    assert decide(parse_policy(bounded(None), "p.yaml"), None, challenger).eligible


def test_a_comparison_without_provisional_cases_keeps_its_content_and_id():
    """``provisional`` is left out of an arm's summary at 0: comparisons made before keep their IDs."""
    plain = compare(pair(arm("run-1", CASES), arm("run-2", BETTER)))
    assert "provisional" not in plain.body()["challenger"] and "provisional" not in plain.body()["incumbent"]
    marked = compare(pair(arm("run-1", CASES, provisional=("c00",)), arm("run-2", BETTER, provisional=("c00",))))
    assert marked.body()["challenger"]["provisional"] == 1 and marked.comparison_id != plain.comparison_id
    assert summarize(arm("run-2", BETTER)).provisional == 0
