"""The MCP tools through the MCP SDK's own client against the running server — ``knowledge_search``
and ``knowledge_answer`` (the same answer, trace and refusals as ``/v1/answer``) — and ``/v1/tools``."""

from __future__ import annotations

import json
import logging
import re
from contextlib import asynccontextmanager

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from ragpipe.answer.generators import ExtractiveGenerator
from ragpipe.kernel.ledger import read_ledger
from ragpipe.release.activation import activate
from ragpipe.server.app import app_from
from ragpipe.server.config import KeyEntry
from ragpipe.server.keys import new_key
from ragpipe.server.knowledge import PARAMETERS, TOOL_NAME
from ragpipe.server.mcp_tool import ANSWER_TOOL_NAME
from ragpipe.server.tracing import TRACE_DOMAIN, find_trace, log_path, traces_with_feedback
from ragpipe_tests.server.test_answer_bounds import llm_release  # noqa: F401  (fixture)
from ragpipe_tests.support.http_server import release_of, running, wait_for
from ragpipe_tests.support.served_http import metric, served
from ragpipe_tests.support.serving import Serving, config_for

STAFF_DOC = "guide/ops.md"


@pytest.fixture
def base(serving: Serving):
    activate(serving.ws, serving.releases["a1"], "staging")
    app = app_from(serving.ws.home, config_for(serving), "staging", serving.targets)
    with running(app) as url:
        wait_for(lambda: release_of(url) == serving.releases["a1"])
        yield url


