"""The server as ``ragpipe serve`` runs it — ``ragpipe.server.connections.uvicorn_config``: the guarded
protocol (header deadline, connection cap), the idle deadline, no uvicorn proxy headers — on
127.0.0.1 with an ephemeral port, in a background thread; and raw-socket helpers for the tests that
talk below HTTP clients (silent sockets, half-sent heads).

Every wait here is on a condition with a bound (a socket timeout, ``wait_for``'s deadline), never a
sleep followed by an assertion.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ragpipe.server.connections import HttpImpl, uvicorn_config
from ragpipe_tests.support.http_server import serving


@contextmanager
def served(app, http: HttpImpl = "auto", ready_timeout: float = 60.0) -> Iterator[str]:
    """Serve ``app`` (``app_from``'s) as ``ragpipe serve`` does until the block ends; yields its base
    URL once uvicorn listens."""
    with serving(uvicorn_config(app, "127.0.0.1", 0, http=http), ready_timeout) as base:
        yield base


def address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


def connect(base: str, sends: bytes = b"", timeout: float = 30.0) -> socket.socket:
    """A TCP connection to the server that has sent ``sends`` (nothing: a silent socket). ``timeout``
    bounds every later read: a test waiting for the server to act fails instead of hanging."""
    sock = socket.create_connection(address(base), timeout=timeout)
    if sends:
        sock.sendall(sends)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket's timeout:
    ``TimeoutError`` if the server never closes it)."""
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    """What the server sends until ``marker`` has arrived (bounded by the socket's timeout)."""
    received = b""
    while marker not in received:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed before {marker!r}: {received!r}")
        received += chunk
    return received


def metric(client: httpx.Client | str, name: str, **labels: str) -> float | None:
    """The value of sample ``name`` with ``labels`` in ``/metrics`` (None when absent). Pass an
    ``httpx.Client`` with a base URL to ask over its kept-alive connection (no new one opened); a
    base URL asks on a new connection with ``Connection: close``, so the *server* closes it — and
    has forgotten it before it reads the next event, which is what lets a test count connections
    exactly (a connection the client closes is forgotten whenever the server notices)."""
    if isinstance(client, httpx.Client):
        text = client.get("/metrics").text
    else:
        text = httpx.get(f"{client}/metrics", headers={"Connection": "close"}, timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None
