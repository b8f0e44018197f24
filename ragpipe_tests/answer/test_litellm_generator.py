"""The litellm generator against a local OpenAI-compatible server, and the strict validator."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ragpipe.answer.answering import answer
from ragpipe.answer.generators import ExtractiveGenerator
from ragpipe.answer.litellm_generator import LiteLLMGenerator
from ragpipe.answer.prompt import INSTRUCTIONS
from ragpipe.answer.validate import SAFE_ABSTENTION
from ragpipe.kernel.ids import bytes_digest
from ragpipe.retrieval.authz import AuthorizationError, Subject, issue_certificate
from ragpipe.retrieval.context import render_payload
from ragpipe.retrieval.plan import GeneratorPlan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.llm_server import LLMServer

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
    (
        "inline_unknown",
        reply("Yes [E1], see also [E7].", ["E1"], False),
        True,
        "answer text refers to unknown label E7",
        [],
    ),
    (
        "non_json",
        "Sure! Aspirin helps.",
        True,
        "generator failed (malformed_output): reply is not JSON (Expecting value at column 1)",
        [],
    ),
    (
        "wrong_keys",
        json.dumps({"answer": "x", "sources": []}),
        True,
        "generator failed (malformed_output): reply must be an object with exactly the keys answer, citations, abstained",
        [],
    ),
    ("fenced", "```json\n" + reply("Yes [E1].", ["E1"], False) + "\n```", False, None, ["E1"]),
    ("abstain", reply("", [], True), True, "model abstained: " + reply("", [], True), []),
]


@pytest.mark.parametrize(("scenario", "content", "abstained", "reason", "cited"), CASES, ids=[c[0] for c in CASES])
def test_model_replies_are_validated_strictly(retriever, scenario, content, abstained, reason, cited):
    with LLMServer() as server:
        server.scenario = scenario
        server.replies[scenario] = content
        gen = LiteLLMGenerator(
            GeneratorPlan(
                kind="litellm",
                model="openai/local-test",
                api_base=server.api_base,
                seed=3,
                temperature=0.0,
                max_tokens=64,
            ),
            retriever.bundle_id,
        )
        result = answer(retriever, QUESTION, generator=gen)
        (request,) = server.requests
    data = result.as_dict()
    assert data["abstained"] is abstained
    assert data["reason"] == reason
    assert [c["label"] for c in data["citations"]] == cited
    if abstained:
        assert data["answer"] == SAFE_ABSTENTION
    # the effective provider settings reached the provider
    assert (request["model"], request["seed"], request["temperature"], request["max_tokens"]) == (
        "local-test",
        3,
        0.0,
        64,
    )
    assert request["response_format"] == {"type": "json_object"}
    assert request["messages"][1]["content"].startswith("[E1] Aspirin and stroke\n")


def test_http_500_is_a_typed_failure(retriever):
    with LLMServer() as server:
        server.scenario = "http500"
        gen = LiteLLMGenerator(
            GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base), retriever.bundle_id
        )
        data = answer(retriever, QUESTION, generator=gen).as_dict()
        assert len(server.requests) == 1  # no retries
    assert data["abstained"] and data["failure"]["kind"] == "http_error:500"
    assert data["reason"].startswith("generator failed (http_error:500)")


def test_timeout_is_a_typed_failure_not_a_hang(retriever):
    with LLMServer() as server:
        server.scenario = "timeout"
        gen = LiteLLMGenerator(
            GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base, timeout_seconds=0.5),
            retriever.bundle_id,
        )
        data = answer(retriever, QUESTION, generator=gen).as_dict()
    assert data["abstained"] and data["failure"]["kind"] == "timeout"


def test_connection_refused_is_a_typed_failure(retriever):
    with LLMServer() as server:
        dead = server.api_base
    gen = LiteLLMGenerator(
        GeneratorPlan(kind="litellm", model="openai/local-test", api_base=dead, timeout_seconds=2), retriever.bundle_id
    )
    data = answer(retriever, QUESTION, generator=gen).as_dict()
    assert data["abstained"] and data["failure"]["kind"] == "connection_error"


def test_answers_are_cached_by_provider_config_prompt_and_context(retriever, tmp_path):
    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        plan = GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base)
        gen = LiteLLMGenerator(plan, retriever.bundle_id, cache_dir=tmp_path)
        first = answer(retriever, QUESTION, generator=gen).as_dict()
        second = answer(retriever, QUESTION, generator=gen).as_dict()
        assert len(server.requests) == 1 and first["answer"] == second["answer"] == "Yes [E1]."
        other_seed = LiteLLMGenerator(plan.model_copy(update={"seed": 8}), retriever.bundle_id, cache_dir=tmp_path)
        answer(retriever, QUESTION, generator=other_seed)
        assert len(server.requests) == 2  # a different effective configuration is a different cache entry


def test_a_cached_answer_reports_the_usage_of_the_call_that_produced_it(retriever, tmp_path):
    """Cache state is operational: a warm cache must not make an answer look free to the gate."""
    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        plan = GeneratorPlan(kind="litellm", model="openai/gpt-4o-mini", api_base=server.api_base)
        gen = LiteLLMGenerator(plan, retriever.bundle_id, cache_dir=tmp_path)
        first = answer(retriever, QUESTION, generator=gen).as_dict()["usage"]
        second = answer(retriever, QUESTION, generator=gen).as_dict()["usage"]
        assert len(server.requests) == 1
    assert first["calls"] == second["calls"] == 1 and (first["cached"], second["cached"]) == (False, True)
    assert first["input_tokens"] > 0 and first["cost_micros"] > 0
    assert {k: v for k, v in first.items() if k != "cached"} == {k: v for k, v in second.items() if k != "cached"}


def test_an_answer_without_reported_usage_has_unknown_tokens_and_cost(retriever):
    with LLMServer() as server:
        server.replies["valid"], server.report_usage = reply("Yes [E1].", ["E1"], False), False
        plan = GeneratorPlan(kind="litellm", model="openai/gpt-4o-mini", api_base=server.api_base)
        usage = answer(retriever, QUESTION, generator=LiteLLMGenerator(plan, retriever.bundle_id)).as_dict()["usage"]
    assert usage == {"calls": 1, "cached": False, "input_tokens": None, "output_tokens": None, "cost_micros": None}


@pytest.mark.parametrize(("fault", "known"), [("429:1", True), ("500", False)])
def test_a_refused_call_costs_nothing_and_a_failed_one_is_unknown(retriever, fault, known):
    with LLMServer() as server:
        server.faults.append(fault)
        plan = GeneratorPlan(kind="litellm", model="openai/gpt-4o-mini", api_base=server.api_base)
        data = answer(retriever, QUESTION, generator=LiteLLMGenerator(plan, retriever.bundle_id)).as_dict()
    assert data["abstained"] and data["failure"] is not None
    figures = (data["usage"]["input_tokens"], data["usage"]["cost_micros"])
    assert data["usage"]["calls"] == 1 and figures == ((0, 0) if known else (None, None))


def test_a_cached_answer_without_usage_is_asked_again(retriever, tmp_path):
    """An entry written before usage was kept would make a warm cache report an unknown cost."""
    from ragpipe.answer.litellm_generator import _value_bytes

    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        plan = GeneratorPlan(kind="litellm", model="openai/gpt-4o-mini", api_base=server.api_base)
        gen = LiteLLMGenerator(plan, retriever.bundle_id, cache_dir=tmp_path)
        answer(retriever, QUESTION, generator=gen)
        (path,) = tmp_path.glob("*.json")
        entry = json.loads(path.read_text())
        del entry["value"]["usage"]
        entry["value_digest"] = bytes_digest(_value_bytes(entry["value"]))  # a valid old-format entry
        path.write_text(json.dumps(entry))
        again = answer(retriever, QUESTION, generator=gen).as_dict()["usage"]
        assert len(server.requests) == 2 and again["cached"] is False and again["cost_micros"] > 0
        assert "usage" in json.loads(path.read_text())["value"]  # rewritten with its usage


def test_the_extractive_generator_uses_no_model(retriever):
    usage = answer(retriever, QUESTION, generator=ExtractiveGenerator()).as_dict()["usage"]
    assert usage == {"calls": 0, "cached": False, "input_tokens": 0, "output_tokens": 0, "cost_micros": 0}


@pytest.mark.parametrize("damage", ["value", "key", "digest", "type", "cut", "not json"])
def test_a_damaged_answer_cache_entry_is_set_aside_and_asked_again(retriever, tmp_path, damage):
    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        plan = GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base)
        gen = LiteLLMGenerator(plan, retriever.bundle_id, cache_dir=tmp_path)
        first = answer(retriever, QUESTION, generator=gen).as_dict()
        (entry_path,) = tmp_path.glob("*.json")
        data = entry_path.read_bytes()
        entry = json.loads(data)
        if damage == "value":  # the cached answer changed, its digest not
            entry["value"]["answer"] = "No [E1]."
        elif damage == "key":  # another question's entry copied under this name
            entry["key"] = "sha256:" + "0" * 64
        elif damage == "digest":
            entry["value_digest"] = "sha256:" + "0" * 64
        elif damage == "type":  # a forged entry with its digest recomputed, but not an answer
            entry["value"]["citations"] = "E1"
            entry["value_digest"] = bytes_digest(
                json.dumps(entry["value"], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
            )
        out = {"cut": data[: len(data) // 2], "not json": b"\xff"}.get(damage, json.dumps(entry).encode())
        entry_path.write_bytes(out)
        again = answer(retriever, QUESTION, generator=gen).as_dict()
        assert len(server.requests) == 2  # asked again, never served from the bad entry
        assert again["answer"] == first["answer"] == "Yes [E1]."
        assert entry_path.with_name(entry_path.name + ".refused").read_bytes() == out
        assert json.loads(entry_path.read_bytes())["value"]["answer"] == "Yes [E1]."  # stored afresh


def test_model_text_never_replaces_evidence(retriever):
    """Source authority: whatever the model says, evidence is the bundle's bytes at the chunk span."""
    with LLMServer() as server:
        server.replies["valid"] = reply("Aspirin CURES stroke in everyone [E1].", ["E1"], False)
        gen = LiteLLMGenerator(
            GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base), retriever.bundle_id
        )
        result = answer(retriever, QUESTION, generator=gen)
    for ev in result.as_dict()["evidence"]:
        chunk = retriever.chunks[ev["chunk_id"]]
        assert ev["text"] == chunk.text
        assert (ev["byte_start"], ev["byte_end"]) == (chunk.byte_start, chunk.byte_end)


