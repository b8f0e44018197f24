"""Time order of a target's history: writers refuse a clock that is behind, readers and writers
refuse a history that holds a back-dated record until a person accepts its time (a correction
record, signed by an approver where the target requires approvals), and nothing is rewritten.

A clock that is behind is produced honestly, without touching the code under test: the last record
of the history is written (past the project's writer, as another machine or program would) with a
time an hour ahead of this machine's clock, which is what this machine's writer then sees."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ragpipe.kernel.ledger import Ledger, LedgerError
from ragpipe.kernel.signatures import load_key_file, new_key_file
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate
from ragpipe.release.approvals import approval_refusal, approval_statement, parse_time
from ragpipe.release.history import HISTORY_DOMAIN, History, read_history
from ragpipe.release.live import live_release
from ragpipe.release.rollback import rollback
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import load_targets
from ragpipe.release.time_order import accept_time, correction_statement
from ragpipe_tests.support.release_fixtures import APPROVER, approve_signed, publish

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def foreign_append(ws: Workspace, target: str, kind: str, payload: dict) -> None:
    """Append a record as a program other than ragpipe's writer would: hash chain right, no checks."""
    store = ReleaseStore(ws)
    with store.target_lock(target), Ledger.open(store.history_path(target), HISTORY_DOMAIN, scope=target) as ledger:
        ledger.append(kind, payload)


def files(ws: Workspace, target: str) -> dict[str, bytes]:
    folder = ReleaseStore(ws).target_dir(target)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def key_file() -> Path:
    return Path(os.environ["RAGPIPE_TARGETS"]).parent / f"{APPROVER}.pem"


def live_production_with_a_back_dated_record(ws: Workspace, bundle: Path) -> str:
    """A release approved and live on production, then record 4 written two hours in the past
    (past the project's writer); the release's ID."""
    rid = publish(ws, bundle, "r1")
    approve_signed(ws, rid, "production")
    activate(ws, rid, "production")
    past = iso(datetime.now(UTC) - timedelta(hours=2))
    foreign_append(
        ws, "production", "rejected", {"action": "activate", "release_id": rid, "reason": "x", "by": "m2", "at": past}
    )
    return rid


def test_a_writer_whose_clock_is_behind_the_history_writes_nothing(ws: Workspace, bundle: Path):
    """The history's last record is an hour ahead of this machine's clock: rollback, activation and
    approval each fail in one line naming both times, and pointer and history are unchanged."""
    a = publish(ws, bundle, "r1")
    b = publish(ws, bundle, "r2", against=a)
    activate(ws, a, "staging")
    activate(ws, b, "staging")
    ahead = iso(datetime.now(UTC) + timedelta(hours=1))
    foreign_append(
        ws, "staging", "rejected", {"action": "activate", "release_id": b, "reason": "x", "by": "m2", "at": ahead}
    )
    # activation is checked with a release gated against b, the live one: a release gated against
    # another is refused before anything would be written, whatever the clock
    c = publish(ws, bundle, "r3", against=b)
    before = files(ws, "staging")
    for act in (lambda: rollback(ws, "staging"), lambda: activate(ws, c, "staging")):
        with pytest.raises(LedgerError) as err:
            act()
        message = str(err.value)
        assert "\n" not in message and message.startswith("target 'staging': this machine's clock says ")
        assert message.endswith(
            f", before the history's latest record (record 5, dated {ahead}): set the clock right and run the "
            "command again; nothing was written"
        )
    with pytest.raises(LedgerError, match="this machine's clock says"):
        approve_signed(ws, a, "production")  # production's history is empty: fine …
        foreign_append(
            ws,
            "production",
            "rejected",
            {"action": "activate", "release_id": a, "reason": "x", "by": "m2", "at": ahead},
        )
        approve_signed(ws, a, "production")  # … until another machine wrote ahead of this one
    assert files(ws, "staging") == before
    assert live_release(ws, "staging").release_id == b  # still serving, as before


