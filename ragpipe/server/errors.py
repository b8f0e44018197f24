"""Errors as JSON with a stable ``code``, and the request-body bound.

Codes: ``unauthorized`` (401), ``rate_limited`` (429, ``Retry-After``), ``invalid_request`` (422: a
field breaks its rule; ``field`` names it), ``invalid_query`` (422: the retriever refused the text
or mode), ``body_too_large`` / ``query_too_long`` (413), ``not_ready`` (503: no release served
yet, and why), ``overloaded`` (503: every compute slot stayed busy for ``queue_timeout_s``),
``authorization_check_failed`` (500: an index row contradicted the verified tables; nothing is
returned). Validation messages name the field and the rule, never echo the input.
"""

from __future__ import annotations

import json

from fastapi.exceptions import RequestValidationError


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}


def error_body(error: ApiError) -> dict[str, object]:
    return {"code": error.code, "message": error.message, "field": error.field}


def validation_error(exc: RequestValidationError) -> ApiError:
    """The first problem of a request that failed validation, as ``invalid_request``."""
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    field = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return ApiError(422, "invalid_request", "body: not valid JSON", "body")
    message = str(first.get("msg", "invalid"))
    return ApiError(422, "invalid_request", f"{field or 'body'}: {message}", field)


class BodyLimit:
    """Refuse a request body over ``max_bytes`` with 413 ``body_too_large`` before the app reads it:
    by ``Content-Length`` when given, else while it streams in (the body is buffered — it is at
    most ``max_bytes`` — and replayed to the app)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: let the app see the disconnect
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed():
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, send) -> None:
        body = json.dumps(
            error_body(ApiError(413, "body_too_large", f"request body: at most {self.max_bytes} bytes", "body"))
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
