"""What an evaluation run that generates answers records of its model calls: each completed
cell's ``answer_usage``, the report's sums, the ``cells`` SQL view, and the per-case figures the
gate's cost phase reads — against a real local OpenAI-protocol server whose token counts are
word counts, so every figure is computed here by hand from the requests it received."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.run_folder import verify_run
from ragpipe.evaluation.runner import run_evaluation
from ragpipe.evaluation.sql import run_sql
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.arms import summarize
from ragpipe.experiment.decision import decide
from ragpipe.experiment.gate_policy import parse_policy
from ragpipe.retrieval.plan import GeneratorPlan, load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.eval_support import EVALUABLE, eval_bundle  # noqa: F401
from ragpipe_tests.support.gate_support import policy_doc
from ragpipe_tests.support.llm_server import LLMServer, words

REPLY = json.dumps({"answer": "Yes, it does [E1].", "citations": ["E1"], "abstained": False})
PRICE_IN, PRICE_OUT = 150_000, 600_000  # openai/gpt-4o-mini in ragpipe/specs/prices.yaml


def evaluate(eval_bundle, out: Path, model: str) -> tuple[Path, list[dict]]:  # noqa: F811
    bundle, suite_path = eval_bundle
    with LLMServer() as server:
        server.scenario, server.responder = "responder", lambda request: REPLY
        base = load_plan()
        generator = GeneratorPlan(kind="litellm", model=model, api_base=server.api_base)
        plan = base.model_copy(update={"answer": base.answer.model_copy(update={"generator": generator})})
        retriever = Retriever(bundle, plan=plan)
        spec = EvaluationSpec.build(load_suite(suite_path), plan, bundle, retriever.bundle_id, k=20, answers=True)
        run_evaluation(spec, out, retriever_factory=lambda _: retriever)
        return out, list(server.requests)


def by_hand(request: dict) -> tuple[int, int, int]:
    tokens_in = sum(words(m["content"]) for m in request["messages"])
    tokens_out = words(REPLY)
    return tokens_in, tokens_out, math.ceil((tokens_in * PRICE_IN + tokens_out * PRICE_OUT) / 1_000_000)


@pytest.fixture(scope="module")
def priced(eval_bundle, tmp_path_factory):  # noqa: F811
    return evaluate(eval_bundle, tmp_path_factory.mktemp("usage") / "priced", "openai/gpt-4o-mini")


def test_each_cell_records_its_call_and_the_report_sums_them(priced):
    run, requests = priced
    state = verify_run(run)
    report = json.loads((run / "report.json").read_text())
    usages = [p["answer_usage"] for p in state.terminal.values()]
    called = [u for u in usages if u["calls"]]
    assert len(usages) == EVALUABLE and len(called) == len(requests) > 0
    expected = [by_hand(r) for r in requests]
    # the run answers cells one at a time, in expected order: the n-th call is the n-th called cell
    ordered = [state.terminal[k]["answer_usage"] for k in state.expected if state.terminal[k]["answer_usage"]["calls"]]
    assert [(u["input_tokens"], u["output_tokens"], u["cost_micros"]) for u in ordered] == expected
    assert all(u == {"calls": 0, "cached": False, "input_tokens": 0, "output_tokens": 0, "cost_micros": 0}
               for u in usages if not u["calls"])  # fmt: skip
    assert report["answer_usage"] == {
        "cells": EVALUABLE,
        "calls": len(requests),
        "cached": 0,
        "input_tokens": sum(e[0] for e in expected),
        "output_tokens": sum(e[1] for e in expected),
        "cost_micros": sum(e[2] for e in expected),
        "unknown_cost_cells": 0,
    }
    md = (run / "report.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("Answers (model usage"))
    assert line == (
        f"Answers (model usage over {EVALUABLE} cells): {len(requests)} calls · 0 cached · "
        f"tokens in {sum(e[0] for e in expected)} · out {sum(e[1] for e in expected)} · "
        f"cost {sum(e[2] for e in expected)} micros"
    )
    _, rows = run_sql(run, "select sum(answer_calls), sum(answer_cost_micros) from cells")
    assert rows == [(len(requests), sum(e[2] for e in expected))]


def test_the_gate_bounds_tokens_and_micros_per_case(priced):
    run, requests = priced
    arm = load_arm(run)
    cost = summarize(arm).answer_cost
    state = verify_run(run)
    per_case = {k[0]: state.terminal[k]["answer_usage"] for k in state.expected}
    micros = sum(u["cost_micros"] for u in per_case.values()) / len(per_case)
    tokens = sum(u["input_tokens"] + u["output_tokens"] for u in per_case.values()) / len(per_case)
    assert cost is not None and (cost.cases, cost.calls) == (EVALUABLE, len(requests))
    assert cost.micros_per_case == pytest.approx(micros) and cost.tokens_per_case == pytest.approx(tokens)

    def verdicts(**bounds):
        base = policy_doc()
        doc = {**base, "cost": {**base["cost"], **bounds}}
        decision = decide(parse_policy(doc, "p.yaml"), None, arm)
        return [(c.name, c.verdict, c.reason) for c in decision.checks if c.name.startswith("answer_")]

    ceiling = math.floor(micros)  # below the measured mean: must fail
    assert verdicts(max_answer_micros_per_case=ceiling, max_answer_tokens_per_case=math.ceil(tokens)) == [
        ("answer_tokens_per_case", "pass", None),
        ("answer_micros_per_case", "fail", f"cost answer_micros_per_case: {micros:.6g} is not <= {ceiling:.6g}"),
    ]


def test_a_model_without_a_price_has_an_unknown_cost_that_fails_a_bound(eval_bundle, tmp_path):  # noqa: F811
    run, requests = evaluate(eval_bundle, tmp_path / "unpriced", "openai/local-test")
    report = json.loads((run / "report.json").read_text())["answer_usage"]
    assert report["calls"] == len(requests) and report["cost_micros"] is None
    assert report["unknown_cost_cells"] == len(requests)
    assert report["input_tokens"] == sum(by_hand(r)[0] for r in requests)  # tokens are still known
    base = policy_doc()
    doc = {**base, "cost": {**base["cost"], "max_answer_micros_per_case": 1_000_000}}
    (check,) = [
        c for c in decide(parse_policy(doc, "p.yaml"), None, load_arm(run)).checks if c.name.startswith("answer_")
    ]
    assert (check.verdict, check.reason) == (
        "fail",
        "cost answer_micros_per_case: some answer's cost is unknown (a model without a price, or a call that reported no usage)",
    )
