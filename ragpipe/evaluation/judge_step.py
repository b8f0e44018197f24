"""Judging answers on the step machinery: one judge call per answer, cached, leased, budgeted.

``judge_answers`` turns each ``JudgeItem`` (plain values: the case's digest, question and required
facts; the answer's text, citations and cited evidence) into exactly one ``JudgeOutcome``, in item
order. Outcomes (``status``), every one counted and none a label by default:

* ``withheld`` — a cited item's document has no scope the disclosure policy lets reach the judge's
  endpoint (``JudgeSpec.may_send``): nothing is sent, nothing is looked up;
* ``judged`` — the reply met the verdict contract (``ragpipe.evaluation.judge.parse_verdict``);
* ``invalid_output`` — a reply that breaks it (the reply is kept as evidence when it is text);
* ``refused`` — the model declined (``message.refusal`` set) or the provider filtered the reply
  (``finish_reason: content_filter``);
* ``provider`` — the call failed after its attempts: ``kind`` says how (``timeout``,
  ``rate_limited``, ``server_error`` — 5xx, unreachable, a body cut half-way — or
  ``client_error``), as ``ragpipe.work.chat.provider_failure`` types it.

The step key is ``step_key("judge", 1, {judge_spec, case, answer, endpoint})``: the judge spec ID
(model, prompt digest, rubric version, parameters, contract, endpoint, send scopes), the case
digest the caller passes, ``answer_digest`` (text, citations, cited payload digest) and the
endpoint. Only judged calls are cached (``JsonEntryStore`` under ``cache_root``, ``KeyLeases`` in
``cache_root/leases``): a failure is asked again next time. A cached value names its key's inputs
and the request, reply, response and usage of its call; on load it must rebuild its key, hold
exactly the request this run would send for that key, have its response's message as its reply
and parse as a verdict — else it is set aside and asked again. A budget stop
(``BudgetExhausted``) leaves every judged call cached: the next run with budget left judges only
the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from ragpipe.evaluation.judge import CitedEvidence, InvalidVerdict, Verdict, answer_digest, judge_request, parse_verdict
from ragpipe.evaluation.judge_spec import JudgeSpec
from ragpipe.kernel.models import FrozenModel
from ragpipe.representations.generate import call_value, check_call_reply
from ragpipe.work.admission import Budget
from ragpipe.work.chat import ChatRequest, complete, worst_cost_micros
from ragpipe.work.entries import JsonEntryStore
from ragpipe.work.failures import StepFailure
from ragpipe.work.keys import step_key
from ragpipe.work.leases import KeyLeases
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.runner import Done, StepReport, run_step
from ragpipe.work.usage import PriceTable

JUDGE_STEP = "judge"
JUDGE_STEP_VERSION = 1
Status = Literal["judged", "provider", "invalid_output", "refused", "withheld"]
STATUSES: tuple[str, ...] = ("judged", "provider", "invalid_output", "refused", "withheld")
FAILURE_STATUSES: tuple[str, ...] = STATUSES[1:]


class JudgeItem(FrozenModel):
    """One answer to judge, as plain values. ``case_digest`` names the case's content (its
    question and required facts included) as the caller identifies it; were it a bare case ID, an
    edited question or fact list would still not be served a stale verdict (a cached reply must
    answer exactly the request this run sends)."""

    case_digest: str = Field(min_length=1)
    question: str
    required_facts: tuple[str, ...]
    answer_text: str
    citations: tuple[str, ...]
    cited_evidence: tuple[CitedEvidence, ...]


@dataclass(frozen=True)
class JudgeOutcome:
    """What became of one item (module docstring). ``kind``/``detail``/``message`` describe a
    failure (``kind`` is the provider failure's kind, or the status itself); ``evidence`` is the
    call (request, content, response, usage) when there was a reply to keep."""

    case_digest: str
    key: str
    status: Status
    n_facts: int
    verdict: Verdict | None = None
    kind: str | None = None
    detail: str | None = None
    message: str | None = None
    evidence: dict | None = None


@dataclass(frozen=True)
class JudgeRun:
    outcomes: list[JudgeOutcome]  # one per item, in item order
    report: StepReport | None  # None when every item was withheld (no step ran)


@dataclass(frozen=True)
class JudgeInput:
    """What the step needs for one key: the inputs the key covers, the request, and what the
    verdict is checked against."""

    key_inputs: dict
    request: ChatRequest
    n_facts: int
    cited_labels: tuple[str, ...]


def key_inputs(spec: JudgeSpec, case_digest: str, answer: str) -> dict:
    return {"judge_spec": spec.spec_id, "case": case_digest, "answer": answer, "endpoint": spec.endpoint}


def judge_key(spec: JudgeSpec, case_digest: str, answer: str) -> str:
    """The step key of judging ``answer`` (an ``answer_digest``) for a case (module docstring)."""
    return step_key(JUDGE_STEP, JUDGE_STEP_VERSION, key_inputs(spec, case_digest, answer))


def judge_input(spec: JudgeSpec, item: JudgeItem) -> tuple[str, JudgeInput]:
    """The key and step input of one item."""
    inputs = key_inputs(spec, item.case_digest, answer_digest(item.answer_text, item.citations, item.cited_evidence))
    request = judge_request(
        spec, item.question, item.required_facts, item.answer_text, item.citations, item.cited_evidence
    )
    key = step_key(JUDGE_STEP, JUDGE_STEP_VERSION, inputs)
    return key, JudgeInput(inputs, request, len(item.required_facts), item.citations)


def refusal_of(response: dict) -> tuple[str, str] | None:
    """``(detail, message)`` when the response is a refusal or a filtered reply."""
    try:
        choice = response["choices"][0]
    except (KeyError, IndexError, TypeError):
        return None
    refusal = (choice.get("message") or {}).get("refusal")
    if refusal:
        return "refusal", f"the model refused: {' '.join(str(refusal).split())[:200]}"
    if choice.get("finish_reason") == "content_filter":
        return "content_filter", "the provider filtered the reply (finish_reason content_filter)"
    return None


class JudgeStep:
    """The judging step (``ragpipe.work.runner.Step``): one call per item."""

    name = JUDGE_STEP
    budget_setting = "execution.judging.budget_micros"

    def __init__(self, spec: JudgeSpec, prices: PriceTable, api_key: str | None = None):
        self.spec, self.prices, self.api_key = spec, prices, api_key

    def compute(self, inputs: list[JudgeInput]) -> list[Done[dict] | StepFailure]:
        return [self._one(item) for item in inputs]

    def _one(self, item: JudgeInput) -> Done[dict] | StepFailure:
        try:
            reply = complete(
                item.request,
                api_base=self.spec.api_base,
                api_key=self.api_key,
                timeout=self.spec.timeout_seconds,
                prices=self.prices,
            )
        except StepFailure as failure:
            return failure
        try:
            reply.content.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: no text to record
            message = "reply is not valid Unicode text (an unpaired surrogate)"
            return StepFailure("invalid_output", message, usage=reply.usage)
        value = {"inputs": item.key_inputs} | call_value(item.request, reply.content, reply.response, reply.usage)
        if (refused := refusal_of(reply.response)) is not None:
            return StepFailure("refused", refused[1], detail=refused[0], usage=reply.usage, evidence=value)
        try:
            parse_verdict(reply.content, item.n_facts, item.cited_labels)
        except InvalidVerdict as exc:
            return StepFailure("invalid_output", str(exc), usage=reply.usage, evidence=value)
        return Done(value, reply.usage)

    def worst_cost(self, inputs: list[JudgeInput]) -> int | None:
        costs = [worst_cost_micros(item.request, self.prices) for item in inputs]
        return None if any(c is None for c in costs) else sum(costs)  # type: ignore[misc]


def value_check(expected: Mapping[str, JudgeInput]):
    """The store's check of a cached value (module docstring); ``ValueError`` refuses it."""

    def check(key: str, value: object) -> None:
        if not isinstance(value, dict) or set(value) != {"inputs", "request", "content", "response", "usage"}:
            raise ValueError("is not a judged call (inputs, request, content, response, usage)")
        if step_key(JUDGE_STEP, JUDGE_STEP_VERSION, value["inputs"]) != key:
            raise ValueError("its inputs do not make its key")
        item = expected.get(key)
        if item is None or ChatRequest.model_validate(value["request"]).digest != item.request.digest:
            raise ValueError("holds the reply to another request than its key's")
        check_call_reply(value)
        try:
            parse_verdict(value["content"], item.n_facts, item.cited_labels)
        except InvalidVerdict as exc:
            raise ValueError(f"its reply is not a verdict: {exc}") from None

    return check


def withheld_reason(spec: JudgeSpec, item: JudgeItem) -> str | None:
    """Why ``item`` may not be sent to the judge, or None."""
    for evidence in item.cited_evidence:
        if not spec.may_send(evidence.access_scopes):
            return (
                f"cited evidence {evidence.label} (scopes {', '.join(evidence.access_scopes) or 'none'}) may not be "
                f"sent to {spec.endpoint} (it may receive {', '.join(spec.send_scopes)})"
            )
    return None


def judge_answers(
    spec: JudgeSpec,
    items: Sequence[JudgeItem],
    cache_root: Path,
    policy: ExecutionPolicy,
    prices: PriceTable,
    *,
    budget: Budget | None = None,
    api_key: str | None = None,
) -> JudgeRun:
    """One outcome per item (module docstring). Raises ``BudgetExhausted`` (judged calls stay
    cached) or ``BudgetUnenforceable`` (a budget and a model without a price)."""
    keyed = [(item, *judge_input(spec, item)) for item in items]
    withheld = {i: why for i, (item, _, _) in enumerate(keyed) if (why := withheld_reason(spec, item)) is not None}
    sent = [(key, inp) for i, (_, key, inp) in enumerate(keyed) if i not in withheld]
    values: dict[str, dict] = {}
    report = None
    if sent:
        values, report = run_step(
            JudgeStep(spec, prices, api_key),
            sent,
            JsonEntryStore(cache_root, "judge cache", value_check(dict(sent))),
            policy,
            leases=KeyLeases(cache_root / "leases"),
            budget=budget,
        )
    failures = {f.key: f for f in report.failures} if report is not None else {}
    outcomes = []
    for i, (item, key, inp) in enumerate(keyed):
        n = inp.n_facts
        if i in withheld:
            outcomes.append(
                JudgeOutcome(
                    item.case_digest, key, "withheld", n, kind="withheld", detail="withheld", message=withheld[i]
                )
            )
        elif key in values:
            verdict = parse_verdict(values[key]["content"], n, inp.cited_labels)
            outcomes.append(JudgeOutcome(item.case_digest, key, "judged", n, verdict=verdict, evidence=values[key]))
        else:
            f = failures[key]
            status = f.kind if f.kind in ("invalid_output", "refused") else "provider"
            outcomes.append(
                JudgeOutcome(
                    item.case_digest,
                    key,
                    status,
                    n,
                    kind=f.kind,
                    detail=f.detail,
                    message=f.message,
                    evidence=f.evidence,
                )  # type: ignore[arg-type]
            )
    return JudgeRun(outcomes, report)
