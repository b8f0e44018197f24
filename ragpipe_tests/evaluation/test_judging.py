"""Judged evaluation runs: the judge's verdicts as cell metrics, recomputed at verification, against
a real local OpenAI-protocol server playing both the generator and the judge."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.judge_spec import DEFAULT_JUDGE_SPEC, judge_spec
from ragpipe.evaluation.judge_step import JudgeItem
from ragpipe.evaluation.judging import JUDGE_METRICS, JUDGE_RECORD_FIELDS, Judging
from ragpipe.evaluation.ledger import read_ledger, reduce_records
from ragpipe.evaluation.report import build_report, render_markdown
from ragpipe.evaluation.run_folder import rebuild_report, verify_run
from ragpipe.evaluation.runner import (
    ANSWERS,
    CELLS_PER_COMMIT,
    pending_answers,
    resume_evaluation,
    run_evaluation,
)
from ragpipe.evaluation.suite import Case, Suite, check_against_bundle, write_suite
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.evaluation.traces import TraceError
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.pairing import PairingError, pair
from ragpipe.retrieval.plan import GeneratorPlan, load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe.work.admission import Budget
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.usage import load_prices
from ragpipe_tests.evaluation.test_recompute import completed, retrace, rewrite
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401
from ragpipe_tests.support.llm_server import LLMServer, judge_reply

PROMPT = (DEFAULT_JUDGE_SPEC.parent / "prompts" / "judge.txt").read_text(encoding="utf-8")
ANSWER = json.dumps({"answer": "Yes, it does [E1].", "citations": ["E1"], "abstained": False})
ABSTAIN = json.dumps({"answer": "", "citations": [], "abstained": True})
MALFORMED = "not JSON at all"  # the generator fails: the system abstains (and the run must still verify)
FACTS = ("yes", "it does", "placebo")  # two of three stated by ANSWER: 2_SUBSTANTIAL


class Both(LLMServer):
    """The generator (answers every question but two: it abstains on one and fails on the other)
    and the judge."""

    abstain_on = fail_on = ""

    def reply(self, request: dict) -> str:
        system, user = str(request["messages"][0]["content"]), str(request["messages"][-1]["content"])
        if "3_AUTHORITATIVE" in system:
            return judge_reply(request)
        if self.abstain_on and self.abstain_on in user:
            return ABSTAIN
        return MALFORMED if self.fail_on and self.fail_on in user else ANSWER


def _suite(eval_bundle, root: Path) -> tuple[Path, str, str]:  # noqa: F811
    """The eval sample suite with required facts on every answerable case; the IDs of the two such
    cases the generator abstains on and fails on."""
    _, suite_path = eval_bundle
    cases = []
    for case in load_suite(suite_path).cases:
        data = case.canonical()
        if case.answerability == "answerable":
            data["required_facts"] = list(FACTS)
        cases.append(data)
    path = root / "suite.jsonl"
    suite = Suite.of([Case(**c) for c in cases], "judged")
    write_suite(suite, path)
    retriever = Retriever(eval_bundle[0], plan=load_plan())
    evaluable = {
        s.case_id for s in check_against_bundle(suite, retriever.scopes.keys(), retriever.chunks.keys()) if s.evaluable
    }
    chosen = [c.id for c in suite.cases if c.answerability == "answerable" and c.id in evaluable]
    return path, chosen[0], chosen[1]


def _plan(server: LLMServer):
    base = load_plan()
    generator = GeneratorPlan(kind="litellm", model="openai/gpt-4o-mini", api_base=server.api_base)
    return base.model_copy(update={"answer": base.answer.model_copy(update={"generator": generator})})


def _judged_run(eval_bundle, root: Path, server: Both, out: str, budget: int | None = None):  # noqa: F811
    bundle, _ = eval_bundle
    suite_path, abstained, failed = _suite(eval_bundle, root)
    suite = load_suite(suite_path)
    server.abstain_on, server.fail_on = suite.by_id()[abstained].query, suite.by_id()[failed].query
    plan = _plan(server)
    spec_judge = judge_spec({"model": "openai/gpt-4o-mini", "api_base": server.api_base, "rubric_version": 1}, PROMPT)
    retriever = Retriever(bundle, plan=plan)
    spec = EvaluationSpec.build(suite, plan, bundle, retriever.bundle_id, k=20, answers=True, judge=spec_judge)
    judging = Judging(
        spec_judge,
        root / "judge-cache",
        ExecutionPolicy(concurrency=2, max_attempts=1),
        load_prices(),
        None if budget is None else Budget(budget),
    )
    result = run_evaluation(spec, root / out, retriever_factory=lambda _: retriever, judging=judging)
    return result, spec, (abstained, failed), judging, retriever


@pytest.fixture(scope="module")
def judged(eval_bundle, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("judged")
    with Both() as server:
        server.scenario, server.responder = "responder", server.reply
        result, spec, (abstained, failed), judging, retriever = _judged_run(eval_bundle, root, server, "run")
        judge_calls = sum("3_AUTHORITATIVE" in str(r["messages"][0]["content"]) for r in server.requests)
        # the same spec again: every verdict comes from the cache, no judge call
        before = len(server.requests)
        again = run_evaluation(spec, root / "again", retriever_factory=lambda _: retriever, judging=judging)
        cached_calls = sum("3_AUTHORITATIVE" in str(r["messages"][0]["content"]) for r in server.requests[before:])
        # the server stays up for the module: a judge is its endpoint too, so a second run judged by
        # "the same judge" must reach this very server
        yield {"run": root / "run", "again": again.out, "spec": spec, "abstained": abstained, "failed": failed,
               "judge_calls": judge_calls, "cached_calls": cached_calls, "report": result.report,
               "server": server}  # fmt: skip


def test_every_answered_answerable_cell_is_judged_and_the_rest_follow_the_rules(judged):
    state = verify_run(judged["run"])
    cells = {key[0]: p for key, p in state.terminal.items()}
    suite = judged["spec"].suite.by_id()
    answered = [c for c, p in cells.items() if suite[c].answerability == "answerable" and p["outcome"] == "success"]
    assert judged["judge_calls"] == len(answered) > 0
    for case_id in answered:
        p = cells[case_id]
        assert p["judge_outcome"] == "judged" and p["judge_usage"]["cost_micros"] > 0
        # two of the three required facts are in "Yes, it does": 2_SUBSTANTIAL, grounded (it cites E1)
        assert {m: p["metrics"][m] for m in JUDGE_METRICS} == {
            "answer_label": 2.0,
            "label_fail_rate": 0.0,
            "label_substantial_rate": 1.0,
            "label_authoritative_rate": 0.0,
            "required_fact_recall": pytest.approx(2 / 3),
            "groundedness_rate": 1.0,
            "judge_failure_rate": 0.0,
        }
    failed = cells[judged["failed"]]  # the generator failed: the system abstained, and the run verifies
    assert failed["outcome"] == "abstained" and failed["metrics"]["answer_label"] == 0.0
    abstained = cells[judged["abstained"]]
    assert abstained["outcome"] == "abstained" and "judge_outcome" not in abstained
    assert {m: abstained["metrics"].get(m) for m in JUDGE_METRICS} == {
        "answer_label": 0.0,
        "label_fail_rate": 1.0,
        "label_substantial_rate": 0.0,
        "label_authoritative_rate": 0.0,
        "required_fact_recall": 0.0,
        "groundedness_rate": None,
        "judge_failure_rate": None,
    }
    unanswerable = [p for c, p in cells.items() if suite[c].answerability == "unanswerable"]
    assert unanswerable and all(not set(JUDGE_METRICS) & set(p["metrics"]) for p in unanswerable)


def test_the_report_shows_the_distribution_and_then_the_mean(judged):
    quality = judged["report"]["answer_quality"]
    n = judged["judge_calls"]
    suite = judged["spec"].suite.by_id()
    state = verify_run(judged["run"])
    # the abstention, the generator's failure (the system abstains), and any case with no evidence
    ruled = sum(
        1
        for k, p in state.terminal.items()
        if suite[k[0]].answerability == "answerable" and p["outcome"] == "abstained"
    )
    assert ruled >= 2
    cells, cases = quality["cells"], quality["cases"]
    assert cells["distribution"] == {"0_FAIL": ruled, "1_PARTIAL": 0, "2_SUBSTANTIAL": n, "3_AUTHORITATIVE": 0}
    assert (cells["labelled"], quality["judged"], cells["by_rule"]) == (n + ruled, n, ruled)
    assert cells["mean_label"] == pytest.approx(2 * n / (n + ruled))
    # one repeat, every case evaluated: the same numbers per case, and the table's mean exactly
    assert (cases["distribution"], cases["labelled"]) == (cells["distribution"], n + ruled)
    assert cases["mean_label"] == judged["report"]["metrics"]["answer_label"]["value"]
    assert quality["failures"] == {"provider": 0, "invalid_output": 0, "refused": 0, "withheld": 0}
    usage = quality["judge_usage"]
    assert (usage["cells"], usage["calls"], usage["cached"]) == (n, n, 0) and usage["cost_micros"] > 0
    assert "agreement" not in quality  # the suite has no reference label
    md = (judged["run"] / "report.md").read_text()
    table = md.index("| over | 0_FAIL | 1_PARTIAL | 2_SUBSTANTIAL | 3_AUTHORITATIVE |")
    assert table < md.index("mean label") and f"| cells | {ruled} | 0 | {n} | 0 |" in md
    assert f"| cases | {ruled} | 0 | {n} | 0 |" in md
    assert f"Judge usage: {n} calls · 0 cached · cost {usage['cost_micros']} micros" in md


def test_a_second_run_takes_every_verdict_from_the_cache(judged):
    assert judged["cached_calls"] == 0
    first, again = verify_run(judged["run"]), verify_run(judged["again"])
    assert {k: p["metrics"] for k, p in first.terminal.items()} == {k: p["metrics"] for k, p in again.terminal.items()}
    # the re-judged run paid for nothing: every verdict is counted cached, none a call, no cost
    n = judged["judge_calls"]
    with_judge = [p for p in again.terminal.values() if p.get("judge_outcome") == "judged"]
    assert len(with_judge) == n and all(p["judge_cached"] is True for p in with_judge)
    assert not any("judge_cached" in p for p in first.terminal.values())  # a cold run's records as before
    usage = rebuild_report(judged["again"])["answer_quality"]["judge_usage"]
    assert usage == {
        "cells": n,
        "calls": 0,
        "cached": n,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_micros": 0,
        "unknown_cost_cells": 0,
    }


def test_each_judged_cell_records_the_digest_of_the_answer_it_judged(judged):
    """The judged answer is bound in the cell's own record (and trace description), not only in
    the judge's entry; a cell with nothing judged carries none."""
    run = judged["run"]
    for payload in verify_run(run).terminal.values():
        if payload.get("judge_outcome") is None:
            assert "answer_digest" not in payload and "answer_digest" not in _description(run, payload)
            continue
        item = JudgeItem.model_validate(json.loads(_description(run, payload)["judge"])["item"])
        assert payload["answer_digest"] == item.answer_digest == _description(run, payload)["answer_digest"]
        assert payload["answer_digest"].startswith("sha256:")


