"""The litellm embedding adapter: one request embeds a batch of texts at a remote endpoint.

``embed_batch`` sends the texts to any embedding provider litellm reaches (OpenAI's
``/v1/embeddings`` and every server speaking it — vLLM, LM Studio, llama.cpp, Ollama's ``/v1`` —,
Ollama's own ``/api/embed``, …) and returns the vectors as float32 in input order with the call's
``Usage``. Nothing else leaves this module:

* a provider error becomes a ``StepFailure`` exactly as a chat call's does (``chat.provider_failure``:
  429 → ``rate_limited`` with the server's ``Retry-After``, a timeout → ``timeout``, 5xx, an
  unreachable server or a body that is not JSON → ``server_error``, any other 4xx → ``client_error``);
* a reply that breaks the embeddings contract is an ``invalid_output`` failure whose ``detail``
  names the rule — never a vector: ``embedding:wrong_count`` (not one embedding per input),
  ``embedding:bad_index`` (the items' ``index`` values are not each input's position once),
  ``embedding:wrong_dimensions`` (a vector of another length than the spec's ``dimensions``),
  ``embedding:non_finite`` (NaN or an infinity, also one that only overflows float32),
  ``embedding:not_numbers`` (anything else in place of a vector). Items are put in input order
  by their ``index``, as the protocol says, whatever order they arrive in.

Usage: input tokens from the reply's ``usage`` (``prompt_tokens``; a reply without it has unknown
tokens and an unknown cost, never zero), the cost in micros from the price table's input price
(``ragpipe/specs/prices.yaml``). litellm's own retries are off — retrying is the step runner's job
under its policy — and it is imported offline (``chat.litellm_module``).
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ragpipe.kernel.settings import current_settings
from ragpipe.work.chat import litellm_module, provider_failure, provider_of
from ragpipe.work.failures import StepFailure
from ragpipe.work.usage import PriceTable, Usage

ENV_API_KEY = "RAGPIPE_EMBEDDER_API_KEY"
# Bounds the budget's worst case: a token is at least one byte of text, plus framing per input.
FRAMING_TOKENS = 8


@dataclass(frozen=True)
class EmbeddingReply:
    vectors: np.ndarray  # (len(texts), dimensions) float32, in input order, every value finite
    usage: Usage


def api_key_for(api_base: str | None) -> str | None:
    """``$RAGPIPE_EMBEDDER_API_KEY``; else None for a provider's own endpoint (litellm reads the
    provider's variable, ``OPENAI_API_KEY`` …) and a placeholder for an endpoint of one's own (a
    local server asks for none, and an OpenAI-compatible client refuses to send nothing)."""
    key = current_settings().embedder_api_key
    if key is not None:
        return key.get_secret_value()
    return None if api_base is None else "no-key"


def worst_cost(model: str, texts: Sequence[str], prices: PriceTable) -> int | None:
    """The most one request for ``texts`` can cost in micros (None: the model has no price)."""
    tokens = sum(len(t.encode("utf-8")) + FRAMING_TOKENS for t in texts)
    return prices.cost_micros(model, tokens, 0)


def embed_batch(
    model: str,
    texts: Sequence[str],
    *,
    dimensions: int,
    send_dimensions: bool,
    api_base: str | None,
    timeout: float,
    prices: PriceTable,
) -> EmbeddingReply:
    """One request (module docstring). Raises ``StepFailure``; never any other provider exception."""
    litellm = litellm_module()
    # litellm's OpenAI embedding path reads ``max_retries or DEFAULT_MAX_RETRIES``, so an explicit 0
    # still retried twice inside the call: its default is what turns them off
    litellm.DEFAULT_MAX_RETRIES = 0
    start = time.perf_counter()
    try:
        response = litellm.embedding(
            model=model,
            input=list(texts),
            api_base=api_base,
            api_key=api_key_for(api_base),
            timeout=timeout,
            dimensions=dimensions if send_dimensions else None,
            max_retries=0,
            num_retries=0,
        )
    except Exception as exc:  # every provider error becomes a typed failure, never a crash
        raise provider_failure(exc, litellm) from None
    latency_ms = round((time.perf_counter() - start) * 1000)
    usage = _usage(model, getattr(response, "usage", None), latency_ms, prices)
    data = getattr(response, "data", None)
    return EmbeddingReply(_vectors(data, len(texts), dimensions, usage), usage)


def _usage(model: str, usage_obj: object, latency_ms: int, prices: PriceTable) -> Usage:
    tokens = getattr(usage_obj, "prompt_tokens", None)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:
        tokens = getattr(usage_obj, "total_tokens", None)
    # litellm fills in a zero usage when the provider reported none: every request sends text, so
    # 0 input tokens means "not reported" — unknown, never a free call
    metered = isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0
    return Usage(
        provider=provider_of(model),
        model=model,
        input_tokens=tokens if metered else 0,
        output_tokens=0,
        latency_ms=latency_ms,
        cost_micros=prices.cost_micros(model, tokens, 0) if metered else None,
    )


def _invalid(detail: str, message: str, usage: Usage) -> StepFailure:
    return StepFailure("invalid_output", message, detail=f"embedding:{detail}", usage=usage)


def _vectors(data: object, count: int, dimensions: int, usage: Usage) -> np.ndarray:
    """The reply's embeddings in input order, float32, after every contract rule (module docstring)."""
    if not isinstance(data, list) or len(data) != count:
        got = len(data) if isinstance(data, list) else "no list of"
        raise _invalid("wrong_count", f"the reply holds {got} embeddings for {count} inputs", usage)
    rows: list[np.ndarray | None] = [None] * count
    for position, item in enumerate(data):
        index = _field(item, "index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count or rows[index] is not None:
            raise _invalid("bad_index", f"item {position} has index {index!r}: not each input's position once", usage)
        rows[index] = _vector(_field(item, "embedding"), index, dimensions, usage)
    return np.stack(rows).astype(np.float32, copy=False) if count else np.zeros((0, dimensions), np.float32)


def _field(item: object, name: str) -> object:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _vector(value: object, index: int, dimensions: int, usage: Usage) -> np.ndarray:
    if isinstance(value, str):  # base64 little-endian float32, the protocol's other encoding
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid("not_numbers", f"input {index}: its embedding is not base64 float32", usage) from None
        if len(raw) % 4:
            raise _invalid("not_numbers", f"input {index}: its embedding is not base64 float32", usage)
        wide = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    elif isinstance(value, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        wide = np.asarray(value, dtype=np.float64)
    else:
        raise _invalid("not_numbers", f"input {index}: its embedding is not a list of numbers", usage)
    if wide.shape != (dimensions,):
        raise _invalid(
            "wrong_dimensions",
            f"input {index}: a {wide.shape[0]}-dimensional vector, the spec declares {dimensions}",
            usage,
        )
    with np.errstate(over="ignore"):
        vector = wide.astype(np.float32)
    if not (np.isfinite(wide).all() and np.isfinite(vector).all()):
        bad = int(np.argmin(np.isfinite(vector)))
        raise _invalid(
            "non_finite", f"input {index}: component {bad} is {float(wide[bad])!r}, not a finite float32", usage
        )
    return vector
