"""The cost phase's answer bounds: ceilings on model tokens and micros per evaluated case — how
they load (line-numbered refusals, the policy ID), and how the decision reads ``AnswerCost``
from synthetic arms (real runs: ``ragpipe_tests/evaluation/test_answer_usage.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.answer.results import AnswerUsage
from ragpipe.experiment.arms import ArmRun, summarize
from ragpipe.experiment.decision import decide
from ragpipe.experiment.gate_policy import PolicyError, load_policy, parse_policy
from ragpipe_tests.experiment.test_gate_policy import BASE, GOLDEN_ID
from ragpipe_tests.support.gate_support import arm, coordinates, policy_doc

LATENCY_LINE = "  max_p95_latency_ms: null\n"
CASES = {f"c{i:02d}": 0.3 + i / 100 for i in range(20)}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def with_bounds(lines: str) -> str:
    assert BASE.count(LATENCY_LINE) == 1
    return BASE.replace(LATENCY_LINE, LATENCY_LINE + lines)


def test_answer_bounds_load_and_enter_the_policy_id(tmp_path: Path):
    policy = load_policy(
        write(tmp_path, with_bounds("  max_answer_tokens_per_case: 900\n  max_answer_micros_per_case: 250\n"))
    )
    assert (policy.cost.max_answer_tokens_per_case, policy.cost.max_answer_micros_per_case) == (900.0, 250.0)
    assert policy.policy_id != GOLDEN_ID
    other = load_policy(write(tmp_path, with_bounds("  max_answer_tokens_per_case: 901\n")))
    assert other.policy_id not in (GOLDEN_ID, policy.policy_id)


def test_unset_answer_bounds_leave_the_policy_id_as_it_was(tmp_path: Path):
    nulls = with_bounds("  max_answer_tokens_per_case: null\n  max_answer_micros_per_case: null\n")
    assert load_policy(write(tmp_path, nulls)).policy_id == GOLDEN_ID


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("max_answer_tokens_per_case: 0", "cost.max_answer_tokens_per_case: must be > 0, got 0"),
        (
            "max_answer_micros_per_case: 12.5",
            "cost.max_answer_micros_per_case: must be a whole number (a count), got 12.5",
        ),
        ("max_answer_micros_per_case: 1 USD", "cost.max_answer_micros_per_case: must be a number, got '1 USD'"),
        ("max_answer_tokens_per_case: .inf", "cost.max_answer_tokens_per_case: threshold must be finite, got inf"),
    ],
    ids=["zero", "fractional", "string", "infinite"],
)
def test_malformed_answer_bounds_are_refused_with_file_line_and_rule(tmp_path: Path, line: str, message: str):
    path = write(tmp_path, with_bounds(f"  {line}\n"))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}:21: {message}"


def answering(run: ArmRun, usage: dict[str, AnswerUsage | None]) -> ArmRun:
    """The arm as a run that generates answers, each case's cell with ``usage[case]``."""
    cells = tuple(c.model_copy(update={"answer_usage": usage.get(c.case_id)}) for c in run.cells)
    return run.model_copy(update={"coordinates": coordinates(answers=True), "cells": cells})


def used(tokens_in: int | None, tokens_out: int | None, micros: int | None, cached: bool = False) -> AnswerUsage:
    return AnswerUsage(calls=1, cached=cached, input_tokens=tokens_in, output_tokens=tokens_out, cost_micros=micros)


def answer_checks(run: ArmRun, **bounds: int) -> list[tuple]:
    base = policy_doc()
    doc = {**base, "cost": {**base["cost"], **bounds}}
    decision = decide(parse_policy(doc, "p.yaml"), None, run)
    return [(c.name, c.value, c.verdict, c.reason) for c in decision.checks if c.name.startswith("answer_")]


def test_per_case_figures_are_means_over_cases_and_bound_by_the_ceilings():
    # half the cases cost 100 micros and 300 tokens, half 300 and 500 (one of them from the cache:
    # it still carries its call's cost, so a warm cache cannot buy a pass)
    usage = {c: used(200, 100, 100) if i % 2 else used(400, 100, 300, cached=i == 0) for i, c in enumerate(CASES)}
    run = answering(arm("run-2", CASES), usage)
    cost = summarize(run).answer_cost
    assert cost is not None and (cost.cases, cost.calls, cost.tokens_per_case, cost.micros_per_case) == (
        20,
        20,
        400.0,
        200.0,
    )
    assert answer_checks(run, max_answer_tokens_per_case=400, max_answer_micros_per_case=199) == [
        ("answer_tokens_per_case", 400.0, "pass", None),
        ("answer_micros_per_case", 200.0, "fail", "cost answer_micros_per_case: 200 is not <= 199"),
    ]


def test_a_decisive_answer_bound_fails_the_decision():
    run = answering(arm("run-2", CASES), {c: used(10, 10, 50) for c in CASES})
    base = policy_doc()
    doc = {**base, "cost": {**base["cost"], "max_answer_micros_per_case": 49}}
    assert not decide(parse_policy(doc, "p.yaml"), None, run).eligible


@pytest.mark.parametrize(
    ("usage", "answers", "reason"),
    [
        (
            {},
            False,
            "cost answer_micros_per_case: the run recorded no answer usage (it generates no answers, or predates usage)",
        ),
        (
            {"c03": used(10, 10, None)},
            True,
            "cost answer_micros_per_case: some answer's cost is unknown "
            "(a model without a price, or a call that reported no usage)",
        ),
    ],
    ids=["no answers", "one unknown cost"],
)
def test_a_missing_figure_fails_the_bound_closed(usage: dict, answers: bool, reason: str):
    base = arm("run-2", CASES)
    known = {c: used(10, 10, 5) for c in CASES}
    run = answering(base, {**known, **usage}) if answers else base
    assert answer_checks(run, max_answer_micros_per_case=1_000_000) == [
        ("answer_micros_per_case", None, "fail", reason)
    ]


def test_repeats_average_within_a_case_and_unevaluated_cases_are_left_out():
    values = {"c00": 0.5, "c01": 0.6, "c02": 0.7}
    run = arm("run-2", values, repeats=2, failed={("c02", 1): "timeout"})
    micros = {("c00", 0): 10, ("c00", 1): 30, ("c01", 0): 100, ("c01", 1): 100, ("c02", 0): 10_000}
    cells = tuple(
        c.model_copy(update={"answer_usage": used(1, 1, micros[(c.case_id, c.repeat)])})
        if c.outcome == "success"
        else c
        for c in run.cells
    )
    run = run.model_copy(update={"coordinates": coordinates(repeats=2, answers=True), "cells": cells})
    cost = summarize(run).answer_cost
    # c02 is not evaluated (a cell failed): its 10,000 micros are not a case's cost
    assert cost is not None and (cost.cases, cost.micros_per_case, cost.tokens_per_case) == (2, (20 + 100) / 2, 2.0)


def test_a_run_that_recorded_no_usage_has_no_answer_cost():
    """Runs made before usage was recorded keep the comparison content they were written with."""
    run = arm("run-2", CASES).model_copy(update={"coordinates": coordinates(answers=True)})
    assert summarize(run).answer_cost is None and "answer_cost" not in summarize(run).model_dump()
