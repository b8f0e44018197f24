"""Judging inside evaluation runs: the judge's verdicts as cell metrics, its calls as trace evidence.

A run whose spec names a judge (``SpecBody.judge``: the judge spec ID; the spec itself is an input
of the run, ``inputs/judge.json``) judges every *answered* cell of an *answerable* case, a group of
cells at a time, through ``judge_step.judge_answers`` (cached by judge spec, case digest and answer
digest; budgeted; every failure counted). Per cell:

* answered and judged → ``answer_label`` (0–3: ``0_FAIL`` … ``3_AUTHORITATIVE``),
  ``label_fail_rate``, ``label_substantial_rate`` (label ≥ 2), ``label_authoritative_rate``
  (label 3) — each 1 or 0, so their means are the label distribution, exactly —
  ``required_fact_recall`` (stated / required, when the case lists required facts),
  ``groundedness_rate`` (1 when every claim cites support) and ``judge_failure_rate`` 0;
* answered, the judge failed (provider, invalid output, refusal, withheld) → ``judge_failure_rate``
  1 and no label: a failure is never a label, and never left out;
* answerable and abstained → by rule, no call: ``answer_label`` 0, ``label_fail_rate`` 1, the
  other two label rates 0, ``required_fact_recall`` 0 when there are facts (an abstention states
  none); no groundedness (it makes no claim), no judge failure (nothing was asked);
* unanswerable → no judge metric (``correct_abstention_rate`` measures those).

The cell's trace description carries ``judge``, as ASCII JSON text (the evidence exactly, whatever
its Unicode form): the outcome, the item judged (answer text, citations, cited evidence: what the
request was built from), the verdict, and the call's evidence (request, reply, response, usage)
when there was a reply; its record carries ``judge_outcome``, ``judge_usage`` (the call's, as its
evidence reports it), ``judge_cached: true`` only when no provider call of the invocation that closed the
cell produced the verdict (``judge_step``: it was in the judge cache — so a verdict paid for by an
invocation stopped on its budget counts as cached when the resume closes its cell: that spend is
in the stop's message, not in the report), and — for every answer put to the judge —
``answer_digest`` (``judge.answer_digest`` of the answer's text, citations and cited payload),
written when the answer is made, in the cell's own record. None of these fields exists in a cell
with nothing to judge, so runs without a judge keep their records. ``recompute_judge`` rebuilds
the metrics at verification: the item's citations are the recorded answer's, its digest is the
record's ``answer_digest`` (so the entry of another cell — another repeat of the case, or another
run's cell with the same citations — cannot stand in), the key and the request rebuild from the
bound judge spec, the case and the item, the cited items' scopes are the cited rows' (so a claimed
``withheld`` is the disclosure policy's), the reply is the response's message and parses (or,
recorded invalid, does not) — so an edited label, fact or claim, another case's request, another
cell's judged answer, or a judged cell recorded as refused or withheld, is refused. Not
recomputable: whether the model said it (evidence of a call, as for generated representations),
whether the answer's text is what the generator said (the trace keeps it only in the judge's
entry; the record's digest binds which answer, not that the generator gave it — likewise evidence
of a call), whether the cited texts are the bundle's (the bundle is not opened to verify a run),
``judge_usage`` and ``judge_cached`` (operational accounting, as ``answer_usage`` is), and a
provider failure (it keeps no evidence: it costs a forger only ``judge_failure_rate``, which a
policy that gates on labels must bound).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragpipe.evaluation.contract_calls import refusal
from ragpipe.evaluation.judge import CitedEvidence, InvalidVerdict, judge_request, parse_verdict
from ragpipe.evaluation.judge_spec import LABELS, JudgeSpec
from ragpipe.evaluation.judge_step import (
    JudgeItem,
    JudgeOutcome,
    judge_answers,
    judge_key,
    withheld_reason,
)
from ragpipe.evaluation.metrics import MetricSpec
from ragpipe.evaluation.suite import Case
from ragpipe.kernel.strict_load import load_json
from ragpipe.representations.generate import check_call_reply
from ragpipe.work.admission import Budget
from ragpipe.work.chat import ChatRequest
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.usage import PriceTable

JUDGE_RATES = (
    ("label_fail_rate", "lower"),
    ("label_substantial_rate", "higher"),
    ("label_authoritative_rate", "higher"),
    ("required_fact_recall", "higher"),
    ("groundedness_rate", "higher"),
    ("judge_failure_rate", "lower"),
)
JUDGE_METRICS = ("answer_label", *(name for name, _ in JUDGE_RATES))
# what a judged cell's record may carry besides its metrics (none of them in a run without a judge)
JUDGE_RECORD_FIELDS = ("judge_outcome", "judge_usage", "judge_cached", "answer_digest")


def judge_metric_specs() -> tuple[MetricSpec, ...]:
    """The judge's metrics, in a fixed order (module docstring)."""
    label = MetricSpec(
        name="answer_label", measure="ragpipe:answer_label", direction="higher", unit="label", k=None, range=(0.0, 3.0)
    )
    return (label,) + tuple(
        MetricSpec(name=name, measure=f"ragpipe:{name}", direction=direction, unit="ratio", k=None, range=(0.0, 1.0))
        for name, direction in JUDGE_RATES
    )


