"""The server over HTTP (a real uvicorn on 127.0.0.1): bodies, headers, keys, bounds, readiness."""

from __future__ import annotations

import re

import httpx
import pytest

from ragpipe.release.activation import activate
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
from ragpipe.server.app import app_from
from ragpipe_tests.support.http_server import release_of, running, wait_for
from ragpipe_tests.support.serving import Serving, config_for

STAFF_DOC = "guide/ops.md"  # access_scopes: [staff]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def server(serving: Serving, **config):
    return running(app_from(serving.ws.home, config_for(serving, **config), "staging", serving.targets))


@pytest.fixture
def active(serving: Serving) -> Serving:
    activate(serving.ws, serving.releases["a1"], "staging")
    return serving


def test_query_body_is_the_cli_json_plus_release_id(active: Serving):
    release = active.releases["a1"]
    with server(active) as base:
        wait_for(lambda: release_of(base) == release)
        r = httpx.post(f"{base}/v1/query", json={"query": "signing keys", "k": 3}, headers=auth(active.keys["bob"]))
    assert r.status_code == 200 and r.headers["x-release-id"] == release
    body = r.json()
    retriever = Retriever(active.ws.bundles / active.bundles[release].removeprefix("sha256:"))
    try:
        expected = retriever.query("signing keys", Subject("bob", ("public", "staff")), k=3).as_dict()
    finally:
        retriever.close()
    # the server serves the release's gated plan, the default plan here: the same hits, exactly
    assert body == {**expected, "release_id": release}
    assert STAFF_DOC in {h["document_id"] for h in body["hits"]}


def test_answer_body_is_the_cli_json_plus_release_id_and_trace_id(active: Serving):
    from ragpipe.answer.answering import answer, make_generator

    release = active.releases["a1"]
    question = "How often are the signing keys rotated?"
    with server(active) as base:
        wait_for(lambda: release_of(base) == release)
        r = httpx.post(f"{base}/v1/answer", json={"question": question}, headers=auth(active.keys["bob"]))
    assert r.status_code == 200 and r.headers["x-release-id"] == release
    retriever = Retriever(active.ws.bundles / active.bundles[release].removeprefix("sha256:"))
    retriever.release_id = release  # as the server's retriever of the release: the certificate binds it
    try:
        generator = make_generator(retriever.plan.answer.generator, retriever.bundle_id)
        expected = answer(retriever, question, Subject("bob", ("public", "staff")), generator=generator).as_dict()
    finally:
        retriever.close()
    trace_id = r.headers["x-trace-id"]  # the answer's trace ID (ragpipe.server.tracing), in the body too
    assert r.json() == {**expected, "release_id": release, "trace_id": trace_id}
    assert r.json()["abstained"] is False and r.json()["citations"]


def test_subject_comes_from_the_key_only(active: Serving):
    smuggled = {
        "query": "rotate the signing keys; scopes: staff principal: bob",
        "k": 10,
        "scopes": ["staff"],
        "principal": "bob",
        "subject": {"principal": "bob", "scopes": ["staff"]},
    }
    with server(active) as base:
        wait_for(lambda: release_of(base))
        r = httpx.post(f"{base}/v1/query", json=smuggled, headers=auth(active.keys["alice"]))
        staff = httpx.post(f"{base}/v1/query", json=smuggled, headers=auth(active.keys["bob"]))
    assert r.status_code == 200
    assert r.json()["subject"] == {"principal": "alice", "scopes": ["public"]}
    assert STAFF_DOC not in {h["document_id"] for h in r.json()["hits"]}  # zero unauthorized chunks
    assert STAFF_DOC in {h["document_id"] for h in staff.json()["hits"]}


@pytest.mark.parametrize(
    "header",
    [None, "Bearer rpk_mallory_" + "x" * 43, "Basic abc", "Bearer not-a-key", "Bearer rpk_alice_wrong-secret"],
)
def test_a_missing_or_unknown_key_is_401(active: Serving, header: str | None):
    with server(active) as base:
        r = httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers={"Authorization": header} if header else {})
    assert r.status_code == 401
    assert r.json() == {
        "code": "unauthorized",
        "message": "missing or unknown API key (Authorization: Bearer rpk_...)",
        "field": None,
    }


def test_anonymous_callers_get_the_public_subject_only_when_allowed(active: Serving):
    with server(active, anonymous=True) as base:
        wait_for(lambda: release_of(base))
        r = httpx.post(f"{base}/v1/query", json={"query": "signing keys", "scopes": ["staff"]})
    assert r.status_code == 200 and r.json()["subject"] == {"principal": "anonymous", "scopes": ["public"]}
    assert STAFF_DOC not in {h["document_id"] for h in r.json()["hits"]}


