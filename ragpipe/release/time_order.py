"""Repairing a target history whose times went backwards: a person accepts a record's time.

A history record dated before the record before it (a clock that was behind: an NTP step, two
machines sharing a target through ``RAGPIPE_STORE``) stops every reader — an approval's validity
is judged at the time of the activation it allowed, so a time written in the past could make an
expired approval count (``ragpipe.release.history``, Time order). Writers refuse to write such a
record; a history that already holds one (written before they did, or by another program) is
repaired by ``accept_time``: once the clock is right, a person appends a ``time_correction``
record naming the record, who accepts its time and why. It rewrites nothing: the record keeps its
time, the chain grows by one record, and readers serve again.

Where the target requires approvals, the correction is an approver's act: it carries the
approver's Ed25519 signature over (target, record number, record hash, approver, reason, time), made with
the key the targets config lists, and readers verify it (``correction_refusal``) — a correction
copied from another record or target, edited, or by someone the target does not list is refused.
Elsewhere (a target anyone may activate) ``by`` names the person, as an intent does.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.signatures import sign, verify
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import History, TargetHistory, TimeCorrection
from ragpipe.release.recovery import settle
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import APPROVER_NAME, TargetsConfig, approver_key, load_targets

MAX_REASON_CHARS = 500
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def correction_statement(target: str, record: int, record_hash: str, by: str, reason: str, at: str) -> bytes:
    """The bytes an approver signs to accept record ``record``'s time (RFC 8785 JSON; the reason
    is signed too, NFC-normalised as canonical JSON requires)."""
    return canonical_bytes(
        {
            "domain": "ragpipe.history-time-correction",
            "version": 1,
            "target": target,
            "record": record,
            "record_hash": record_hash,
            "by": by,
            "reason": unicodedata.normalize("NFC", reason),
            "at": at,
        }
    )


def refuse_untimely(config: TargetsConfig, target: str, state: TargetHistory) -> None:
    """For a writer, under the target's lock before it writes: ``ReleaseError`` unless ``time_refusal``
    says the history holds its time order (the readers' rule, so no writer moves a target no
    reader would serve)."""
    refused = time_refusal(config, target, state)
    if refused:
        raise ReleaseError(f"{refused}; nothing was written")


def time_refusal(config: TargetsConfig, target: str, state: TargetHistory) -> str | None:
    """The one time-order rule readers and writers of ``target``'s history apply (None: it holds):
    no back-dated record without a correction, and every correction one that counts."""
    return state.time_problem(target) or correction_refusal(config, target, state)


def accept_time(
    ws: Workspace,
    target: str | None,
    record: int,
    *,
    by: str,
    reason: str,
    key_file=None,
    config: TargetsConfig | None = None,
) -> TimeCorrection:
    """Append the ``time_correction`` accepting record ``record``'s time (module docstring);
    ``ReleaseError`` (nothing written) when the record needs none, the reason or name is not
    acceptable, or — where the target requires approvals — ``key_file`` is not the key of an
    approver ``by`` of the target."""
    if not APPROVER_NAME.match(by):
        raise ReleaseError(f"name {by!r}: 1-64 of a-z 0-9 . _ @ - (starting with a letter or digit)")
    if not reason.strip() or _CONTROL.search(reason) or len(reason) > MAX_REASON_CHARS:
        raise ReleaseError(
            f"the reason must be 1 to {MAX_REASON_CHARS} characters without control characters (say what was wrong)"
        )
    store = ReleaseStore(ws)
    name, spec = (config or load_targets()).get(target)
    key = None
    if spec.approval_required:
        if key_file is None:
            raise ReleaseError(f"target {name!r} requires approvals: sign the correction with --key KEYFILE")
        key = approver_key(spec, name, by, key_file)
    with store.target_lock(name), History(store, name) as history:
        late = next((b for b in history.state.backwards if b.seq == record), None)
        if late is None:
            raise ReleaseError(
                f"target {name!r}: history record {record} is not dated before the record before it; nothing to accept"
            )
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        signature = (
            sign(key, correction_statement(name, record, late.hash, by, reason, at)) if key is not None else None
        )
        history.append(
            "time_correction", {"record": record, "by": by, "reason": reason, "at": at, "signature": signature}
        )
        correction = history.state.corrections[-1]
        settle(store, history)  # an intent the wedge left open can be settled now
        return correction


def correction_refusal(config: TargetsConfig, target: str, state: TargetHistory) -> str | None:
    """Why a ``time_correction`` of ``target``'s history does not count (None: all do): where the
    target requires approvals, each must be signed by an approver the target lists now."""
    spec = config.targets[target]
    if not spec.approval_required:
        return None
    for c in state.corrections:
        key = spec.approvers.get(c.by)
        if key is None:
            return f"target {target!r}: the time correction of record {c.record.seq} (record {c.seq}) is by {c.by!r}, not an approver of the target"
        statement = correction_statement(target, c.record.seq, c.record.hash, c.by, c.reason, c.at)
        if c.signature is None or not verify(key, statement, c.signature):
            return f"target {target!r}: the time correction of record {c.record.seq} (record {c.seq}) is not signed by approver {c.by!r}"
    return None