@dataclass(frozen=True)
class Judging:
    """How a run's judge is reached this time: operational (never in an ID), given again on resume.
    ``budget`` bounds what this invocation spends on judge calls (cache hits cost nothing)."""

    spec: JudgeSpec
    cache_root: Path
    policy: ExecutionPolicy
    prices: PriceTable
    budget: Budget | None = None
    api_key: str | None = None


def judge_item(case: Case, answer: Mapping[str, Any], evidence: Sequence[Mapping[str, Any]]) -> JudgeItem:
    """What is judged of one answer (``AnswerResult.as_dict()`` and its context's evidence with
    access scopes): the case's question and required facts, the answer's text, citation labels
    and the cited items."""
    citations = tuple(str(c["label"]) for c in answer["citations"])
    by_label = {str(e["label"]): e for e in evidence}
    cited = tuple(
        CitedEvidence(
            label=label,
            title=str(by_label[label]["title"]),
            text=str(by_label[label]["text"]),
            access_scopes=tuple(by_label[label]["access_scopes"]),
        )
        for label in citations
    )
    return JudgeItem(
        case_digest=case.digest,
        question=case.query,
        required_facts=case.required_facts,
        answer_text=str(answer["answer"] or ""),
        citations=citations,
        cited_evidence=cited,
    )


def abstained_metrics(case: Case) -> dict[str, float]:
    """An answerable case the answer abstained on, by rule (module docstring)."""
    metrics = {"answer_label": 0.0, "label_fail_rate": 1.0, "label_substantial_rate": 0.0}
    metrics["label_authoritative_rate"] = 0.0
    if case.required_facts:
        metrics["required_fact_recall"] = 0.0
    return metrics


def _verdict_metrics(label: str, stated: int, n_facts: int, grounded: bool) -> dict[str, float]:
    score = LABELS.index(label)
    metrics = {
        "answer_label": float(score),
        "label_fail_rate": float(score == 0),
        "label_substantial_rate": float(score >= 2),
        "label_authoritative_rate": float(score == 3),
    }
    if n_facts:
        metrics["required_fact_recall"] = stated / n_facts
    return {**metrics, "groundedness_rate": float(grounded), "judge_failure_rate": 0.0}


def outcome_metrics(outcome: JudgeOutcome) -> dict[str, float]:
    """One judged (or failed) answer's metrics (module docstring)."""
    if outcome.status != "judged" or outcome.verdict is None:
        return {"judge_failure_rate": 1.0}
    v = outcome.verdict
    return _verdict_metrics(v.label, v.stated, outcome.n_facts, v.grounded)


def trace_entry(item: JudgeItem, outcome: JudgeOutcome) -> dict[str, Any]:
    """The ``judge`` entry of a cell's trace description (module docstring)."""
    return {
        "status": outcome.status,
        "key": outcome.key,
        "kind": outcome.kind,
        "detail": outcome.detail,
        "message": outcome.message,
        "item": item.model_dump(mode="json"),
        "evidence": outcome.evidence,
        "verdict": None if outcome.verdict is None else outcome.verdict.model_dump(mode="json"),
    }


