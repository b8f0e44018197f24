"""The generic hash-chained ledger of ragpipe.kernel.ledger: chain, head, recovery, refusals."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ledger import (
    Domain,
    Ledger,
    LedgerError,
    encode,
    fold,
    head_path,
    parse_ledger,
    read_head,
    read_ledger,
)
from ragpipe_tests.support.paths import REPO

D = Domain("test-ledger-record", 1)
G = Domain("test-ledger-record", 1, max_group=4)  # the same records, appended in groups of up to 4


def make(path: Path, n: int = 3, domain: Domain = D) -> Ledger:
    ledger = Ledger.open(path, domain, create=True)
    for i in range(n):
        ledger.append("event", {"i": i, "text": f"value {i}"})
    return ledger


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_append_read_roundtrip_and_head(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    with make(path) as ledger:
        records = list(ledger.records)
    read = read_ledger(path, D)
    assert read.records == tuple(records) and read.dropped_bytes == 0
    assert [r.seq for r in records] == [1, 2, 3] and records[0].prev is None
    assert [r.prev for r in records[1:]] == [r.hash for r in records[:2]]
    assert records[0].hash == D.record_hash(1, "event", {"i": 0, "text": "value 0"}, None)
    assert read_head(path) == (3, records[-1].hash)
    assert head_path(path).read_bytes() == canonical_bytes({"hash": records[-1].hash, "seq": 3}) + b"\n"
    assert path.read_bytes() == b"".join(encode(r) for r in records)


def test_golden_record_hash():
    """The record encoding pinned independently: RFC 8785 bytes under the domain prefix."""
    expected = hashlib.sha256(
        b"ragpipe/test-ledger-record/v1\0" + b'{"kind":"event","payload":{"i":0},"prev":null,"seq":1}'
    )
    assert D.record_hash(1, "event", {"i": 0}, None) == "sha256:" + expected.hexdigest()
    from ragpipe.evaluation.ledger import record_hash

    assert Domain("eval-ledger-record").record_hash(2, "K", {"a": [1]}, "p") == record_hash(2, "K", {"a": [1]}, "p")


def test_domains_separate_ledgers(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    make(path).close()
    with pytest.raises(LedgerError) as exc:
        read_ledger(path, Domain("other-ledger-record"))
    assert str(exc.value) == f"{path}: record 1: hash does not match the record's content"


def test_reads_and_writes_evaluation_ledgers_byte_identically(tmp_path: Path):
    """Superset of ragpipe.evaluation.ledger: same bytes, same hashes, same head."""
    from ragpipe.evaluation import ledger as evaluation

    path = tmp_path / "ledger.jsonl"
    with Ledger.open(path, Domain("eval-ledger-record"), create=True) as ledger:
        ledger.append("RunCreated", {"run_id": "r", "spec_id": "s", "cells": []})
    theirs = evaluation.parse_ledger(path.read_bytes(), str(path))
    assert [r.as_dict() for r in theirs.records] == [r.as_dict() for r in ledger.records]
    assert evaluation.read_head(tmp_path) == read_head(path)


def test_missing_ledger_names_rule(tmp_path: Path):
    with pytest.raises(LedgerError, match=r"^.*/none\.jsonl: record 1: no ledger file$"):
        read_ledger(tmp_path / "none.jsonl", D)
    with pytest.raises(LedgerError) as exc:
        Ledger.create(make(tmp_path / "x.jsonl").path, D)
    assert str(exc.value) == f"{tmp_path / 'x.jsonl'}: record 1: a ledger already exists here"


@pytest.mark.parametrize("tail", [b'{"hash":"sha', b'{"hash":"sha256:00"}\xff', b"\x00\x00\x00", b'{"seq":4'])
def test_torn_final_line_is_the_only_thing_dropped(tmp_path: Path, tail: bytes):
    path = tmp_path / "l.jsonl"
    make(path).close()
    intact = path.read_bytes()
    path.write_bytes(intact + tail)
    read = read_ledger(path, D)
    assert (len(read.records), read.valid_bytes, read.dropped_bytes) == (3, len(intact), len(tail))
    with Ledger.open(path, D) as ledger:  # recovery truncates the torn tail, then appends continue the chain
        ledger.append("event", {"i": 3, "text": "after"})
    assert path.read_bytes().startswith(intact) and len(read_ledger(path, D).records) == 4


def damage(path: Path, n: int, edit) -> None:
    data = lines(path)
    data[n - 1] = edit(data[n - 1])
    path.write_bytes(b"".join(data))


@pytest.mark.parametrize(
    "edit, rule, n",
    [
        (lambda line: line.replace(b"value 1", b"value X"), "hash does not match the record's content", 2),
        (lambda line: b"not json\n", "not valid JSON", 2),
        (lambda line: b"[1, 2]\n", "not a ledger record (keys must be hash, kind, payload, prev, seq)", 2),
        (lambda line: line.replace(b'"seq":2', b'"seq":7'), "seq is 7, expected 2 (gap or reorder)", 2),
        (
            lambda line: line.replace(b'"prev":"sha256:', b'"prev":"sha256:0'),
            "prev does not match the hash of record 1 (broken chain)",
            2,
        ),
        (lambda line: line.replace(b'"kind":"event"', b'"kind":7'), "kind must be a string and payload an object", 2),
        (lambda line: line.replace(b"{", b"{ ", 1), "not in canonical form", 2),
        (lambda line: line[:-1] + b" junk\n", "not valid JSON", 3),
        # nested past the parser's depth, in the middle and as the final line: refused, never dropped as torn
        (lambda line: b"[" * 100_000 + b"]" * 100_000 + b"\n", "not valid JSON (nested too deeply)", 2),
        (lambda line: b"[" * 100_000 + b"]" * 100_000 + b"\n", "not valid JSON (nested too deeply)", 3),
    ],
)
def test_damage_refuses_naming_the_record(tmp_path: Path, edit, rule: str, n: int):
    path = tmp_path / "l.jsonl"
    make(path).close()
    damage(path, n, edit)
    with pytest.raises(LedgerError) as exc:
        Ledger.open(path, D)
    assert str(exc.value) == f"{path}: record {n}: {rule}"


def test_head_rules(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    with make(path) as ledger:
        second, third = ledger.records[1], ledger.records[2]
    head = head_path(path)
    head.write_bytes(canonical_bytes({"hash": second.hash, "seq": 2}))  # lags one: a crash before the head rewrite
    with Ledger.open(path, D):
        pass
    assert read_head(path) == (3, third.hash)  # repaired
    head.write_bytes(canonical_bytes({"hash": "sha256:" + "0" * 64, "seq": 1}))
    with pytest.raises(LedgerError) as exc:
        read_ledger(path, D)
    assert str(exc.value) == f"{path}: record 1: hash differs from the one l.head names"
    head.write_bytes(canonical_bytes({"hash": ledger.records[0].hash, "seq": 1}))
    with pytest.raises(LedgerError) as exc:  # more than one append lost its head: a replayed older head
        read_ledger(path, D)
    assert str(exc.value) == f"{path}: record 2: l.head lags 2 records behind the ledger (one append writes at most 1)"
    assert [r.seq for r in read_ledger(path, G).records] == [1, 2, 3]  # a ledger of groups of two or more
    head.write_bytes(canonical_bytes({"hash": third.hash, "seq": 5}))
    with pytest.raises(LedgerError) as exc:
        read_ledger(path, D)
    assert str(exc.value) == f"{path}: record 4: missing (the ledger ends at record 3; l.head names record 5)"
    head.unlink()
    with pytest.raises(LedgerError) as exc:
        read_ledger(path, D)
    assert str(exc.value) == f"{path}: record 3: l.head is missing"
    head.write_bytes(b"{nope")
    with pytest.raises(LedgerError) as exc:
        read_ledger(path, D)
    assert str(exc.value) == f"{head}: record ?: head file is not {{hash, seq}} JSON"


def test_refused_payload_writes_nothing(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    ledger = make(path, 1)
    with pytest.raises(ValueError, match=r"non-finite float nan is not allowed"):
        ledger.append("event", {"x": float("nan")})
    ledger.close()
    assert len(read_ledger(path, D).records) == 1 and len(lines(path)) == 1


def test_fold_names_the_record_of_an_illegal_transition(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    make(path).close()

    def step(total: int, record) -> int:
        if record.payload["i"] == 2:
            raise ValueError("i must stay below 2")
        return total + record.payload["i"]

    with pytest.raises(LedgerError) as exc:
        fold(read_ledger(path, D).records, step, 0, "where.jsonl")
    assert str(exc.value) == "where.jsonl: record 3: i must stay below 2"


@settings(max_examples=60, deadline=None)
# NFC text: the canonical encoder refuses any other (ragpipe.kernel.canonical).
@given(
    texts=st.lists(st.text(max_size=12).map(lambda t: unicodedata.normalize("NFC", t)), min_size=1, max_size=5),
    cut=st.floats(0, 1),
)
def test_law_any_prefix_recovers_exactly_the_complete_records(tmp_path_factory, texts: list[str], cut: float):
    """A crash can leave any prefix of the bytes: recovery keeps exactly the records whose newline
    was written, and drops the rest — never refuses, never invents."""
    path = tmp_path_factory.mktemp("law") / "l.jsonl"
    with Ledger.open(path, D, create=True) as ledger:
        for t in texts:
            ledger.append("t", {"t": t})
    data = path.read_bytes()
    prefix = data[: int(len(data) * cut)]
    read = parse_ledger(prefix, D, "p")
    assert read.records == tuple(ledger.records[: prefix.count(b"\n")])
    assert read.valid_bytes + read.dropped_bytes == len(prefix)


KILL_AFTER_APPEND = """
import os, signal, sys
from pathlib import Path
from ragpipe.kernel.ledger import Domain, Ledger
ledger = Ledger.open(Path(sys.argv[1]), Domain("test-ledger-record"), create=True,
                     on_append=lambda kind: os.kill(os.getpid(), signal.SIGKILL) if kind == "last" else None)
