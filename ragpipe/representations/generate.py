"""Generated representations: an LLM writes a chunk's questions (doc2query) or its summary.

A generated text is *evidence of a call*, not something a verifier can re-derive: what the bundle
keeps, per chunk and kind, is the exact request (``ChatRequest``; its digest is the cache key's
input), the model's reply as litellm returned it, and whether the reply met the kind's output
contract (``ragpipe.representations.generations`` records and verifies these).

The request is fixed by the spec: a system message — the prompt's text, a blank line, then the
contract's instruction (the reply's JSON form, the count, the length limit) — and a user message
with the document's title and the chunk's text. Output contracts:

* ``ragpipe.questions/v1``: a JSON object ``{"questions": [...]}`` of exactly ``n`` distinct,
  non-empty strings of at most ``max_chars`` characters each; the representation's text is the
  questions, one per line, stripped.
* ``ragpipe.summary/v1``: ``{"summary": "..."}``, non-empty, at most ``max_chars``; its text is the
  summary, stripped.

A reply that breaks its contract is an ``invalid_output`` failure (``InvalidOutput`` names the
rule): it is counted, shown and recorded as evidence, and never becomes a representation. Either
way the answer cites the parent chunk's bytes, never this text.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragpipe.spec import GeneratedKindSpec, GenerationExecution
from ragpipe.work.chat import ChatMessage, ChatRequest, complete, reply_json, worst_cost_micros
from ragpipe.work.failures import StepFailure
from ragpipe.work.keys import step_key
from ragpipe.work.runner import Done
from ragpipe.work.usage import PriceTable, Usage

GENERATION_STEP_VERSION = 1
_INSTRUCTIONS = {
    "questions": 'Reply with a JSON object {{"questions": [...]}} holding exactly {n} distinct questions, '
    "each at most {max_chars} characters.",
    "summary": 'Reply with a JSON object {{"summary": "..."}}: one summary of at most {max_chars} characters.',
}


class InvalidOutput(ValueError):
    """A reply that breaks its kind's output contract; ``str(e)`` is the rule."""


def instruction(kind: str, spec: GeneratedKindSpec) -> str:
    return _INSTRUCTIONS[kind].format(n=spec.n, max_chars=spec.max_chars)


def generation_input(title: str, chunk_text: str) -> str:
    return f"Title: {title}\n\n{chunk_text}" if title else chunk_text


def chat_request(
    kind: str, spec: GeneratedKindSpec, title: str, chunk_text: str, prompt_text: str | None = None
) -> ChatRequest:
    """The request for one chunk (module docstring). ``prompt_text`` defaults to the spec's."""
    prompt = prompt_text if prompt_text is not None else spec.prompt_text
    if prompt is None:
        raise ValueError(f"generated kind {kind}: the spec carries no prompt text (a spec read back from a record)")
    system = prompt + "\n\n" + instruction(kind, spec)
    return ChatRequest(
        model=spec.model,
        messages=(
            ChatMessage(role="system", content=system),
            ChatMessage(role="user", content=generation_input(title, chunk_text)),
        ),
        temperature=spec.temperature,
        max_tokens=spec.max_tokens,
        seed=spec.seed,
        response_format="json_object",
    )


def prompt_of(kind: str, spec: GeneratedKindSpec, request: ChatRequest) -> str | None:
    """The prompt text a request was built from (its system message without the instruction)."""
    suffix = "\n\n" + instruction(kind, spec)
    system = request.messages[0].content if request.messages else ""
    return system[: -len(suffix)] if system.endswith(suffix) else None


def generation_key(kind: str, spec: GeneratedKindSpec, request: ChatRequest) -> str:
    """The step key: the request's digest (model, prompt, parameters, text), the contract and the
    endpoint that answers (a spec recorded before endpoints entered it has none: its keys stay)."""
    value = {"request": request.digest, "contract": spec.contract}
    if spec.endpoint is not None:
        value["endpoint"] = spec.endpoint
    return step_key(f"generate.{kind}", GENERATION_STEP_VERSION, value)


