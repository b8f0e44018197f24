"""The keyed seal (ragpipe.kernel.seals) and the sealed ledger head: what only a key holder can
write is refused when forged, unsealed, sealed with another key, or sealed with no key to check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ledger import Domain, Ledger, LedgerError, encode, head_path, read_ledger
from ragpipe.kernel.seals import SealKey, make_seal, seal_problem, sealed, unsealed

KEY = SealKey(b"a record key of at least 32 bytes!!")
OTHER = SealKey(b"another key that is 32 bytes long!")
D = Domain("test-ledger-record", 1)


def test_the_rule_of_seal_problem():
    content = {"a": 1, "b": ["x"]}
    seal = make_seal(KEY, "thing/v1", content)
    assert seal["key_id"] == KEY.key_id and seal["mac"].startswith("hmac-sha256:")
    assert seal_problem(None, "thing/v1", content, None) is None
    assert seal_problem(seal, "thing/v1", content, KEY) is None
    assert seal_problem(None, "thing/v1", content, KEY) == (
        f"not sealed, but key {KEY.key_id} is configured: only records sealed with it are trusted"
    )
    assert seal_problem(seal, "thing/v1", content, None).startswith(f"sealed with key {KEY.key_id}, but no key is")
    assert seal_problem(seal, "thing/v1", content, OTHER) == (
        f"sealed with key {KEY.key_id}, the configured key is {OTHER.key_id}"
    )
    edited = "the seal does not match the record (edited or forged)"
    assert seal_problem(seal, "thing/v1", {**content, "a": 2}, KEY) == edited
    assert seal_problem(seal, "other/v1", content, KEY) == edited  # domains never share a seal
    assert seal_problem({**seal, "extra": 1}, "thing/v1", content, KEY) == "the seal is not {key_id, mac}"
    assert seal_problem({**seal, "mac": 7}, "thing/v1", content, KEY) == edited
    assert sealed(content, "thing/v1", None) == content
    assert unsealed(sealed(content, "thing/v1", KEY), "thing/v1", KEY) == (content, None)


def keyed(path: Path, n: int = 3, key: SealKey | None = KEY) -> list:
    with Ledger.open(path, D, create=True, key=key) as ledger:
        for i in range(n):
            ledger.append("event", {"i": i})
        return list(ledger.records)


def test_a_keyed_ledger_seals_its_head_and_reads_back_only_with_that_key(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    records = keyed(path)
    head = json.loads(head_path(path).read_bytes())
    content = {"hash": records[-1].hash, "seq": 3}
    assert head == {**content, "seal": make_seal(KEY, "ledger-head/test-ledger-record/v1", content)}
    assert read_ledger(path, D, key=KEY).records == tuple(records)
    with pytest.raises(LedgerError, match=rf"record 3: l\.head: sealed with key {KEY.key_id}, but no key"):
        read_ledger(path, D, key=None)
    with pytest.raises(LedgerError, match=rf"record 3: l\.head: sealed with key {KEY.key_id}, the configured key"):
        read_ledger(path, D, key=OTHER)
    with pytest.raises(LedgerError, match="record 3: l.head: sealed with key"):
        Ledger.open(path, D, key=OTHER)


def test_an_unkeyed_ledger_is_refused_once_a_key_is_configured(tmp_path: Path):
    path = tmp_path / "l.jsonl"
    keyed(path, key=None)
    assert json.loads(head_path(path).read_bytes()).keys() == {"hash", "seq"}
    with pytest.raises(LedgerError, match=rf"record 3: l\.head: not sealed, but key {KEY.key_id} is configured"):
        read_ledger(path, D, key=KEY)
    head_path(path).unlink()
    with pytest.raises(LedgerError, match=rf"record 3: l\.head is missing: key {KEY.key_id} is configured"):
        read_ledger(path, D, key=KEY)


def test_a_record_forged_with_chain_and_head_recomputed_is_refused(tmp_path: Path):
    """A forger appends a record and rewrites the head for it; they cannot seal it."""
    path = tmp_path / "l.jsonl"
    records = keyed(path)
    forged = D.make_record(4, "event", {"i": "forged"}, records[-1].hash)
    path.write_bytes(path.read_bytes() + encode(forged))
    old_seal = json.loads(head_path(path).read_bytes())["seal"]
    for head in ({"hash": forged.hash, "seq": 4}, {"hash": forged.hash, "seq": 4, "seal": old_seal}):
        head_path(path).write_bytes(canonical_bytes(head) + b"\n")
        with pytest.raises(LedgerError, match="record 4: l.head: (not sealed|the seal does not match)"):
            read_ledger(path, D, key=KEY)


def test_a_record_after_the_sealed_head_is_uncommitted_ignored_by_readers_and_dropped_by_the_writer(
    tmp_path: Path,
):
    """A crash between a record's fsync and its head's rewrite: the record was never sealed. (Its
    append never returned, so dropping it is the same as a crash just before it.)"""
    path = tmp_path / "l.jsonl"
    records = keyed(path)
    sealed_bytes = path.read_bytes()
    unsealed_record = D.make_record(4, "event", {"i": 3}, records[-1].hash)
    path.write_bytes(sealed_bytes + encode(unsealed_record))
    read = read_ledger(path, D, key=KEY)
    assert read.records == tuple(records) and read.dropped_bytes == len(encode(unsealed_record))
    with Ledger.open(path, D, key=KEY) as ledger:
        assert ledger.records == records
        assert path.read_bytes() == sealed_bytes  # dropped, as a torn tail is
        again = ledger.append("event", {"i": "again"})
    assert again.seq == 4 and read_ledger(path, D, key=KEY).records[-1] == again


def test_a_sealed_record_cannot_be_removed_by_cutting_its_line_or_the_ledger(tmp_path: Path):
    """Cutting the last line's newline makes it look torn; removing the ledger leaves its head:
    with a key, both are removals, refused by readers and writers alike."""
    path = tmp_path / "l.jsonl"
    keyed(path)
    whole = path.read_bytes()
    path.write_bytes(whole[:-1])
    with pytest.raises(LedgerError, match=r"record 3: its line is cut, but the sealed l\.head names it"):
        read_ledger(path, D, key=KEY)
    with pytest.raises(LedgerError, match="its line is cut"):
        Ledger.open(path, D, key=KEY)
    path.unlink()
    for attempt in (lambda: read_ledger(path, D, key=KEY), lambda: Ledger.open(path, D, create=True, key=KEY)):
        with pytest.raises(LedgerError, match=r"record 1: the ledger is missing, but l\.head exists"):
            attempt()


def test_a_head_seal_binds_its_scope(tmp_path: Path):
    """A history sealed for one target does not verify as another's (same records, other scope)."""
    path = tmp_path / "l.jsonl"
    with Ledger.open(path, D, create=True, key=KEY, scope="staging") as ledger:
        ledger.append("event", {"i": 1})
    assert len(read_ledger(path, D, key=KEY, scope="staging").records) == 1
    with pytest.raises(LedgerError, match="the seal does not match the record"):
        read_ledger(path, D, key=KEY, scope="production")