ledger.append("first", {})
ledger.append("last", {})
"""


def test_sigkill_after_append_keeps_the_record(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_APPEND, str(path)], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [r.kind for r in read_ledger(path, D).records] == ["first", "last"]
    assert os.stat(path).st_size == len(path.read_bytes())


def test_a_group_is_the_records_single_appends_write(tmp_path: Path):
    """``append_group`` writes byte for byte what the same appends one at a time write (one
    ``write``, one fsync, one head rewrite instead of one each), and ``on_append`` runs once."""
    events = [("event", {"i": i, "text": f"value {i}"}) for i in range(3)]
    one, grouped = tmp_path / "one.jsonl", tmp_path / "grouped.jsonl"
    make(one).close()
    seen: list[str] = []
    with Ledger.open(grouped, G, create=True, on_append=seen.append) as ledger:
        assert ledger.append_group([]) == []
        records = ledger.append_group(events)
    assert one.read_bytes() == grouped.read_bytes() and [r.seq for r in records] == [1, 2, 3]
    assert head_path(one).read_bytes() == head_path(grouped).read_bytes() and seen == ["event"]


def test_a_refused_payload_in_a_group_writes_none_of_it(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    with make(path, 1, G) as ledger:
        before = path.read_bytes()
        with pytest.raises(LedgerError, match="5 records in one append; this ledger takes at most 4$"):
            ledger.append_group([("event", {"i": i}) for i in range(5)])
        with pytest.raises(ValueError):
            ledger.append_group([("event", {"i": 1}), ("event", {"f": float("nan")})])
        assert path.read_bytes() == before and len(ledger.records) == 1


def test_every_byte_cut_of_a_group_recovers_its_complete_records(tmp_path: Path):
    """A crash in a group's ``write``: the ledger holds the records before it plus any prefix of the
    group's bytes, with the head on the record before the group. Recovery keeps exactly the
    records whose line is complete and repairs the head to the last of them."""
    path = tmp_path / "l.jsonl"
    with make(path, 1, G) as ledger:
        before, head = path.read_bytes(), head_path(path).read_bytes()
        group = ledger.append_group([("event", {"i": i}) for i in range(1, 4)])
    data = path.read_bytes()
    for cut in range(len(before), len(data) + 1):
        path.write_bytes(data[:cut])
        head_path(path).write_bytes(head)
        complete = data[len(before) : cut].count(b"\n")
        with Ledger.open(path, G) as reopened:
            assert [r.seq for r in reopened.records] == list(range(1, 2 + complete)), cut
        assert path.read_bytes() == data[: len(before) + sum(len(encode(r)) for r in group[:complete])]
        assert read_head(path) == (1 + complete, ([ledger.records[0]] + group)[complete].hash)


def test_a_writer_that_forgets_its_records_appends_the_same_ledger(tmp_path: Path):
    """``forget_records`` keeps one record in memory; the file is byte for byte what a writer
    keeping every record writes."""
    kept, forgetful = tmp_path / "kept.jsonl", tmp_path / "forgetful.jsonl"
    make(kept, 5).close()
    ledger = make(forgetful, 2)
    ledger.forget_records()
    for i in range(2, 5):
        ledger.append("event", {"i": i, "text": f"value {i}"})
        ledger.forget_records()
        assert len(ledger.records) == 1 and ledger.records[0].seq == i + 1
    ledger.close()
    assert forgetful.read_bytes() == kept.read_bytes()
    assert head_path(forgetful).read_bytes() == head_path(kept).read_bytes()
    assert [r.seq for r in read_ledger(forgetful, D).records] == [1, 2, 3, 4, 5]