def test_labels_of_a_judged_run_pair_only_with_the_same_judge(judged, eval_bundle, tmp_path):  # noqa: F811
    arm = load_arm(judged["run"])
    assert arm.coordinates.judge == judged["spec"].body.judge
    assert pair(arm, load_arm(judged["again"])).coordinates.judge == arm.coordinates.judge
    # an unjudged run of the same suite: refused, naming the judge (not a metric list)
    bundle, _ = eval_bundle
    spec = judged["spec"]
    with Both() as server:
        server.scenario, server.responder = "responder", server.reply
        plan = _plan(server)
        plain = EvaluationSpec.build(spec.suite, plan, bundle, spec.body.bundle_id, k=20, answers=True)
        run_evaluation(plain, tmp_path / "plain", retriever_factory=lambda _: Retriever(bundle, plan=plan))
    # a run without a judge records none of the judge's fields (its records are what they were)
    plain_cells = verify_run(tmp_path / "plain").terminal.values()
    assert not any(set(JUDGE_RECORD_FIELDS) & set(p) for p in plain_cells)
    with pytest.raises(PairingError, match=r"^runs differ in judge: incumbent 'sha256:"):
        pair(arm, load_arm(tmp_path / "plain"))


def _copy(judged, tmp_path: Path) -> Path:
    return Path(shutil.copytree(judged["run"], tmp_path / "run"))


