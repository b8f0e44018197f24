"""Judging on the step machinery against the real local OpenAI-protocol server: every outcome
counted as its kind, the cache (hits, new keys, forged entries), the budget stop and resume."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ragpipe.evaluation.judge import CitedEvidence, answer_digest
from ragpipe.evaluation.judge_metrics import judge_metrics
from ragpipe.evaluation.judge_spec import DEFAULT_JUDGE_SPEC, JudgeSpec, judge_spec
from ragpipe.evaluation.judge_step import JudgeItem, JudgeStep, judge_answers, judge_input, judge_key
from ragpipe.kernel.ids import bytes_digest
from ragpipe.work.admission import Budget
from ragpipe.work.disclosure import DisclosurePolicy
from ragpipe.work.entries import JsonEntryStore, value_bytes
from ragpipe.work.failures import BudgetExhausted
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.usage import PriceTable, load_prices
from ragpipe_tests.support.llm_server import LLMServer, judge_reply

PROMPT = (DEFAULT_JUDGE_SPEC.parent / "prompts" / "judge.txt").read_text(encoding="utf-8")
ONCE = ExecutionPolicy(max_attempts=1)  # each fault is the item's outcome (no retry hides it)
E1 = CitedEvidence(label="E1", title="Aspirin", text="Low-dose aspirin reduced stroke risk.", access_scopes=("public",))
E2 = CitedEvidence(label="E2", title="Staff notes", text="Internal dosing notes.", access_scopes=("staff",))
PRICES = PriceTable.model_validate(
    {"schema": "ragpipe.prices/v1", "models": {"openai/judge-test": {"input": 1_000_000, "output": 2_000_000}}}
)


def spec_for(server: LLMServer, disclosure: DisclosurePolicy | None = None, **fields) -> JudgeSpec:
    data = {"model": "openai/judge-test", "api_base": server.api_base, "rubric_version": 1, "timeout_seconds": 1.0}
    return judge_spec(data | fields, PROMPT, disclosure)


def item(case: str = "c1", answer: str = "Aspirin reduces stroke risk.", evidence=(E1,)) -> JudgeItem:
    return JudgeItem(
        case_digest=case,
        question="Does aspirin reduce strokes?",
        required_facts=("aspirin reduces", "stroke risk", "low-dose"),
        answer_text=answer,
        citations=tuple(e.label for e in evidence),
        cited_evidence=tuple(evidence),
    )


def judging(server: LLMServer) -> LLMServer:
    server.scenario, server.responder = "responder", judge_reply
    return server


def test_a_valid_reply_is_judged_with_its_verdict_evidence_and_cost(tmp_path):
    with judging(LLMServer()) as server:
        spec = spec_for(server)
        run = judge_answers(spec, [item()], tmp_path, ONCE, PRICES)
    (outcome,) = run.outcomes
    assert (outcome.status, outcome.kind, outcome.n_facts) == ("judged", None, 3)
    assert outcome.verdict.label == "2_SUBSTANTIAL"  # two of the three facts' words are in the answer
    assert [f.stated for f in outcome.verdict.facts] == [True, True, False]
    assert outcome.key == judge_key(spec, "c1", answer_digest("Aspirin reduces stroke risk.", ["E1"], [E1]))
    assert outcome.evidence["request"]["messages"] == server.requests[0]["messages"]
    assert outcome.evidence["response"]["choices"][0]["message"]["content"] == outcome.evidence["content"]
    usage = outcome.evidence["usage"]
    # 1 micro per input word, 2 per output word (the server counts words)
    assert usage["cost_micros"] == usage["input_tokens"] + 2 * usage["output_tokens"] > 0
    assert (run.report.computed, run.report.usage.cost_micros) == (1, usage["cost_micros"])


@pytest.mark.parametrize(
    ("fault", "status", "kind", "detail", "message"),
    [
        (
            "content:not json",
            "invalid_output",
            "invalid_output",
            "invalid_output",
            "reply is not JSON (not valid JSON: Expecting value (column 1))",
        ),
        (
            'content:{"label": "3_AUTHORITATIVE"}',
            "invalid_output",
            "invalid_output",
            "invalid_output",
            "reply must be an object with exactly the keys label, facts, claims, grounded, explanation "
            "(missing facts, claims, grounded, explanation)",
        ),
        ("refusal", "refused", "refused", "refusal", "the model refused: I can't help with judging this."),
        (
            "content_filter",
            "refused",
            "refused",
            "content_filter",
            "the provider filtered the reply (finish_reason content_filter)",
        ),
        ("timeout", "provider", "timeout", "timeout", None),
        ("429:7", "provider", "rate_limited", "http_error:429", None),
        ("500", "provider", "server_error", "http_error:500", None),
        ("partial", "provider", "server_error", "connection_error", None),
    ],
)
def test_each_fault_is_counted_as_its_kind_and_never_as_a_label(tmp_path, fault, status, kind, detail, message):
    with judging(LLMServer()) as server:
        server.faults.append(fault)
        run = judge_answers(spec_for(server), [item()], tmp_path, ONCE, PRICES)
        assert len(server.requests) == 1
        # a failure is not cached: the next run asks again (and is judged)
        again = judge_answers(spec_for(server), [item()], tmp_path, ONCE, PRICES)
        assert len(server.requests) == 2 and again.outcomes[0].status == "judged"
    (outcome,) = run.outcomes
    assert (outcome.status, outcome.kind, outcome.detail, outcome.verdict) == (status, kind, detail, None)
    if message is not None:
        assert outcome.message == message
    if status in ("invalid_output", "refused"):  # the reply is kept as evidence
        assert outcome.evidence["response"]["choices"][0]["finish_reason"] in ("stop", "content_filter")
    metrics = judge_metrics(run.outcomes)
    assert (metrics.attempted, metrics.judged, metrics.judge_failure_rate) == (1, 0, 1.0)
    assert metrics.failures == {"provider": 0, "invalid_output": 0, "refused": 0, "withheld": 0} | {status: 1}
    assert metrics.distribution == dict.fromkeys(("0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"), 0)
    assert metrics.mean_label is None and metrics.label_fail_rate is None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"label": "\ud800"}', "reply is not valid Unicode text (an unpaired surrogate)"),  # escaped on the wire
        ("x" * 1_000_000, "reply has 1000000 characters, more than 65536"),
    ],
)
def test_a_reply_that_cannot_be_a_verdict_is_invalid_output(tmp_path, content, message):
    with judging(LLMServer()) as server:
        server.faults.append("content:" + content)
        run = judge_answers(spec_for(server), [item()], tmp_path, ONCE, PRICES)
    (outcome,) = run.outcomes
    assert (outcome.status, outcome.message, outcome.verdict) == ("invalid_output", message, None)
    # a reply that is not Unicode text cannot be recorded; a long one is kept as it came
    assert (outcome.evidence is None) == (len(content) < 100)


def test_a_rate_limited_call_is_retried_under_the_policy_and_then_judged(tmp_path):
    with judging(LLMServer()) as server:
        server.faults.append("429:0")
        policy = ExecutionPolicy(max_attempts=2, backoff_seconds=0)
        run = judge_answers(spec_for(server), [item()], tmp_path, policy, PRICES)
        assert len(server.requests) == 2
    assert run.outcomes[0].status == "judged" and run.report.retries == {"rate_limited": 1}


def test_evidence_the_endpoint_may_not_receive_is_withheld_and_nothing_is_sent(tmp_path):
    with judging(LLMServer()) as server:
        policy = DisclosurePolicy(endpoints={server.api_base: ("public",)})
        spec = spec_for(server, policy)
        run = judge_answers(spec, [item("c1", evidence=(E1, E2)), item("c2")], tmp_path, ONCE, PRICES)
        assert len(server.requests) == 1  # c2 only
        assert "Internal dosing notes" not in server.bodies[0].decode()
    withheld, judged = run.outcomes
    assert (withheld.status, withheld.kind, withheld.verdict) == ("withheld", "withheld", None)
    assert withheld.message == (
        f"cited evidence E2 (scopes staff) may not be sent to {spec.endpoint} (it may receive public)"
    )
    assert judged.status == "judged"
    metrics = judge_metrics(run.outcomes)
    assert (metrics.attempted, metrics.judged, metrics.judge_failure_rate, metrics.failures["withheld"]) == (
        2,
        1,
        0.5,
        1,
    )


def test_everything_withheld_sends_nothing(tmp_path):
    with judging(LLMServer()) as server:
        spec = spec_for(server, DisclosurePolicy(endpoints={server.api_base: ("public",)}))
        run = judge_answers(spec, [item(evidence=(E2,))], tmp_path, ONCE, PRICES)
        assert server.connections == 0
    assert [o.status for o in run.outcomes] == ["withheld"] and run.report is None


def test_a_cache_hit_makes_no_request_and_a_rubric_change_is_a_new_key(tmp_path):
    items = [item("c1"), item("c2"), item("c1", answer="Aspirin reduces stroke risk at low-dose.")]
    with judging(LLMServer()) as server:
        spec = spec_for(server)
        first = judge_answers(spec, items, tmp_path, ONCE, PRICES)
        assert len(server.requests) == 3
        second = judge_answers(spec, items, tmp_path, ONCE, PRICES)
        assert len(server.requests) == 3  # every verdict came from the cache
        assert (second.report.cache_hits, second.report.computed, second.report.usage.calls) == (3, 0, 0)
        assert [o.verdict for o in second.outcomes] == [o.verdict for o in first.outcomes]
        assert [o.verdict.label for o in first.outcomes] == ["2_SUBSTANTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"]
        rubric2 = spec_for(server, rubric_version=2)
        third = judge_answers(rubric2, items, tmp_path, ONCE, PRICES)
        assert len(server.requests) == 6 and third.report.computed == 3
    assert {o.key for o in third.outcomes}.isdisjoint(o.key for o in first.outcomes)


def test_a_verdict_no_call_of_this_invocation_produced_is_cached(tmp_path):
    """Cached: a hit before admission, and a second item with the key of one judged in the same
    invocation (one request for both); a failure is never cached."""
    twice = [item("c1"), item("c2"), item("c1")]
    with judging(LLMServer()) as server:
        spec = spec_for(server)
        first = judge_answers(spec, twice, tmp_path, ONCE, PRICES)
        assert len(server.requests) == 2
        assert [(o.status, o.cached) for o in first.outcomes] == [
            ("judged", False),
            ("judged", False),
            ("judged", True),
        ]
        again = judge_answers(spec, [*twice, item("c3")], tmp_path, ONCE, PRICES)
        assert len(server.requests) == 3
        assert [o.cached for o in again.outcomes] == [True, True, True, False]
        server.faults.append("content:not json")
        (broken,) = judge_answers(spec, [item("c4")], tmp_path, ONCE, PRICES).outcomes
    assert (broken.status, broken.cached) == ("invalid_output", False)


def _entry(root: Path, key: str) -> Path:
    return JsonEntryStore(root, "judge cache").path_of(key)


def _write(path: Path, key: str, value: dict) -> None:
    """An entry as a forger writes one: its value digest recomputed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "value": value, "value_digest": bytes_digest(value_bytes(value))}))


