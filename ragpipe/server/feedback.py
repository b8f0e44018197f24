"""``POST /v1/feedback``: a verdict on a served answer, appended to its trace's log.

Body ``{"trace_id", "verdict": "up"|"down"|"disputed", "note"?}`` (note: at most
``MAX_NOTE_CHARS``). Only the key that asked for the answer (the trace's ``key_id``) or a key with
the ``reviewer`` role may send it. Errors, in the order they are checked: 422 ``invalid_request``
(a bad body, naming the field), 409 ``tracing_disabled`` (nothing is traced, so nothing can be
found), 404 ``trace_not_found``, 403 ``forbidden`` — whose message names the trace ID only, never
what the trace holds. The record is a ``feedback`` record in the same log as the trace
(``ragpipe.server.tracing``), so one verified chain holds an answer and every verdict on it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ragpipe.release.history import now_iso
from ragpipe.server.auth import Caller
from ragpipe.server.config import ServeConfig
from ragpipe.server.errors import ApiError
from ragpipe.server.tracing import FEEDBACK, TraceLog, find_trace, nfc_strings

MAX_NOTE_CHARS = 2000
TRACE_ID = r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"


class FeedbackRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    trace_id: str = Field(pattern=TRACE_ID, description="The trace ID of an answer (its X-Trace-Id).")
    verdict: Literal["up", "down", "disputed"]
    note: str | None = Field(None, max_length=MAX_NOTE_CHARS, description="Why (at most 2000 characters).")


def send_feedback(
    config: ServeConfig, traces: TraceLog, target: str, served: str | None, body: FeedbackRequest, caller: Caller
) -> dict[str, object]:
    """Append ``caller``'s verdict to the log of the trace ``body.trace_id`` of ``target`` (the
    release ``served`` now is looked in first); the response body, or an ``ApiError``."""
    if not config.tracing.enabled:
        raise ApiError(409, "tracing_disabled", "tracing is not enabled on this server: no trace can be found")
    entry = find_trace(traces.home, target, body.trace_id, first=served)
    if entry is None:
        raise ApiError(404, "trace_not_found", f"no trace {body.trace_id} on target {target}", "trace_id")
    own = caller.key_id is not None and entry.trace.get("key_id") == caller.key_id
    reviewer = "reviewer" in caller.roles
    if not (own or reviewer):
        raise ApiError(
            403, "forbidden", f"trace {body.trace_id}: only the key that asked or a reviewer may send feedback"
        )
    payload = {
        "trace_id": body.trace_id,
        "at": now_iso(),
        "verdict": body.verdict,
        **({"note": body.note} if body.note is not None else {}),
        "key_id": caller.key_id,
        "subject": caller.subject.principal,
        "as_reviewer": not own,
    }
    record = traces.append(target, entry.release_id, FEEDBACK, nfc_strings(payload))
    return {"trace_id": body.trace_id, "verdict": body.verdict, "release_id": entry.release_id, "seq": record.seq}