def _judged_payload(payloads) -> dict:
    return completed(payloads, lambda p: p.get("judge_outcome") == "judged")


def test_a_label_edited_with_every_digest_recomputed_is_refused(judged, tmp_path):
    run = _copy(judged, tmp_path)

    def edit(payloads):
        payload = _judged_payload(payloads)
        payload["metrics"] = {**payload["metrics"], "answer_label": 3.0, "label_authoritative_rate": 1.0}

        def meta(described):
            described["metrics"] = payload["metrics"]
            entry = json.loads(described["judge"])
            entry["verdict"]["label"] = "3_AUTHORITATIVE"
            described["judge"] = json.dumps(entry, ensure_ascii=True, sort_keys=True)

        retrace(run, payloads, payload, lambda t: t, meta)

    rewrite(run, edit)
    with pytest.raises(TraceError, match=r"record \d+: the recorded verdict is not what the reply says"):
        verify_run(run)


def test_a_reply_edited_to_a_better_verdict_does_not_rebuild(judged, tmp_path):
    """The forger edits the model's reply (and the response's message) to 3_AUTHORITATIVE with every
    fact stated, and the verdict and metrics to match: what is not bound is the reply — it is
    evidence of a call — so this is what a keyed seal stops; but the request must still be the
    case's: a reply moved from another case is refused."""
    run = _copy(judged, tmp_path)
    state = verify_run(run)
    other = next(p for p in state.terminal.values() if p.get("judge_outcome") == "judged")

    def edit(payloads):
        payload = next(
            p
            for k, p in payloads
            if k == "CellCompleted" and p.get("judge_outcome") == "judged" and p["cell"] != other["cell"]
        )

        def meta(described):
            entry = json.loads(described["judge"])
            source = json.loads(_description(run, other)["judge"])
            entry["evidence"] = source["evidence"]  # another case's request and reply
            described["judge"] = json.dumps(entry, ensure_ascii=True, sort_keys=True)

        retrace(run, payloads, payload, lambda t: t, meta)

    rewrite(run, edit)
    with pytest.raises(TraceError, match=r"the recorded request is not the one the spec, the case and the answer make"):
        verify_run(run)