# --- certified bytes are the bytes sent -------------------------------------------------------

TOP = "[E1] Aspirin and stroke\nLow-dose aspirin reduces the risk of a first stroke in older adults. The effect was modest.\n"


def certified(retriever, question=QUESTION, subject=None):
    """The context ``answer(retriever, ...)`` builds for ``question`` and a certificate over its evidence."""
    subject = subject or Subject.default()
    context = answer(retriever, question, subject, generator=ExtractiveGenerator()).context
    return context, issue_certificate(subject, retriever.policy, retriever.bundle_id, context.evidence)


def generator(retriever, server, **kw):
    return LiteLLMGenerator(
        GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base), retriever.bundle_id, **kw
    )


def sent_evidence(server) -> list[str]:
    """The evidence message of every request, decoded from the raw bytes the server received."""
    return [json.loads(body)["messages"][1]["content"] for body in server.bodies]


def test_request_carries_exactly_the_certified_payload(retriever):
    ctx, cert = certified(retriever)
    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        cand = generator(retriever, server).generate(QUESTION, ctx, cert)
    assert (cand.answer, cand.citations) == ("Yes [E1].", ("E1",))
    (request,) = server.requests
    payload = render_payload(ctx.evidence)
    assert request["messages"] == [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": payload},
        {"role": "user", "content": "Question: " + QUESTION},
    ]
    (sent,) = sent_evidence(server)
    assert bytes_digest(sent.encode("utf-8")) == cert.payload_digest == ctx.digest
    assert sent.startswith(TOP)  # titles are in the payload, hence certified
    assert sent.count("\n[E") == len(ctx.evidence) - 1 and len(ctx.evidence) >= 2