@pytest.mark.parametrize(
    ("forge", "why"),
    [
        ("inputs", "its inputs do not make its key"),
        ("moved", "its inputs do not make its key"),
        ("request", "holds the reply to another request than its key's"),
        ("reply", "its reply text is not its response's message"),
        (
            "verdict",
            "its reply is not a verdict: label must be one of 0_FAIL, 1_PARTIAL, 2_SUBSTANTIAL, "
            '3_AUTHORITATIVE, not "4_PERFECT"',
        ),
    ],
)
def test_a_forged_cache_entry_is_refused_and_judged_again(tmp_path, caplog, forge, why):
    with judging(LLMServer()) as server:
        spec = spec_for(server)
        items = [item("c1"), item("c2", answer="Aspirin reduces risk.")]  # two requests
        first = judge_answers(spec, items, tmp_path, ONCE, PRICES)
        one, two = first.outcomes
        value = json.loads(_entry(tmp_path, one.key).read_text())["value"]
        target = one.key
        if forge == "inputs":  # another case's inputs under this key
            value["inputs"] = value["inputs"] | {"case": "c2"}
        elif forge == "moved":  # c1's verdict copied under c2's key, the key field rewritten
            target = two.key
        elif forge == "request":  # the inputs kept, the request another case's
            value["request"] = json.loads(_entry(tmp_path, two.key).read_text())["value"]["request"]
        elif forge == "reply":
            value["content"] = value["content"].replace("2_SUBSTANTIAL", "3_AUTHORITATIVE")
        elif forge == "verdict":
            value["content"] = value["content"].replace("2_SUBSTANTIAL", "4_PERFECT")
            value["response"]["choices"][0]["message"]["content"] = value["content"]
        _write(_entry(tmp_path, target), target, value)
        with caplog.at_level(logging.WARNING, logger="ragpipe.work.entries"):
            again = judge_answers(spec, items, tmp_path, ONCE, PRICES)
        assert len(server.requests) == 3  # the forged entry's item was asked again, the other not
    path = _entry(tmp_path, target)
    assert [r.getMessage() for r in caplog.records] == [
        f"judge cache: {path}: {why}; set aside as {path.name}.refused, computing it again"
    ]
    assert path.with_name(path.name + ".refused").exists()
    assert [o.verdict for o in again.outcomes] == [o.verdict for o in first.outcomes]