def _description(run: Path, payload: dict) -> dict:
    import pyarrow.parquet as pq

    from ragpipe.evaluation.traces import CELLS_METADATA_KEY

    table = pq.read_table(run / payload["trace"]["file"])
    cells = json.loads(table.schema.metadata[CELLS_METADATA_KEY])["cells"]
    return next(c for c in cells if c["cell"] == payload["cell"])


def test_a_judged_cell_turned_into_an_abstention_or_a_failure_is_refused(judged, tmp_path):
    run = _copy(judged, tmp_path)

    def edit(payloads):
        payload = _judged_payload(payloads)
        payload["judge_outcome"] = "refused"
        payload["metrics"] = {k: v for k, v in payload["metrics"].items() if k not in JUDGE_METRICS} | {
            "judge_failure_rate": 1.0
        }

        def meta(described):
            described["metrics"], described["judge_outcome"] = payload["metrics"], "refused"
            entry = json.loads(described["judge"])
            entry["status"] = "refused"
            described["judge"] = json.dumps(entry, ensure_ascii=True, sort_keys=True)

        retrace(run, payloads, payload, lambda t: t, meta)

    rewrite(run, edit)
    with pytest.raises(TraceError, match=r"recorded refused, but the response is no refusal"):
        verify_run(run)


def test_an_edited_bound_judge_spec_is_refused(judged, tmp_path):
    run = _copy(judged, tmp_path)
    path = run / "inputs" / "judge.json"
    spec = json.loads(path.read_bytes())
    spec["rubric_version"] = 2
    path.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(Exception, match=r"judge\.json: differs from the digest of its InputBound record"):
        verify_run(run)