def test_rate_limit_is_per_key_with_retry_after(active: Serving):
    with server(active, limits={"requests_per_minute": 3}) as base:
        wait_for(lambda: release_of(base))
        codes = [
            httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers=auth(active.keys["alice"])).status_code
            for _ in range(3)
        ]
        limited = httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers=auth(active.keys["alice"]))
        other = httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers=auth(active.keys["bob"]))
    assert codes == [200, 200, 200] and other.status_code == 200
    assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 60
    assert limited.json() == {
        "code": "rate_limited",
        "message": "rate limit of 3 requests a minute reached",
        "field": None,
    }


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"query": "x" * 101}, 413, ("query_too_long", "query: 101 characters, at most 100 allowed", "query")),
        ({"query": "keys", "k": 51}, 422, ("invalid_request", "k: at most 50", "k")),
        ({"query": "keys", "k": 0}, 422, ("invalid_request", "k: Input should be greater than or equal to 1", "k")),
        (
            {"query": "keys", "mode": "fuzzy"},
            422,
            ("invalid_request", "mode: Input should be 'hybrid', 'lexical' or 'vector'", "mode"),
        ),
        ({"k": 3}, 422, ("invalid_request", "query: Field required", "query")),
        ({"query": "   "}, 422, ("invalid_query", "query text is empty (or only whitespace)", "query")),
    ],
)
def test_bounds_and_bad_fields_are_json_errors_naming_the_field(active: Serving, body, status, error):
    with server(active, limits={"max_query_chars": 100, "max_k": 50}) as base:
        wait_for(lambda: release_of(base))
        r = httpx.post(f"{base}/v1/query", json=body, headers=auth(active.keys["alice"]))
    assert r.status_code == status
    assert r.json() == dict(zip(("code", "message", "field"), error))


def test_body_size_and_malformed_json(active: Serving):
    with server(active, limits={"max_body_bytes": 1024}) as base:
        big = httpx.post(
            f"{base}/v1/query", content=b'{"query": "' + b"a" * 2000 + b'"}', headers=auth(active.keys["alice"])
        )
        bad = httpx.post(
            f"{base}/v1/query",
            content=b'{"query": ',
            headers={**auth(active.keys["alice"]), "content-type": "application/json"},
        )
    assert big.status_code == 413
    assert big.json() == {"code": "body_too_large", "message": "request body: at most 1024 bytes", "field": "body"}
    assert bad.status_code == 422
    assert bad.json() == {"code": "invalid_request", "message": "body: not valid JSON", "field": "body"}


def test_a_body_nested_past_the_bound_is_a_json_error_not_a_traceback(active: Serving):
    deep = b'{"query": "q", "filter": ' + b"[" * 300 + b"]" * 300 + b"}"
    nested_filter = {"query": "signing keys", "filter": {"field": "source_role", "eq": "runbook"}}
    for _ in range(33):  # one level past the filter's bound of 32
        nested_filter["filter"] = {"not": nested_filter["filter"]}
    with server(active) as base:
        wait_for(lambda: release_of(base))
        r = httpx.post(f"{base}/v1/query", content=deep, headers=auth(active.keys["alice"]))
        # the same in UTF-16, which json reads by its first bytes (and a UTF-8 view would not see)
        utf16 = httpx.post(
            f"{base}/v1/query", content=deep.decode().encode("utf-16"), headers=auth(active.keys["alice"])
        )
        too_deep_filter = httpx.post(f"{base}/v1/query", json=nested_filter, headers=auth(active.keys["bob"]))
    assert r.status_code == 422
    assert r.json() == {
        "code": "invalid_request",
        "message": "request body: nesting deeper than 256 levels (column 281)",
        "field": "body",
    }
    assert utf16.status_code == 422 and utf16.json()["code"] == "invalid_request"
    # a filter past its own bound (32 levels of and/or/not) is refused by the filter's rule
    assert too_deep_filter.status_code == 422 and too_deep_filter.json()["code"] == "invalid_filter"
    assert "nesting deeper than 32 levels" in too_deep_filter.json()["message"]


def test_a_body_without_the_json_content_type_is_read_as_json(active: Serving):
    """``curl -d`` sends the form content type; the API takes JSON only, so it reads JSON."""
    with server(active) as base:
        wait_for(lambda: release_of(base))
        for headers in ({"content-type": "application/x-www-form-urlencoded"}, {}):
            r = httpx.post(
                f"{base}/v1/query",
                content=b'{"query": "signing keys", "k": 2}',
                headers={**auth(active.keys["alice"]), **headers},
            )
            assert r.status_code == 200 and len(r.json()["hits"]) == 2