@pytest.mark.parametrize("seq", ["1e999", "true", "-1", "1.5", '"3"'])
def test_a_head_whose_seq_is_not_a_count_is_refused(tmp_path: Path, seq: str):
    path = tmp_path / "l.jsonl"
    keyed(path, key=None)
    head_path(path).write_text('{"hash":"x","seq":%s}\n' % seq)
    with pytest.raises(LedgerError, match=r"l\.head: record \?: head file is not \{hash, seq\} JSON"):
        read_ledger(path, D, key=None)


def test_a_group_after_the_sealed_head_is_uncommitted_as_a_whole(tmp_path: Path):
    """A crash after a group's fsync, before its head: none of the group was sealed, so all of it
    is dropped (an evaluation runs those cells again)."""
    path = tmp_path / "l.jsonl"
    group = Domain("test-ledger-record", 1, max_group=3)
    with Ledger.open(path, group, create=True, key=KEY) as ledger:
        ledger.append("event", {"i": 0})
        records = list(ledger.records)
    sealed_bytes, head = path.read_bytes(), head_path(path).read_bytes()
    with Ledger.open(path, group, key=KEY) as ledger:
        ledger.append_group([("event", {"i": i}) for i in range(1, 4)])
    head_path(path).write_bytes(head)
    assert read_ledger(path, group, key=KEY).records == tuple(records)
    with Ledger.open(path, group, key=KEY) as ledger:
        assert ledger.records == records
    assert path.read_bytes() == sealed_bytes
