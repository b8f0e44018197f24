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
endpoint. The call, its cache and its checks are ``ragpipe.evaluation.contract_calls``'s: only
judged calls are cached, and a cached value must rebuild its key, hold exactly the request this run
would send and parse as a verdict — else it is set aside and asked again. A judged outcome is
``cached`` unless this invocation's provider call produced it (a hit before admission, a value a
concurrent run committed while this one waited, or a second item with the key of one judged
earlier in the same invocation): only the others were paid for here. A budget stop
(``BudgetExhausted``) leaves every judged call cached: the next run with budget left judges only
the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from ragpipe.evaluation.contract_calls import ContractCall, ContractStep, failure_status, run_calls
from ragpipe.evaluation.judge import CitedEvidence, Verdict, answer_digest, judge_request, parse_verdict
from ragpipe.evaluation.judge_spec import JudgeSpec
from ragpipe.kernel.models import FrozenModel
from ragpipe.work.admission import Budget
from ragpipe.work.failures import StepFailure
from ragpipe.work.keys import step_key
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.runner import Done, StepReport
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

    @property
    def answer_digest(self) -> str:
        """``judge.answer_digest`` of the answer judged (what the key binds besides the case);
        ``ValueError`` when the cited evidence is not the citations'."""
        return answer_digest(self.answer_text, self.citations, self.cited_evidence)


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
    cached: bool = False  # a judged verdict no provider call of this invocation produced


@dataclass(frozen=True)
class JudgeRun:
    outcomes: list[JudgeOutcome]  # one per item, in item order
    report: StepReport | None  # None when every item was withheld (no step ran)


@dataclass(frozen=True)
class JudgeInput(ContractCall):
    """What the step needs for one key: the inputs the key covers, the request, and what the
    verdict is checked against."""

    n_facts: int
    cited_labels: tuple[str, ...]

    def parse(self, content: str) -> Verdict:
        return parse_verdict(content, self.n_facts, self.cited_labels)


def key_inputs(spec: JudgeSpec, case_digest: str, answer: str) -> dict:
    return {"judge_spec": spec.spec_id, "case": case_digest, "answer": answer, "endpoint": spec.endpoint}


def judge_key(spec: JudgeSpec, case_digest: str, answer: str) -> str:
    """The step key of judging ``answer`` (an ``answer_digest``) for a case (module docstring)."""
    return step_key(JUDGE_STEP, JUDGE_STEP_VERSION, key_inputs(spec, case_digest, answer))


def judge_input(spec: JudgeSpec, item: JudgeItem) -> tuple[str, JudgeInput]:
    """The key and step input of one item."""
    inputs = key_inputs(spec, item.case_digest, item.answer_digest)
    request = judge_request(
        spec, item.question, item.required_facts, item.answer_text, item.citations, item.cited_evidence
    )
    key = step_key(JUDGE_STEP, JUDGE_STEP_VERSION, inputs)
    return key, JudgeInput(inputs, request, len(item.required_facts), item.citations)


class JudgeStep(ContractStep):
    """The judging step (``ragpipe.evaluation.contract_calls.ContractStep``): one call per item."""

    def __init__(self, spec: JudgeSpec, prices: PriceTable, api_key: str | None = None):
        super().__init__(
            JUDGE_STEP, "execution.judging.budget_micros", spec.api_base, spec.timeout_seconds, prices, api_key
        )
        self.spec = spec
        self.called: set[str] = set()  # keys whose value a call of this step produced (the rest: cached)
        self._lock = threading.Lock()  # batches may compute on several threads

    def compute(self, inputs: list[ContractCall]) -> list[Done[dict] | StepFailure]:
        outcomes = super().compute(inputs)
        produced = {
            step_key(JUDGE_STEP, JUDGE_STEP_VERSION, item.key_inputs)
            for item, outcome in zip(inputs, outcomes, strict=True)
            if isinstance(outcome, Done)
        }
        with self._lock:
            self.called |= produced
        return outcomes


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
    step = JudgeStep(spec, prices, api_key)
    results = run_calls(step, JUDGE_STEP_VERSION, "a verdict", sent, cache_root, policy, budget)
    outcomes = []
    paid: set[str] = set()  # keys whose call is already counted for an earlier item
    for i, (item, key, inp) in enumerate(keyed):
        n = inp.n_facts
        if i in withheld:
            outcomes.append(
                JudgeOutcome(
                    item.case_digest, key, "withheld", n, kind="withheld", detail="withheld", message=withheld[i]
                )
            )
        elif key in results.values:
            value, cached = results.values[key], key not in step.called or key in paid
            paid.add(key)
            verdict = inp.parse(value["content"])
            outcomes.append(JudgeOutcome(item.case_digest, key, "judged", n, verdict, evidence=value, cached=cached))
        else:
            f = results.failures[key]
            outcomes.append(
                JudgeOutcome(
                    item.case_digest,
                    key,
                    failure_status(f.kind),  # type: ignore[arg-type]
                    n,
                    kind=f.kind,
                    detail=f.detail,
                    message=f.message,
                    evidence=f.evidence,
                )
            )
    return JudgeRun(outcomes, results.report)
