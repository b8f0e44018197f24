"""One model call per item under a reply contract, on the step machinery (``ragpipe.work.runner``).

What the answer judge (``judge_step``) and the case drafter (``drafting``) share: each item is a
``ContractCall`` — the inputs its step key covers, the exact ``ChatRequest`` and the contract its
reply must meet (``parse``: the reply's meaning, or ``ValueError`` naming the broken rule). A call
ends as one of:

* a value — the reply met the contract; the cache keeps ``{inputs, request, content, response,
  usage}`` (``representations.generate.call_value``);
* ``refused`` — the model declined (``message.refusal``) or the provider filtered the reply
  (``finish_reason: content_filter``);
* ``invalid_output`` — a reply that breaks the contract, or is no Unicode text (the reply is kept
  as evidence when it is text);
* ``provider`` — the call failed after its attempts (``kind``: timeout, rate_limited,
  server_error, client_error — ``ragpipe.work.chat.provider_failure``).

Only values are cached (``JsonEntryStore`` under ``cache_root``, ``KeyLeases`` in
``cache_root/leases``): a failure is asked again next time. On load a cached value must rebuild its
key from its inputs, hold exactly the request this run would send for that key, have its
response's message as its reply and meet the contract again — else it is set aside and asked again.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragpipe.kernel.strict_load import StrictLoadError, load_json
from ragpipe.representations.generate import call_value, check_call_reply
from ragpipe.work.admission import Budget
from ragpipe.work.chat import ChatRequest, complete, reply_body, worst_cost_micros
from ragpipe.work.entries import JsonEntryStore
from ragpipe.work.failures import ItemFailure, StepFailure
from ragpipe.work.keys import step_key
from ragpipe.work.leases import KeyLeases
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.runner import Done, StepReport, run_step
from ragpipe.work.usage import PriceTable

CALL_FIELDS = {"inputs", "request", "content", "response", "usage"}


@dataclass(frozen=True)
class ContractCall(ABC):
    """One item: the inputs its key covers and the request. Abstract: each contract (the judge's
    ``JudgeInput``, the drafter's ``DraftInput``) is a subclass defining ``parse``."""

    key_inputs: dict
    request: ChatRequest

    @abstractmethod
    def parse(self, content: str) -> object:
        """The reply's meaning under the contract; ``ValueError`` naming the first broken rule."""


def contract_json(reply: str, max_chars: int, error: type[ValueError]) -> object:
    """The JSON value of a reply, read as every contract reads it, or ``error`` in one line:

    * a reply longer than ``max_chars`` is refused before it is parsed;
    * one Markdown code fence around the JSON is accepted (``work.chat.reply_body``); text before
      or after it, or two objects, is not JSON;
    * strictly (``kernel.strict_load.load_json``): a key given twice, ``NaN`` or nesting deeper
      than 64 levels is refused, never resolved by the parser's choice;
    * lone surrogates (as a JSON escape or in the text) are refused: a reply is Unicode text,
      recorded and hashed as UTF-8."""
    if len(reply) > max_chars:
        raise error(f"reply has {len(reply)} characters, more than {max_chars}")
    try:
        value = load_json(reply_body(reply), "reply")
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # lone surrogates, escaped or raw
    except UnicodeEncodeError:
        raise error("reply is not valid Unicode text (an unpaired surrogate)") from None
    except StrictLoadError as exc:
        raise error(f"reply is not JSON ({exc.rule})") from None
    return value


def refusal(response: dict) -> tuple[str, str] | None:
    """``(detail, message)`` when the response is a refusal or a filtered reply."""
    try:
        choice = response["choices"][0]
    except (KeyError, IndexError, TypeError):
        return None
    refused = (choice.get("message") or {}).get("refusal")
    if refused:
        return "refusal", f"the model refused: {' '.join(str(refused).split())[:200]}"
    if choice.get("finish_reason") == "content_filter":
        return "content_filter", "the provider filtered the reply (finish_reason content_filter)"
    return None


def failure_status(kind: str) -> str:
    """The outcome status of a failure kind: ``invalid_output`` and ``refused`` as they are, any
    other kind a ``provider`` failure."""
    return kind if kind in ("invalid_output", "refused") else "provider"


class ContractStep:
    """A step (``ragpipe.work.runner.Step``) making one call per ``ContractCall``."""

    def __init__(
        self,
        name: str,
        budget_setting: str,
        api_base: str | None,
        timeout_seconds: float,
        prices: PriceTable,
        api_key: str | None = None,
    ):
        self.name, self.budget_setting = name, budget_setting
        self.api_base, self.timeout_seconds, self.prices, self.api_key = api_base, timeout_seconds, prices, api_key

    def compute(self, inputs: list[ContractCall]) -> list[Done[dict] | StepFailure]:
        return [self._one(item) for item in inputs]

    def _one(self, item: ContractCall) -> Done[dict] | StepFailure:
        try:
            reply = complete(
                item.request,
                api_base=self.api_base,
                api_key=self.api_key,
                timeout=self.timeout_seconds,
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
        if (refused := refusal(reply.response)) is not None:
            return StepFailure("refused", refused[1], detail=refused[0], usage=reply.usage, evidence=value)
        try:
            item.parse(reply.content)
        except ValueError as exc:
            return StepFailure("invalid_output", str(exc), usage=reply.usage, evidence=value)
        return Done(value, reply.usage)

    def worst_cost(self, inputs: list[ContractCall]) -> int | None:
        costs = [worst_cost_micros(item.request, self.prices) for item in inputs]
        return None if any(c is None for c in costs) else sum(costs)  # type: ignore[misc]


def value_check(step: str, version: int, what: str, expected: Mapping[str, ContractCall]):
    """The store's check of a cached value (module docstring); ``ValueError`` refuses it. ``what``
    names the contract's meaning in the message (``a verdict``)."""

    def check(key: str, value: object) -> None:
        if not isinstance(value, dict) or set(value) != CALL_FIELDS:
            raise ValueError(f"is not a {step} call (inputs, request, content, response, usage)")
        if step_key(step, version, value["inputs"]) != key:
            raise ValueError("its inputs do not make its key")
        item = expected.get(key)
        if item is None or ChatRequest.model_validate(value["request"]).digest != item.request.digest:
            raise ValueError("holds the reply to another request than its key's")
        check_call_reply(value)
        try:
            item.parse(value["content"])
        except ValueError as exc:
            raise ValueError(f"its reply is not {what}: {exc}") from None

    return check


@dataclass(frozen=True)
class CallResults:
    values: dict[str, dict]  # key → cached call value, for every call that met the contract
    failures: dict[str, ItemFailure]  # key → how the call failed
    report: StepReport | None  # None when nothing was sent (no step ran)


def run_calls(
    step: ContractStep,
    version: int,
    what: str,
    sent: Sequence[tuple[str, ContractCall]],
    cache_root: Path,
    policy: ExecutionPolicy,
    budget: Budget | None = None,
) -> CallResults:
    """Run ``sent`` (key, call) through ``step`` with the cache and leases under ``cache_root``.
    Raises ``BudgetExhausted`` (values stay cached) or ``BudgetUnenforceable``."""
    if not sent:
        return CallResults({}, {}, None)
    values, report = run_step(
        step,
        list(sent),
        JsonEntryStore(cache_root, f"{step.name} cache", value_check(step.name, version, what, dict(sent))),
        policy,
        leases=KeyLeases(cache_root / "leases"),
        budget=budget,
    )
    return CallResults(values, {f.key: f for f in report.failures}, report)
