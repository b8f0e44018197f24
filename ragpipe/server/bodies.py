"""Request bodies: bounded in size, and always read as JSON.

``BodyLimit`` refuses a body over ``max_bytes`` with 413 ``body_too_large`` before the app reads it,
and one nesting deeper than ``MAX_BODY_DEPTH`` with 422 ``invalid_request`` (field ``body``).
Every body route takes JSON and nothing else, so a body arriving without a content type, or with
the form type ``curl -d`` sends by default, is handed to the app as ``application/json`` (the form
is never parsed; the lab's pages under ``/lab/`` are the exception: ``FORM_PREFIX``). Strict content-type checks guard cookie-authenticated apps against cross-site
form posts; here a subject needs a ``Bearer`` key, which a cross-site form cannot send.
"""

from __future__ import annotations

import json

import anyio

from ragpipe.kernel.strict_load import json_depth_rule
from ragpipe.server.errors import ApiError, error_body

AS_JSON = {None, b"application/x-www-form-urlencoded"}
FORM_PREFIX = "/lab/"


# JSON nesting a body may have: far beyond any request (a filter's 32 levels of and/or/not are
# about 65 of JSON), far below the depth at which ``json`` runs out of stack.
MAX_BODY_DEPTH = 256


class BodyLimit:
    """Refuse a request body over ``max_bytes`` with 413 ``body_too_large`` before the app reads it:
    by ``Content-Length`` when given, else while it streams in (the body is buffered — it is at
    most ``max_bytes`` — and replayed to the app)."""

    def __init__(self, app, max_bytes: int, timeout_s: float = 10.0):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        try:
            with anyio.fail_after(self.timeout_s):  # a body trickling in must not hold a connection forever
                chunks = await self._read(receive)
        except TimeoutError:
            await self._send(
                send, ApiError(408, "request_timeout", f"request body: not received within {self.timeout_s} s", "body")
            )
            return
        if chunks is None:
            await self._refuse(send)
            return
        body = b"".join(chunks)
        # decoded as json will decode it (UTF-8, or UTF-16/32 by its first bytes): a check on another
        # view of the bytes could be walked round
        text = body.decode(json.detect_encoding(body), "replace") if body else ""
        too_deep = json_depth_rule(text, MAX_BODY_DEPTH) if text else None
        if too_deep:  # json would recurse past Python's limit: a 500 and a logged traceback
            await self._send(send, ApiError(422, "invalid_request", f"request body: {too_deep}", "body"))
            return
        replay = [{"type": "http.request", "body": body, "more_body": False}]

        async def replayed():
            return replay.pop() if replay else await receive()

        # The lab's pages post real forms and guard them with a session's CSRF token
        # (ragpipe.server.lab.login): their content type is left as sent.
        if headers.get(b"content-type") in AS_JSON and not scope.get("path", "").startswith(FORM_PREFIX):
            kept = [(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
            scope = {**scope, "headers": [*kept, (b"content-type", b"application/json")]}
        await self.app(scope, replayed, send)

    async def _read(self, receive) -> list[bytes] | None:
        """The body's chunks; None once more than ``max_bytes`` arrived."""
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return chunks  # the client went away: let the app see an empty body
            body = message.get("body", b"")
            total += len(body)
            if total > self.max_bytes:
                return None
            chunks.append(body)
            if not message.get("more_body", False):
                return chunks

    async def _refuse(self, send) -> None:
        await self._send(send, ApiError(413, "body_too_large", f"request body: at most {self.max_bytes} bytes", "body"))

    async def _send(self, send, error: ApiError) -> None:
        body = json.dumps(error_body(error)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
