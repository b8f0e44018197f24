"""The connection layer of ``ragpipe serve``: uvicorn, with the deadlines and the connection cap it lacks.

What uvicorn (0.55, read from ``uvicorn/protocols/http/{h11,httptools}_impl.py``) offers:

- ``timeout_keep_alive`` is armed only once a response is complete (``on_response_complete``): it
  closes a kept-alive connection left idle *between* requests, and nothing else;
- nothing times the arrival of a request head. A socket that connects and sends nothing, or sends
  half a request line and stops, stays open for as long as the peer likes (``h11_max_incomplete_event_size``
  bounds a head's size under h11, not its time);
- ``limit_concurrency`` is checked when a head is complete: at that many open connections (or
  tasks) the request gets a plain-text 503. The silent sockets above count as open connections
  but never complete a head, so ``limit_concurrency`` of them turn every other request into a 503
  and are never refused themselves.

So the deadline and the cap live here, in a subclass of the protocol uvicorn would pick
(``GuardedConnection`` over ``HttpToolsProtocol`` when httptools is installed, else ``H11Protocol``):

- **header deadline** (``limits.header_timeout_s``): from the moment a connection opens, or the
  first byte of a later request arrives on a kept-alive one, the request head must be complete
  within the deadline; otherwise the connection is closed — with a JSON 408 ``request_timeout`` if
  part of a head had arrived, silently if nothing had. The body has its own deadline
  (``limits.body_timeout_s``, ``ragpipe.server.bodies``);
- **idle deadline** (``limits.idle_timeout_s``): uvicorn's ``timeout_keep_alive``;
- **connection cap** (``limits.max_connections``): a connection that would make one too many
  first closes the connection that has waited longest *without a request in progress* (a silent
  socket, a head still trickling in, an idle kept-alive connection): those are the cheap ones to
  drop and the ones a flood consists of. Only when every open connection has a request in progress
  is the new one refused — with a JSON 503 ``overloaded`` once its head arrives. uvicorn's
  ``limit_concurrency`` is therefore not used.

Each close is counted in ``ragpipe_connections_closed_total{reason}`` (``header_timeout``,
``evicted``, ``refused``), and ``ragpipe_connections_open`` is the number open. Forwarded headers are not uvicorn's business here either
(``proxy_headers`` off): ``ragpipe.server.proxies`` decides whose header counts.
"""

from __future__ import annotations

import asyncio
import json
import time
from types import FrameType
from typing import Any, Literal

import uvicorn

from ragpipe.server.errors import ApiError, error_body
from ragpipe.server.metrics import ServerMetrics

HttpImpl = Literal["auto", "h11", "httptools"]


def _response(error: ApiError, extra: list[tuple[bytes, bytes]] = ()) -> tuple[list[tuple[bytes, bytes]], bytes]:
    body = json.dumps(error_body(error)).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
    ]
    return headers, body


