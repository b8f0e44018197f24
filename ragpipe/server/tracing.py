"""Served answers you can look up: trace IDs, the per-release trace log, and feedback on a trace.

Every ``/v1/answer`` response gets a **trace ID** (a UUIDv7, ``new_trace_id``), whether tracing is
on or not: with it off the ID names the response in the access log only. With ``tracing.enabled``
(``ServeConfig.tracing``, off by default) each answer is appended to the trace log of the target
and release that answered it::

    <home>/serve_traces/<target>/<release hex>/traces.jsonl   (+ traces.head, traces.lock)

an append-only, hash-chained ledger (``ragpipe.kernel.ledger``, domain ``serve-trace-record`` v1,
sealed like every ledger when a key is configured, scope ``<target>/<release_id>``). Two kinds of
record:

- ``trace``: ``trace_id``, ``at`` (UTC), ``target``, ``release_id`` — always — ``via``
  (``"mcp"``) for an answer asked over MCP (``knowledge_answer``; absent for ``/v1/answer``, so
  the records written before it existed, and every HTTP one, are unchanged) — then exactly the
  fields of ``tracing.keep`` (``TRACE_FIELDS``: ``subject`` (the principal), ``key_id`` (None for
  an anonymous caller), ``certificate_id``, ``context_digest``, ``answer`` (its text),
  ``abstained``, ``citations`` (``[{label, chunk_id, document_id}]``)), and ``query`` (the
  question) only with ``tracing.keep_query_text``;
- ``feedback``: ``trace_id``, ``at``, ``verdict`` (``up``, ``down``, ``disputed``), ``note`` (only
  when given), ``key_id`` and ``subject`` of the sender, ``as_reviewer`` (whether the sender's
  ``reviewer`` role was what allowed it).

Texts are kept in Unicode NFC (ledger records are canonical JSON, which takes no other form).

Writers: one ``TraceLog`` per server serialises its threads with a lock and other processes (a
second server on the same home) with ``flock`` on ``traces.lock``; the open ledger is kept between
appends and verified again only when another writer changed the file. A writer killed mid-append
leaves a torn line that the next writer's ``Ledger.open`` drops, or a head one record behind that
it repairs (the ledger's own recovery rules).

Readers (``find_trace``, ``traces_with_feedback``) verify the whole log they read and change
nothing; they are what the laboratory's views read.
"""

from __future__ import annotations

import os
import threading
import unicodedata
from pathlib import Path
from typing import Any

from ragpipe.evaluation.runner import new_run_id
from ragpipe.kernel.ledger import Domain, Ledger, LedgerError, Record, read_ledger
from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.models import FrozenModel
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import now_iso
from ragpipe.server.auth import Caller
from ragpipe.server.config import Tracing

TRACE_DOMAIN = Domain("serve-trace-record", 1)
LOG_NAME = "traces.jsonl"
TRACE, FEEDBACK = "trace", "feedback"


def new_trace_id() -> str:
    """A UUIDv7 (the evaluation runner's run-ID generator): time-ordered, 74 random bits."""
    return new_run_id()


def log_path(home: Path, target: str, release_id: str) -> Path:
    """The trace log of ``release_id`` served on ``target`` (both already validated names)."""
    return Workspace(home).serve_traces / target / release_id.removeprefix("sha256:") / LOG_NAME


def _scope(target: str, release_id: str) -> str:
    return f"{target}/{release_id}"