def test_a_back_dated_record_stops_readers_and_writers_until_its_time_is_accepted(ws: Workspace, bundle: Path):
    """A rollback recorded an hour in the past (written before writers checked, or by another
    program): readers refuse naming the record and the repair, every writer refuses with the same
    line; ``accept_time`` appends one correction and the target serves and moves again; the
    back-dated record is still there, byte for byte."""
    a = publish(ws, bundle, "r1")
    b = publish(ws, bundle, "r2", against=a)
    activate(ws, a, "staging")
    activate(ws, b, "staging")
    store = ReleaseStore(ws)
    state, records = read_history(store, "staging")
    past = iso(datetime.now(UTC) - timedelta(hours=1))
    intent = {"action": "rollback", "release_id": a, "from_generation": 2, "generation": 3, "previous": b, "by": "ops"}
    foreign_append(ws, "staging", "intent", {**intent, "at": past})
    from ragpipe.release.pointer import Pointer, write_pointer

    write_pointer(store, Pointer("staging", a, 3, b, read_history(store, "staging")[1][-1].hash))
    foreign_append(
        ws, "staging", "observed",
        {"intent": 5, "outcome": "active", "release_id": a, "generation": 3, "reason": None, "at": past},
    )  # fmt: skip
    line = (
        f"target 'staging': history record 5 is dated {past}, before record 4 ({records[-1].payload['at']}): a clock "
        "was behind when it was written; set the clock right, then accept that record's time with ragpipe release "
        "accept-time --target staging --record 5 --by NAME --reason TEXT (--key KEYFILE where the target requires "
        "approvals)"
    )
    with pytest.raises(ReleaseError) as err:
        live_release(ws, "staging")
    assert str(err.value) == line
    for act in (lambda: activate(ws, b, "staging"), lambda: rollback(ws, "staging", to=b)):
        with pytest.raises(ReleaseError) as err:
            act()
        assert str(err.value) == f"{line}; nothing was written"
    with pytest.raises(ReleaseError, match="history record 4 is not dated before the record before it"):
        accept_time(ws, "staging", 4, by="ops", reason="clock")
    with pytest.raises(ReleaseError, match="the reason must be 1 to 500 characters"):
        accept_time(ws, "staging", 5, by="ops", reason=" ")
    kept = (store.history_path("staging").read_bytes(), files(ws, "staging"))
    correction = accept_time(ws, "staging", 5, by="ops", reason="the NTP step on host b")
    assert (correction.record.seq, correction.record.at, correction.by, correction.seq) == (5, past, "ops", 7)
    with pytest.raises(ReleaseError, match="history record 6 is dated"):  # the observed record was back-dated too
        live_release(ws, "staging")
    assert accept_time(ws, "staging", 6, by="ops", reason="the NTP step on host b").seq == 8
    assert store.history_path("staging").read_bytes().startswith(kept[0])  # appended to, never rewritten
    assert live_release(ws, "staging").release_id == a
    assert activate(ws, b, "staging").generation == 4


def test_on_a_target_that_requires_approvals_only_an_approvers_signed_correction_counts(
    ws: Workspace, bundle: Path, tmp_path: Path
):
    live_production_with_a_back_dated_record(ws, bundle)
    with pytest.raises(ReleaseError, match="not an approver of target 'production'|is not one"):
        accept_time(ws, "production", 4, by="ops", reason="clock", key_file=key_file())
    with pytest.raises(ReleaseError, match="sign the correction with --key KEYFILE"):
        accept_time(ws, "production", 4, by=APPROVER, reason="clock")
    mallory = tmp_path / "mallory.pem"
    new_key_file(mallory)
    with pytest.raises(ReleaseError, match="not the key of approver 'alice'"):
        accept_time(ws, "production", 4, by=APPROVER, reason="clock", key_file=mallory)
    # an unsigned correction, written past the project's writer, does not count
    forged = {"record": 4, "by": APPROVER, "reason": "clock", "at": iso(datetime.now(UTC)), "signature": None}
    foreign_append(ws, "production", "time_correction", forged)
    with pytest.raises(ReleaseError) as err:
        live_release(ws, "production")
    assert str(err.value) == (
        "target 'production': the time correction of record 4 (record 5) is not signed by approver 'alice'"
    )


