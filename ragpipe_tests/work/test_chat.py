"""The litellm adapter against a real local OpenAI-protocol server: replies, usage, typed failures."""

from __future__ import annotations

import pytest

from ragpipe.work.chat import ChatMessage, ChatRequest, complete
from ragpipe.work.failures import StepFailure
from ragpipe.work.usage import load_prices
from ragpipe_tests.support.llm_server import LLMServer

REQUEST = ChatRequest(
    model="openai/gpt-4o-mini",
    messages=(ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="three word question")),
    temperature=0,
    max_tokens=50,
    seed=0,
    response_format="json_object",
)


def call(server: LLMServer, timeout: float = 2.0):
    return complete(REQUEST, api_base=server.api_base, api_key="k", timeout=timeout, prices=load_prices())


def test_a_reply_carries_its_text_response_and_priced_usage():
    with LLMServer() as server:
        server.scenario = "responder"
        server.responder = lambda request: '{"summary": "one two three four"}'
        reply = call(server)
    assert reply.content == '{"summary": "one two three four"}'
    assert reply.response["choices"][0]["message"]["content"] == reply.content
    # 5 prompt words (2 + 3), 5 reply words: ceil((5 × 150,000 + 5 × 600,000) / 10^6) = ceil(3.75) = 4 micros
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.cost_micros) == (5, 5, 4)
    assert (reply.usage.provider, reply.usage.model) == ("openai", "openai/gpt-4o-mini")
    sent = server.requests[0]
    assert sent["messages"] == [m.model_dump() for m in REQUEST.messages]
    assert (sent["temperature"], sent["max_tokens"], sent["seed"]) == (0, 50, 0)


def test_a_reply_without_token_counts_has_unknown_usage_not_a_free_one():
    with LLMServer() as server:
        server.scenario, server.responder, server.report_usage = "responder", lambda request: '{"summary": "x"}', False
        reply = call(server)
    # litellm fills in zeros for the missing counts: they are read as "not reported"
    assert (reply.usage.input_tokens, reply.usage.cost_micros, reply.usage.metered) == (0, None, False)


@pytest.mark.parametrize(
    ("fault", "kind", "detail", "retry_after"),
    [
        ("429:3", "rate_limited", "http_error:429", 3.0),
        ("500", "server_error", "http_error:500", None),
        ("malformed", "server_error", "http_error:500", None),
        ("partial", "server_error", "connection_error", None),
        ("timeout", "timeout", "timeout", None),
    ],
)
def test_each_server_fault_is_a_typed_failure(fault, kind, detail, retry_after):
    with LLMServer() as server:
        server.scenario = "responder"
        server.faults.append(fault)
        with pytest.raises(StepFailure) as caught:
            call(server, timeout=0.5)
    assert (caught.value.kind, caught.value.detail, caught.value.retry_after) == (kind, detail, retry_after)
    assert "\n" not in caught.value.message


@pytest.mark.parametrize(("header", "expected"), [("2.5", 2.5), ("soon", None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)])
def test_retry_after_is_seconds_or_an_http_date_and_unreadable_is_ignored(header, expected):
    with LLMServer() as server:
        server.scenario = "responder"
        server.faults.append(f"429:{header}")
        with pytest.raises(StepFailure) as caught:
            call(server)
    assert (caught.value.kind, caught.value.retry_after) == ("rate_limited", expected)


def test_an_unreachable_server_is_a_connection_error():
    with LLMServer() as server:
        base = server.api_base
    with pytest.raises(StepFailure) as caught:
        complete(REQUEST, api_base=base, api_key="k", timeout=1, prices=load_prices())
    assert (caught.value.kind, caught.value.detail) == ("server_error", "connection_error")


def test_the_request_digest_binds_every_byte():
    other = REQUEST.model_copy(
        update={"messages": (REQUEST.messages[0], ChatMessage(role="user", content="three word question "))}
    )
    assert REQUEST.digest != other.digest
    assert REQUEST.digest == ChatRequest.model_validate_json(REQUEST.model_dump_json()).digest
