"""Errors as JSON with a stable ``code``.

Codes: ``unauthorized`` (401), ``rate_limited`` (429, ``Retry-After``), ``too_many_sessions`` (429:
the key holds its share of MCP sessions), ``invalid_request`` (422: a field breaks its rule,
``field`` names it; 400: a body that cannot be parsed), ``invalid_query`` (422: the retriever
refused the text or mode), ``body_too_large`` / ``query_too_long`` (413), ``request_timeout`` (408:
the body, or a request head, did not arrive in time), ``not_found`` (404), ``method_not_allowed``
(405), ``not_ready`` (503: no release served yet, and why), ``overloaded`` (503: every compute slot
stayed busy for ``queue_timeout_s``, every connection is busy at ``max_connections``, or every MCP
session slot is taken), ``authorization_check_failed`` (500: an index row contradicted the verified
tables; nothing is returned), ``internal_error`` (500: the traceback is logged, never returned).
Validation messages name the field and the rule, never echo the input; messages built from an
exception or a refusal name no absolute path (``ragpipe.server.redact``).
"""

from __future__ import annotations

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