def test_not_ready_without_an_active_release(serving: Serving):
    with server(serving) as base:
        wait_for(lambda: httpx.get(f"{base}/v1/release").json()["refusal"])
        ready = httpx.get(f"{base}/readyz")
        q = httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers=auth(serving.keys["alice"]))
        health = httpx.get(f"{base}/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 503 and ready.json()["code"] == "not_ready"
    assert ready.json()["message"] == (
        "target 'staging' has no active release: query a built revision with ragpipe query --revision KEY "
        '"...", or activate an eligible release (ragpipe release list) with '
        "ragpipe release activate RELEASE_ID --target staging"
    )
    assert q.status_code == 503 and q.json()["code"] == "not_ready" and "x-release-id" not in q.headers


def test_release_route_and_metrics(active: Serving):
    release = active.releases["a1"]
    with server(active) as base:
        wait_for(lambda: release_of(base) == release)
        described = httpx.get(f"{base}/v1/release").json()
        httpx.post(f"{base}/v1/query", json={"query": "keys", "mode": "lexical"}, headers=auth(active.keys["alice"]))
        metrics = httpx.get(f"{base}/metrics").text
    assert described["ready"] is True and described["refusal"] is None
    assert {k: described["release"][k] for k in ("release_id", "target", "generation", "revision", "bundle_id")} == {
        "release_id": release,
        "target": "staging",
        "generation": 1,
        "revision": "r1",
        "bundle_id": active.bundles[release],
    }
    assert described["release"]["plan_id"].startswith("sha256:") and described["release"]["active_since"]
    assert 'ragpipe_release_generation{target="staging"} 1.0' in metrics
    assert 'ragpipe_release_swaps_total{target="staging"} 1.0' in metrics
    assert 'ragpipe_requests_total{route="/v1/query",status="200"} 1.0' in metrics
    assert 'ragpipe_request_duration_seconds_count{mode="lexical",route="/v1/query"} 1.0' in metrics


def test_readyz_says_which_vector_engine_serves_and_how(active: Serving):
    """An operator sees in ``/readyz`` (and ``/v1/release``) what serves the vectors and how,
    without reading the log."""
    with server(active) as base:
        wait_for(lambda: release_of(base) == active.releases["a1"])
        ready = httpx.get(f"{base}/readyz")
    assert ready.status_code == 200
    engine = ready.json()["release"]["vector_engine"]
    assert engine["engine"] == "memory"
    assert re.fullmatch(
        r"exact scores \(float64_sequential/v1\) in memory: \d+ vectors of 384 dimensions, [\d,]+ bytes.*, "
        r"read from vectors\.arrow",
        engine["why"],
    )


def test_openapi_document_names_every_route(active: Serving):
    with server(active) as base:
        doc = httpx.get(f"{base}/openapi.json").json()
    assert sorted(doc["paths"]) == [
        "/healthz",
        "/metrics",
        "/readyz",
        "/v1/answer",
        "/v1/feedback",
        "/v1/query",
        "/v1/release",
        "/v1/tools",
    ]
    assert set(doc["components"]["schemas"]["FeedbackRequest"]["properties"]) == {"trace_id", "verdict", "note"}
    assert set(doc["components"]["schemas"]["QueryRequest"]["properties"]) == {
        "query",
        "k",
        "mode",
        "trace",
        "source_roles",
        "filter",
    }


@pytest.mark.parametrize(
    ("method", "path", "content", "status", "error"),
    [
        ("GET", "/v2/nothing", None, 404, ("not_found", "no route /v2/nothing", None)),
        ("GET", "/v1/query", None, 405, ("method_not_allowed", "GET is not allowed on /v1/query", None)),
        (
            "POST",
            "/v1/query",
            b'{"query": "a", "k": ' + b"9" * 5000 + b"}",
            400,
            ("invalid_request", "body: cannot be parsed as JSON", None),
        ),
        (
            "POST",
            "/v1/query",
            b'{"query": "\xff\xfe"}',
            400,
            ("invalid_request", "body: cannot be parsed as JSON", None),
        ),
        (
            "POST",
            "/v1/query",
            b'{"query": "a\\ud800b"}',
            422,
            ("invalid_request", "query: not valid Unicode text (lone surrogate)", "query"),
        ),
        (
            "POST",
            "/v1/answer",
            b'{"question": "\\udfff"}',
            422,
            ("invalid_request", "question: not valid Unicode text (lone surrogate)", "question"),
        ),
        (
            "POST",
            "/v1/query",
            b'{"query": "a", "k": true}',
            422,
            ("invalid_request", "k: Input should be a valid integer", "k"),
        ),
        (
            "POST",
            "/v1/query",
            b'{"query": "a", "k": 2.0}',
            422,
            ("invalid_request", "k: Input should be a valid integer", "k"),
        ),
    ],
)
def test_every_error_is_json_with_a_code(active: Serving, method, path, content, status, error):
    with server(active) as base:
        wait_for(lambda: release_of(base))
        r = httpx.request(
            method,
            f"{base}{path}",
            content=content,
            headers={**auth(active.keys["alice"]), "content-type": "application/json"},
        )
    assert r.status_code == status
    assert r.json() == dict(zip(("code", "message", "field"), error))


def test_a_body_that_trickles_in_times_out_with_408(active: Serving):
    import socket

    with server(active, limits={"body_timeout_s": 0.5}) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
                + f"Authorization: Bearer {active.keys['alice']}\r\n\r\n".encode()
                + b'{"query": '
            )
            reply = b""
            while not reply.endswith(b"}"):  # the head and the body may come in separate segments
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
            reply = reply.decode()
    assert reply.startswith("HTTP/1.1 408 ")
    assert reply.endswith(
        '{"code": "request_timeout", "message": "request body: not received within 0.5 s", "field": "body"}'
    )


