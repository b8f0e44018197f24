"""The evaluation run's custody ledger: append-only, hash-chained JSONL with a separate head file.

Record ``{seq, kind, payload, prev, hash}``: ``seq`` counts from 1 (the *record number* every error
names), ``prev`` is the previous record's ``hash`` (``None`` for record 1), and ``hash`` is the content
ID (domain ``eval-ledger-record`` v1) of the canonical record without ``hash``. Each line is exactly the record's
RFC 8785 bytes plus ``\\n``, written with one ``write`` and fsynced before ``append`` returns; then
``ledger.head`` (``{"hash": …, "seq": …}``) is rewritten atomically.

Recovery (``read_ledger``) may drop exactly one thing: an incomplete final line — no trailing
newline, or bytes at the very end that are not a JSON value (a torn write is a prefix of a
record, and no proper prefix of a canonical object parses). Everything else refuses with the
record number: an unparsable or non-canonical line before the end, a final line that parses but
carries trailing bytes (a record whose newline was damaged), a bad hash, a broken chain, a gap in
``seq``, and a head that disagrees with the ledger. The head may lag one record behind (a crash
between the ledger fsync and the head rewrite) and may name the record whose torn line was dropped;
a head further ahead means complete records were lost, which is refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragpipe.evaluation.run_state import RunState, apply, initial_state
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import domain_digest
from ragpipe.kernel.publish import write_file_atomic

LEDGER = "ledger.jsonl"
HEAD = "ledger.head"
RECORD_KEYS = ("hash", "kind", "payload", "prev", "seq")


class LedgerError(ValueError):
    """The ledger (or its head) is damaged; ``str(e)`` is ``"<file>: record <n>: <rule>"``."""


@dataclass(frozen=True)
class Record:
    seq: int
    kind: str
    payload: dict[str, Any]
    prev: str | None
    hash: str

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "payload": self.payload, "prev": self.prev, "hash": self.hash}


@dataclass(frozen=True)
class LedgerRead:
    """The verified records, the bytes they occupy, and the torn tail that was dropped (if any)."""

    records: tuple[Record, ...]
    valid_bytes: int
    dropped_bytes: int


def _body(seq: int, kind: str, payload: dict[str, Any], prev: str | None) -> bytes:
    """Canonical bytes of the record without ``hash`` (what the hash covers)."""
    return canonical_bytes({"seq": seq, "kind": kind, "payload": payload, "prev": prev})


def _line(body: bytes, digest: str) -> bytes:
    # "hash" sorts before every other key, so the canonical record is the body with it in front
    return b'{"hash":"' + digest.encode() + b'",' + body[1:] + b"\n"


def record_hash(seq: int, kind: str, payload: dict[str, Any], prev: str | None) -> str:
    return domain_digest("eval-ledger-record", 1, _body(seq, kind, payload, prev))


def make_record(seq: int, kind: str, payload: dict[str, Any], prev: str | None) -> Record:
    return Record(seq, kind, payload, prev, record_hash(seq, kind, payload, prev))


def encode(record: Record) -> bytes:
    """The record's line: its canonical RFC 8785 bytes plus a newline."""
    return _line(_body(record.seq, record.kind, record.payload, record.prev), record.hash)