def test_retriever_answer_sends_exactly_the_certified_payload(retriever):
    """End to end: answer(retriever, ...) certifies the context's evidence (titles included) and the
    server receives exactly the payload whose digest that certificate holds."""
    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        result = answer(retriever, QUESTION, generator=generator(retriever, server))
    expected = issue_certificate(Subject.default(), retriever.policy, retriever.bundle_id, result.context.evidence)
    assert result.certificate_id == expected.certificate_id
    (sent,) = sent_evidence(server)
    assert bytes_digest(sent.encode("utf-8")) == expected.payload_digest == result.as_dict()["context_digest"]
    assert sent.startswith(TOP)


def _retitle(ctx, index: int, title: str):
    """Change one evidence title and re-render, so only the title check can catch it."""
    evidence = list(ctx.evidence)
    evidence[index] = replace(evidence[index], title=title)
    return replace(ctx, evidence=tuple(evidence), rendered=render_payload(evidence))


def _retext(ctx, index: int, text: str):
    evidence = list(ctx.evidence)
    evidence[index] = replace(evidence[index], text=text)
    return replace(ctx, evidence=tuple(evidence), rendered=render_payload(evidence))


def _tamper(name, ctx, cert, retriever):
    """(context, certificate, exact refusal) for each way the sent bytes could leave the certificate."""
    e1, last = ctx.evidence[0], ctx.evidence[-1]
    if name == "rendered_appended":
        forged = replace(
            ctx, rendered=ctx.rendered + "\n[E9] Aspirin stroke aspirin stroke\nthe secret aspirin stroke trial data.\n"
        )
        return (
            forged,
            cert,
            f"the context's rendered text ({forged.digest}) differs from what its certified evidence renders to ({ctx.digest})",
        )
    if name == "rendered_title":  # the title as sent differs from the evidence's (certified) title
        forged = replace(
            ctx, rendered=ctx.rendered.replace("[E1] Aspirin and stroke", "[E1] Aspirin stroke aspirin stroke", 1)
        )
        return (
            forged,
            cert,
            f"the context's rendered text ({forged.digest}) differs from what its certified evidence renders to ({ctx.digest})",
        )
    if name == "first_title":
        return (
            _retitle(ctx, 0, "Aspirin stroke aspirin stroke"),
            cert,
            f"evidence E1 (chunk {e1.chunk_id}): title differs from the certified title",
        )
    if name == "last_title":
        forged = _retitle(ctx, len(ctx.evidence) - 1, last.title + " ")
        return forged, cert, f"evidence {last.label} (chunk {last.chunk_id}): title differs from the certified title"
    if name == "text_altered":
        forged = _retext(ctx, 0, "the secret aspirin stroke trial data.")
        return forged, cert, f"evidence E1 (chunk {e1.chunk_id}): text differs from the certified text"
    if name == "text_trailing_space":  # renders to the same bytes, but is not the certified text
        return (
            _retext(ctx, 0, e1.text + " "),
            cert,
            f"evidence E1 (chunk {e1.chunk_id}): text differs from the certified text",
        )
    if name == "order_swapped":
        swapped = (ctx.evidence[1], ctx.evidence[0]) + ctx.evidence[2:]
        forged = replace(ctx, evidence=swapped, rendered=render_payload(swapped))
        return forged, cert, f"evidence E2 (chunk {swapped[0].chunk_id}): label E2 differs from the certified label E1"
    if name == "item_dropped":
        forged = replace(ctx, evidence=ctx.evidence[:-1], rendered=render_payload(ctx.evidence[:-1]))
        return (
            forged,
            cert,
            f"the context has {len(ctx.evidence) - 1} evidence item(s), the certificate covers {len(ctx.evidence)}",
        )
    if name == "scopes_changed":  # scopes are not rendered, but they are certified
        evidence = (replace(e1, access_scopes=("public", "secret")),) + ctx.evidence[1:]
        forged = replace(ctx, evidence=evidence)
        return (
            forged,
            cert,
            f"evidence E1 (chunk {e1.chunk_id}): access_scopes ['public', 'secret'] differ from the certified ['public']",
        )
    if name == "payload_format":
        return (
            ctx,
            replace(cert, payload_format="evidence-block/v0"),
            "the certificate covers payload format evidence-block/v0, the adapter renders evidence-block/v1",
        )
    if name == "unknown_policy":
        return (
            ctx,
            replace(cert, policy_id="sha256:" + "2" * 64),
            f"the certificate's policy sha256:{'2' * 64} is unknown, so it cannot be re-checked",
        )
    if name == "other_bundle":
        return (
            ctx,
            replace(cert, bundle_id="sha256:" + "0" * 64),
            f"the certificate is for bundle sha256:{'0' * 64}, the adapter serves bundle {retriever.bundle_id}",
        )
    if name == "other_subject":
        stranger = replace(cert, subject=Subject("stranger", ("nobody",)))
        return (
            ctx,
            stranger,
            f"evidence E1 (chunk {e1.chunk_id}): scopes ['public'] are not visible to the certificate's subject stranger ['nobody']",
        )
    if name == "payload_digest":
        return (
            ctx,
            replace(cert, payload_digest="sha256:" + "1" * 64),
            f"payload digest {ctx.digest} differs from the certified payload digest sha256:{'1' * 64}",
        )
    raise AssertionError(name)