def test_a_budget_stop_keeps_the_run_and_a_resume_judges_the_rest_with_the_answers_given(eval_bundle, tmp_path):  # noqa: F811
    suite_path, _, failed = _suite(eval_bundle, tmp_path / "ids")
    queries = {c.id: c.query for c in load_suite(suite_path).cases}

    def asked(requests: list[dict]) -> list[str]:
        """The query of each generator request (the judge's left out), in order (two cases of the
        suite share a query: x-forbidden is another case's query)."""
        texts = [str(r["messages"][-1]["content"]) for r in requests if not _judge_request(r)]
        return [max((q for q in queries.values() if q in text), key=len) for text in texts]

    with Both() as server:
        server.scenario, server.responder = "responder", server.reply
        from ragpipe.work.failures import BudgetExhausted

        with pytest.raises(BudgetExhausted):
            _judged_run(eval_bundle, tmp_path, server, "run", budget=0)
        run = tmp_path / "run"
        stopped = verify_run(run)
        assert sum(map(_judge_request, server.requests)) == 0  # a budget of 0 admits no call
        first = asked(server.requests)
        kept = sorted(p.name for p in (run / ANSWERS).iterdir())
        before = len(server.requests)
        result = resume_evaluation(
            run,
            retriever_factory=lambda s: Retriever(s.bundle_path, plan=s.plan),
            judging=lambda s: Judging(
                s.judge, tmp_path / "judge-cache", ExecutionPolicy(max_attempts=1), load_prices()
            ),
        )
        again = asked(server.requests[before:])
    group, rest = stopped.expected[:CELLS_PER_COMMIT], stopped.expected[CELLS_PER_COMMIT:]
    assert stopped.status == "running" and len(stopped.terminal) == 0  # the first group never closed
    assert (len(stopped.expected), len(group), len(rest)) == (38, 32, 6)
    assert first == [queries[case] for case, _, _ in group]  # once per cell of the stopped group
    # the stopped group's answers are kept, one folder per cell; the failed call (MALFORMED) is not
    assert kept == sorted(pending_answers(run, key).name for key in group if key[0] != failed)
    # the resume asks again only for the answer that failed, then for the cells that never ran
    assert again == [queries[failed]] + [queries[case] for case, _, _ in rest]
    assert result.report["status"] == "completed" and result.report["answer_quality"]["judged"] > 0
    usage = result.report["answer_usage"]
    assert (usage["cells"], usage["calls"], usage["cached"]) == (38, 38, 31)
    assert not (run / ANSWERS).exists()  # the pending answers go when the run completes
    verify_run(run)


def _judge_request(request: dict) -> bool:
    return "3_AUTHORITATIVE" in str(request["messages"][0]["content"])


def test_a_gate_bounds_groundedness_and_regressions_of_0_fail(judged, eval_bundle, tmp_path):  # noqa: F811
    """A challenger whose judge fails one answer (0_FAIL, an unsupported claim): hard
    groundedness_rate >= 1 refuses it and passes the incumbent (every answer grounded); regression
    label_fail_rate — one more 0_FAIL than the incumbent — is refused under a 0 loss limit and
    passed under one just above the loss."""
    from ragpipe.experiment.comparison import compare
    from ragpipe.experiment.decision import decide
    from ragpipe.experiment.gate_policy import parse_policy
    from ragpipe_tests.support.gate_support import policy_doc

    arm = load_arm(judged["run"])
    first = next(k[0] for k, p in verify_run(judged["run"]).terminal.items() if p.get("judge_outcome") == "judged")
    worse_on = judged["spec"].suite.by_id()[first].query
    server = judged["server"]  # the same endpoint: the same judge

    def reply(request: dict) -> str:
        judging_it = "3_AUTHORITATIVE" in str(request["messages"][0]["content"])
        if judging_it and worse_on in str(request["messages"][-1]["content"]):
            verdict = json.loads(judge_reply(request))
            claims = [{"text": "An unsupported claim.", "supported_by": []}]
            return json.dumps({**verdict, "label": "0_FAIL", "claims": claims, "grounded": False})
        return server.reply(request)

    server.responder = reply
    try:
        _judged_run(eval_bundle, tmp_path, server, "worse")
    finally:
        server.responder = server.reply
    worse = load_arm(tmp_path / "worse")

    # a policy bounding a judge label must bound judge failures too (docs/gates.md)
    failures = {"judge_failure_rate": {"max": 0.05, "if_measured": True}}

    def hard(challenger) -> str:
        base = policy_doc()
        doc = {**base, "hard": {**base["hard"], **failures, "groundedness_rate": {"min": 1.0, "if_measured": True}}}
        checks = decide(parse_policy(doc, "p.yaml"), None, challenger).checks
        (check,) = [c for c in checks if c.phase == "hard" and c.metric == "groundedness_rate"]
        return check.verdict

    assert (hard(arm), hard(worse)) == ("pass", "fail")
    comparison = compare(pair(arm, worse))
    stats = comparison.slices["all"].metrics["label_fail_rate"].stats
    assert (stats.wins, stats.losses) == (0, 1)  # lower is better: one case lost, none won
    delta = abs(stats.mean)

    def regression(limit: float) -> str:
        base = policy_doc()
        doc = {**base, "hard": {**base["hard"], **failures}}
        doc["regression"] = {"overall": {"label_fail_rate": limit}, "tags": {}}
        decision = decide(parse_policy(doc, "p.yaml"), comparison)
        (check,) = [c for c in decision.checks if c.phase == "regression" and c.metric == "label_fail_rate"]
        return check.verdict

    assert (regression(0.0), regression(delta + 0.001)) == ("fail", "pass")