def judge_cells(items: Sequence[tuple[JudgeItem, dict[str, Any], dict[str, Any] | None]], judging: Judging) -> None:
    """Judge ``items`` — ``(item, record payload, trace description)`` of each answered cell of a
    group — in one step run, adding each one's metrics, ``judge_outcome``, ``judge_usage`` and
    (a verdict from the cache) ``judge_cached`` to its record and description and its ``judge``
    entry to the description. Raises ``BudgetExhausted`` (the group stays open: resuming runs it
    again, its answers reused (``runner.pending_answers``), judged calls cached)."""
    if not items:
        return
    run = judge_answers(
        judging.spec,
        [item for item, _, _ in items],
        judging.cache_root,
        judging.policy,
        judging.prices,
        budget=judging.budget,
        api_key=judging.api_key,
    )
    for (item, payload, described), outcome in zip(items, run.outcomes, strict=True):
        usage = (outcome.evidence or {}).get("usage")
        added = {"judge_outcome": outcome.status, "judge_usage": usage}
        if outcome.cached:  # only then: a cold run's records stay as they were
            added["judge_cached"] = True
        payload["metrics"] = {**payload["metrics"], **outcome_metrics(outcome)}
        payload.update(added)
        if described is not None:
            described["metrics"] = payload["metrics"]
            described.update(added)
            # as ASCII JSON text: the call's evidence is kept exactly (a canonical trace holds only
            # NFC strings, and a model's reply need not be one)
            described["judge"] = json.dumps(trace_entry(item, outcome), ensure_ascii=True, sort_keys=True)


class JudgeCheckError(ValueError):
    """A judged cell's evidence does not give its claimed outcome; ``str(e)`` is the rule."""


