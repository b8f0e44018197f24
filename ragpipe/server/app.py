"""The HTTP API (FastAPI): query and answer over the release a ``ReleaseFollower`` serves.

| route | what |
|---|---|
| ``POST /v1/query``  | ``{"query", "k", "mode", "trace"}`` → the body of ``ragpipe query --json`` + ``release_id`` |
| ``POST /v1/answer`` | ``{"question", "mode"}`` → the body of ``ragpipe answer --json`` + ``release_id``, ``trace_id`` |
| ``POST /v1/feedback`` | ``{"trace_id", "verdict", "note"}`` → a verdict on a traced answer (``ragpipe.server.feedback``) |
| ``GET /v1/release`` | the release served (ID, target, generation, since when, bundle, plan) and the last refusal |
| ``GET /v1/tools``   | ``knowledge_search`` as an OpenAI-style function schema (``ragpipe.server.knowledge``) |
| ``/mcp``            | that tool and ``knowledge_answer`` (``/v1/answer``'s) over MCP, streamable HTTP (``ragpipe.server.mcp_tool``), same keys |
| ``GET /healthz``    | 200 while the process runs |
| ``GET /readyz``     | 200 while a release is served (with the last refusal, if any), else 503 and why |
| ``GET /metrics``    | Prometheus text format (``ragpipe.server.metrics``) |
| ``/lab/``           | the laboratory's pages for keys with the ``reviewer`` role (``ragpipe.server.lab``) |

The subject of a request comes from its key alone (``Authorization: Bearer rpk_…``); a body field or
query text naming scopes or a principal changes nothing. Every response carries ``X-Release-Id``
(the release that answered, else the one being served); every error is JSON
``{"code", "message", "field"}`` with a stable ``code`` (``ragpipe.server.errors``). No response names
an absolute path of the server's (``ragpipe.server.redact``); the client address is the TCP peer's
unless the peer is a configured proxy (``ragpipe.server.proxies``); deadlines and the connection
cap live below the app (``ragpipe.server.connections``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from ragpipe.kernel.workspace import Workspace
from ragpipe.retrieval.authz import AuthorizationError
from ragpipe.retrieval.results import QueryError
from ragpipe.server.answers import FILTER_DESCRIPTION, AnswerRequest, answer_body, refusal
from ragpipe.server.auth import Caller, KeyRing
from ragpipe.server.bodies import BodyLimit
from ragpipe.server.config import ServeConfig
from ragpipe.server.errors import ApiError, error_body, validation_error
from ragpipe.server.feedback import FeedbackRequest, send_feedback
from ragpipe.server.follower import InService, NotReady, ReleaseFollower
from ragpipe.server.knowledge import openai_tools
from ragpipe.server.lab.views import lab_app
from ragpipe.server.mcp_tool import KeyGuard, build_mcp, mcp_app
from ragpipe.server.metrics import ServerMetrics
from ragpipe.server.proxies import ForwardedClient
from ragpipe.server.ratelimit import RateLimiter
from ragpipe.server.redact import PathRedactor
from ragpipe.server.tracing import TraceLog

access_log = logging.getLogger("ragpipe.access")
log = logging.getLogger("ragpipe.server")
ROUTES = (
    "/v1/query",
    "/v1/answer",
    "/v1/feedback",
    "/v1/release",
    "/v1/tools",
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/docs",
)
RELEASE_HEADER = "X-Release-Id"
TRACE_HEADER = "X-Trace-Id"  # every /v1/answer response's trace ID (ragpipe.server.tracing)


class QueryRequest(BaseModel):
    # Unknown fields (a smuggled "scopes" or "principal") are ignored, never honoured or echoed.
    model_config = ConfigDict(extra="ignore")

    query: str = Field(description="The query text.")
    k: StrictInt = Field(10, ge=1, description="Number of hits (at most the server's max_k).")
    mode: Literal["hybrid", "lexical", "vector"] | None = Field(None, description="Channels (default: the plan's).")
    trace: StrictBool = Field(False, description="Add the subject's view of the trace.")
    source_roles: list[str] | None = Field(
        None, min_length=1, max_length=32, description="Only chunks of documents with one of these source roles."
    )
    filter: dict[str, Any] | None = Field(None, description=FILTER_DESCRIPTION)


class Service:
    """What the routes share: config, keys, the follower, metrics, limits."""

    def __init__(self, ws: Workspace, config: ServeConfig, follower: ReleaseFollower, metrics: ServerMetrics):
        self.ws = ws
        self.config = config
        self.follower = follower
        self.metrics = metrics
        self.keys = KeyRing(config)
        self.limiter = RateLimiter(config.limits.requests_per_minute)
        self.slots = threading.BoundedSemaphore(config.limits.max_concurrent)
        self.redact = PathRedactor(ws.home)  # every message built from an exception or a refusal passes here
        self.traces = TraceLog(ws.home)  # appends only with config.tracing.enabled

    def limit(self, rate_key: str) -> None:
        """429 ``rate_limited`` once ``rate_key`` has used up its requests of the last minute."""
        retry_after = self.limiter.hit(rate_key)
        if retry_after is not None:
            raise ApiError(
                429,
                "rate_limited",
                f"rate limit of {self.config.limits.requests_per_minute} requests a minute reached",
                headers={"Retry-After": str(retry_after)},
            )

    def check_text(self, text: str, field: str) -> None:
        limit = self.config.limits.max_query_chars
        if len(text) > limit:
            raise ApiError(413, "query_too_long", f"{field}: {len(text)} characters, at most {limit} allowed", field)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a JSON \ud800 escape: no tokenizer takes it
            raise ApiError(422, "invalid_request", f"{field}: not valid Unicode text (lone surrogate)", field) from None

    def compute(self, state, work):
        """Run ``work(in_service)`` in a compute slot on the release served now (captured once);
        ``state`` is the request's state (it learns the release that answered)."""
        if not self.slots.acquire(timeout=self.config.limits.queue_timeout_s):
            raise ApiError(503, "overloaded", "all compute slots are busy: retry shortly", headers={"Retry-After": "1"})
        try:
            try:
                in_service = self.follower.acquire()
            except NotReady as exc:
                raise ApiError(503, "not_ready", self.redact(str(exc)), headers={"Retry-After": "1"}) from None
            state.release_id = in_service.release_id
            self.metrics.in_flight.inc()
            try:
                return work(in_service)
            finally:
                self.metrics.in_flight.dec()
                self.follower.release(in_service)
        finally:
            self.slots.release()


