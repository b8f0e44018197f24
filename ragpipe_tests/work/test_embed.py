"""The litellm embedding adapter against a real local embeddings server: vectors, usage, typed failures."""

from __future__ import annotations

import numpy as np
import pytest

from ragpipe.work.embed import ENV_API_KEY, api_key_for, embed_batch, worst_cost
from ragpipe.work.failures import StepFailure
from ragpipe.work.usage import load_prices
from ragpipe_tests.support.embeddings_server import EmbeddingsServer, vector_for

MODEL = "openai/text-embedding-3-small"  # priced: 20,000 micros per million input tokens
TEXTS = ["aspirin reduces stroke risk", "statins lower cholesterol", "ünïcode — 日本語"]


def call(server: EmbeddingsServer, texts=TEXTS, *, model=MODEL, dimensions=8, timeout=2.0, **options):
    base = options.pop("api_base", server.api_base)
    return embed_batch(
        model,
        texts,
        dimensions=dimensions,
        send_dimensions=options.pop("send_dimensions", False),
        api_base=base,
        timeout=timeout,
        prices=load_prices(),
    )


def test_one_request_gives_the_servers_exact_vectors_in_input_order_with_priced_usage():
    with EmbeddingsServer() as server:
        reply = call(server)
    assert len(server.requests) == 1 and server.paths == ["/v1/embeddings"]
    assert server.requests[0] == {"model": "text-embedding-3-small", "input": TEXTS}  # nothing else is asked
    assert reply.vectors.dtype == np.float32 and reply.vectors.shape == (3, 8)
    expected = np.stack([vector_for("text-embedding-3-small", t, 8) for t in TEXTS])
    assert np.array_equal(reply.vectors, expected)  # bit for bit
    # 4 + 3 + 3 words = 10 prompt tokens: ceil(10 × 20,000 / 10^6) = 1 micro
    usage = reply.usage
    assert (usage.provider, usage.model, usage.input_tokens, usage.output_tokens, usage.cost_micros) == (
        "openai",
        MODEL,
        10,
        0,
        1,
    )


def test_items_out_of_order_are_put_in_input_order_by_their_index():
    with EmbeddingsServer() as server:
        server.faults.append("reversed")
        reply = call(server)
    assert np.array_equal(reply.vectors[0], vector_for("text-embedding-3-small", TEXTS[0], 8))
    assert np.array_equal(reply.vectors[2], vector_for("text-embedding-3-small", TEXTS[2], 8))


def test_send_dimensions_asks_the_provider_for_that_length():
    with EmbeddingsServer(dimensions=8) as server:
        reply = call(server, dimensions=4, send_dimensions=True)
    assert server.requests[0]["dimensions"] == 4 and reply.vectors.shape == (3, 4)


def test_the_ollama_api_is_reached_through_its_own_route():
    with EmbeddingsServer() as server:
        reply = call(server, model="ollama/nomic-embed-text", api_base=server.ollama_base)
    assert server.paths == ["/api/embed"] and server.requests[0] == {"model": "nomic-embed-text", "input": TEXTS}
    assert np.array_equal(reply.vectors[1], vector_for("nomic-embed-text", TEXTS[1], 8))
    assert (reply.usage.provider, reply.usage.input_tokens, reply.usage.cost_micros) == ("ollama", 10, 0)


def test_a_reply_without_usage_has_an_unknown_cost_not_a_free_one():
    with EmbeddingsServer() as server:
        server.report_usage = False
        reply = call(server)
    assert (reply.usage.input_tokens, reply.usage.cost_micros, reply.usage.metered) == (0, None, False)


@pytest.mark.parametrize(
    ("fault", "kind", "detail", "retry_after"),
    [
        ("429:3", "rate_limited", "http_error:429", 3.0),
        ("500", "server_error", "http_error:500", None),
        ("malformed", "server_error", "http_error:500", None),
        ("400", "client_error", "http_error:400", None),
        ("timeout", "timeout", "timeout", None),
    ],
)
def test_each_server_fault_is_a_typed_failure_after_exactly_one_request(fault, kind, detail, retry_after):
    with EmbeddingsServer() as server:
        server.faults.append(fault)
        with pytest.raises(StepFailure) as caught:
            call(server, timeout=0.5)
        requests = len(server.requests)
    assert (caught.value.kind, caught.value.detail, caught.value.retry_after) == (kind, detail, retry_after)
    assert requests == 1  # litellm's own retries are off: retrying is the step runner's job
    assert "\n" not in caught.value.message


@pytest.mark.parametrize(
    ("fault", "detail", "message"),
    [
        ("wrong_dims", "embedding:wrong_dimensions", "input 0: a 7-dimensional vector, the spec declares 8"),
        ("nan", "embedding:non_finite", "input 0: component 0 is nan, not a finite float32"),
        ("inf", "embedding:non_finite", "input 0: component 0 is inf, not a finite float32"),
        ("wrong_count", "embedding:wrong_count", "the reply holds 2 embeddings for 3 inputs"),
        ("bad_index", "embedding:bad_index", "item 1 has index 0: not each input's position once"),
    ],
)
def test_a_reply_breaking_the_embeddings_contract_is_invalid_output_never_a_vector(fault, detail, message):
    with EmbeddingsServer() as server:
        server.faults.append(fault)
        with pytest.raises(StepFailure) as caught:
            call(server)
    assert (caught.value.kind, caught.value.detail, caught.value.message) == ("invalid_output", detail, message)
    assert caught.value.usage is not None and caught.value.usage.input_tokens == 10  # the call was still paid for


def test_a_value_that_overflows_float32_is_non_finite():
    from ragpipe.work.embed import _vectors
    from ragpipe.work.usage import Usage

    usage = Usage(provider="openai", model="m", input_tokens=1, output_tokens=0, latency_ms=0, cost_micros=0)
    with pytest.raises(StepFailure, match="component 1 is 1e\\+39"):
        _vectors([{"index": 0, "embedding": [0.5, 1e39]}], 1, 2, usage)
    with pytest.raises(StepFailure, match="not a list of numbers") as caught:
        _vectors([{"index": 0, "embedding": [0.5, "x"]}], 1, 2, usage)
    assert caught.value.detail == "embedding:not_numbers"
    # the protocol's base64 encoding: little-endian float32
    import base64

    raw = base64.b64encode(np.array([0.25, -1.5], dtype="<f4").tobytes()).decode()
    assert _vectors([{"index": 0, "embedding": raw}], 1, 2, usage).tolist() == [[0.25, -1.5]]


def test_the_api_key_comes_from_its_variable_else_the_provider_or_a_placeholder(monkeypatch):
    monkeypatch.delenv(ENV_API_KEY, raising=False)
    assert api_key_for(None) is None  # litellm reads the provider's own variable (OPENAI_API_KEY …)
    assert api_key_for("http://127.0.0.1:1/v1") == "no-key"
    monkeypatch.setenv(ENV_API_KEY, "sk-test")
    assert api_key_for(None) == api_key_for("http://127.0.0.1:1/v1") == "sk-test"
    with EmbeddingsServer() as server:
        call(server)
    assert server.headers_seen[0]["authorization"] == "Bearer sk-test"


def test_worst_cost_bounds_a_request_by_bytes_and_is_unknown_without_a_price():
    prices = load_prices()
    # (26 + 8) + (3 + 8) bytes as tokens at 20,000 micros per million: ceil(0.9) = 1
    assert worst_cost(MODEL, ["x" * 26, "abc"], prices) == 1
    assert worst_cost("openai/no-such-model", ["x"], prices) is None
