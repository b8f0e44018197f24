"""A run's stored events, turned into what ``ragpipe build`` shows: plain dataclasses.

``Tracker.feed`` takes each ``EventLogEntry`` as it is stored (in process through an event
listener, from the queue by polling the event log) and returns zero or more of the dataclasses
below; the CLI renders them and never touches a Dagster object. A step that evaluated checks is
shown as its check lines, not as a step line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from dagster import DagsterEventType, EventLogEntry

from ragpipe.defs.celery_wait import WAIT_MESSAGE
from ragpipe.defs.metadata import ENCODED, NEW_TEXTS

# Dagster's engine event for a step waiting on a pool carries the pool as structured metadata.
POOL = "pool"
# Materialization metadata a step line shows, in order, when the step's materialization has it.
COUNT_KEYS = (
    ("dagster/row_count", "rows"),
    ("excluded", "excluded"),
    ("encoded", "encoded"),
    ("cache_hits", "cached"),
    ("generation_calls", "model calls"),  # representations with generated kinds
    ("generation_cost", "cost"),
    ("bundle_id", "bundle"),
)
# The chain's steps have other key facts (and release_manifest also carries bundle_id, which its
# line should not repeat), so their keys are chosen per step.
STEP_COUNT_KEYS = {
    "evaluation_run": (("evaluated", "evaluated"), ("skipped", "skipped"), ("failed", "failed")),
    "gate_decision": (("eligible", "eligible"), ("decisive_phase", "decisive phase")),
    "release_manifest": (("release_id", "release"),),
}


@dataclass(frozen=True)
class RunQueued:
    run_id: str


@dataclass(frozen=True)
class RunStarted:
    run_id: str


@dataclass(frozen=True)
class PoolWait:
    step: str
    pool: str


@dataclass(frozen=True)
class WorkerWait:
    """A step no Celery worker has taken yet (``ragpipe.defs.celery_wait``)."""

    step: str
    message: str


@dataclass(frozen=True)
class EmbeddingProgress:
    done: int
    total: int


@dataclass(frozen=True)
class StepFinished:
    step: str
    ok: bool
    seconds: float
    counts: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class CheckFinished:
    asset: str
    check: str
    passed: bool
    description: str | None


@dataclass(frozen=True)
class LogLine:
    """One event as Dagster would print it; emitted only when following verbosely."""

    text: str


Progress = RunQueued | RunStarted | PoolWait | WorkerWait | EmbeddingProgress | StepFinished | CheckFinished | LogLine


@dataclass
class Tracker:
    """Stateful: a step line needs its start time, its materialization and whether it ran checks."""

    log_lines: bool = False
    _started: dict[str, float] = field(default_factory=dict)
    _counts: dict[str, tuple[tuple[str, object], ...]] = field(default_factory=dict)
    _check_steps: set[str] = field(default_factory=set)
    _waiting: set[str] = field(default_factory=set)  # steps whose pool wait was shown

    def feed(self, entry: EventLogEntry) -> list[Progress]:
        shown: list[Progress] = [LogLine(log_line(entry))] if self.log_lines else []
        event = entry.dagster_event
        if event is None:
            return shown
        kind, step, data = event.event_type, event.step_key or "", event.event_specific_data
        if kind == DagsterEventType.RUN_ENQUEUED:
            shown.append(RunQueued(entry.run_id))
        elif kind == DagsterEventType.RUN_START:
            shown.append(RunStarted(entry.run_id))
        elif kind == DagsterEventType.STEP_START:
            self._started[step] = entry.timestamp
        elif kind == DagsterEventType.ENGINE_EVENT and POOL in (getattr(data, "metadata", None) or {}):
            if step not in self._waiting:  # "blocked", then "still blocked" every poll: one line
                self._waiting.add(step)
                shown.append(PoolWait(step, str(_value(data.metadata[POOL]))))  # type: ignore[union-attr]
        elif kind == DagsterEventType.ENGINE_EVENT and entry.message.startswith(WAIT_MESSAGE):
            shown.append(WorkerWait(step, entry.message))
        elif kind == DagsterEventType.ASSET_OBSERVATION and step == "embeddings":
            metadata = data.asset_observation.metadata  # type: ignore[union-attr]
            if ENCODED in metadata and NEW_TEXTS in metadata:
                shown.append(EmbeddingProgress(int(_value(metadata[ENCODED])), int(_value(metadata[NEW_TEXTS]))))
        elif kind == DagsterEventType.ASSET_MATERIALIZATION:
            self._counts[step] = counts(data.materialization.metadata, step)  # type: ignore[union-attr]
        elif kind == DagsterEventType.ASSET_CHECK_EVALUATION:
            self._check_steps.add(step)
            key = data.asset_check_key  # type: ignore[union-attr]
            shown.append(CheckFinished(key.asset_key.to_user_string(), key.name, bool(data.passed), data.description))  # type: ignore[union-attr]
        elif kind in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE) and step not in self._check_steps:
            ok = kind == DagsterEventType.STEP_SUCCESS
            seconds = data.duration_ms / 1000 if ok else entry.timestamp - self._started.get(step, entry.timestamp)  # type: ignore[union-attr]
            shown.append(StepFinished(step, ok, round(seconds, 3), self._counts.get(step, ())))
        return shown


def _value(entry: object) -> object:
    """A metadata entry's plain value (Dagster wraps values in ``MetadataValue`` objects)."""
    return getattr(entry, "value", entry)


def counts(metadata: dict[str, object], step: str | None = None) -> tuple[tuple[str, object], ...]:
    """The step line's counts from a materialization's metadata; keys that are absent are skipped."""
    return tuple(
        (label, _value(metadata[key])) for key, label in STEP_COUNT_KEYS.get(step or "", COUNT_KEYS) if key in metadata
    )


def log_line(entry: EventLogEntry) -> str:
    """``HH:MM:SS LEVEL EVENT_TYPE step - message``, roughly Dagster's console format."""
    stamp = datetime.fromtimestamp(entry.timestamp).strftime("%H:%M:%S")
    level = (
        entry.level
        if isinstance(entry.level, str)
        else {10: "DEBUG", 20: "INFO", 30: "WARNING", 40: "ERROR"}.get(entry.level, str(entry.level))
    )
    kind = entry.dagster_event.event_type_value if entry.dagster_event else ""
    parts = [stamp, level, kind, entry.step_key or ""]
    return " ".join(p for p in parts if p) + " - " + entry.message
