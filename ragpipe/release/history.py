"""A target's history: a hash-chained ledger of intent and observed records and a pure reducer.

Records (``ragpipe.kernel.ledger``, domain ``release-history-record`` v1), payload keys:

- ``approval``  {release_id, by, note, at, expires, signature}: an approver signed that the release
  may go live on this target (``ragpipe.release.approvals``); records of the earlier form
  {release_id, by, note, at} still parse, and never count as an approval.
- ``intent``    {action: activate|rollback, release_id, from_generation, generation, previous, by, at
  [, waived]}: appended *before* the pointer swap; ``generation = from_generation + 1``; ``waived:
  human_apply_required`` on an automatic activation the target waived that for
  (``ragpipe.release.automatic``).
- ``observed``  {intent, outcome: active|failed|cancelled, release_id, generation, reason, at}: what
  happened to the intent of record ``intent`` (``active``: the pointer now names the release).
- ``rejected``  {action, release_id, reason, by, at}: the release was refused before any intent
  (its bundle failed verification).
- ``time_correction`` {record, by, reason, at, signature}: a person accepts the time of record
  ``record``, which is dated before the record before it (a clock was behind when it was
  written); ``signature``: an approver's signature of that (``ragpipe.release.time_order``),
  required where the target requires approvals, else null.

**Time order.** ``at`` is a clock's reading, so it can be wrong; but an approval's validity is
judged at the time of the activation it allowed, so no record may be dated before any record
before it. Readers and writers apply that one rule (``TargetHistory.backwards``): the reducer
lists every record dated before the latest time before it, the writer (``History.append``) refuses to write
one — the command fails in one line, nothing is written, the clock is to be set right — and
refuses to extend a history that already holds one until a ``time_correction`` accepts it
(``ragpipe release accept-time``); a reader refuses to serve from such a history, naming the
record and the command. Nothing ever rewrites a record.

``reduce_history`` folds records into ``TargetHistory`` and refuses an illegal sequence with the
record number: an intent while another is unresolved, an intent that does not start from the
current generation, a rollback to a release never active here, an observed record for another
intent, a time correction of a record that needs none. Release states per target: ``activating``
(open intent), ``active``, ``superseded`` (replaced by an activation), ``rolled_back`` (replaced
by a rollback), ``failed``, ``cancelled``, ``rejected``; a release with no record here is
*awaiting activation*.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ragpipe.kernel.ledger import Domain, Ledger, LedgerError, Record, fold, read_ledger, refuse_orphan_head
from ragpipe.release.store import ReleaseStore

HISTORY_DOMAIN = Domain("release-history-record", 1)
UNSIGNED_APPROVAL = {"release_id", "by", "note", "at"}  # the form before approvals were signed
KEYS = {
    "approval": {"release_id", "by", "note", "at", "expires", "signature"},
    "intent": {"action", "release_id", "from_generation", "generation", "previous", "by", "at"},
    "observed": {"intent", "outcome", "release_id", "generation", "reason", "at"},
    "rejected": {"action", "release_id", "reason", "by", "at"},
    "time_correction": {"record", "by", "reason", "at", "signature"},
}
ACTIONS = ("activate", "rollback")
OUTCOMES = ("active", "failed", "cancelled")


@dataclass(frozen=True)
class Approval:
    release_id: str
    by: str
    note: str
    at: str
    seq: int
    expires: str | None = None  # None (with signature): recorded unsigned, before approvals were signed
    signature: str | None = None


@dataclass(frozen=True)
class BackwardsRecord:
    """A record dated before the record before it (module docstring, Time order)."""

    seq: int
    hash: str
    at: str
    previous_at: str  # the latest time before it
    previous_seq: int  # the record that has that time


@dataclass(frozen=True)
class TimeCorrection:
    record: BackwardsRecord  # the record whose time it accepts
    by: str
    reason: str
    at: str
    seq: int
    signature: str | None


@dataclass(frozen=True)
class TargetHistory:
    """The reduced state of one target's history (see module docstring)."""

    active: str | None = None
    generation: int = 0
    active_intent: str | None = None  # hash of the intent record of the current activation
    open_intent: Record | None = None
    stack: tuple[str, ...] = ()  # rollback stack: the active release last, the one before it below
    ever_active: tuple[str, ...] = ()  # every release that was active here, first activation order
    states: dict[str, str] = field(default_factory=dict)
    approvals: dict[str, tuple[Approval, ...]] = field(default_factory=dict)
    activations: tuple[tuple[int, str, str], ...] = ()  # (generation, release_id, action) per swap
    last_at: str = ""  # the latest time of any record so far
    last_seq: int = 0  # the record that has it
    backwards: tuple[BackwardsRecord, ...] = ()  # dated before their predecessors, not corrected
    corrections: tuple[TimeCorrection, ...] = ()

    def judged_time(self, seq: int, at: str) -> str:
        """The time to judge record ``seq`` (dated ``at``) at: for a back-dated record whose time a
        correction accepted, the latest time before it — so accepting a time never makes an
        approval that had expired by then count."""
        for c in self.corrections:
            if c.record.seq == seq:
                return c.record.previous_at
        return at

    def time_problem(self, target: str) -> str | None:
        """Why this history breaks time order (None: it does not) — one line with the repair."""
        if not self.backwards:
            return None
        b = self.backwards[0]
        return (
            f"target {target!r}: history record {b.seq} is dated {b.at}, before record {b.previous_seq} ({b.previous_at}): "
            f"a clock was behind when it was written; set the clock right, then accept that record's time with "
            f"ragpipe release accept-time --target {target} --record {b.seq} --by NAME --reason TEXT "
            "(--key KEYFILE where the target requires approvals)"
        )


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _need(record: Record) -> dict[str, Any]:
    keys = KEYS.get(record.kind)
    if keys is None:
        raise ValueError(f"unknown record kind {record.kind!r}")
    given = set(record.payload)
    older_approval = record.kind == "approval" and given == UNSIGNED_APPROVAL
    waiver = (
        record.kind == "intent" and given == keys | {"waived"} and record.payload["waived"] == "human_apply_required"
    )
    if given != keys and not older_approval and not waiver:
        raise ValueError(f"{record.kind} record must have exactly the keys {', '.join(sorted(keys))}")
    return record.payload