TAMPERINGS = [
    "rendered_appended",
    "rendered_title",
    "first_title",
    "last_title",
    "text_altered",
    "text_trailing_space",
    "order_swapped",
    "item_dropped",
    "scopes_changed",
    "payload_format",
    "unknown_policy",
    "other_bundle",
    "other_subject",
    "payload_digest",
]


@pytest.mark.parametrize("name", TAMPERINGS)
def test_uncertified_bytes_are_refused_before_any_network_call(retriever, name):
    ctx, cert = certified(retriever)
    forged_ctx, forged_cert, reason = _tamper(name, ctx, cert, retriever)
    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        with pytest.raises(AuthorizationError) as refused:
            generator(retriever, server).generate(QUESTION, forged_ctx, forged_cert)
    assert str(refused.value) == "refusing to send: " + reason
    assert (server.connections, server.requests) == (0, [])


def test_refusal_comes_before_the_answer_cache(retriever, tmp_path):
    """A cached answer for the honest context is not served to a forged one either."""
    ctx, cert = certified(retriever)
    with LLMServer() as server:
        server.replies["valid"] = reply("Yes [E1].", ["E1"], False)
        gen = generator(retriever, server, cache_dir=tmp_path)
        assert not gen.generate(QUESTION, ctx, cert).cached
        assert gen.generate(QUESTION, ctx, cert).cached
        forged = replace(ctx, rendered=ctx.rendered.replace("Aspirin and stroke", "Aspirin stroke aspirin stroke", 1))
        with pytest.raises(AuthorizationError, match=r"^refusing to send: the context's rendered text"):
            gen.generate(QUESTION, forged, cert)
    assert len(server.requests) == 1
