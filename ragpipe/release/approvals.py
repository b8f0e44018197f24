"""Approvals: an approver's *signature* that a release may go live on a target (docs/releases.md).

A target lists its approvers' Ed25519 public keys (``approvers: {name: "ed25519:…"}`` in the
targets config). ``approve`` signs the statement (release ID, target, approver, time, expiry) with
the approver's private key file and appends an ``approval`` record ``{release_id, by, note, at,
expires, signature}`` to the target's history, so it is hash-chained with the activations it
permits. Only an eligible release can be approved; the approver name must be one the target
lists, the key file must hold that approver's key, and names and notes carry no control
characters.

``approval_refusal`` is what activation, the sensor and serving ask where the target requires
approval: the release needs one approval on that target whose approver the target lists *now*,
whose signature verifies over exactly (release, target, approver, time, expiry) — so a record
copied to another release or target, or edited, does not verify — and that was valid at the
moment of use (signed before it, expiring after it: for activation, now; for a release already
live, the moment its activation took effect). An unsigned approval (recorded before approvals
were signed) never counts.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.signatures import sign, verify
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import Approval, History, TargetHistory
from ragpipe.release.manifest import load_manifest
from ragpipe.release.recovery import settle
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import APPROVER_NAME, TargetsConfig, approver_key, load_targets
from ragpipe.release.time_order import refuse_untimely

MAX_NOTE_CHARS = 500
MAX_DAYS = 90
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def approval_statement(release_id: str, target: str, approver: str, at: str, expires: str) -> bytes:
    """The bytes an approver signs (RFC 8785 JSON; every field is ASCII, so nothing normalises)."""
    return canonical_bytes(
        {
            "domain": "ragpipe.release-approval",
            "version": 1,
            "release_id": release_id,
            "target": target,
            "approver": approver,
            "at": at,
            "expires": expires,
        }
    )


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def approve(
    ws: Workspace,
    release_id: str,
    target: str | None,
    *,
    by: str,
    key_file,
    note: str = "",
    days: int = 7,
    config: TargetsConfig | None = None,
) -> Approval:
    """Sign and record ``by``'s approval of ``release_id`` for ``target``, valid ``days`` days."""
    if not APPROVER_NAME.match(by):
        raise ReleaseError(f"approver {by!r}: a name is 1-64 of a-z 0-9 . _ @ - (starting with a letter or digit)")
    if _CONTROL.search(note) or len(note) > MAX_NOTE_CHARS:
        raise ReleaseError(f"the note must be at most {MAX_NOTE_CHARS} characters without control characters")
    if not 1 <= days <= MAX_DAYS:
        raise ReleaseError(f"an approval is valid for 1 to {MAX_DAYS} days, not {days}")
    store = ReleaseStore(ws)
    targets = config or load_targets()
    name, spec = targets.get(target)
    key = approver_key(spec, name, by, key_file)
    manifest = load_manifest(store, release_id)
    if not manifest.gate.eligible:
        raise ReleaseError(
            f"release {release_id} is not eligible for activation "
            f"(gate decision {manifest.gate.decision_id}: decisive phase {manifest.gate.decisive_phase}); it cannot be approved"
        )
    with store.target_lock(name), History(store, name) as history:
        refuse_untimely(targets, name, history.state)
        settle(store, history)
        # dated and signed under the lock: no other writer appends between the time and the record
        moment = datetime.now(UTC)
        at, expires = _iso(moment), _iso(moment + timedelta(days=days))
        signature = sign(key, approval_statement(release_id, name, by, at, expires))
        payload = {
            "release_id": release_id,
            "by": by,
            "note": note,
            "at": at,
            "expires": expires,
            "signature": signature,
        }
        record = history.append("approval", payload)
    return Approval(release_id, by, note, at, record.seq, expires, signature)


def approval_refusal(
    config: TargetsConfig,
    target: str,
    state: TargetHistory,
    release_id: str,
    now: datetime | None = None,
    before_seq: int | None = None,
) -> str | None:
    """Why ``release_id`` lacks an approval on ``target`` valid at ``now`` (None: one verifies; module
    docstring). ``now`` is the moment of use: the present for an activation, the time the history
    made the release active for a release already live — an approval signed before that moment
    and expiring after it allowed that activation, whatever the time is now. ``before_seq``: the
    history record number of that activation's intent; only approvals recorded before it count."""
    approvals = state.approvals.get(release_id, ())
    if not approvals:
        return f"target {target!r} requires an approval, and release {release_id} has none"
    now = now or datetime.now(UTC)
    approvers = config.targets[target].approvers
    problems = []
    for a in reversed(approvals):
        late = before_seq is not None and a.seq >= before_seq
        problem = "recorded after the activation it would allow" if late else _problem(a, target, approvers, now)
        if problem is None:
            return None
        problems.append(f"approval {a.seq} by {a.by!r}: {problem}")
    return f"target {target!r} requires an approval, and release {release_id} has no valid one: " + "; ".join(problems)


def _problem(a: Approval, target: str, approvers: dict[str, str], now: datetime) -> str | None:
    if a.signature is None or a.expires is None:
        return "unsigned"
    key = approvers.get(a.by)
    if key is None:
        return f"not an approver of target {target!r}"
    if not verify(key, approval_statement(a.release_id, target, a.by, a.at, a.expires), a.signature):
        return "its signature does not verify"
    try:
        signed, expires = parse_time(a.at), parse_time(a.expires)
    except (TypeError, ValueError):
        return f"time {a.at!r} or expiry {a.expires!r} is not a time"
    if expires - signed > timedelta(days=MAX_DAYS):  # the CLI's limit, whoever wrote the record
        return f"valid from {a.at} to {a.expires}, longer than the {MAX_DAYS} days an approval may be"
    if now >= expires:
        return f"expired at {a.expires}"
    if now < signed:
        return f"signed at {a.at}, after the activation it would allow"
    return None


def parse_time(text: str) -> datetime:
    """A time as ``history.now_iso`` writes it."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