def _intent(state: TargetHistory, record: Record, p: dict[str, Any]) -> TargetHistory:
    if state.open_intent is not None:
        raise ValueError(f"intent while the intent of record {state.open_intent.seq} is unresolved")
    if p["action"] not in ACTIONS:
        raise ValueError(f"intent action {p['action']!r} is not one of {', '.join(ACTIONS)}")
    if p["from_generation"] != state.generation or p["generation"] != state.generation + 1:
        raise ValueError(
            f"intent goes from generation {p['from_generation']!r} to {p['generation']!r}, "
            f"but the target is at generation {state.generation}"
        )
    if p["previous"] != state.active:
        raise ValueError(f"intent names previous release {p['previous']}, but the active release is {state.active}")
    if p["action"] == "rollback" and (p["release_id"] not in state.ever_active or p["release_id"] == state.active):
        raise ValueError(f"rollback to {p['release_id']}, which is not a previously active release of this target")
    return replace(state, open_intent=record, states={**state.states, p["release_id"]: "activating"})


def _observed(state: TargetHistory, record: Record, p: dict[str, Any]) -> TargetHistory:
    intent = state.open_intent
    if intent is None or p["intent"] != intent.seq:
        raise ValueError(
            f"observed record for record {p['intent']!r}, but the open intent is {intent.seq if intent else 'none'}"
        )
    if (p["release_id"], p["generation"]) != (intent.payload["release_id"], intent.payload["generation"]):
        raise ValueError("observed record names another release or generation than its intent")
    if p["outcome"] not in OUTCOMES:
        raise ValueError(f"outcome {p['outcome']!r} is not one of {', '.join(OUTCOMES)}")
    release, states = p["release_id"], dict(state.states)
    if p["outcome"] != "active":
        states[release] = p["outcome"]
        if state.active is not None:
            states[state.active] = "active"
        return replace(state, open_intent=None, states=states)
    action = intent.payload["action"]
    if state.active is not None:
        states[state.active] = "rolled_back" if action == "rollback" else "superseded"
    states[release] = "active"
    if action == "rollback":
        stack = state.stack[: state.stack.index(release) + 1] if release in state.stack else (*state.stack, release)
    else:
        stack = (*state.stack, release)
    return replace(
        state,
        active=release,
        generation=p["generation"],
        active_intent=intent.hash,
        open_intent=None,
        stack=stack,
        ever_active=state.ever_active + (() if release in state.ever_active else (release,)),
        states=states,
        activations=(*state.activations, (p["generation"], release, action)),
    )


