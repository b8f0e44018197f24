"""Starvation without a key: silent sockets, half-sent heads and idle connections cannot hold the
server's connections (``ragpipe.server.connections``), against the server as ``ragpipe serve`` runs
it (``uvicorn_config``) on 127.0.0.1, under both of uvicorn's HTTP implementations."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import httpx
import pytest

from ragpipe.release.activation import activate
from ragpipe.server.app import app_from
from ragpipe_tests.support.http_server import release_of, wait_for
from ragpipe_tests.support.served_http import connect, metric, read_until, read_until_closed, served
from ragpipe_tests.support.serving import Serving, config_for

HALF_HEAD = b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
IMPLEMENTATIONS = ["h11", "httptools"]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def active(serving: Serving) -> Serving:
    activate(serving.ws, serving.releases["a1"], "staging")
    return serving


def server(serving: Serving, http: str, **limits):
    return served(app_from(serving.ws.home, config_for(serving, limits=limits), "staging", serving.targets), http=http)


def keyed_query(client: httpx.Client, serving: Serving) -> httpx.Response:
    return client.post("/v1/query", json={"query": "signing keys", "k": 2}, headers=auth(serving.keys["alice"]))


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_max_connections_silent_and_half_sent_sockets_do_not_starve_a_keyed_request(active: Serving, http: str):
    """``max_connections`` sockets that never complete a head — half silent, half stopped mid-head —
    with a header deadline far away: the keyed request that makes one too many is served at once,
    because the connection that waited longest without a request is closed to make room."""
    with server(active, http, max_connections=16, header_timeout_s=120) as base:
        wait_for(lambda: release_of(base) == active.releases["a1"])
        # no connection is open but the probe's own (which the server closes): the count starts at 0
        wait_for(lambda: metric(base, "ragpipe_connections_open") == 1)
        silent = [connect(base) for _ in range(8)]
        half = [connect(base, HALF_HEAD) for _ in range(8)]
        try:
            # the listener accepts in arrival order, so this connection comes after all sixteen
            with httpx.Client(base_url=base, timeout=30) as client:
                r = keyed_query(client, active)
                assert r.status_code == 200 and r.json()["release_id"] == active.releases["a1"]
                assert len(r.json()["hits"]) == 2
                # one kept-alive connection for both requests: the count stays at the cap
                assert metric(client, "ragpipe_connections_closed_total", reason="evicted") == 1.0
                assert metric(client, "ragpipe_connections_closed_total", reason="refused") == 0.0
                assert metric(client, "ragpipe_connections_open") == 16.0
            assert read_until_closed(silent[0]) == b""  # the first silent socket waited longest
        finally:
            for sock in silent + half:
                sock.close()


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_the_header_deadline_closes_silent_and_half_sent_sockets(active: Serving, http: str):
    """With a short header deadline every one of ``max_connections`` silent or half-sent sockets is
    closed by the server (a half-sent head is told why, with a JSON 408); then a keyed request is
    served without any connection having been evicted: the deadline made the room."""
    with server(active, http, max_connections=8, header_timeout_s=0.3) as base:
        wait_for(lambda: release_of(base) == active.releases["a1"])
        wait_for(lambda: metric(base, "ragpipe_connections_open") == 1)
        silent = [connect(base) for _ in range(4)]
        half = [connect(base, HALF_HEAD) for _ in range(4)]
        try:
            assert [read_until_closed(sock) for sock in silent] == [b""] * 4
            replies = [read_until_closed(sock).decode() for sock in half]
        finally:
            for sock in silent + half:
                sock.close()
        for reply in replies:
            head, _, body = reply.partition("\r\n\r\n")
            assert head.splitlines()[0] == "HTTP/1.1 408 Request Timeout"
            assert "connection: close" in head.lower().splitlines()
            assert json.loads(body) == {
                "code": "request_timeout",
                "message": "request head: not received within 0.3 s",
                "field": None,
            }
        with httpx.Client(base_url=base, timeout=30) as client:
            assert keyed_query(client, active).status_code == 200
            assert metric(client, "ragpipe_connections_closed_total", reason="header_timeout") == 8.0
            assert metric(client, "ragpipe_connections_closed_total", reason="evicted") == 0.0


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_an_idle_kept_alive_connection_is_closed_and_a_later_head_has_its_own_deadline(serving: Serving, http: str):
    """After a response, a kept-alive connection that sends nothing is closed, silently, at the idle
    deadline; one that starts a second request and stops mid-head gets the header deadline's 408
    (the idle deadline is far away there: only the header deadline can close it)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with server(serving, http, idle_timeout_s=0.3) as base:
        idle = connect(base, request)
        try:
            first = read_until(idle, b'{"status":"ok"}').decode()
            assert first.startswith("HTTP/1.1 200 OK\r\n") and "connection: close" not in first.lower()
            assert read_until_closed(idle) == b""
        finally:
            idle.close()
    with server(serving, http, idle_timeout_s=120, header_timeout_s=0.3) as base:
        again = connect(base, request)
        try:
            read_until(again, b'{"status":"ok"}')
            again.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            second = read_until_closed(again).decode()
        finally:
            again.close()
    assert second.startswith("HTTP/1.1 408 Request Timeout\r\n")
    assert second.endswith(
        '{"code": "request_timeout", "message": "request head: not received within 0.3 s", "field": null}'
    )


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
def test_when_every_connection_is_busy_a_new_one_gets_503_overloaded(serving: Serving, http: str):
    """``max_connections`` connections each with a request in progress (a head whose body has not
    come, held by ``Expect: 100-continue``): nothing can be evicted, so one more connection is
    answered 503 ``overloaded``; once a busy connection goes, requests are served again."""
    head = (
        b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n"
        + f"Expect: 100-continue\r\nAuthorization: Bearer {serving.keys['alice']}\r\n\r\n".encode()
    )
    with server(serving, http, max_connections=4, body_timeout_s=120) as base:
        wait_for(lambda: metric(base, "ragpipe_connections_open") == 1)
        busy = [connect(base, head) for _ in range(4)]
        try:
            for sock in busy:  # the app has asked for the body: the request is in progress
                assert read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 100 ")
            refused = httpx.get(f"{base}/healthz", timeout=30)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.headers["connection"] == "close"
            assert refused.json() == {
                "code": "overloaded",
                "message": "all 4 connections are busy: retry shortly",
                "field": None,
            }
            busy.pop().close()
            # the server notices the close on its own time: ask until it has, counting the refusals
            statuses: list[int] = []

            def served_again() -> bool:
                statuses.append(httpx.get(f"{base}/healthz", timeout=30).status_code)
                return statuses[-1] == 200

            wait_for(served_again)
            assert set(statuses[:-1]) <= {503}
            refusals = 1 + len(statuses) - 1  # the first refusal above, and those while waiting
            assert metric(base, "ragpipe_connections_closed_total", reason="refused") == refusals
            assert metric(base, "ragpipe_connections_closed_total", reason="evicted") == 0.0
        finally:
            for sock in busy:
                sock.close()


def test_the_server_remembers_the_signals_it_shut_down_on():
    """``ragpipe serve`` ends with 130 whenever the server shut down on SIGINT, whether or not
    uvicorn's re-raised signal survives asyncio's runner (cli/serve.py): the server keeps them.
    Run in a process of its own: sse-starlette patches uvicorn's ``handle_exit`` to set a
    process-wide flag that ends every later SSE stream (MCP's) in the process that calls it."""
    script = textwrap.dedent(
        """
        import signal

        import uvicorn

        from ragpipe.server.connections import SignalledServer

        server = SignalledServer(uvicorn.Config(app=lambda scope, receive, send: None))
        print(server.signals, server.should_exit)
        server.handle_exit(signal.SIGINT, None)
        print(server.signals, server.should_exit, server.force_exit)
        server.handle_exit(signal.SIGINT, None)  # a second Ctrl-C: uvicorn's forced exit, still remembered
        print(server.signals, server.force_exit)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    sigint = repr(signal.SIGINT)
    assert done.stdout.splitlines() == [
        "[] False",
        f"[{sigint}] True False",
        f"[{sigint}, {sigint}] True",
    ]