def _check_record(raw: bytes, seq: int, prev: str | None, where: str) -> Record:
    """Parse and verify line ``seq`` (without its newline) against the chain so far."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise LedgerError(f"{where}: record {seq}: not valid JSON") from None
    if not isinstance(obj, dict) or tuple(sorted(obj)) != RECORD_KEYS:
        raise LedgerError(f"{where}: record {seq}: not a ledger record (keys must be {', '.join(RECORD_KEYS)})")
    if obj["seq"] != seq or isinstance(obj["seq"], bool):
        raise LedgerError(f"{where}: record {seq}: seq is {obj['seq']!r}, expected {seq} (gap or reorder)")
    if obj["prev"] != prev:
        raise LedgerError(f"{where}: record {seq}: prev does not match the hash of record {seq - 1} (broken chain)")
    if not isinstance(obj["kind"], str) or not isinstance(obj["payload"], dict):
        raise LedgerError(f"{where}: record {seq}: kind must be a string and payload an object")
    body = _body(seq, obj["kind"], obj["payload"], prev)
    digest = domain_digest("eval-ledger-record", 1, body)
    if obj["hash"] != digest:
        raise LedgerError(f"{where}: record {seq}: hash does not match the record's content")
    if _line(body, digest) != raw + b"\n":
        raise LedgerError(f"{where}: record {seq}: not in canonical form")
    return Record(seq, obj["kind"], obj["payload"], prev, digest)


def _is_torn(tail: bytes) -> bool:
    """True if the final bytes are a torn write: no complete JSON value starts them."""
    try:
        json.JSONDecoder().raw_decode(tail.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return True
    return False


def parse_ledger(data: bytes, where: str = LEDGER) -> LedgerRead:
    """Verify ``data`` (a ledger's bytes) record by record; drop only a torn final line."""
    records: list[Record] = []
    pos = 0
    prev: str | None = None
    while pos < len(data):
        end = data.find(b"\n", pos)
        seq = len(records) + 1
        if end < 0:  # no newline: the final line was never completed
            return LedgerRead(tuple(records), pos, len(data) - pos)
        line = data[pos:end]
        if end + 1 == len(data) and _is_torn(line):
            return LedgerRead(tuple(records), pos, len(data) - pos)
        record = _check_record(line, seq, prev, where)
        records.append(record)
        prev = record.hash
        pos = end + 1
    return LedgerRead(tuple(records), pos, 0)


def read_head(folder: Path) -> tuple[int, str] | None:
    path = folder / HEAD
    if not path.exists():
        return None
    try:
        obj = json.loads(path.read_bytes())
        return int(obj["seq"]), str(obj["hash"])
    except (ValueError, KeyError, TypeError):
        raise LedgerError(f"{path}: record ?: head file is not {{hash, seq}} JSON") from None


def check_head(folder: Path, read: LedgerRead) -> None:
    """Refuse when ``ledger.head`` says complete records are missing or differ (module docstring)."""
    head = read_head(folder)
    n = len(read.records)
    where = str(folder / LEDGER)
    if head is None:
        if n > 1:
            raise LedgerError(f"{where}: record {n}: ledger.head is missing")
        return
    seq, digest = head
    if 1 <= seq <= n:
        if read.records[seq - 1].hash != digest:
            raise LedgerError(f"{where}: record {seq}: hash differs from the one ledger.head names")
        if seq < n - 1:
            raise LedgerError(f"{where}: record {seq + 1}: ledger.head lags {n - seq} records behind the ledger")
        return
    if seq == n + 1 and read.dropped_bytes:
        return  # the head was written for the record whose line is torn: impossible by order, harmless
    raise LedgerError(f"{where}: record {n + 1}: missing (the ledger ends at record {n}; ledger.head names record {seq})")


def read_ledger(folder: Path) -> LedgerRead:
    """Read and verify ``folder/ledger.jsonl`` against its chain and ``ledger.head``."""
    path = folder / LEDGER
    if not path.is_file():
        raise LedgerError(f"{path}: record 1: no ledger file (not an evaluation run folder)")
    read = parse_ledger(path.read_bytes(), str(path))
    check_head(folder, read)
    return read


def reduce_records(records: tuple[Record, ...] | list[Record], where: str = LEDGER) -> RunState:
    """Fold the records into run state; an illegal transition refuses with its record number."""
    state = initial_state()
    for record in records:
        try:
            state = apply(state, record.kind, record.payload)
        except ValueError as exc:
            raise LedgerError(f"{where}: record {record.seq}: {exc}") from None
    return state


class Ledger:
    """The single writer of one run's ledger. ``open`` recovers (truncating a torn tail) and
    reduces; ``append`` checks the transition with the reducer first, so a refused event writes
    nothing. ``on_append(kind)`` runs after each durable append (failure-injection tests)."""

    def __init__(self, folder: Path, records: tuple[Record, ...], state: RunState, on_append: Callable[[str], None] | None = None):
        self.folder = folder
        self.records = list(records)
        self.state = state
        self.on_append = on_append
        self._fd = os.open(folder / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @classmethod
    def create(cls, folder: Path) -> Ledger:
        """A new, empty ledger in ``folder`` (which must not hold one yet)."""
        if (folder / LEDGER).exists():
            raise LedgerError(f"{folder / LEDGER}: record 1: a ledger already exists here")
        return cls(folder, (), initial_state())

    @classmethod
    def open(cls, folder: Path) -> Ledger:
        read = read_ledger(folder)
        state = reduce_records(read.records, str(folder / LEDGER))
        if read.dropped_bytes:  # recovery: the torn final line is the only thing ever removed
            with open(folder / LEDGER, "r+b") as fh:
                fh.truncate(read.valid_bytes)
                os.fsync(fh.fileno())
        ledger = cls(folder, read.records, state)
        if ledger.records:
            ledger._write_head()  # repairs a head that lagged one record
        return ledger

    @property
    def head(self) -> str | None:
        return self.records[-1].hash if self.records else None

    def append(self, kind: str, payload: dict[str, Any]) -> Record:
        state = apply(self.state, kind, payload)  # raises before anything is written
        record = make_record(len(self.records) + 1, kind, payload, self.head)
        data = encode(record)
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(f"{self.folder / LEDGER}: short write of record {record.seq}")
        os.fsync(self._fd)
        self.records.append(record)
        self.state = state
        self._write_head()
        if self.on_append is not None:
            self.on_append(kind)
        return record

    def _write_head(self) -> None:
        last = self.records[-1]
        write_file_atomic(self.folder / HEAD, canonical_bytes({"hash": last.hash, "seq": last.seq}) + b"\n")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