@asynccontextmanager
async def session(base: str, key: str, mode: str = "legacy"):
    """An MCP client session (``legacy``: the handshake that has session IDs)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30)) as http:
        async with Client(streamable_http_client(f"{base}/mcp/", http_client=http), mode=mode) as client:
            yield client


async def call(client, **arguments) -> dict:
    result = await client.call_tool(TOOL_NAME, arguments)
    assert not result.is_error, result.content
    return result.structured_content


def test_two_concurrent_sessions_get_their_own_labels(serving: Serving, base: str):
    out: dict[str, list[dict]] = {}

    async def one(name: str, key: str, queries: list[str]) -> None:
        async with session(base, key) as client:
            tools = await client.list_tools()
            assert [t.name for t in tools.tools] == [TOOL_NAME, ANSWER_TOOL_NAME]
            out[name] = [await call(client, query=q, limit=3) for q in queries]

    async def main() -> None:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    one, "alice", serving.keys["alice"], ["signing keys", "honest evaluation", "signing keys"]
                )
                tg.start_soon(one, "bob", serving.keys["bob"], ["rotate the signing keys"])

    anyio.run(main)
    first, second, again = out["alice"]
    (bob,) = out["bob"]
    for response in (first, second, again, bob):
        assert (response["release_id"], response["bundle_id"]) == (
            serving.releases["a1"],
            serving.bundles[serving.releases["a1"]],
        )
    # labels in order of first sight, stable within the session, deduplicated by chunk
    labels = {}
    for item in first["items"] + second["items"]:
        labels.setdefault(item["chunk_id"], item["label"])
    assert sorted(labels.values(), key=lambda label: int(label[1:])) == [f"E{i}" for i in range(1, len(labels) + 1)]
    assert [(i["chunk_id"], i["label"]) for i in again["items"]] == [
        (i["chunk_id"], labels[i["chunk_id"]]) for i in first["items"]
    ]
    # another session starts at E1; alice never sees the staff document, bob does
    assert [i["label"] for i in bob["items"]] == [f"E{i}" for i in range(1, len(bob["items"]) + 1)]
    assert first["ledger_scope"].startswith("session:") and bob["ledger_scope"].startswith("session:")
    assert first["ledger_scope"] != bob["ledger_scope"] and first["ledger_scope"] == again["ledger_scope"]
    assert STAFF_DOC not in {i["document_id"] for r in out["alice"] for i in r["items"]}
    assert STAFF_DOC in {i["document_id"] for i in bob["items"]}
    item = first["items"][0]
    assert set(item) == {
        "label",
        "chunk_id",
        "document_id",
        "title",
        "byte_start",
        "byte_end",
        "score",
        "text",
        "metadata",
        "pages",
    }


def test_without_a_session_a_run_id_scopes_the_labels(serving: Serving, base: str):
    async def main():
        with anyio.fail_after(60):
            async with session(base, serving.keys["alice"], mode="auto") as client:
                alone = [await call(client, query="signing keys", limit=2) for _ in range(2)]
                run = [
                    await call(client, query=q, limit=2, run_id="run-7") for q in ("signing keys", "honest evaluation")
                ]
                return alone, run

    alone, run = anyio.run(main)
    assert [r["ledger_scope"] for r in alone] == ["call", "call"]
    assert [i["label"] for i in alone[1]["items"]] == ["E1", "E2"]  # a call alone starts again at E1
    assert {r["ledger_scope"] for r in run} == {"run:run-7"}
    labels = {i["chunk_id"]: i["label"] for i in run[0]["items"]}
    assert sorted(labels.values()) == ["E1", "E2"]
    for item in run[1]["items"]:  # seen chunks keep their label, new ones continue from E3
        labels.setdefault(item["chunk_id"], f"E{len(labels) + 1}")
        assert item["label"] == labels[item["chunk_id"]]


def test_two_keys_of_one_principal_never_share_a_ledger(serving: Serving):
    """A public-only key of principal bob must not see the numbering of bob's staff key's run."""
    from ragpipe.server.config import KeyEntry
    from ragpipe.server.keys import new_key

    key, stored = new_key("bob-public")
    entries = (*serving.key_entries, KeyEntry(id="bob-public", hash=stored, subject="bob", scopes=("public",)))
    activate(serving.ws, serving.releases["a1"], "staging")
    config = config_for(serving).model_copy(update={"keys": entries})
    with running(app_from(serving.ws.home, config, "staging", serving.targets)) as url:
        wait_for(lambda: release_of(url))

        async def main():
            with anyio.fail_after(60):
                async with session(url, serving.keys["bob"], mode="auto") as staff:
                    first = await call(staff, query="rotate the signing keys", limit=3, run_id="shared")
                async with session(url, key, mode="auto") as public:
                    second = await call(public, query="rotate the signing keys", limit=3, run_id="shared")
                return first, second

        first, second = anyio.run(main)
    assert STAFF_DOC in {i["document_id"] for i in first["items"]}
    assert [i["label"] for i in second["items"]] == [f"E{n}" for n in range(1, len(second["items"]) + 1)]
    assert STAFF_DOC not in {i["document_id"] for i in second["items"]}


def test_source_roles_filter_the_evidence(serving: Serving, base: str):
    async def main():
        with anyio.fail_after(60):
            async with session(base, serving.keys["bob"]) as client:
                return await call(client, query="rotate the signing keys", limit=5, source_roles=["runbook"])

    found = anyio.run(main)
    assert {i["document_id"] for i in found["items"]} == {STAFF_DOC}


def test_a_metadata_filter_restricts_the_evidence(serving: Serving, base: str):
    async def main():
        with anyio.fail_after(60):
            async with session(base, serving.keys["bob"]) as client:
                kept = await call(
                    client, query="rotate the signing keys", limit=5, filter={"field": "source_role", "eq": "runbook"}
                )
                refused = await client.call_tool(TOOL_NAME, {"query": "keys", "filter": {"field": "year", "eq": 1}})
                return kept, refused

    kept, refused = anyio.run(main)
    assert {i["document_id"] for i in kept["items"]} == {STAFF_DOC}
    assert refused.is_error
    assert refused.content[0].text == (
        "Error executing tool knowledge_search: filter field 'year' is not in this corpus (known fields: source_role)"
    )


def test_an_unknown_key_is_refused_before_any_mcp_message(serving: Serving, base: str):
    r = httpx.post(
        f"{base}/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers={"Authorization": "Bearer x"}
    )
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"


def test_a_bad_argument_is_a_tool_error_naming_it(serving: Serving, base: str):
    async def main():
        with anyio.fail_after(60):
            async with session(base, serving.keys["alice"]) as client:
                return await client.call_tool(TOOL_NAME, {"query": "keys", "limit": 500})

    result = anyio.run(main)
    assert result.is_error
    assert result.content[0].text == "Error executing tool knowledge_search: limit: must be an integer from 1 to 20"


def test_tools_route_is_the_function_schema(base: str):
    tools = httpx.get(f"{base}/v1/tools").json()
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": TOOL_NAME,
                "description": tools[0]["function"]["description"],
                "parameters": PARAMETERS,
            },
        }
    ]


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def open_session(base: str, key: str) -> httpx.Response:
    """One MCP ``initialize`` over plain HTTP: a session opens when the response names its ID."""
    return httpx.post(
        f"{base}/mcp/", json=INITIALIZE, headers={**MCP_HEADERS, "Authorization": f"Bearer {key}"}, timeout=30
    )


def test_one_key_cannot_take_every_session_slot(serving: Serving):
    """Two sessions a key, three in all: a key's third opening is refused (429 ``too_many_sessions``)
    while another key still opens one; when all three are open, the next opening is 503
    ``overloaded``; open sessions keep working; a key that ends one of its sessions may open another."""
    limits = {"mcp_sessions_per_key": 2, "mcp_sessions": 3}
    with served(app_from(serving.ws.home, config_for(serving, limits=limits), "staging", serving.targets)) as url:
        alice, bob = serving.keys["alice"], serving.keys["bob"]
        first, second = open_session(url, alice), open_session(url, alice)
        assert first.status_code == second.status_code == 200
        sessions = [first.headers["mcp-session-id"], second.headers["mcp-session-id"]]
        third = open_session(url, alice)
        assert third.status_code == 429 and "mcp-session-id" not in third.headers
        assert third.json() == {
            "code": "too_many_sessions",
            "message": "this caller holds 2 open MCP sessions, the most one key (or anonymous address) may: end "
            "one (DELETE /mcp/ with its Mcp-Session-Id) or leave one idle for 1800 s",
            "field": None,
        }
        bobs = open_session(url, bob)
        assert bobs.status_code == 200 and bobs.headers["mcp-session-id"] not in sessions
        full = open_session(url, bob)
        assert full.status_code == 503 and full.headers["retry-after"] == "1"
        assert full.json() == {
            "code": "overloaded",
            "message": "all 3 MCP sessions are open: retry shortly",
            "field": None,
        }
        # the sessions already open are not refused: alice's first one lists the tool
        listed = httpx.post(
            f"{url}/mcp/",
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            headers={
                **MCP_HEADERS,
                "Authorization": f"Bearer {alice}",
                "Mcp-Session-Id": sessions[0],
                "Mcp-Protocol-Version": "2025-06-18",
            },
            timeout=30,
        )
        assert listed.status_code == 200 and TOOL_NAME in listed.text
        ended = httpx.delete(
            f"{url}/mcp/",
            headers={
                "Authorization": f"Bearer {alice}",
                "Mcp-Session-Id": sessions[1],
                "Mcp-Protocol-Version": "2025-06-18",
            },
            timeout=30,
        )
        assert ended.status_code < 300
        again = open_session(url, alice)
        assert again.status_code == 200 and again.headers["mcp-session-id"] not in sessions
        assert metric(url, "ragpipe_mcp_sessions_refused_total", reason="per_key") == 1.0
        assert metric(url, "ragpipe_mcp_sessions_refused_total", reason="total") == 1.0


def test_an_idle_session_frees_its_slot(serving: Serving):
    """A session without a request for ``mcp_session_idle_s`` ends (the SDK's idle timeout, mirrored
    by the quota), and its key may open another; the ended session's ID is unknown from then on."""
    limits = {"mcp_sessions_per_key": 1, "mcp_session_idle_s": 0.5}
    with served(app_from(serving.ws.home, config_for(serving, limits=limits), "staging", serving.targets)) as url:
        first = open_session(url, serving.keys["alice"])
        assert first.status_code == 200
        refused: list[int] = []

        def reopened() -> httpx.Response | None:
            r = open_session(url, serving.keys["alice"])
            if r.status_code == 200:
                return r
            refused.append(r.status_code)
            return None

        second = wait_for(reopened)
        assert set(refused) <= {429}
        assert second.headers["mcp-session-id"] != first.headers["mcp-session-id"]
        stale = httpx.post(
            f"{url}/mcp/",
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            headers={
                **MCP_HEADERS,
                "Authorization": f"Bearer {serving.keys['alice']}",
                "Mcp-Session-Id": first.headers["mcp-session-id"],
                "Mcp-Protocol-Version": "2025-06-18",
            },
            timeout=30,
        )
        assert stale.status_code == 404


