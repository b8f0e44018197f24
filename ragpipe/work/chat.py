"""The litellm adapter: the only module that imports litellm.

``complete`` sends one chat request to any provider litellm reaches and returns the reply's text,
litellm's response (the provider's reply in OpenAI form) and the call's ``Usage``; every provider
error becomes a ``StepFailure`` of a typed kind: 429 → ``rate_limited`` (with the server's
``Retry-After``), a timeout → ``timeout``, 5xx, an unreachable server, a body that is not JSON or
stops half-way → ``server_error``, any other refusal (4xx) → ``client_error``. litellm's own
retries are off: retrying is the step runner's job (``ragpipe.work.runner``), under its policy.
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import time
from typing import Literal

from pydantic import Field

from ragpipe.kernel.ids import domain_digest
from ragpipe.kernel.models import FrozenModel
from ragpipe.kernel.settings import current_settings
from ragpipe.work.entries import value_bytes
from ragpipe.work.failures import StepFailure
from ragpipe.work.usage import PriceTable, Usage


class ChatMessage(FrozenModel):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(FrozenModel):
    """Exactly what is asked of the model (everything that can change its reply)."""

    model: str = Field(min_length=1)
    messages: tuple[ChatMessage, ...]
    temperature: float = Field(ge=0, le=2)
    max_tokens: int = Field(ge=1)
    seed: int | None = None
    response_format: Literal["json_object"] | None = None

    def body(self) -> dict:
        return self.model_dump(mode="json")

    @property
    def digest(self) -> str:
        """``sha256:…`` of the request's exact JSON bytes (module ``entries.value_bytes``), domain
        ``chat-request``: the text is bound byte for byte, never normalised."""
        return domain_digest("chat-request", 1, value_bytes(self.body()))


class ChatReply(FrozenModel):
    content: str
    response: dict  # litellm's response object as JSON (OpenAI chat-completion form)
    usage: Usage


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def reply_body(content: str) -> str:
    """The JSON text of a model's reply: stripped, and without one Markdown code fence around it."""
    text = content.strip()
    if m := _FENCE.match(text):
        text = m.group(1)
    return text


def reply_json(content: str) -> object:
    """The JSON value of a model's reply (a Markdown code fence around it is allowed);
    ``ValueError`` ``reply is not JSON (<problem> at column <c>)`` otherwise."""
    text = reply_body(content)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"reply is not JSON ({exc.msg} at column {exc.colno})") from None


# A worst case per message for the budget: a token is at least one byte of text, plus framing.
_FRAMING_TOKENS = 16


def worst_cost_micros(request: ChatRequest, prices: PriceTable) -> int | None:
    """An upper bound on what one call with ``request`` costs: every byte of its messages a token,
    plus framing per message, and ``max_tokens`` of output (None when the model has no price)."""
    tokens_in = sum(len(m.content.encode("utf-8")) + _FRAMING_TOKENS for m in request.messages)
    return prices.cost_micros(request.model, tokens_in, request.max_tokens)


def _retry_after(exc: BaseException) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # unreadable: the policy's own backoff applies
    return max(0.0, when.timestamp() - time.time()) if when.tzinfo is not None else None


def _caused_by_connection_failure(exc: BaseException) -> bool:
    """litellm reports a refused connection as InternalServerError(500); the cause chain tells."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionError) or type(seen).__name__ in ("ConnectError", "APIConnectionError"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def provider_failure(exc: Exception, litellm) -> StepFailure:
    """The typed failure of a litellm exception (module docstring); the embedding adapter
    (``ragpipe.work.embed``) maps its errors with it too."""
    if isinstance(exc, litellm.RateLimitError):
        return StepFailure("rate_limited", _short(exc), detail="http_error:429", retry_after=_retry_after(exc))
    if isinstance(exc, litellm.Timeout):
        return StepFailure("timeout", _short(exc), detail="timeout")
    if isinstance(exc, litellm.APIConnectionError) or _caused_by_connection_failure(exc):
        return StepFailure("server_error", _short(exc), detail="connection_error")
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and status >= 500:
        return StepFailure("server_error", _short(exc), detail=f"http_error:{status}")
    return StepFailure("client_error", _short(exc), detail=f"http_error:{status}" if status else type(exc).__name__)


def provider_of(model: str) -> str:
    """The provider litellm routes ``model`` to (``openai``, ``ollama``…), from its prefix."""
    return model.split("/", 1)[0] if "/" in model else "openai"


def llm_api_key() -> str | None:
    """``RAGPIPE_LLM_API_KEY`` (``current_settings().llm_api_key``), None when unset."""
    key = current_settings().llm_api_key
    return None if key is None else key.get_secret_value()


def litellm_module():
    """litellm, imported offline: it never fetches its cost map, never prints its banner. The one
    import of litellm (``ragpipe.work.embed`` calls it through this too)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch the cost map
    import litellm

    litellm.suppress_debug_info = True  # its "Give Feedback" banner would reach the user's terminal
    return litellm


def complete(
    request: ChatRequest, *, api_base: str | None, api_key: str | None, timeout: float, prices: PriceTable
) -> ChatReply:
    """One call (module docstring). Raises ``StepFailure``; never any other provider exception."""
    litellm = litellm_module()
    start = time.perf_counter()
    try:
        response = litellm.completion(
            model=request.model,
            messages=[m.model_dump() for m in request.messages],
            api_base=api_base,
            api_key=api_key or llm_api_key() or "no-key",
            temperature=request.temperature,
            seed=request.seed,
            max_tokens=request.max_tokens,
            timeout=timeout,
            response_format={"type": request.response_format} if request.response_format else None,
            num_retries=0,
            max_retries=0,
        )
    except Exception as exc:  # every provider error becomes a typed failure, never a crash
        raise provider_failure(exc, litellm) from None
    latency_ms = round((time.perf_counter() - start) * 1000)
    usage_obj = getattr(response, "usage", None)
    input_tokens = getattr(usage_obj, "prompt_tokens", None)
    output_tokens = getattr(usage_obj, "completion_tokens", None)
    # litellm fills in a zero usage when the provider reported none; every request sends a
    # prompt, so 0 input tokens means "not reported" — unknown, never a free call
    metered = isinstance(input_tokens, int) and isinstance(output_tokens, int) and input_tokens > 0
    usage = Usage(
        provider=provider_of(request.model),
        model=request.model,
        input_tokens=input_tokens if metered else 0,
        output_tokens=output_tokens if metered else 0,
        latency_ms=latency_ms,
        # a reply without token counts has an unknown cost, never a zero one
        cost_micros=prices.cost_micros(request.model, input_tokens, output_tokens) if metered else None,
    )
    choices = getattr(response, "choices", None) or []
    content = (choices[0].message.content if choices else None) or ""
    return ChatReply(content=content, response=response.model_dump(mode="json"), usage=usage)