def test_a_correction_signed_over_another_record_does_not_count(ws: Workspace, bundle: Path):
    """The approver's own key, a valid signature — over another record's hash: refused, naming it."""
    from ragpipe.kernel.signatures import sign

    rid = live_production_with_a_back_dated_record(ws, bundle)
    _, records = read_history(ReleaseStore(ws), "production")
    at = iso(datetime.now(UTC))
    statement = correction_statement("production", 4, records[0].hash, APPROVER, "clock", at)
    wrong = sign(load_key_file(key_file()), statement)
    foreign_append(
        ws,
        "production",
        "time_correction",
        {"record": 4, "by": APPROVER, "reason": "clock", "at": at, "signature": wrong},
    )
    with pytest.raises(ReleaseError) as err:
        live_release(ws, "production")
    assert str(err.value) == (
        "target 'production': the time correction of record 4 (record 5) is not signed by approver 'alice'"
    )
    before = files(ws, "production")
    with pytest.raises(ReleaseError) as err:  # and no writer moves a target no reader would serve
        approve_signed(ws, rid, "production")
    assert str(err.value) == (
        "target 'production': the time correction of record 4 (record 5) is not signed by approver 'alice'; "
        "nothing was written"
    )
    assert files(ws, "production") == before


def test_each_back_dated_record_needs_its_own_correction_and_is_judged_at_the_latest_time_before_it():
    """12:00, then 10:00, then 11:00: both later records are back-dated (the latest time before
    each is 12:00); accepting one leaves the other; an accepted time is judged at 12:00."""
    from ragpipe.kernel.ledger import Record
    from ragpipe.release.history import reduce_history

    def rec(seq: int, at: str, kind: str = "rejected", payload: dict | None = None) -> Record:
        rejected = {"action": "activate", "release_id": "sha256:" + "a" * 64, "reason": "x", "by": "m", "at": at}
        return Record(seq, kind, payload or rejected, None, f"h{seq}")

    day = "2026-12-06T"
    records = [rec(1, day + "12:00:00.000000Z"), rec(2, day + "10:00:00.000000Z"), rec(3, day + "11:00:00.000000Z")]
    state = reduce_history(records, "t")
    assert [(b.seq, b.previous_seq, b.previous_at) for b in state.backwards] == [
        (2, 1, day + "12:00:00.000000Z"),
        (3, 1, day + "12:00:00.000000Z"),
    ]
    fix = {"record": 2, "by": "ops", "reason": "clock", "at": day + "13:00:00.000000Z", "signature": None}
    state = reduce_history([*records, rec(4, fix["at"], "time_correction", fix)], "t")
    assert [b.seq for b in state.backwards] == [3]
    assert state.time_problem("staging").startswith("target 'staging': history record 3 is dated")
    assert state.judged_time(2, day + "10:00:00.000000Z") == day + "12:00:00.000000Z"
    assert state.judged_time(3, day + "11:00:00.000000Z") == day + "11:00:00.000000Z"


def test_a_signed_correction_by_an_approver_restores_a_target_that_requires_approvals(ws: Workspace, bundle: Path):
    rid = live_production_with_a_back_dated_record(ws, bundle)
    with pytest.raises(ReleaseError, match="history record 4 is dated"):
        live_release(ws, "production")
    correction = accept_time(ws, "production", 4, by=APPROVER, reason="host clock", key_file=key_file())
    assert correction.signature is not None
    assert live_release(ws, "production").release_id == rid


def test_an_approval_valid_longer_than_ninety_days_is_refused_at_verification(ws: Workspace, bundle: Path):
    """A validly signed approval whose validity exceeds the CLI's 90-day limit (written by other
    tooling with the approver's key) never counts."""
    from ragpipe.kernel.signatures import sign

    rid = publish(ws, bundle, "r1")
    now = datetime.now(UTC)
    at, expires = iso(now), iso(now + timedelta(days=120))
    signature = sign(load_key_file(key_file()), approval_statement(rid, "production", APPROVER, at, expires))
    store = ReleaseStore(ws)
    with store.target_lock("production"), History(store, "production") as history:
        history.append(
            "approval",
            {"release_id": rid, "by": APPROVER, "note": "", "at": at, "expires": expires, "signature": signature},
        )
    state, _ = read_history(store, "production")
    assert approval_refusal(load_targets(), "production", state, rid, parse_time(at) + timedelta(days=1)) == (
        f"target 'production' requires an approval, and release {rid} has no valid one: approval 1 by 'alice': "
        f"valid from {at} to {expires}, longer than the 90 days an approval may be"
    )