def _dated(state: TargetHistory, record: Record) -> TargetHistory:
    """The time-order bookkeeping of ``record`` (module docstring, Time order): a record dated
    before the latest time of any record before it is back-dated (compared with the latest, not
    only the previous, so one accepted record never lets a second one through)."""
    at = str(record.payload["at"])
    if at >= state.last_at:
        return replace(state, last_at=at, last_seq=record.seq)
    late = BackwardsRecord(record.seq, record.hash, at, state.last_at, state.last_seq)
    return replace(state, backwards=(*state.backwards, late))


def _time_correction(state: TargetHistory, record: Record, p: dict[str, Any]) -> TargetHistory:
    corrected = next((b for b in state.backwards if b.seq == p["record"]), None)
    if corrected is None:
        raise ValueError(f"time correction of record {p['record']!r}, which is not dated before its predecessor")
    correction = TimeCorrection(corrected, p["by"], p["reason"], p["at"], record.seq, p["signature"])
    return replace(
        state,
        backwards=tuple(b for b in state.backwards if b is not corrected),
        corrections=(*state.corrections, correction),
    )


def step(state: TargetHistory, record: Record) -> TargetHistory:
    """One transition of the reducer (pure); raises ``ValueError`` on an illegal record."""
    p = _need(record)
    state = _dated(state, record)
    if record.kind == "time_correction":
        return _time_correction(state, record, p)
    if record.kind == "approval":
        approval = Approval(
            p["release_id"], p["by"], p["note"], p["at"], record.seq, p.get("expires"), p.get("signature")
        )
        return replace(
            state, approvals={**state.approvals, p["release_id"]: (*state.approvals.get(p["release_id"], ()), approval)}
        )
    if record.kind == "intent":
        return _intent(state, record, p)
    if record.kind == "observed":
        return _observed(state, record, p)
    if state.states.get(p["release_id"]) != "active":  # rejected: a refused release never replaces the active state
        return replace(state, states={**state.states, p["release_id"]: "rejected"})
    return state


def reduce_history(records: tuple[Record, ...] | list[Record], where: str) -> TargetHistory:
    return fold(records, step, TargetHistory(), where)


def read_history(store: ReleaseStore, target: str) -> tuple[TargetHistory, tuple[Record, ...]]:
    """The target's verified history without writing (a torn final line is ignored, not removed);
    an empty history when the target has none."""
    path = store.history_path(target)
    with store.current(target):  # with an object store: the store's history
        if not path.is_file():
            refuse_orphan_head(path)  # a removed history is not an empty one
            return TargetHistory(), ()
        read = read_ledger(path, HISTORY_DOMAIN, scope=target)
    return reduce_history(read.records, str(path)), read.records


class History:
    """The writer's view of a target's history: the open ledger plus its reduced state. Open it
    only under the target's lock. ``append`` checks the transition before writing anything."""

    def __init__(self, store: ReleaseStore, target: str, on_append=None):
        self.target = target
        self.where = str(store.history_path(target))
        self.ledger = Ledger.open(
            store.history_path(target), HISTORY_DOMAIN, create=True, on_append=on_append, scope=target
        )
        self.state = reduce_history(self.ledger.records, self.where)

    def append(self, kind: str, payload: dict[str, Any]) -> Record:
        """Append one record after checking it (nothing is written when it is refused): a legal
        transition, dated no earlier than the record before it, onto a history whose times are
        in order (or a ``time_correction`` that makes them so)."""
        record = HISTORY_DOMAIN.make_record(len(self.ledger.records) + 1, kind, payload, self.ledger.head)
        wedged = self.state.time_problem(self.target)
        if wedged is not None and kind != "time_correction":
            raise LedgerError(f"{wedged}; nothing was written")
        if str(payload.get("at", "")) < self.state.last_at:
            raise LedgerError(
                f"target {self.target!r}: this machine's clock says {payload.get('at')}, before the history's latest "
                f"record (record {self.state.last_seq}, dated {self.state.last_at}): set the clock right and run the "
                "command again; nothing was written"
            )
        try:
            state = step(self.state, record)  # refuses before anything is written
        except ValueError as exc:
            raise LedgerError(f"{self.where}: record {record.seq}: {exc}") from None
        written = self.ledger.append(kind, payload)
        self.state = state
        return written

    def close(self) -> None:
        self.ledger.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