def nfc_strings(value: Any) -> Any:
    """``value`` with every string in NFC: the only form a canonical ledger record takes."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, dict):
        return {nfc_strings(k): nfc_strings(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [nfc_strings(v) for v in value]
    return value


def trace_payload(
    policy: Tracing,
    target: str,
    answer: dict[str, Any],
    subject: str,
    key_id: str | None,
    question: str,
    via: str | None = None,
) -> dict[str, Any]:
    """The ``trace`` record of one answer (``answer``: the ``/v1/answer`` body, with its
    ``trace_id`` and ``release_id``): the fixed fields, ``via`` when given (the channel it was
    asked over if not HTTP), exactly the fields ``policy.keep`` names, and the question only with
    ``keep_query_text``."""
    available = {
        "subject": subject,
        "key_id": key_id,
        "certificate_id": answer.get("certificate_id"),
        "context_digest": answer.get("context_digest"),
        "answer": answer.get("answer"),
        "abstained": answer.get("abstained"),
        "citations": answer.get("citations", []),
    }
    payload = {"trace_id": answer["trace_id"], "at": now_iso(), "target": target, "release_id": answer["release_id"]}
    if via is not None:
        payload["via"] = via
    payload |= {name: available[name] for name in policy.keep}
    if policy.keep_query_text:
        payload["query"] = question
    return nfc_strings(payload)


class TraceLog:
    """The appender of one server process: every release's log under ``home``, each kept open
    between appends. Thread-safe; safe beside other processes appending to the same logs."""

    def __init__(self, home: Path):
        self.home = home
        self._lock = threading.Lock()
        self._open: dict[Path, tuple[Ledger, int]] = {}  # log -> (its ledger, its size after our last append)

    def append(self, target: str, release_id: str, kind: str, payload: dict[str, Any]) -> Record:
        """Append one record to the log of ``release_id`` on ``target``, durably (fsynced)."""
        path = log_path(self.home, target, release_id)
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(path.with_suffix(".lock"), exclusive=True):
                ledger = self._ledger(path, target, release_id)
                record = ledger.append(kind, payload)
                ledger.forget_records()  # appends only: memory must not grow with traffic
                self._open[path] = (ledger, os.stat(path).st_size)
                return record

    def _ledger(self, path: Path, target: str, release_id: str) -> Ledger:
        """The open ledger of ``path``, opened again (verified, recovered) if any other writer
        appended — or left a torn tail — since our last append: the file is append-only but for a
        torn tail's removal, so an unchanged size means nobody else wrote."""
        kept = self._open.get(path)
        if kept is not None and path.exists() and os.stat(path).st_size == kept[1]:
            return kept[0]
        if kept is not None:
            kept[0].close()
        ledger = Ledger.open(path, TRACE_DOMAIN, create=True, scope=_scope(target, release_id))
        ledger.forget_records()
        self._open[path] = (ledger, os.stat(path).st_size)
        return ledger

    def close(self) -> None:
        with self._lock:
            for ledger, _ in self._open.values():
                ledger.close()
            self._open.clear()


def record_answer(
    traces: TraceLog,
    policy: Tracing,
    target: str,
    answer: dict[str, Any],
    caller: Caller,
    question: str,
    via: str | None = None,
) -> None:
    """Append the trace of ``answer`` (a ``/v1/answer`` body; ``via``: see ``trace_payload``) to
    its release's log, when ``policy`` enables tracing; nothing otherwise."""
    if policy.enabled:
        payload = trace_payload(policy, target, answer, caller.subject.principal, caller.key_id, question, via)
        traces.append(target, answer["release_id"], TRACE, payload)


class TraceEntry(FrozenModel):
    """One trace with the feedback sent on it, in log order; ``seq``: the trace record's number."""

    release_id: str
    seq: int
    trace: dict[str, Any]
    feedback: tuple[dict[str, Any], ...] = ()


def read_log(home: Path, target: str, release_id: str) -> list[TraceEntry]:
    """Every trace of one release's log with its feedback (verified; [] when there is no log)."""
    path = log_path(home, target, release_id)
    if not path.exists():
        return []
    records = read_ledger(path, TRACE_DOMAIN, scope=_scope(target, release_id)).records
    entries: dict[str, TraceEntry] = {}
    for record in records:
        trace_id = record.payload.get("trace_id")
        if record.kind == TRACE:
            entries[trace_id] = TraceEntry(release_id=release_id, seq=record.seq, trace=record.payload)
        elif record.kind == FEEDBACK and trace_id in entries:
            entry = entries[trace_id]
            entries[trace_id] = entry.model_copy(update={"feedback": (*entry.feedback, record.payload)})
        else:
            raise LedgerError(f"{path}: record {record.seq}: {record.kind} record names no earlier trace")
    return list(entries.values())


def logged_releases(home: Path, target: str) -> list[str]:
    """The releases of ``target`` that have a trace log, most recently written first."""
    folder = Workspace(home).serve_traces / target
    if not folder.is_dir():
        return []
    logs = [p / LOG_NAME for p in folder.iterdir() if (p / LOG_NAME).is_file()]
    logs.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    return ["sha256:" + p.parent.name for p in logs]


def find_trace(home: Path, target: str, trace_id: str, first: str | None = None) -> TraceEntry | None:
    """The trace ``trace_id`` of ``target`` with its feedback, or None. Looks in release ``first``
    (the one served now) before the others; every log it reads is verified whole."""
    releases = logged_releases(home, target)
    if first in releases:
        releases.remove(first)
        releases.insert(0, first)
    for release_id in releases:
        for entry in read_log(home, target, release_id):
            if entry.trace["trace_id"] == trace_id:
                return entry
    return None


def traces_with_feedback(
    home: Path, target: str, release_id: str | None = None, verdict: str | None = None
) -> list[TraceEntry]:
    """The traces that received feedback (with ``verdict`` among it, when given) — of one release,
    or of every logged release of ``target`` — in log order within a release, newest log first.
    The review queue pulls ``verdict="disputed"``."""
    releases = [release_id] if release_id is not None else logged_releases(home, target)
    found = []
    for rid in releases:
        for entry in read_log(home, target, rid):
            if entry.feedback and (verdict is None or any(f["verdict"] == verdict for f in entry.feedback)):
                found.append(entry)
    return found