QUESTION = "How often are the signing keys rotated?"
UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def http_answer(base: str, key: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base}/v1/answer", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


async def mcp_answer(base: str, key: str, **arguments):
    """One ``knowledge_answer`` call in a fresh SDK client session (its raw ``CallToolResult``)."""
    with anyio.fail_after(60):
        async with session(base, key) as client:
            return await client.call_tool(ANSWER_TOOL_NAME, arguments)


def answered(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def test_knowledge_answer_is_the_v1_answer_of_the_same_question(serving: Serving, base: str):
    """With no generator in the plan (the extractive default, as /v1/answer then uses), the tool's
    body is /v1/answer's for the same question and key — answer, citations, evidence, release and
    subject — but for its own trace ID; each key answers from the evidence its scopes allow."""
    for who, sees_staff in (("alice", False), ("bob", True)):
        key = serving.keys[who]
        over_mcp = answered(anyio.run(lambda key=key: mcp_answer(base, key, question=QUESTION)))
        over_http = http_answer(base, key, {"question": QUESTION})
        assert over_http.status_code == 200, over_http.text
        http_body = over_http.json()
        assert UUID7.match(over_mcp["trace_id"]) and over_mcp["trace_id"] != http_body["trace_id"]
        assert {k: v for k, v in over_mcp.items() if k != "trace_id"} == {
            k: v for k, v in http_body.items() if k != "trace_id"
        }
        assert set(over_mcp) == set(http_body)
        assert over_mcp["release_id"] == serving.releases["a1"] and over_mcp["generator"] == ExtractiveGenerator.name
        assert over_mcp["subject"]["principal"] == who
        # bob's answer cites the staff runbook; alice's evidence holds no answer, so she gets an abstention
        assert (bool(over_mcp["citations"]), over_mcp["abstained"]) == (sees_staff, not sees_staff), over_mcp
        assert (STAFF_DOC in {e["document_id"] for e in over_mcp["evidence"]}) is sees_staff
    # the mode and filter arguments are /v1/answer's too
    narrowed = {"mode": "lexical", "filter": {"field": "source_role", "eq": "runbook"}}
    over_mcp = answered(anyio.run(lambda: mcp_answer(base, serving.keys["bob"], question=QUESTION, **narrowed)))
    http_body = http_answer(base, serving.keys["bob"], {"question": QUESTION, **narrowed}).json()
    assert {k: v for k, v in over_mcp.items() if k != "trace_id"} == {
        k: v for k, v in http_body.items() if k != "trace_id"
    }
    assert {e["document_id"] for e in over_mcp["evidence"]} == {STAFF_DOC}


def test_an_mcp_answer_is_traced_like_v1_answer_and_takes_feedback(serving: Serving, caplog):
    """Tracing on: the MCP answer's trace is in its release's log (one verified chain with the HTTP
    answer's), found by its ID, marked ``via: "mcp"`` where the HTTP one has no ``via``; its key's
    feedback on it is 200 and a disputed verdict puts it in the review queue. Its access line is a
    ``/mcp`` line carrying the trace ID."""
    caplog.set_level(logging.INFO, logger="ragpipe.access")
    activate(serving.ws, serving.releases["a1"], "staging")
    config = config_for(serving, tracing={"enabled": True})
    with served(app_from(serving.ws.home, config, "staging", serving.targets)) as url:
        wait_for(lambda: release_of(url) == serving.releases["a1"])
        alice = serving.keys["alice"]
        over_http = http_answer(url, alice, {"question": QUESTION}).json()
        over_mcp = answered(anyio.run(lambda: mcp_answer(url, alice, question=QUESTION)))
        sent = httpx.post(
            f"{url}/v1/feedback",
            json={"trace_id": over_mcp["trace_id"], "verdict": "disputed", "note": "asked over MCP"},
            headers={"Authorization": f"Bearer {alice}"},
            timeout=60,
        )
    release = serving.releases["a1"]
    assert sent.status_code == 200 and sent.json() == {
        "trace_id": over_mcp["trace_id"],
        "verdict": "disputed",
        "release_id": release,
        "seq": 3,
    }
    records = read_ledger(log_path(serving.ws.home, "staging", release), TRACE_DOMAIN, scope=f"staging/{release}")
    assert [(r.kind, r.payload["trace_id"]) for r in records.records] == [
        ("trace", over_http["trace_id"]),
        ("trace", over_mcp["trace_id"]),
        ("feedback", over_mcp["trace_id"]),
    ]
    http_trace, mcp_trace = records.records[0].payload, records.records[1].payload
    assert "via" not in http_trace and mcp_trace["via"] == "mcp"
    assert set(mcp_trace) == set(http_trace) | {"via"}
    assert {k: mcp_trace[k] for k in ("release_id", "key_id", "subject", "answer", "citations", "certificate_id")} == {
        "release_id": release,
        "key_id": "alice",
        "subject": "alice",
        "answer": over_mcp["answer"],
        "citations": over_mcp["citations"],
        "certificate_id": over_mcp["certificate_id"],
    }
    found = find_trace(serving.ws.home, "staging", over_mcp["trace_id"])
    assert found is not None and found.trace == mcp_trace and found.seq == 2
    [queued] = traces_with_feedback(serving.ws.home, "staging", verdict="disputed")
    assert queued.trace == mcp_trace and [f["note"] for f in queued.feedback] == ["asked over MCP"]
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragpipe.access"]
    traced = [(line["route"], line["trace_id"]) for line in lines if "trace_id" in line]
    assert traced == [("/v1/answer", over_http["trace_id"]), ("/mcp", over_mcp["trace_id"])]


def test_bad_questions_are_the_one_line_errors_of_v1_answer(serving: Serving):
    """An empty question and one over ``max_query_chars`` are refused over MCP with the code and
    message /v1/answer's JSON error has (``<code>: <message>``), and nothing is traced."""
    limits = {"max_query_chars": 50}
    config = config_for(serving, limits=limits, tracing={"enabled": True})
    activate(serving.ws, serving.releases["a1"], "staging")
    with served(app_from(serving.ws.home, config, "staging", serving.targets)) as url:
        wait_for(lambda: release_of(url) == serving.releases["a1"])
        key = serving.keys["alice"]
        seen = []
        for question in ("", "x" * 51):
            refused = anyio.run(lambda q=question: mcp_answer(url, key, question=q))
            http = http_answer(url, key, {"question": question})
            seen.append((http.status_code, http.json(), refused.is_error, refused.content[0].text))
    too_long = "question: 51 characters, at most 50 allowed"
    assert seen[1] == (
        413,
        {"code": "query_too_long", "message": too_long, "field": "question"},
        True,
        f"Error executing tool knowledge_answer: query_too_long: {too_long}",
    )
    status, body, is_error, text = seen[0]
    assert (status, body["code"], body["field"], is_error) == (422, "invalid_query", "question", True)
    assert text == f"Error executing tool knowledge_answer: invalid_query: {body['message']}"
    assert "\n" not in text
    assert not log_path(serving.ws.home, "staging", serving.releases["a1"]).exists()


def test_with_an_llm_in_the_plan_the_tool_answers_through_it_within_the_servers_cap(llm_release):  # noqa: F811
    """The release's plan names an LLM (the local OpenAI-protocol server): the tool's answer is the
    model's, as /v1/answer's is; with the model silent, ``limits.llm_timeout_s`` cuts the call short
    and the tool returns the abstention /v1/answer returns then (a body, not an error)."""
    ws, targets, release, llm = llm_release
    key, stored = new_key("alice")
    serving = Serving(
        ws, targets, {}, {}, {"alice": key}, (KeyEntry(id="alice", hash=stored, subject="alice", scopes=("public",)),)
    )
    llm.scenario = "valid"
    llm.replies["valid"] = json.dumps({"answer": "Every quarter [E1].", "citations": ["E1"], "abstained": False})
    with served(app_from(ws.home, config_for(serving), "staging", targets)) as url:
        wait_for(lambda: release_of(url) == release)
        valid = answered(anyio.run(lambda: mcp_answer(url, key, question=QUESTION)))
    assert (valid["answer"], valid["abstained"], valid["generator"]) == (
        "Every quarter [E1].",
        False,
        "litellm:openai/local-test",
    )
    assert [c["label"] for c in valid["citations"]] == ["E1"] and valid["release_id"] == release
    llm.scenario = "timeout"  # the LLM server holds each request for 10 s, then drops it unanswered
    capped = config_for(serving, limits={"llm_timeout_s": 0.5})
    with served(app_from(ws.home, capped, "staging", targets)) as url:
        wait_for(lambda: release_of(url) == release)
        silent = answered(anyio.run(lambda: mcp_answer(url, key, question="How often are keys rotated?")))
    assert silent["abstained"] is True and silent["failure"]["kind"] == "timeout"
    assert silent["reason"].startswith("generator failed (timeout)") and len(llm.requests) == 2