def parse_reply(kind: str, spec: GeneratedKindSpec, content: str) -> str:
    """The representation text of a reply, or ``InvalidOutput`` naming the broken rule."""
    try:
        obj = reply_json(content)
    except ValueError as exc:
        raise InvalidOutput(str(exc)) from None
    field = "questions" if kind == "questions" else "summary"
    if not isinstance(obj, dict) or set(obj) != {field}:
        raise InvalidOutput(f"reply must be an object with exactly the key {field!r}")
    items = obj[field] if kind == "questions" else [obj[field]]
    if not isinstance(items, list) or not all(isinstance(q, str) for q in items):
        raise InvalidOutput(f"{field} must be {'a list of strings' if kind == 'questions' else 'a string'}")
    items = [" ".join(q.split()) for q in items]
    if len(items) != spec.n:
        raise InvalidOutput(f"{len(items)} {field} for the {spec.n} asked")
    for i, q in enumerate(items):
        if not q:
            raise InvalidOutput(f"{field} {i + 1} is empty")
        if len(q) > spec.max_chars:
            raise InvalidOutput(f"{field} {i + 1} has {len(q)} characters, more than {spec.max_chars}")
    if len(set(items)) != len(items):
        raise InvalidOutput(f"{field} repeat one another")
    return "\n".join(items)


@dataclass(frozen=True)
class GenerationInput:
    kind: str
    spec: GeneratedKindSpec
    request: ChatRequest


def call_value(request: ChatRequest, content: str, response: dict, usage: Usage) -> dict:
    """What the cache keeps of one call: the request, the reply (text and litellm's response), its usage."""
    return {"request": request.body(), "content": content, "response": response, "usage": usage.model_dump()}


def check_call_reply(value: dict) -> None:
    """A cached ``call_value``'s reply checked: its usage well-formed, its reply a text and its
    response a chat completion whose message is that text; ``ValueError`` (pydantic's
    ``ValidationError`` is one) naming what is wrong."""
    Usage.model_validate(value["usage"])
    if not isinstance(value["content"], str) or not isinstance(value["response"], dict):
        raise ValueError("its reply is not a text and a response object")
    try:
        message = value["response"]["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise ValueError("its response is not a chat completion") from None
    if message != value["content"]:
        raise ValueError("its reply text is not its response's message")


class GenerationStep:
    """The step for one generated kind (``ragpipe.work.runner.Step``): one call per item."""

    def __init__(self, kind: str, spec: GeneratedKindSpec, execution: GenerationExecution, prices: PriceTable):
        self.name = f"generate.{kind}"
        self.kind, self.spec, self.execution, self.prices = kind, spec, execution, prices

    def compute(self, inputs: list[GenerationInput]) -> list[Done[dict] | StepFailure]:
        out: list[Done[dict] | StepFailure] = []
        for item in inputs:
            try:
                reply = complete(
                    item.request,
                    api_base=self.execution.api_base,
                    api_key=None,
                    timeout=self.execution.timeout_seconds,
                    prices=self.prices,
                )
            except StepFailure as failure:
                out.append(failure)
                continue
            try:
                reply.content.encode("utf-8")  # a lone surrogate (a JSON escape) is no text
                value = call_value(item.request, reply.content, reply.response, reply.usage)
                parse_reply(self.kind, self.spec, reply.content)
            except UnicodeEncodeError:
                message = "reply is not valid Unicode text (an unpaired surrogate)"
                out.append(StepFailure("invalid_output", message, usage=reply.usage))
                continue
            except InvalidOutput as exc:
                out.append(StepFailure("invalid_output", str(exc), usage=reply.usage, evidence=value))
                continue
            out.append(Done(value, reply.usage))
        return out

    def worst_cost(self, inputs: list[GenerationInput]) -> int | None:
        """An upper bound on one attempt: every byte of the messages a token, plus framing, and
        ``max_tokens`` of output (None when the model has no price)."""
        total = 0
        for item in inputs:
            cost = worst_cost_micros(item.request, self.prices)
            if cost is None:
                return None
            total += cost
        return total
