"""Approvals are signatures: forged, replayed, expired, unsigned and edited approvals never count;
names and notes with control characters are refused."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ragpipe.kernel.ledger import Ledger
from ragpipe.kernel.signatures import KeyFileError, load_key_file, new_key_file, sign
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate
from ragpipe.release.approvals import approval_refusal, approval_statement, approve, parse_time
from ragpipe.release.history import HISTORY_DOMAIN, now_iso, read_history
from ragpipe.release.live import live_release
from ragpipe.release.pointer import Pointer, write_pointer
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import load_targets
from ragpipe_tests.support.release_fixtures import (
    APPROVER,
    approve_signed,
    forge_activation,
    publish,
)

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


def refusal(ws: Workspace, rid: str, target: str = "production", now: datetime | None = None) -> str | None:
    state, _ = read_history(ReleaseStore(ws), target)
    return approval_refusal(load_targets(), target, state, rid, now)


def copy_record(ws: Workspace, payload: dict, target: str) -> None:
    """Append ``payload`` as an approval record to ``target``'s history, the hash chain recomputed
    (past the project's writer, which would refuse a copy dated before the last record)."""
    store = ReleaseStore(ws)
    with store.target_lock(target), forger_ledger(store, target) as history:
        history.append("approval", payload)


def test_a_signed_approval_counts_until_it_expires(ws: Workspace, bundle: Path):
    rid = publish(ws, bundle, "r1")
    approval = approve_signed(ws, rid, "production", days=2)
    assert refusal(ws, rid) is None
    expires = datetime.strptime(approval.expires, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert timedelta(days=2) - (expires - datetime.now(UTC)) < timedelta(minutes=5)
    assert refusal(ws, rid, now=expires) == (
        f"target 'production' requires an approval, and release {rid} has no valid one: "
        f"approval 1 by 'alice': expired at {approval.expires}"
    )
    assert activate(ws, rid, "production").generation == 1


def test_replayed_forged_edited_and_unsigned_approvals_never_count(ws: Workspace, bundle: Path, tmp_path: Path):
    a, b = publish(ws, bundle, "r1"), publish(ws, bundle, "r2")
    signed = approve_signed(ws, a, "production")
    base = {"by": APPROVER, "note": "", "at": signed.at, "expires": signed.expires, "signature": signed.signature}
    head = f"target 'production' requires an approval, and release {b} has no valid one: "
    # replayed onto another release, and onto another target (both require an approval here)
    copy_record(ws, {**base, "release_id": b}, "production")
    assert refusal(ws, b) == head + "approval 2 by 'alice': its signature does not verify"
    copy_record(ws, {**base, "release_id": a}, "staging")
    assert refusal(ws, a, "staging") == (
        f"target 'staging' requires an approval, and release {a} has no valid one: "
        "approval 1 by 'alice': its signature does not verify"
    )
    # edited: the expiry pushed out, everything else the real record's
    copy_record(ws, {**base, "release_id": b, "expires": "2099-01-01T00:00:00.000000Z"}, "production")
    # forged: signed with another key under the approver's name
    other = tmp_path / "mallory.pem"
    new_key_file(other)
    at, expires = now_iso(), "2099-01-01T00:00:00.000000Z"
    forged = sign(load_key_file(other), approval_statement(b, "production", APPROVER, at, expires))
    copy_record(
        ws,
        {"release_id": b, "by": APPROVER, "note": "", "at": at, "expires": expires, "signature": forged},
        "production",
    )
    # unsigned: the form before approvals were signed, and a name the target does not list
    copy_record(ws, {"release_id": b, "by": APPROVER, "note": "", "at": at}, "production")
    copy_record(ws, {**base, "release_id": b, "by": "mallory", "at": at}, "production")  # in time order
    assert refusal(ws, b) == head + "; ".join(
        [
            "approval 6 by 'mallory': not an approver of target 'production'",
            "approval 5 by 'alice': unsigned",
            "approval 4 by 'alice': its signature does not verify",
            "approval 3 by 'alice': its signature does not verify",
            "approval 2 by 'alice': its signature does not verify",
        ]
    )
    with pytest.raises(ReleaseError, match="needs an approval for target 'production' before activation"):
        activate(ws, b, "production")
    assert activate(ws, a, "production").generation == 1


@pytest.mark.parametrize(
    ("by", "note", "message"),
    [
        ("alice\x1b[31m", "", "approver 'alice\\x1b[31m': a name is 1-64 of a-z 0-9 . _ @ - (starting with"),
        ("Alice", "", "approver 'Alice': a name is 1-64"),
        ("", "", "approver '': a name is 1-64"),
        ("alice", "ok\x1b]0;pwned\x07", "the note must be at most 500 characters without control characters"),
        ("alice", "x" * 501, "the note must be at most 500 characters without control characters"),
    ],
)
def test_names_and_notes_with_control_characters_are_refused(ws: Workspace, bundle: Path, by, note, message):
    rid = publish(ws, bundle, "r1")
    key = Path(os.environ["RAGPIPE_TARGETS"]).parent / f"{APPROVER}.pem"
    with pytest.raises(ReleaseError) as caught:
        approve(ws, rid, "production", by=by, key_file=key, note=note)
    assert str(caught.value).startswith(message)
    assert read_history(ReleaseStore(ws), "production")[0].approvals == {}


def test_the_key_must_be_the_listed_approvers(ws: Workspace, bundle: Path, tmp_path: Path):
    rid = publish(ws, bundle, "r1")
    other = tmp_path / "other.pem"
    new_key_file(other)
    with pytest.raises(ReleaseError) as caught:
        approve(ws, rid, "production", by=APPROVER, key_file=other)
    assert str(caught.value) == (
        f"{other}: not the key of approver 'alice' of target 'production' (the targets config lists another)"
    )
    with pytest.raises(ReleaseError, match="already exists"):
        try:
            new_key_file(other)
        except KeyFileError as exc:
            raise ReleaseError(str(exc)) from None
    assert oct(other.stat().st_mode & 0o777) == "0o600"


def test_a_live_release_stays_live_after_its_approval_expires_but_a_later_approval_never_vouches(
    ws: Workspace, bundle: Path
):
    a, b = publish(ws, bundle, "r1"), publish(ws, bundle, "r2")
    approval = approve_signed(ws, a, "production", days=1)
    activate(ws, a, "production")
    state, _ = read_history(ReleaseStore(ws), "production")
    after_expiry = parse_time(approval.expires) + timedelta(seconds=1)
    assert approval_refusal(load_targets(), "production", state, a, after_expiry) is not None
    assert live_release(ws, "production").release_id == a  # judged at its activation, not now
    forge_activation(ws, b, "production")  # moved without activation's checks, then approved
    later = approve_signed(ws, b, "production")
    with pytest.raises(ReleaseError) as caught:
        live_release(ws, "production")
    assert str(caught.value) == (
        f"target 'production' requires an approval, and release {b} has no valid one: "
        f"approval {later.seq} by 'alice': recorded after the activation it would allow"
    )


def forger_ledger(store: ReleaseStore, target: str) -> Ledger:
    """The target's history ledger opened directly, as a program other than ragpipe's writer would."""
    return Ledger.open(store.history_path(target), HISTORY_DOMAIN, create=True, scope=target)


def test_a_back_dated_activation_cannot_revive_an_expired_approval(ws: Workspace, bundle: Path):
    rid = publish(ws, bundle, "r1")
    approve_signed(ws, rid, "production", days=1)
    store = ReleaseStore(ws)
    # written past the project's writer (which refuses a time before the last record's)
    with store.target_lock("production"), forger_ledger(store, "production") as history:
        intent = history.append(
            "intent",
            {
                "action": "activate",
                "release_id": rid,
                "from_generation": 0,
                "generation": 1,
                "previous": None,
                "by": "forger",
                "at": "2020-01-02T00:00:00.000000Z",  # dated before the approval it was appended after
            },
        )
        write_pointer(store, Pointer("production", rid, 1, None, intent.hash))
    with pytest.raises(ReleaseError, match="history record 2 is dated 2020-01-02T00:00:00.000000Z, before record 1"):
        live_release(ws, "production")