def test_a_budget_stop_leaves_the_rest_unjudged_and_a_resume_judges_only_the_rest(tmp_path):
    items = [item(f"c{i}") for i in range(5)]
    with judging(LLMServer()) as server:
        spec = spec_for(server)
        worst = JudgeStep(spec, PRICES).worst_cost([judge_input(spec, items[0])[1]])
        # the first call fits the budget exactly; after it, spent > 0 and no other worst case fits
        with pytest.raises(BudgetExhausted) as info:
            judge_answers(spec, items, tmp_path, ONCE, PRICES, budget=Budget(worst))
        assert len(server.requests) == 1 and info.value.not_admitted == 4
        assert str(info.value).startswith(f"judge: budget of {worst} micros reached: ")
        assert str(info.value).endswith(
            "(finished items are cached: raise execution.judging.budget_micros and build again to continue)"
        )
        resumed = judge_answers(spec, items, tmp_path, ONCE, PRICES, budget=Budget(10 * worst))
        assert len(server.requests) == 5  # only the four left
    assert (resumed.report.cache_hits, resumed.report.computed) == (1, 4)
    assert [o.status for o in resumed.outcomes] == ["judged"] * 5


@pytest.mark.parametrize("shared", [False, True])
def test_a_budget_with_an_unpriced_judge_is_refused_before_anything_is_sent(tmp_path, shared: bool):
    """Whether the budget is the policy's or one shared by the caller (an evaluation run's)."""
    from ragpipe.work.admission import Budget
    from ragpipe.work.failures import BudgetUnenforceable

    with judging(LLMServer()) as server:
        spec = spec_for(server, model="openai/unpriced")
        policy, budget = (ExecutionPolicy(), Budget(10)) if shared else (ExecutionPolicy(budget_micros=10), None)
        with pytest.raises(BudgetUnenforceable):
            judge_answers(spec, [item()], tmp_path, policy, load_prices(), budget=budget)
        assert server.connections == 0
