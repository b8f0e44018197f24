"""The litellm generator against a local OpenAI-compatible server, and the strict validator."""

from __future__ import annotations

import json

import pytest

from ragpipe.answer.litellm_generator import LiteLLMGenerator
from ragpipe.answer.validate import SAFE_ABSTENTION
from ragpipe.retrieval.plan import GeneratorPlan
from ragpipe.retrieval.service import Retriever
from ragpipe_tests.llm_server import LLMServer

QUESTION = "Does low-dose aspirin reduce the risk of a first stroke?"


@pytest.fixture(scope="module")
def retriever(scoped_bundles):
    return Retriever(scoped_bundles[0])


def reply(answer: str, citations: list[str], abstained: bool) -> str:
    return json.dumps({"answer": answer, "citations": citations, "abstained": abstained})


CASES = [
    ("valid", reply("Yes, modestly [E1].", ["E1"], False), False, None, ["E1"]),
    ("unknown_label", reply("Yes [E9].", ["E9"], False), True, "citation of unknown label E9", []),
    ("duplicate", reply("Yes [E1][E1].", ["E1", "E1"], False), True, "duplicate citation E1", []),
    ("abstain_cites", reply("", ["E1"], True), True, "model abstained but cited evidence: E1", []),
    ("no_citations", reply("Yes.", [], False), True, "answer cites no evidence", []),
    ("inline_unknown", reply("Yes [E1], see also [E7].", ["E1"], False), True, "answer text refers to unknown label E7", []),
    ("non_json", "Sure! Aspirin helps.", True, "generator failed (malformed_output): reply is not JSON (Expecting value at column 1)", []),
    ("wrong_keys", json.dumps({"answer": "x", "sources": []}), True, "generator failed (malformed_output): reply must be an object with exactly the keys answer, citations, abstained", []),
    ("fenced", "```json\n" + reply("Yes [E1].", ["E1"], False) + "\n```", False, None, ["E1"]),
    ("abstain", reply("", [], True), True, "model abstained: " + reply("", [], True), []),
]


@pytest.mark.parametrize(("scenario", "content", "abstained", "reason", "cited"), CASES, ids=[c[0] for c in CASES])
def test_model_replies_are_validated_strictly(retriever, scenario, content, abstained, reason, cited):
    with LLMServer() as server:
        server.scenario = scenario
        server.replies[scenario] = content
        gen = LiteLLMGenerator(GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base, seed=3, temperature=0.0, max_tokens=64), retriever.bundle_id)
        result = retriever.answer(QUESTION, generator=gen)
        (request,) = server.requests
    data = result.as_dict()
    assert data["abstained"] is abstained
    assert data["reason"] == reason
    assert [c["label"] for c in data["citations"]] == cited
    if abstained:
        assert data["answer"] == SAFE_ABSTENTION
    # the effective provider settings reached the provider
    assert (request["model"], request["seed"], request["temperature"], request["max_tokens"]) == ("local-test", 3, 0.0, 64)
    assert request["response_format"] == {"type": "json_object"}
    assert "[E1] Aspirin and stroke" in request["messages"][0]["content"]


def test_http_500_is_a_typed_failure(retriever):
    with LLMServer() as server:
        server.scenario = "http500"
        gen = LiteLLMGenerator(GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base), retriever.bundle_id)
        data = retriever.answer(QUESTION, generator=gen).as_dict()
        assert len(server.requests) == 1  # no retries
    assert data["abstained"] and data["failure"]["kind"] == "http_error:500"
    assert data["reason"].startswith("generator failed (http_error:500)")


def test_timeout_is_a_typed_failure_not_a_hang(retriever):
    with LLMServer() as server:
        server.scenario = "timeout"
        gen = LiteLLMGenerator(GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base, timeout_seconds=0.5), retriever.bundle_id)
        data = retriever.answer(QUESTION, generator=gen).as_dict()
    assert data["abstained"] and data["failure"]["kind"] == "timeout"


def test_connection_refused_is_a_typed_failure(retriever):
    with LLMServer() as server:
        dead = server.api_base
    gen = LiteLLMGenerator(GeneratorPlan(kind="litellm", model="openai/local-test", api_base=dead, timeout_seconds=2), retriever.bundle_id)
    data = retriever.answer(QUESTION, generator=gen).as_dict()
    assert data["abstained"] and data["failure"]["kind"] == "connection_error"


def test_answers_are_cached_by_provider_config_prompt_and_context(retriever, tmp_path):
    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        plan = GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base)
        gen = LiteLLMGenerator(plan, retriever.bundle_id, cache_dir=tmp_path)
        first = retriever.answer(QUESTION, generator=gen).as_dict()
        second = retriever.answer(QUESTION, generator=gen).as_dict()
        assert len(server.requests) == 1 and first["answer"] == second["answer"] == "Yes [E1]."
        other_seed = LiteLLMGenerator(plan.model_copy(update={"seed": 8}), retriever.bundle_id, cache_dir=tmp_path)
        retriever.answer(QUESTION, generator=other_seed)
        assert len(server.requests) == 2  # a different effective configuration is a different cache entry


def test_model_text_never_replaces_evidence(retriever):
    """Source authority: whatever the model says, evidence is the bundle's bytes at the chunk span."""
    with LLMServer() as server:
        server.replies["valid"] = reply("Aspirin CURES stroke in everyone [E1].", ["E1"], False)
        gen = LiteLLMGenerator(GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base), retriever.bundle_id)
        result = retriever.answer(QUESTION, generator=gen)
    for ev in result.as_dict()["evidence"]:
        chunk = retriever.chunks[ev["chunk_id"]]
        assert ev["text"] == chunk.text
        assert (ev["byte_start"], ev["byte_end"]) == (chunk.byte_start, chunk.byte_end)