# The dependencies are coroutines: FastAPI runs a plain ``def`` dependency in a worker thread,
# and each such hop costs more here than the key check and rate limit do (microseconds).
async def _service(request: Request) -> Service:
    return request.app.state.service


async def _caller(request: Request, service: Annotated[Service, Depends(_service)]) -> Caller:
    client = request.client.host if request.client else "-"
    try:
        caller = service.keys.authenticate(request.headers.get("authorization"), client)
    except ApiError:
        service.limit(f"refused:{client}")  # guessing keys counts against the caller's address
        raise
    request.state.subject = caller.subject.principal
    service.limit(caller.rate_key)
    return caller


CallerDep = Annotated[Caller, Depends(_caller)]


def _query(service: Service, body: QueryRequest, caller: Caller, request: Request) -> dict[str, object]:
    service.check_text(body.query, "query")
    if service.config.log_query_text:
        request.state.query_text = body.query
    if body.k > service.config.limits.max_k:
        raise ApiError(422, "invalid_request", f"k: at most {service.config.limits.max_k}", "k")
    request.state.mode = body.mode

    def work(in_service: InService) -> dict[str, object]:
        roles = tuple(body.source_roles) if body.source_roles else None
        result = in_service.retriever.query(
            body.query,
            caller.subject,
            k=body.k,
            mode=body.mode,
            trace=body.trace,
            source_roles=roles,
            filter=body.filter,
        )
        request.state.mode = result.mode
        request.state.hits = len(result.hits)
        return {**result.as_dict(), "release_id": in_service.release_id}

    return service.compute(request.state, work)


def _answered(service: Service, work, field: str) -> JSONResponse:
    """``work()``'s body as JSON; the retriever's refusals as JSON errors naming ``field`` (their
    text redacted: a retriever's message may name a file of the bundle)."""
    try:
        return JSONResponse(work())
    except (QueryError, AuthorizationError) as exc:
        raise refusal(exc, service.redact, field) from None