class GuardedConnection:
    """Mixin over a uvicorn HTTP protocol class (see the module docstring). Class attributes, set by
    ``guarded_protocol``: ``header_timeout_s``, ``max_connections``, ``metrics`` (``ServerMetrics``).

    A connection is *waiting* while no request is in progress on it: before its first head is
    complete, and between a complete response and the next complete head. Only waiting connections
    are under the header deadline, and only they are evicted to make room."""

    header_timeout_s: float
    max_connections: int
    metrics: ServerMetrics

    # the attributes uvicorn's protocols define (typed for the reader; set by the base class)
    transport: asyncio.Transport
    connections: set[Any]
    cycle: Any
    loop: asyncio.AbstractEventLoop
    app: Any
    config: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started = False  # a byte of the pending head has arrived
        self._waiting_since = time.monotonic()
        self._refusing = False

    # -- state -------------------------------------------------------------------------------

    def _waiting(self) -> bool:
        return (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing()

    def _open(self) -> int:
        """Open connections, not counting those already closing (their ``connection_lost`` is pending)."""
        return sum(1 for c in self.connections if not (c.transport and c.transport.is_closing()))

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self.metrics.connections_open.inc()
        self._arm_head_deadline()
        if len(self.connections) > self.max_connections and self._open() > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        if self._waiting():
            if self._head_timer is None:  # the first bytes of a new head on a kept-alive connection
                self._arm_head_deadline()
            self._head_started = self._head_started or bool(data)
            if self._refusing and self._open() <= self.max_connections:  # room was made meanwhile
                self._refusing = False
                self.app = self.config.loaded_app
        before = self.cycle
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not before:  # a head is complete: the request runs (its body has its own deadline)
            self._cancel_head_deadline()
            self._head_started = False

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        # idle from now on (uvicorn's keep-alive timer runs) unless a pipelined request started
        self._waiting_since = time.monotonic()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        self.metrics.connections_open.dec()
        super().connection_lost(exc)  # type: ignore[misc]

    # -- the header deadline -----------------------------------------------------------------

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_started = False
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._waiting():  # the head completed, or the connection is closing anyway
            return
        if self._head_started:  # a client mid-request is told why; a silent socket is just closed
            error = ApiError(408, "request_timeout", f"request head: not received within {self.header_timeout_s:g} s")
            headers, body = _response(error)
            head = b"HTTP/1.1 408 Request Timeout\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
            self.transport.write(head + b"\r\n" + body)
        self.transport.close()
        self.metrics.closed("header_timeout")

    # -- the connection cap --------------------------------------------------------------------

    def _make_room(self) -> None:
        """One connection too many: close the longest-waiting other connection, else refuse this one."""
        waiting = [c for c in self.connections if c is not self and isinstance(c, GuardedConnection) and c._waiting()]
        if waiting:
            victim = min(waiting, key=lambda c: c._waiting_since)
            victim.transport.close()
            self.metrics.closed("evicted")
            return
        # Every other connection has a request in progress: this one is answered 503 when its head
        # arrives (under the header deadline like any other), unless room is made before then.
        self._refusing = True
        self.app = self._overloaded

    async def _overloaded(self, scope, receive, send) -> None:
        error = ApiError(503, "overloaded", f"all {self.max_connections} connections are busy: retry shortly")
        headers, body = _response(error, [(b"retry-after", b"1")])
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.metrics.closed("refused")


def _base_protocol(http: HttpImpl) -> type[asyncio.Protocol]:
    """The class uvicorn's ``http="auto"`` picks (httptools when installed, else h11), or the one named."""
    if http in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

            return HttpToolsProtocol
        except ImportError:
            if http == "httptools":
                raise
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


def guarded_protocol(
    http: HttpImpl, header_timeout_s: float, max_connections: int, metrics: ServerMetrics
) -> type[asyncio.Protocol]:
    """A ``GuardedConnection`` subclass of uvicorn's ``http`` protocol class with these settings."""
    base = _base_protocol(http)
    attributes = {"header_timeout_s": header_timeout_s, "max_connections": max_connections, "metrics": metrics}
    return type(f"Guarded{base.__name__}", (GuardedConnection, base), attributes)


class SignalledServer(uvicorn.Server):
    """uvicorn's server, remembering the signals it shut down on (``signals``). uvicorn re-raises
    them after a graceful shutdown, from inside ``asyncio.run``, whose own SIGINT handler it
    re-invokes; when that re-raised SIGINT lands as the main task ends it can be lost, and the
    process then ended with 0 instead of as a Ctrl-C (seen under load). The caller uses
    ``signals`` to end the same way every time."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.signals: list[int] = []

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals.append(sig)
        super().handle_exit(sig, frame)


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 0, http: HttpImpl = "auto") -> uvicorn.Config:
    """The uvicorn configuration ``ragpipe serve`` runs ``app`` (``ragpipe.server.app.Observed``) with:
    its ``limits`` as deadlines and the connection cap, no WebSocket upgrades (no route takes one),
    no uvicorn access log (``ragpipe.access`` has one line per request), and no proxy headers
    (``ragpipe.server.proxies`` reads them, from configured proxies only)."""
    limits = app.service.config.limits
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guarded_protocol(http, limits.header_timeout_s, limits.max_connections, app.service.metrics),
        ws="none",
        lifespan="on",
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]  # a float is what call_later takes
        limit_concurrency=None,
    )
