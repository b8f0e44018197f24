"""What went wrong in a failed run, in the user's terms.

Dagster wraps a user-code exception (``StageError``, ``RevisionError``, …) in its own errors
("Error occurred while executing op …"); a failed blocking check surfaces as a step failure that
names only the check. These functions unwrap both: a step failure is reported as its root cause,
the first non-Dagster exception down the ``cause``/``context`` chain; a failed check as its
``description``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from dagster import DagsterEvent, DagsterEventType

if TYPE_CHECKING:  # the type of every event's error; not part of dagster's public API
    from ragpipe.orchestration.dagster_internals import SerializableErrorInfo

# A failed blocking check also fails its step with this error; the check's own evaluation (with
# its description) is the message worth showing.
_CHECK_FAILED = "DagsterAssetCheckFailedError"


def root_cause(error: SerializableErrorInfo) -> SerializableErrorInfo:
    """The first error down the chain that is not one of Dagster's wrappers (or the last one)."""
    while error.cls_name.startswith("Dagster") and (error.cause or error.context) is not None:
        error = error.cause or error.context  # type: ignore[assignment]
    return error


def error_text(error: SerializableErrorInfo) -> str:
    """The exception's message; ragpipe's own error classes without their module-qualified name,
    any other class (``KeyError: 'x'``) with it, since there the class is the information."""
    text = error.message.strip()
    head, sep, rest = text.partition(": ")
    if sep and head.startswith("ragpipe.") and head.endswith("." + error.cls_name):
        return rest.strip() or error.cls_name
    return text or error.cls_name


def failure_messages(events: Iterable[DagsterEvent]) -> list[str]:
    """One line (or block) per failed check and per failed step, in event order; the run's own
    failure (e.g. a resource that could not start) only when no step or check explains it."""
    messages: list[str] = []
    run_failure: list[str] = []
    for event in events:
        data = event.event_specific_data
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION and not data.passed:  # type: ignore[union-attr]
            key = data.asset_check_key  # type: ignore[union-attr]
            reason = data.description or "(the check gave no description)"  # type: ignore[union-attr]
            messages.append(f"check {key.name} on {key.asset_key.to_user_string()} failed: {reason}")
        elif event.is_step_failure and getattr(data, "error", None) is not None:
            cause = root_cause(data.error)  # type: ignore[union-attr]
            if cause.cls_name != _CHECK_FAILED:
                messages.append(f"{event.step_key}: {error_text(cause)}")
        elif event.event_type == DagsterEventType.RUN_FAILURE and getattr(data, "error", None) is not None:
            run_failure.append(error_text(root_cause(data.error)))  # type: ignore[union-attr]
    return messages or run_failure or ["the run failed without a step or check error: see its logs in Dagster"]