def test_a_judged_cell_claimed_withheld_is_refused(judged, tmp_path):
    """The judge's endpoint may receive every scope here: a cell recorded withheld did not happen."""
    run = _copy(judged, tmp_path)

    def edit(payloads):
        payload = _judged_payload(payloads)
        payload["judge_outcome"] = "withheld"
        kept = {k: v for k, v in payload["metrics"].items() if k not in JUDGE_METRICS}
        payload["metrics"] = kept | {"judge_failure_rate": 1.0}

        def meta(described):
            described["metrics"], described["judge_outcome"], described["judge_usage"] = (
                payload["metrics"],
                "withheld",
                None,
            )
            entry = json.loads(described["judge"])
            entry.update(status="withheld", evidence=None, verdict=None)
            described["judge"] = json.dumps(entry, ensure_ascii=True, sort_keys=True)

        payload["judge_usage"] = None
        retrace(run, payloads, payload, lambda t: t, meta)

    rewrite(run, edit)
    with pytest.raises(TraceError, match=r"recorded withheld, but the disclosure policy lets the item be sent"):
        verify_run(run)


ANSWER_ALL = json.dumps({"answer": "Yes, it does, placebo [E1].", "citations": ["E1"], "abstained": False})


class Alternating(Both):
    """``Both``, but the second, fourth … answer to a question states every fact (3_AUTHORITATIVE):
    two repeats of a case give two answers, judged 2_SUBSTANTIAL and 3_AUTHORITATIVE."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: dict[str, int] = {}

    def reply(self, request: dict) -> str:
        text = super().reply(request)
        if text != ANSWER:
            return text
        user = str(request["messages"][-1]["content"])
        self.asked[user] = self.asked.get(user, 0) + 1
        return ANSWER if self.asked[user] % 2 else ANSWER_ALL


@pytest.fixture(scope="module")
def repeated(eval_bundle, tmp_path_factory):  # noqa: F811
    """A judged run of two repeats whose suite gives every answerable case the reference label
    2_SUBSTANTIAL."""
    root = tmp_path_factory.mktemp("repeated")
    bundle, _ = eval_bundle
    suite_path, abstained, failed = _suite(eval_bundle, root)
    cases = [
        Case(**(c.canonical() | ({"quality_label": "2_SUBSTANTIAL"} if c.answerability == "answerable" else {})))
        for c in load_suite(suite_path).cases
    ]
    suite = Suite.of(cases, "repeated")
    with Alternating() as server:
        server.scenario, server.responder = "responder", server.reply
        server.abstain_on, server.fail_on = suite.by_id()[abstained].query, suite.by_id()[failed].query
        plan = _plan(server)
        judge = judge_spec({"model": "openai/gpt-4o-mini", "api_base": server.api_base, "rubric_version": 1}, PROMPT)
        retriever = Retriever(bundle, plan=plan)
        spec = EvaluationSpec.build(
            suite, plan, bundle, retriever.bundle_id, k=20, answers=True, judge=judge, repeats=2
        )
        judging = Judging(judge, root / "judge-cache", ExecutionPolicy(max_attempts=1), load_prices())
        result = run_evaluation(spec, root / "run", retriever_factory=lambda _: retriever, judging=judging)
    yield {"run": root / "run", "report": result.report, "spec": spec}


def _labels_by_case(state) -> dict[str, list[int]]:
    labels: dict[str, list[int]] = {}
    for key, p in state.terminal.items():
        if "answer_label" in p["metrics"]:
            labels.setdefault(key[0], []).append(int(p["metrics"]["answer_label"]))
    return {case: sorted(ls) for case, ls in labels.items()}


def test_with_repeats_cells_and_cases_are_both_reported_and_cases_weigh_as_the_metric_tables(repeated):
    state = verify_run(repeated["run"])
    labels = _labels_by_case(state)
    answered = sorted(c for c, ls in labels.items() if ls == [2, 3])  # the two repeats' two answers
    ruled = sorted(c for c, ls in labels.items() if ls == [0, 0])  # abstained in both repeats
    assert len(answered) > 0 and len(ruled) >= 2 and len(answered) + len(ruled) == len(labels)
    n, r = len(answered), len(ruled)
    quality = repeated["report"]["answer_quality"]
    assert quality["cells"] == {
        "distribution": {"0_FAIL": 2 * r, "1_PARTIAL": 0, "2_SUBSTANTIAL": n, "3_AUTHORITATIVE": n},
        "labelled": 2 * (n + r),
        "by_rule": 2 * r,
        "mean_label": 5 * n / (2 * (n + r)),
    }
    assert quality["cases"] == {
        "distribution": {"0_FAIL": float(r), "1_PARTIAL": 0.0, "2_SUBSTANTIAL": n / 2, "3_AUTHORITATIVE": n / 2},
        "labelled": n + r,
        "mean_label": quality["cases"]["mean_label"],
    }
    table = repeated["report"]["metrics"]
    assert quality["cases"]["mean_label"] == table["answer_label"]["value"] == pytest.approx(2.5 * n / (n + r))
    assert quality["cases"]["distribution"]["0_FAIL"] / (n + r) == table["label_fail_rate"]["value"]
    share = quality["cases"]["distribution"]["3_AUTHORITATIVE"] / (n + r)
    assert share == pytest.approx(table["label_authoritative_rate"]["value"])
    assert (quality["judged"], quality["judge_usage"]["calls"], quality["judge_usage"]["cached"]) == (2 * n, 2 * n, 0)


def test_agreement_with_the_suites_reference_labels(repeated):
    """Every answerable case's reference is 2_SUBSTANTIAL: of each answered case's two verdicts one
    agrees exactly, the other (3_AUTHORITATIVE) within one; abstentions are by rule, not compared."""
    state = verify_run(repeated["run"])
    labels = _labels_by_case(state)
    answered = sorted(c for c, ls in labels.items() if ls == [2, 3])
    n, r = len(answered), len(labels) - len(answered)
    confusion = {ref: dict.fromkeys(("0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"), 0) for ref in
                 ("0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE")}  # fmt: skip
    confusion["2_SUBSTANTIAL"].update({"2_SUBSTANTIAL": n, "3_AUTHORITATIVE": n})
    assert repeated["report"]["answer_quality"]["agreement"] == {
        "cells": 2 * n,
        "cases": n,
        "exact_rate": 0.5,
        "within_one_rate": 1.0,
        "confusion": confusion,
        "disagreements": [],
        "judge_failed": 0,
        "by_rule": 2 * r,
    }
    assert rebuild_report(repeated["run"]) == repeated["report"]  # rebuilt from the bound suite alike
    md = (repeated["run"] / "report.md").read_text()
    summary = (
        f"Agreement with reference labels: {2 * n} judged answers of {n} cases · exact 0.500 · within one 1.000 · "
        f"2+ apart: none · not compared: 0 judge failures, {2 * r} abstentions by rule"
    )
    assert summary in md and f"| 2_SUBSTANTIAL | 0 | 0 | {n} | {n} |" in md
    # references two ranks below a case's verdicts: that case disagrees (its 3 is three apart)
    read = read_ledger(repeated["run"])
    state = reduce_records(read.records)
    report = build_report(repeated["run"], read.records, state, {answered[0]: "0_FAIL"})
    agreed = report["answer_quality"]["agreement"]
    assert (agreed["cells"], agreed["exact_rate"], agreed["within_one_rate"]) == (2, 0.0, 0.0)
    assert agreed["disagreements"] == [answered[0]]
    assert agreed["confusion"]["0_FAIL"] == {"0_FAIL": 0, "1_PARTIAL": 0, "2_SUBSTANTIAL": 1, "3_AUTHORITATIVE": 1}
    assert f"2+ apart: {answered[0]} ·" in render_markdown(report)


def _swap_judge_entries(run: Path, also_digests: bool) -> None:
    """Swap everything the judge gave two repeats of one case — the trace's judge entries, the
    metrics and usage in records and descriptions — with every digest recomputed; the cells'
    ``answer_digest`` too when ``also_digests``."""
    state = verify_run(run)
    case = next(k[0] for k, p in state.terminal.items() if k[1] == 0 and p.get("judge_outcome") == "judged")

    def edit(payloads):
        first, second = (
            next(
                p
                for k, p in payloads
                if k == "CellCompleted" and p["cell"]["case"] == case and p["cell"]["repeat"] == r
            )
            for r in (0, 1)
        )
        entries = [_description(run, first)["judge"], _description(run, second)["judge"]]
        moved = ["metrics", "judge_usage"] + (["answer_digest"] if also_digests else [])
        taken = [{k: first[k] for k in moved}, {k: second[k] for k in moved}]
        for payload, fields, entry in ((first, taken[1], entries[1]), (second, taken[0], entries[0])):
            payload.update(fields)

            def meta(described, fields=fields, entry=entry):
                described.update(fields)
                described["judge"] = entry

            retrace(run, payloads, payload, lambda t: t, meta)

    rewrite(run, edit)


def test_the_judge_entries_of_two_repeats_swapped_are_refused(repeated, tmp_path):
    """Two repeats of one case gave two answers with the same citations; swapping what the judge
    said of each (every digest recomputed) no longer verifies: each cell's record names the answer
    it judged."""
    run = Path(shutil.copytree(repeated["run"], tmp_path / "run"))
    _swap_judge_entries(run, also_digests=False)
    with pytest.raises(
        TraceError,
        match=r"record \d+: the judged answer is not this cell's: its digest is not the record's answer_digest$",
    ):
        verify_run(run)


def test_moving_the_answer_digests_too_is_what_only_a_seal_stops(repeated, tmp_path):
    """The same swap with the records' answer digests swapped as well verifies: which answer a cell
    gave is the record's word (the answer's text is evidence of a call), as with a reply — a whole
    cell forged consistently is what the keyed seal stops (docs/trust.md)."""
    run = Path(shutil.copytree(repeated["run"], tmp_path / "run"))
    _swap_judge_entries(run, also_digests=True)
    verify_run(run)


def test_judging_for_reaches_the_homes_judge_cache_and_refuses_in_the_callers_words(tmp_path: Path):
    from ragpipe.evaluation.judging import judging_for

    spec_judge = judge_spec({"model": "openai/gpt-4o-mini", "rubric_version": 1}, PROMPT)
    reached = judging_for(spec_judge, tmp_path / "home", 5000, 3)
    assert reached.cache_root == tmp_path / "home" / "generation_cache" / "judge"
    assert (reached.policy.concurrency, reached.budget.limit if reached.budget else None) == (3, 5000)
    assert judging_for(spec_judge, tmp_path / "home").budget is None
    unpriced = judge_spec({"model": "openai/unpriced-judge", "rubric_version": 1}, PROMPT)
    refusals = {
        (spec_judge, -1, 4, "--judge-budget-micros must be >= 0, got -1"),
        (spec_judge, None, 65, "--judge-concurrency must be 1 to 64, got 65"),
        (
            unpriced,
            10,
            4,
            "--judge-budget-micros: the judge's model 'openai/unpriced-judge' has no price in the price table "
            "(ragpipe/specs/prices.yaml or $RAGPIPE_PRICES), so no budget can be kept",
        ),
    }
    for spec, budget, concurrency, message in refusals:
        with pytest.raises(ValueError) as refused:
            judging_for(spec, tmp_path / "home", budget, concurrency)
        assert str(refused.value) == message
    assert judging_for(unpriced, tmp_path / "home").budget is None  # no budget: nothing to price
    assert not (tmp_path / "home").exists()  # nothing written: the cache folder is made by the first call


@pytest.mark.parametrize(
    ("fields", "refusal"),
    [
        ({"judge_usage": {"input_tokens": 1}, "judge_cached": True}, "judge fields on a cell with nothing to judge"),
        ({"answer_digest": "sha256:" + "0" * 64}, "judge fields on a cell with nothing to judge"),
    ],
)
def test_judge_fields_on_a_cell_with_nothing_to_judge_are_refused(judged, tmp_path, fields, refusal):
    """An abstention or an unanswerable case is never put to the judge: judge usage or a cached
    mark added to its record (every digest recomputed) would count in the report's judge usage."""
    run = _copy(judged, tmp_path)

    def edit(payloads):
        payload = completed(payloads, lambda p: "judge_outcome" not in p)
        payload.update(fields)
        retrace(run, payloads, payload, lambda t: t, lambda described: described.update(fields))

    rewrite(run, edit)
    with pytest.raises(TraceError, match=refusal):
        verify_run(run)


def test_a_cached_mark_on_a_judge_failure_is_refused(judged, tmp_path):
    """Only a judged verdict comes from the judge cache: a failure marked cached is refused."""
    run = _copy(judged, tmp_path)

    def edit(payloads):
        payload = _judged_payload(payloads)
        payload["judge_cached"] = "yes"
        retrace(run, payloads, payload, lambda t: t, lambda described: described.update(judge_cached="yes"))

    rewrite(run, edit)
    with pytest.raises(TraceError, match=r"judge_cached is true, and only on a judged verdict"):
        verify_run(run)
