"""The MCP tools: the official SDK's server, streamable HTTP, mounted at ``/mcp``.

``knowledge_search`` (``ragpipe.server.knowledge``): labelled evidence. ``knowledge_answer``: a
grounded answer with citations, exactly ``POST /v1/answer``'s (``ragpipe.server.answers``: the
same body with ``release_id`` and ``trace_id``, the same limits and trace record, which says
``via: "mcp"``). A refusal is a one-line tool error: ``<code>: <message>`` for what HTTP answers
with a JSON error, the rule broken for a bad ``knowledge_search`` argument.

The MCP app sits behind ``KeyGuard``, which authenticates every HTTP request with the server's own
``KeyRing`` (the same keys, the same 401, the same rate limit) and hands the subject to the tools
through the request state; the SDK also binds each MCP session to the authenticated user, so
another key presenting a session's ID is refused. Sessions are bounded per key as well as in all
(``ragpipe.server.sessions``; refusals are the server's JSON errors). A tool call runs in a worker
thread and in one of the server's compute slots, on the release captured once for the call.

The session ID the label ledger is scoped to is the ``Mcp-Session-Id`` header. Clients on a
protocol version without sessions (or in stateless mode) have none: they pass ``run_id`` to keep
labels across calls, else every call starts at ``E1``.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp.server.transport_security import TransportSecuritySettings

from ragpipe.server.answers import AnswerRequest, Mode, answer_body
from ragpipe.server.config import Limits
from ragpipe.server.errors import ApiError, error_body
from ragpipe.server.knowledge import TOOL_DESCRIPTION, TOOL_NAME, LabelLedgers, ToolError, check_arguments, search
from ragpipe.server.sessions import SessionQuota, may_open_session

ANSWER_TOOL_NAME = "knowledge_answer"
ANSWER_TOOL_DESCRIPTION = (
    "Answer a question from the knowledge base (the active, verified release) with citations to the evidence "
    "it used, or abstain when the evidence does not answer it; only evidence the caller may see is used. "
    "Returns the answer, its citations and evidence, the release_id and a trace_id to send feedback on."
)


def build_mcp(service) -> MCPServer:
    """The MCP server with its two tools, answering from ``service`` (``ragpipe.server.app.Service``)."""
    mcp = MCPServer("ragpipe", instructions=TOOL_DESCRIPTION, log_level="WARNING")
    ledgers = LabelLedgers()

    @mcp.tool(name=TOOL_NAME, description=TOOL_DESCRIPTION)
    async def knowledge_search(
        query: str,
        ctx: Context,
        limit: int = 5,
        source_roles: list[str] | None = None,
        filter: dict[str, Any] | None = None,
        run_id: str | None = None,
    ) -> dict[str, object]:
        # The SDK shows a ToolError's message to the caller (any other exception becomes a bare
        # "Error executing tool" and a logged traceback).
        request = ctx.request_context.request
        try:
            check_arguments(query, limit, source_roles, run_id, service.config.limits.max_query_chars, filter)
            subject = request.state.caller.subject
            ledger = ledgers.ledger(request.state.caller, request.headers.get("mcp-session-id"), run_id)

            def work(in_service):
                return search(in_service, ledger, subject, query, limit, source_roles, filter)

            return await anyio.to_thread.run_sync(service.compute, request.state, work)
        except ToolError as exc:
            raise McpToolError(str(exc)) from None
        except ApiError as exc:
            raise refused(service, exc) from None
        except ValueError as exc:  # QueryError, AuthorizationError: the retriever's one-line refusals
            raise McpToolError(service.redact(str(exc))) from None

    @mcp.tool(name=ANSWER_TOOL_NAME, description=ANSWER_TOOL_DESCRIPTION)
    async def knowledge_answer(
        question: str,
        ctx: Context,
        mode: Mode | None = None,
        filter: dict[str, Any] | None = None,
    ) -> dict[str, object]:
        request = ctx.request_context.request
        body = AnswerRequest(question=question, mode=mode, filter=filter)
        try:
            return await anyio.to_thread.run_sync(
                answer_body, service, body, request.state.caller, request.state, "mcp"
            )
        except ApiError as exc:  # every refusal of the answer path, the retriever's included
            raise refused(service, exc) from None

    return mcp


def refused(service, exc: ApiError) -> McpToolError:
    """The tool error of what HTTP refuses with ``exc``: ``<code>: <message>``, one line, redacted."""
    return McpToolError(f"{exc.code}: {service.redact(exc.message)}")


def mcp_app(mcp: MCPServer, limits: Limits):
    """The streamable-HTTP ASGI app of ``mcp`` (mount it at ``/mcp``; run ``mcp.session_manager``
    in the host app's lifespan), with the SDK's session bounds from ``limits`` (``KeyGuard`` refuses
    first, as JSON; the SDK's own limit is the backstop). Host-header checks are the deployment's
    proxy's job: the SDK's default allows only 127.0.0.1/localhost with a port, which would refuse a
    server behind one."""
    return mcp.streamable_http_app(
        streamable_http_path="/",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_sessions=limits.mcp_sessions,
        session_idle_timeout=limits.mcp_session_idle_s,
    )


class KeyGuard:
    """Authenticate (and rate-limit) each HTTP request to the MCP app with the server's keys, and
    hold each caller to its share of MCP sessions (``SessionQuota``)."""

    def __init__(self, app, service):
        self.app = app
        self.service = service
        limits = service.config.limits
        self.sessions = SessionQuota(
            limits.mcp_sessions,
            limits.mcp_sessions_per_key,
            limits.mcp_session_idle_s,
            refused=lambda reason: service.metrics.sessions_refused.labels(reason).inc(),
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        client = scope.get("client") or ("-", 0)
        state = scope.setdefault("state", {})
        try:
            try:
                caller = self.service.keys.authenticate(headers.get("authorization"), client[0])
            except ApiError:
                self.service.limit(f"refused:{client[0]}")
                raise
            self.service.limit(caller.rate_key)
        except ApiError as exc:
            await _send_error(send, exc)
            return
        state["caller"] = caller
        state["subject"] = caller.subject.principal
        token = AccessToken(
            token="-", client_id=caller.rate_key, scopes=list(caller.subject.scopes), subject=caller.subject.principal
        )
        scope["user"] = AuthenticatedUser(token)  # the SDK binds a session to the user that opened it
        owner = caller.rate_key
        session_id = headers.get("mcp-session-id")
        if may_open_session(headers):
            try:
                self.sessions.reserve(owner)
            except ApiError as exc:
                await _send_error(send, exc)
                return
            opened: list[str] = []

            async def send_opened(message) -> None:
                if message["type"] == "http.response.start" and message["status"] < 400:
                    opened.extend(v.decode("latin-1") for k, v in message.get("headers", []) if k == b"mcp-session-id")
                await send(message)

            try:
                await self.app(scope, receive, send_opened)
            finally:
                self.sessions.opened(owner, opened[0] if opened else None)
            return
        if session_id is None or not self.sessions.started(session_id, owner):
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def send_observed(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            self.sessions.finished(session_id, status[0] if status else None, scope.get("method") == "DELETE")


async def _send_error(send, exc: ApiError) -> None:
    body = json.dumps(error_body(exc)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
