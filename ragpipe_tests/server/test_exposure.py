"""What the server says without a key, and what it logs: no response names the home's path
(``ragpipe.server.redact``), and no access line carries query text unless configured."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from ragpipe.release.activation import activate
from ragpipe.release.store import ReleaseStore
from ragpipe.server.app import ROUTES, app_from
from ragpipe_tests.support.http_server import release_of, wait_for
from ragpipe_tests.support.served_http import served
from ragpipe_tests.support.serving import Serving, config_for

SCANNED = [*ROUTES, "/mcp/", "/mcp", "/v2/nothing"]
MARKER = "zebra-quokka-7319"  # query text that must not reach a log line


def unauthenticated_responses(base: str) -> dict[tuple[str, str, str], httpx.Response]:
    """Every route, by GET and POST, with no key and with a wrong one."""
    found = {}
    for path in SCANNED:
        for who, headers in (("none", {}), ("wrong", {"Authorization": "Bearer rpk_mallory_" + "x" * 43})):
            for method in ("GET", "POST"):
                body = {"query": "q", "question": "q"} if method == "POST" else None
                found[(method, path, who)] = httpx.request(
                    method, f"{base}{path}", json=body, headers=headers, timeout=30
                )
    return found


def assert_no_home(responses: dict, home) -> None:
    for where, r in responses.items():
        text = r.text + "".join(f"{k}: {v}\n" for k, v in r.headers.items())
        for root in {str(home), str(home.resolve())}:
            assert root not in text, (where, r.status_code, text)
        assert "Traceback" not in text, where


def break_pointer(serving: Serving) -> str:
    """Make the target's pointer unreadable: the refusal's reason names the pointer file's absolute path."""
    path = ReleaseStore(serving.ws).pointer_path("staging")
    path.write_text("{not json", encoding="utf-8")
    return str(path)


def test_no_unauthenticated_response_names_the_homes_path(serving: Serving):
    """A refusal whose reason names a file under the home — while a release is served (``/readyz``
    200 with the refusal) and while none is (503 ``not_ready``, the same reason in a query's error
    for an anonymous caller) — is shown with ``$RAGPIPE_HOME`` in place of the home, on every route."""
    home = serving.ws.home
    activate(serving.ws, serving.releases["a1"], "staging")
    app = app_from(home, config_for(serving), "staging", serving.targets)
    with served(app) as base:
        wait_for(lambda: release_of(base) == serving.releases["a1"])
        pointer = break_pointer(serving)
        wait_for(lambda: httpx.get(f"{base}/readyz").json()["refusal"])
        raw = app.service.follower.status()["refusal"]["reason"]
        assert pointer in raw  # the operator's reason names the file: the redaction is exercised
        responses = unauthenticated_responses(base)
    expected = raw.replace(str(home), "$RAGPIPE_HOME")
    assert expected.startswith("$RAGPIPE_HOME/") and expected.endswith(": pointer is not valid JSON")
    ready = responses[("GET", "/readyz", "none")]
    assert ready.status_code == 200 and ready.json()["refusal"]["reason"] == expected
    assert responses[("GET", "/v1/release", "none")].json()["refusal"]["reason"] == expected
    assert responses[("POST", "/v1/query", "none")].status_code == 401
    assert_no_home(responses, home)

    # started on the broken pointer, anonymous access on: nothing is served, the query says why
    app = app_from(home, config_for(serving, anonymous=True), "staging", serving.targets)
    with served(app) as base:
        wait_for(lambda: httpx.get(f"{base}/readyz").json().get("status", {}).get("refusal"))
        responses = unauthenticated_responses(base)
    ready = responses[("GET", "/readyz", "none")]
    assert ready.status_code == 503 and ready.json()["code"] == "not_ready"
    assert ready.json()["message"] == expected
    query = responses[("POST", "/v1/query", "none")]
    assert query.status_code == 503
    assert query.json() == {"code": "not_ready", "message": expected, "field": None}
    assert_no_home(responses, home)


def access_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragpipe.access"]


def tool_call(base: str, key: str, query: str) -> httpx.Response:
    """``knowledge_search`` over MCP with plain HTTP: initialize, initialized, tools/call."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {key}",
    }
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    opened = httpx.post(f"{base}/mcp/", json=init, headers=headers, timeout=30)
    headers |= {"Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-06-18"}
    httpx.post(f"{base}/mcp/", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "knowledge_search", "arguments": {"query": query, "limit": 2}},
    }
    return httpx.post(f"{base}/mcp/", json=call, headers=headers, timeout=60)


@pytest.mark.parametrize("log_query_text", [False, True])
def test_access_lines_carry_no_query_text_unless_configured(serving: Serving, caplog, log_query_text: bool):
    """Queries, answers, MCP tool calls and refused queries (too long, a bad field): one access line
    each, none with the query text — unless ``log_query_text: true``, where the query and answer
    lines (and only they) carry it. The answer's line carries its trace ID; tracing is on, and
    its log holds no query text either way (``tracing.keep_query_text`` is apart: ``test_tracing.py``)."""
    caplog.set_level(logging.INFO, logger="ragpipe.access")
    activate(serving.ws, serving.releases["a1"], "staging")
    config = config_for(
        serving, log_query_text=log_query_text, limits={"max_query_chars": 100}, tracing={"enabled": True}
    )
    key = {"Authorization": f"Bearer {serving.keys['alice']}"}
    with served(app_from(serving.ws.home, config, "staging", serving.targets)) as base:
        wait_for(lambda: release_of(base) == serving.releases["a1"])
        caplog.clear()
        query = httpx.post(f"{base}/v1/query", json={"query": f"{MARKER} signing keys"}, headers=key).status_code
        answered = httpx.post(f"{base}/v1/answer", json={"question": f"{MARKER} keys?"}, headers=key, timeout=60)
        answer_trace_id = answered.json()["trace_id"]
        statuses = [
            query,
            answered.status_code,
            httpx.post(f"{base}/v1/query", json={"query": MARKER * 10}, headers=key).status_code,
            httpx.post(f"{base}/v1/query", json={"query": MARKER, "k": 0}, headers=key).status_code,
        ]
        tool = tool_call(base, serving.keys["alice"], f"{MARKER} signing keys")
    assert statuses == [200, 200, 413, 422]
    assert tool.status_code == 200 and '"items"' in tool.text and '"isError":false' in tool.text.replace(" ", "")
    lines = access_lines(caplog)
    by_route = [(line["route"], line["status"]) for line in lines]
    assert by_route[:4] == [("/v1/query", 200), ("/v1/answer", 200), ("/v1/query", 413), ("/v1/query", 422)]
    assert {route for route, _ in by_route[4:]} == {"/mcp"}
    fields = {"route", "status", "latency_ms", "release_id", "subject", "hits"}
    for line in lines:
        carries = MARKER in json.dumps(line)
        expected = fields | ({"trace_id"} if line["route"] == "/v1/answer" else set())
        if log_query_text and line["route"] in ("/v1/query", "/v1/answer") and line["status"] == 200:
            assert set(line) == expected | {"query"} and carries
        else:
            assert set(line) == expected and not carries, line
    assert lines[1]["trace_id"] == answer_trace_id
    [log] = serving.ws.serve_traces.rglob("traces.jsonl")
    assert answer_trace_id.encode() in log.read_bytes() and MARKER.encode() not in log.read_bytes()
