"""The custody ledger and its pure reducer: records, chain, head, transitions, laws."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.evaluation.ledger import HEAD, LEDGER, Ledger, LedgerError, encode, make_record, read_ledger
from ragpipe.evaluation.run_state import TransitionError, apply, cell_dict, initial_state, reduce
from ragpipe.kernel.canonical import canonical_bytes

CELLS = [("q1", 0, "a"), ("q1", 1, "a"), ("q2", 0, "a")]
CREATED = {"run_id": "r", "spec_id": "sha256:" + "0" * 64, "cells": [cell_dict(c) for c in CELLS]}


def cell(key):
    return {"cell": cell_dict(key)}


def full_run() -> list[tuple[str, dict]]:
    events = [("RunCreated", CREATED), ("InputBound", {"name": "suite", "digest": "sha256:x"})]
    for key in CELLS:
        events += [
            ("CellStarted", cell(key)),
            ("CellCompleted", {**cell(key), "outcome": "success", "metrics": {"m": 0.5}}),
        ]
    return events + [("RunCompleted", {})]


def write(folder: Path, events) -> Ledger:
    folder.mkdir(parents=True, exist_ok=True)
    ledger = Ledger.create(folder)
    for kind, payload in events:
        ledger.append(kind, payload)
    return ledger


def test_record_hash_golden_vector():
    record = make_record(1, "RunCreated", {"run_id": "r"}, None)
    # sha256(b"ragpipe/eval-ledger-record/v1\0" + b'{"kind":"RunCreated","payload":{"run_id":"r"},"prev":null,"seq":1}')
    assert record.hash == "sha256:5cce0f36389c5489ea07dd05c8d79aa2a7a880cf964c4ffeadad328c006b95af"
    # the line is exactly the canonical record plus a newline, keys sorted
    assert (
        encode(record)
        == ('{"hash":"%s","kind":"RunCreated","payload":{"run_id":"r"},"prev":null,"seq":1}\n' % record.hash).encode()
    )


def test_append_chains_fsyncs_and_writes_head(tmp_path):
    ledger = write(tmp_path / "run", full_run())
    ledger.close()
    lines = (tmp_path / "run" / LEDGER).read_bytes().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["seq"] for r in records] == list(range(1, 10))
    assert [r["prev"] for r in records[1:]] == [r["hash"] for r in records[:-1]] and records[0]["prev"] is None
    assert json.loads((tmp_path / "run" / HEAD).read_bytes()) == {"hash": records[-1]["hash"], "seq": 9}
    read = read_ledger(tmp_path / "run")
    assert (len(read.records), read.dropped_bytes) == (9, 0)


def test_refused_event_writes_nothing(tmp_path):
    ledger = write(tmp_path / "run", full_run()[:4])  # q1/0 completed
    size = (tmp_path / "run" / LEDGER).stat().st_size
    with pytest.raises(TransitionError, match=r"^CellCompleted: cell \('q1', 0, 'a'\) is already terminal$"):
        ledger.append("CellCompleted", {**cell(CELLS[0]), "outcome": "success"})
    with pytest.raises(
        TransitionError, match=r"^RunCompleted with 2 expected cells not terminal \(first: cell \('q1', 1, 'a'\)\)$"
    ):
        ledger.append("RunCompleted", {})
    with pytest.raises(
        TransitionError, match=r"^CellStarted: cell \('zz', 0, 'a'\) is not an expected cell of this run$"
    ):
        ledger.append("CellStarted", cell(("zz", 0, "a")))
    with pytest.raises(TransitionError, match=r"^CellCompleted: cell \('q2', 0, 'a'\) was never started$"):
        ledger.append("CellCompleted", {**cell(CELLS[2]), "outcome": "success"})
    assert (tmp_path / "run" / LEDGER).stat().st_size == size and len(ledger.records) == 4


def test_terminal_run_rejects_appends(tmp_path):
    ledger = write(tmp_path / "run", full_run())
    with pytest.raises(TransitionError, match=r"^the run is completed: no record may follow RunCompleted$"):
        ledger.append("RunFailed", {"reason": "late"})
    failed = write(tmp_path / "failed", full_run()[:2] + [("RunFailed", {"reason": "bundle gone"})])
    with pytest.raises(TransitionError, match=r"^the run is failed: no record may follow RunFailed$"):
        failed.append("CellStarted", cell(CELLS[0]))


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([("InputBound", {"name": "s", "digest": "d"})], "InputBound before RunCreated"),
        ([("RunCreated", CREATED), ("RunCreated", CREATED)], "RunCreated must be the first record and appear once"),
        ([("RunCreated", {**CREATED, "cells": [cell_dict(CELLS[0])] * 2})], "RunCreated lists a cell twice"),
        (
            [("RunCreated", CREATED), ("CellStarted", cell(CELLS[0])), ("InputBound", {"name": "s", "digest": "d"})],
            "InputBound is allowed only after RunCreated and before the first cell starts",
        ),
        (
            [
                ("RunCreated", CREATED),
                ("InputBound", {"name": "s", "digest": "d"}),
                ("InputBound", {"name": "s", "digest": "e"}),
            ],
            "input 's' is already bound",
        ),
        (
            [
                ("RunCreated", CREATED),
                ("CellStarted", cell(CELLS[0])),
                ("CellCompleted", {**cell(CELLS[0]), "outcome": "failure"}),
            ],
            "CellCompleted: outcome must be one of success, abstained",
        ),
        (
            [
                ("RunCreated", CREATED),
                ("CellStarted", cell(CELLS[0])),
                ("CellFailed", {**cell(CELLS[0]), "outcome": "success"}),
            ],
            "CellFailed: outcome must be one of failure, cancelled",
        ),
        (
            [("RunCreated", CREATED), ("CellStarted", {"cell": {"case": "q1", "repeat": -1, "arm": "a"}})],
            "cell: case and arm must be strings, repeat an integer >= 0",
        ),
        (
            [("RunCreated", CREATED), ("Bogus", {})],
            "unknown record kind 'Bogus' (one of RunCreated, InputBound, CellStarted, CellCompleted, CellFailed, RunCompleted, RunFailed)",
        ),
        ([("RunCreated", CREATED), ("RunFailed", {})], "RunFailed needs a reason (string)"),
    ],
)
def test_illegal_transitions_have_exact_messages(events, message):
    with pytest.raises(TransitionError) as info:
        reduce(events)
    assert str(info.value) == message


def test_a_cell_restarted_after_a_crash_completes_once():
    key = CELLS[0]
    state = reduce(
        full_run()[:2]
        + [
            ("CellStarted", cell(key)),
            ("CellStarted", cell(key)),
            ("CellFailed", {**cell(key), "outcome": "failure", "error": "E"}),
        ]
    )
    assert (
        state.starts[key] == 2 and state.terminal[key]["outcome"] == "failure" and state.missing() == tuple(CELLS[1:])
    )


def _ledger_lines(folder: Path, records) -> Path:
    folder.mkdir(parents=True)
    (folder / LEDGER).write_bytes(b"".join(encode(r) for r in records))
    return folder


def test_chain_gap_and_hash_damage_name_the_record(tmp_path):
    r1 = make_record(1, "RunCreated", CREATED, None)
    r2 = make_record(2, "InputBound", {"name": "s", "digest": "d"}, r1.hash)
    gap = make_record(4, "InputBound", {"name": "t", "digest": "d"}, r2.hash)
    with pytest.raises(LedgerError, match=r"forged/ledger.jsonl: record 3: seq is 4, expected 3 \(gap or reorder\)$"):
        read_ledger(_ledger_lines(tmp_path / "a" / "forged", [r1, r2, gap]))
    broken = make_record(3, "InputBound", {"name": "t", "digest": "d"}, r1.hash)
    with pytest.raises(LedgerError, match=r"record 3: prev does not match the hash of record 2 \(broken chain\)$"):
        read_ledger(_ledger_lines(tmp_path / "b", [r1, r2, broken]))
    forged = r2.__class__(2, "InputBound", {"name": "s", "digest": "EVIL"}, r1.hash, r2.hash)
    with pytest.raises(LedgerError, match=r"record 2: hash does not match the record's content$"):
        read_ledger(_ledger_lines(tmp_path / "c", [r1, forged]))


def test_head_rewritten_in_place_across_digit_boundaries(tmp_path):
    """The head is rewritten in place (one write + fsync): its bytes are exactly the canonical
    ``{hash, seq}`` line at every append, including when ``seq`` gains a digit (9 -> 10), and when
    ``open`` repairs a head naming a torn record 10 back to record 9 (the file shrinks)."""
    folder = tmp_path / "run"
    ledger = write(folder, full_run()[:2])
    for _ in range(7):
        ledger.append("CellStarted", cell(CELLS[0]))
    assert len(ledger.records) == 9
    inode = (folder / HEAD).stat().st_ino
    ledger.append("CellStarted", cell(CELLS[0]))
    records = ledger.records
    ledger.close()
    assert (folder / HEAD).read_bytes() == canonical_bytes({"hash": records[9].hash, "seq": 10}) + b"\n"
    assert (folder / HEAD).stat().st_ino == inode  # rewritten, not replaced
    data = (folder / LEDGER).read_bytes()
    (folder / LEDGER).write_bytes(data[: len(data) - 5])  # record 10's line torn; the head still names it
    with Ledger.open(folder) as reopened:
        assert len(reopened.records) == 9
    assert (folder / HEAD).read_bytes() == canonical_bytes({"hash": records[8].hash, "seq": 9}) + b"\n"
    assert read_ledger(folder).records == tuple(records[:9])


def test_head_disagreements_are_refused(tmp_path):
    ledger = write(tmp_path / "run", full_run())
    head = (tmp_path / "run" / HEAD).read_bytes()
    records = ledger.records
    ledger.close()
    data = (tmp_path / "run" / LEDGER).read_bytes()
    # the last two complete records removed: the head names record 9, the ledger ends at 7
    cut = len(data) - len(encode(records[-1])) - len(encode(records[-2]))
    (tmp_path / "run" / LEDGER).write_bytes(data[:cut])
    with pytest.raises(
        LedgerError, match=r"record 8: missing \(the ledger ends at record 7; ledger.head names record 9\)$"
    ):
        read_ledger(tmp_path / "run")
    # a head lagging one record (crash between the ledger fsync and the head rewrite) is fine
    (tmp_path / "run" / LEDGER).write_bytes(data)
    (tmp_path / "run" / HEAD).write_bytes(json.dumps({"hash": records[-2].hash, "seq": 8}).encode())
    assert len(read_ledger(tmp_path / "run").records) == 9
    # ... and so is one lagging a group (a crash between a group commit's fsync and its head)
    (tmp_path / "run" / HEAD).write_bytes(json.dumps({"hash": records[-4].hash, "seq": 6}).encode())
    assert len(read_ledger(tmp_path / "run").records) == 9
    (tmp_path / "run" / HEAD).write_bytes(json.dumps({"hash": records[0].hash, "seq": 9}).encode())
    with pytest.raises(LedgerError, match=r"record 9: hash differs from the one ledger.head names$"):
        read_ledger(tmp_path / "run")
    (tmp_path / "run" / HEAD).unlink()
    with pytest.raises(LedgerError, match=r"record 9: ledger.head is missing$"):
        read_ledger(tmp_path / "run")
    (tmp_path / "run" / HEAD).write_bytes(head)
    assert len(read_ledger(tmp_path / "run").records) == 9


# ---- reducer laws (hypothesis) -------------------------------------------------------------

KEYS = CELLS + [("zz", 0, "a")]
event = st.one_of(
    st.just(("RunCreated", CREATED)),
    st.builds(lambda n: ("InputBound", {"name": n, "digest": "d"}), st.sampled_from(["suite", "plan"])),
    st.builds(lambda k: ("CellStarted", cell(k)), st.sampled_from(KEYS)),
    st.builds(
        lambda k, o, v: ("CellCompleted", {**cell(k), "outcome": o, "metrics": {"m": v}}),
        st.sampled_from(KEYS),
        st.sampled_from(["success", "abstained", "failure"]),
        st.floats(0, 1),
    ),
    st.builds(
        lambda k, o: ("CellFailed", {**cell(k), "outcome": o, "error": "E"}),
        st.sampled_from(KEYS),
        st.sampled_from(["failure", "cancelled"]),
    ),
    st.just(("RunCompleted", {})),
    st.just(("RunFailed", {"reason": "stop"})),
)


def accepted_events(events):
    """Feed events as the ledger does: a refused one is not recorded and leaves the state as is."""
    state, kept = initial_state(), []
    for kind, payload in events:
        before = copy.deepcopy(state)
        try:
            new = apply(state, kind, payload)
        except TransitionError:
            assert state == before  # pure: refusing changed nothing
            if kind == "RunCompleted" and state.status in ("created", "running"):
                assert state.missing()  # refused only because a cell was not terminal
            continue
        if kind == "RunCompleted":
            assert not state.missing()
        state = new
        kept.append((kind, payload))
    return state, kept


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=25), st.data())
def test_reducer_laws(events, data):
    state, kept = accepted_events([("RunCreated", CREATED)] + events)
    # replaying the accepted events gives the same state; so does any prefix + the rest
    assert reduce(kept) == state
    i = data.draw(st.integers(0, len(kept)))
    assert reduce(kept[i:], reduce(kept[:i])) == state
    assert state.events == len(kept)
    # a cell is terminal at most once, and its terminal record is the first one accepted
    closing = [(k, p) for k, p in kept if k in ("CellCompleted", "CellFailed")]
    keys = [(p["cell"]["case"], p["cell"]["repeat"], p["cell"]["arm"]) for _, p in closing]
    assert len(keys) == len(set(keys)) and set(keys) <= set(CELLS)
    assert all(state.terminal[k] == p for k, (_, p) in zip(keys, closing))
    # after a terminal record nothing is accepted
    terminal_at = next((j for j, (k, _) in enumerate(kept) if k in ("RunCompleted", "RunFailed")), None)
    assert terminal_at is None or terminal_at == len(kept) - 1
    if state.status == "completed":
        assert not state.missing()


def test_a_second_writer_of_a_run_is_refused_until_the_first_closes(tmp_path: Path):
    """Two resumes of one run folder would both recover, append and run the same cells: the
    ledger's writer holds an exclusive lock, in this process or another."""
    import subprocess
    import sys

    folder = tmp_path / "run"
    folder.mkdir()
    Ledger.create(folder).close()
    holder = Ledger.open(folder)
    with pytest.raises(LedgerError) as refused:
        Ledger.open(folder)
    assert str(refused.value) == (
        f"{folder / 'ledger.jsonl'}: another process is writing this run (an evaluation or a resume of it); "
        "wait for it to end, then resume"
    )
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from ragpipe.evaluation.ledger import Ledger; Ledger.open(Path(sys.argv[1]))",
            str(folder),
        ],
        capture_output=True,
        text=True,
    )
    assert other.returncode == 1 and "another process is writing this run" in other.stderr
    holder.close()
    Ledger.open(folder).close()  # free again