def recompute_judge(
    spec: JudgeSpec,
    case: Case,
    answer: Mapping[str, Any],
    cited_scopes: Sequence[tuple[str, ...]],
    entry: object,
    outcome: object,
    recorded_digest: object,
) -> dict[str, float]:
    """The judge metrics of one cell, rebuilt from its trace entry (module docstring);
    ``cited_scopes``: the access scopes of the cited rows the trace shows, in citation order (what
    decides whether the item could be sent); ``recorded_digest``: the record's ``answer_digest``
    (the answer the cell judged); ``JudgeCheckError`` when the evidence does not hold."""
    if case.answerability != "answerable":
        if entry is not None or outcome is not None or recorded_digest is not None:
            raise JudgeCheckError("an unanswerable case is never judged")
        return {}
    if answer["abstained"]:
        if entry is not None or outcome is not None or recorded_digest is not None:
            raise JudgeCheckError("an abstention is not judged (its label is 0_FAIL by rule)")
        return abstained_metrics(case)
    try:
        entry = load_json(entry, "judge") if isinstance(entry, str) else None
    except ValueError as exc:
        raise JudgeCheckError(f"the trace's judge entry is not JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(entry, dict) or entry.get("status") != outcome:
        raise JudgeCheckError("the trace records no judge outcome matching the record's")
    try:
        item = JudgeItem.model_validate(entry["item"])
    except (KeyError, ValueError) as exc:
        raise JudgeCheckError(f"the judged item is malformed ({type(exc).__name__})") from None
    cited = [str(c["label"]) for c in answer["citations"]]
    if list(item.citations) != cited or item.case_digest != case.digest:
        raise JudgeCheckError("the judged item is not this cell's case and answer")
    if [tuple(sorted(e.access_scopes)) for e in item.cited_evidence] != [tuple(sorted(s)) for s in cited_scopes]:
        raise JudgeCheckError("the judged item's cited scopes are not the cited rows' the trace shows")
    try:
        digest = item.answer_digest
    except ValueError as exc:
        raise JudgeCheckError(f"the judged item's evidence is not its citations ({exc})") from None
    if digest != recorded_digest:
        raise JudgeCheckError("the judged answer is not this cell's: its digest is not the record's answer_digest")
    key = judge_key(spec, case.digest, digest)
    if entry.get("key") != key or item.question != case.query or item.required_facts != case.required_facts:
        raise JudgeCheckError("the judge key does not rebuild from the spec, the case and the item")
    if outcome == "withheld":
        if withheld_reason(spec, item) is None:
            raise JudgeCheckError("recorded withheld, but the disclosure policy lets the item be sent")
        return {"judge_failure_rate": 1.0}
    evidence = entry.get("evidence")
    if evidence is None:
        # a call that failed without a reply to keep (provider errors; a reply that was no text)
        if outcome not in ("provider", "invalid_output"):
            raise JudgeCheckError(f"a {outcome} outcome keeps the call's evidence")
        return {"judge_failure_rate": 1.0}
    try:
        check_call_reply(evidence)
        request = ChatRequest.model_validate(evidence["request"])
    except (KeyError, TypeError, ValueError) as exc:
        raise JudgeCheckError(f"the call's evidence is malformed ({type(exc).__name__})") from None
    expected = judge_request(
        spec, item.question, item.required_facts, item.answer_text, item.citations, item.cited_evidence
    )
    if request.digest != expected.digest:
        raise JudgeCheckError("the recorded request is not the one the spec, the case and the answer make")
    if refusal(evidence["response"]) is not None:
        if outcome != "refused":
            raise JudgeCheckError(f"recorded {outcome}, but the response is a refusal")
        return {"judge_failure_rate": 1.0}
    if outcome == "refused":
        raise JudgeCheckError("recorded refused, but the response is no refusal")
    try:
        verdict = parse_verdict(evidence["content"], len(item.required_facts), item.citations)
    except InvalidVerdict:
        if outcome != "invalid_output":
            raise JudgeCheckError(f"recorded {outcome}, but the reply is not a verdict") from None
        return {"judge_failure_rate": 1.0}
    if outcome != "judged":
        raise JudgeCheckError(f"recorded {outcome}, but the reply is a verdict")
    if entry.get("verdict") != verdict.model_dump(mode="json"):
        raise JudgeCheckError("the recorded verdict is not what the reply says")
    return _verdict_metrics(verdict.label, verdict.stated, len(item.required_facts), verdict.grounded)


def require_priced(spec: JudgeSpec, prices: PriceTable, budget_micros: int | None, setting: str) -> None:
    """A judge budget can be kept only for a model the price table prices: ``ValueError``
    ``<setting>: the judge's model '<model>' has no price …`` otherwise (no budget: nothing to keep)."""
    if budget_micros is not None and prices.price(spec.model) is None:
        raise ValueError(
            f"{setting}: the judge's model {spec.model!r} has no price in the price table "
            "(ragpipe/specs/prices.yaml or $RAGPIPE_PRICES), so no budget can be kept"
        )


def judging_for(
    spec: JudgeSpec,
    home: Path,
    budget_micros: int | None = None,
    concurrency: int = 4,
    *,
    budget_setting: str = "--judge-budget-micros",
    concurrency_setting: str = "--judge-concurrency",
) -> Judging:
    """How one invocation reaches ``spec``'s judge: the judge cache of the workspace at ``home``
    (``generation_cache/judge``), the price table, ``concurrency`` calls at once, retries of
    transient failures, and one budget of ``budget_micros`` for all of it (None: no bound).
    Refused with ``ValueError`` naming ``budget_setting`` / ``concurrency_setting`` (the CLI's
    options, or a pipeline spec's fields) before anything is called or written."""
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.work.usage import load_prices

    if budget_micros is not None and budget_micros < 0:
        raise ValueError(f"{budget_setting} must be >= 0, got {budget_micros}")
    if not 1 <= concurrency <= 64:
        raise ValueError(f"{concurrency_setting} must be 1 to 64, got {concurrency}")
    prices = load_prices()
    require_priced(spec, prices, budget_micros, budget_setting)
    return Judging(
        spec=spec,
        cache_root=Workspace(home).generation_cache / "judge",
        policy=ExecutionPolicy(concurrency=concurrency),
        prices=prices,
        budget=None if budget_micros is None else Budget(budget_micros),
    )
