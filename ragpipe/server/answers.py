"""One served answer, asked over HTTP (``POST /v1/answer``) or MCP (``knowledge_answer``).

Both ways run ``answer_body``: the same text limits, the same compute slot and release captured
once (``Service.compute``), the same generator (the plan's, its timeout capped by
``limits.llm_timeout_s``), the same trace ID and trace record, and the same refusals as
``ApiError`` (``refusal`` maps the retriever's). Only how a refusal reaches the caller differs: a
JSON error over HTTP, a one-line tool error ``<code>: <message>`` over MCP.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ragpipe.retrieval.authz import AuthorizationError
from ragpipe.retrieval.results import FilterQueryError, QueryError
from ragpipe.server.auth import Caller
from ragpipe.server.errors import ApiError
from ragpipe.server.follower import InService
from ragpipe.server.tracing import new_trace_id, record_answer

FILTER_DESCRIPTION = (
    "Only chunks of documents whose metadata matches this filter, e.g. "
    '{"and": [{"field": "category", "eq": "faq"}, {"field": "year", "gte": 2020}]} (docs/retrieval.md).'
)
Mode = Literal["hybrid", "lexical", "vector"]


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    question: str = Field(description="The question.")
    mode: Mode | None = None
    filter: dict[str, Any] | None = Field(None, description=FILTER_DESCRIPTION)


def refusal(exc: QueryError | AuthorizationError, redact, field: str) -> ApiError:
    """The ``ApiError`` of one of the retriever's refusals, naming ``field`` (``filter`` for a bad
    filter); its text redacted (``redact``: ``Service.redact``), as a retriever's message may name
    a file of the bundle."""
    if isinstance(exc, FilterQueryError):
        return ApiError(422, "invalid_filter", redact(str(exc)), "filter")
    if isinstance(exc, QueryError):
        return ApiError(422, "invalid_query", redact(str(exc)), field)
    return ApiError(500, "authorization_check_failed", redact(str(exc)))


def answer_body(service, body: AnswerRequest, caller: Caller, state, via: str | None = None) -> dict[str, object]:
    """The ``/v1/answer`` body answering ``body`` for ``caller``'s subject from the release served
    now (``service``: ``ragpipe.server.app.Service``), traced when tracing is enabled; every
    refusal an ``ApiError``. ``state`` (the HTTP request's state) learns the trace ID first, then
    the release, mode and hits its access line reports. ``via`` (``"mcp"``) goes into the trace
    record; None (HTTP) leaves it out."""
    from ragpipe.answer.answering import answer, make_generator  # the answer stack only when asked

    state.trace_id = new_trace_id()  # in the body, X-Trace-Id and the access line
    service.check_text(body.question, "question")
    if service.config.log_query_text:
        state.query_text = body.question
    state.mode = body.mode

    def work(in_service: InService) -> dict[str, object]:
        plan = in_service.served.plan.answer.generator
        timeout = min(plan.timeout_seconds, service.config.limits.llm_timeout_s)
        generator = in_service.generators.get("answer")
        if generator is None:
            bounded = plan.model_copy(update={"timeout_seconds": timeout})
            generator = in_service.generators.setdefault(
                "answer", make_generator(bounded, in_service.served.bundle.bundle_id, service.ws.answer_cache)
            )
        result = answer(
            in_service.retriever, body.question, caller.subject, generator=generator, mode=body.mode, filter=body.filter
        )
        data = {**result.as_dict(), "release_id": in_service.release_id, "trace_id": state.trace_id}
        state.hits = len(data.get("evidence", []))  # type: ignore[arg-type]
        record_answer(service.traces, service.config.tracing, service.follower.target, data, caller, body.question, via)
        return data

    try:
        return service.compute(state, work)
    except (QueryError, AuthorizationError) as exc:
        raise refusal(exc, service.redact, "question") from None