def create_app(
    ws: Workspace,
    config: ServeConfig,
    follower: ReleaseFollower,
    metrics: ServerMetrics,
) -> Observed:
    """The app over ``follower`` (started by the app's lifespan, stopped when it ends)."""
    service = Service(ws, config, follower, metrics)
    mcp = build_mcp(service)
    tool_app = KeyGuard(mcp_app(mcp, config.limits), service)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Sync routes and the MCP tool run in anyio's worker threads (40 by default): room for every
        # compute slot plus the requests queued for one, so max_concurrent is never capped by the pool.
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, 2 * config.limits.max_concurrent + 16)
        follower.start()
        try:
            async with mcp.session_manager.run():  # a mounted app's own lifespan is not run
                yield
        finally:
            follower.stop()
            service.traces.close()

    app = FastAPI(
        title="ragpipe",
        summary="Retrieval and grounded answers from the active, verified release of a target.",
        version="1",
        lifespan=lifespan,
    )
    app.state.service = service

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        message = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
        error = ApiError(exc.status_code, code, message.get(exc.status_code, "body: cannot be parsed as JSON"))
        return JSONResponse(error_body(error), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The traceback is for the operator's log; the caller gets one line and a stable code.
        log.error("internal error on %s", request.url.path, exc_info=exc)
        return JSONResponse(error_body(ApiError(500, "internal_error", "internal error")), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        error = validation_error(exc)
        return JSONResponse(error_body(error), status_code=error.status)

    # The bodies are plain JSON already (what the CLI prints): returned as a JSONResponse they skip
    # FastAPI's recursive encoder, which costs about a millisecond on ten hits with their text.
    @app.post("/v1/query", response_model=None)
    def query(request: Request, body: QueryRequest, caller: CallerDep) -> JSONResponse:
        """Ranked chunks visible to the caller's subject, from the release served now."""
        return _answered(service, lambda: _query(service, body, caller, request), "query")

    @app.post("/v1/answer", response_model=None)
    def answer_route(request: Request, body: AnswerRequest, caller: CallerDep) -> JSONResponse:
        """A grounded answer with citations, or an abstention, from the release served now (the
        same answer as MCP's ``knowledge_answer``: ``ragpipe.server.answers``)."""
        return JSONResponse(answer_body(service, body, caller, request.state))

    @app.post("/v1/feedback", response_model=None)
    def feedback(body: FeedbackRequest, caller: CallerDep) -> JSONResponse:
        """A verdict (up, down, disputed) on a traced answer, by the key that asked or a reviewer."""
        served = follower.current_release_id
        return JSONResponse(send_feedback(config, service.traces, follower.target, served, body, caller))

    # The light routes are coroutines: they never wait behind queries for a worker thread.
    @app.get("/v1/release")
    async def release(request: Request) -> dict[str, object]:
        """The release being served and the last refused pointer change (paths redacted: no key needed)."""
        return service.redact.tree(follower.status())  # type: ignore[return-value]

    @app.get("/v1/tools")
    async def tools() -> list[dict[str, object]]:
        """The tools this server offers, as OpenAI-style function schemas (served over MCP at /mcp)."""
        return openai_tools()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        status: dict = service.redact.tree(follower.status())  # type: ignore[assignment]
        if status["ready"]:
            return JSONResponse(status)
        reason = status["refusal"]["reason"] if status["refusal"] else "starting"  # type: ignore[index]
        return JSONResponse(error_body(ApiError(503, "not_ready", str(reason))) | {"status": status}, status_code=503)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    app.mount("/mcp", tool_app)
    app.mount("/lab", lab_app(service))
    app.add_middleware(BodyLimit, max_bytes=config.limits.max_body_bytes, timeout_s=config.limits.body_timeout_s)
    return Observed(ForwardedClient(app, config.trusted_proxies, config.forwarded_header), service)


def route_label(path: str) -> str:
    """The metrics/log label of ``path``: a known route, ``/mcp``, or ``other`` (bounded cardinality)."""
    if path in ROUTES:
        return path
    for mounted in ("/mcp", "/lab"):
        if path == mounted or path.startswith(mounted + "/"):
            return mounted
    return "other"


class Observed:
    """Outermost ASGI layer: the ``X-Release-Id`` header, metrics and the access log line of every
    HTTP response (a pure ASGI wrapper: no per-request task or body copy)."""

    def __init__(self, app, service: Service):
        self.app = app
        self.service = service

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope.setdefault("state", {})
        status_holder = {"status": 500}

        async def send_observed(message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                release_id = state.get("release_id") or self.service.follower.current_release_id
                headers = list(message.get("headers", []))
                if release_id:
                    headers.append((RELEASE_HEADER.lower().encode(), release_id.encode()))
                if state.get("trace_id"):
                    headers.append((TRACE_HEADER.lower().encode(), state["trace_id"].encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            self._record(scope, state, status_holder["status"], time.perf_counter() - started)

    def _record(self, scope, state: dict, status: int, seconds: float) -> None:
        route = route_label(scope.get("path", ""))
        self.service.metrics.observe(route, status, state.get("mode"), seconds)
        line = {
            "route": route,
            "status": status,
            "latency_ms": round(seconds * 1000, 3),
            "release_id": state.get("release_id"),
            "subject": state.get("subject"),
            "hits": state.get("hits"),
        }
        if state.get("trace_id"):
            line["trace_id"] = state["trace_id"]
        if self.service.config.log_query_text and "query_text" in state:
            line["query"] = state["query_text"]
        access_log.info(json.dumps(line, sort_keys=True))


def app_from(
    home: Path, config: ServeConfig, target: str | None, targets_path: Path | None = None, **retriever_options
) -> Observed:
    """The whole server for ``home`` (its follower, metrics and app); what ``ragpipe serve`` runs."""
    ws = Workspace(home)
    # the served home's cache
    retriever_options = {"query_graph_dir": ws.query_graphs, **retriever_options}
    follower_holder: dict[str, ServerMetrics] = {}
    follower = ReleaseFollower(
        ws,
        target or config.target,
        config.poll_interval_s,
        targets_path,
        retriever_options,
        on_swap=lambda s: follower_holder["m"].swapped(s.served.generation),
        on_refusal=lambda _: follower_holder["m"].refusal(),
    )
    metrics = follower_holder["m"] = ServerMetrics(follower.target)
    return create_app(ws, config, follower, metrics)