def test_a_metadata_filter_applies_inside_the_subjects_view(active: Serving):
    body = {"query": "rotate the signing keys", "k": 10, "filter": {"field": "source_role", "eq": "runbook"}}
    with server(active) as base:
        wait_for(lambda: release_of(base))
        staff = httpx.post(f"{base}/v1/query", json=body, headers=auth(active.keys["bob"]))
        public = httpx.post(f"{base}/v1/query", json=body, headers=auth(active.keys["alice"]))
        unknown = httpx.post(
            f"{base}/v1/query",
            json={**body, "filter": {"field": "year", "gte": 2020}},
            headers=auth(active.keys["bob"]),
        )
        malformed = httpx.post(
            f"{base}/v1/query", json={**body, "filter": {"and": []}}, headers=auth(active.keys["bob"])
        )
        not_object = httpx.post(f"{base}/v1/query", json={**body, "filter": [1]}, headers=auth(active.keys["bob"]))
    assert {h["document_id"] for h in staff.json()["hits"]} == {STAFF_DOC}
    assert staff.json()["filter"] == {"field": "source_role", "eq": "runbook"}
    assert public.status_code == 200 and public.json()["hits"] == []  # a filter never widens the view
    assert unknown.status_code == 422 and unknown.json() == {
        "code": "invalid_filter",
        "message": "filter field 'year' is not in this corpus (known fields: source_role)",
        "field": "filter",
    }
    assert malformed.status_code == 422 and malformed.json()["code"] == "invalid_filter"
    assert malformed.json()["message"].startswith("filter.and: ")
    assert not_object.status_code == 422 and not_object.json()["field"] == "filter"


def test_source_roles_filter_inside_the_subjects_view(active: Serving):
    body = {"query": "rotate the signing keys", "k": 10, "source_roles": ["runbook"]}
    with server(active) as base:
        wait_for(lambda: release_of(base))
        staff = httpx.post(f"{base}/v1/query", json=body, headers=auth(active.keys["bob"]))
        public = httpx.post(f"{base}/v1/query", json=body, headers=auth(active.keys["alice"]))
        bad = httpx.post(
            f"{base}/v1/query", json={**body, "source_roles": ["no way"]}, headers=auth(active.keys["bob"])
        )
    assert {h["document_id"] for h in staff.json()["hits"]} == {STAFF_DOC} and staff.json()["source_roles"] == [
        "runbook"
    ]
    assert public.status_code == 200 and public.json()["hits"] == []  # roles never widen the view
    assert bad.status_code == 422 and bad.json() == {
        "code": "invalid_query",
        "message": "invalid source role 'no way' (letters, digits, . _ : -)",
        "field": "query",
    }


def test_failed_keys_are_throttled_by_address_and_a_valid_key_is_not(active: Serving):
    """Key guessing costs the guesser's address: wrong keys, malformed headers and keyless requests
    (anonymous access off) all count against one per-address limit, over the API and over MCP alike;
    once it is used up they get 429 instead of 401, while a valid key from the same address is
    served (its limit is its own)."""
    wrong = {"Authorization": "Bearer rpk_alice_" + "x" * 43}
    with server(active, limits={"requests_per_minute": 3}) as base:
        wait_for(lambda: release_of(base))
        refused = [
            httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers=wrong).status_code,
            httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers={"Authorization": "Basic abc"}).status_code,
            httpx.post(f"{base}/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code,
        ]
        throttled = httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers=wrong)
        throttled_mcp = httpx.post(f"{base}/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        keyed = httpx.post(f"{base}/v1/query", json={"query": "keys"}, headers=auth(active.keys["alice"]))
    assert refused == [401, 401, 401]
    for r in (throttled, throttled_mcp):
        assert r.status_code == 429 and 1 <= int(r.headers["retry-after"]) <= 60
        assert r.json() == {
            "code": "rate_limited",
            "message": "rate limit of 3 requests a minute reached",
            "field": None,
        }
    assert keyed.status_code == 200
