"""A generic append-only, hash-chained JSONL ledger with a separate head file (docs/trust.md).

Record ``{seq, kind, payload, prev, hash}``: ``seq`` counts from 1 (the *record number* every error
names), ``prev`` is the previous record's ``hash`` (``None`` for record 1) and ``hash`` is
``content_id(<domain>, <version>, record without hash)``. The domain tag separates ledgers of
different purposes: a record of one can never verify as a record of another. Each line is exactly
the record's RFC 8785 bytes plus ``\\n``, written with one ``write`` and fsynced before ``append``
returns (``append_group`` writes several records with one ``write`` and one fsync: a group
commit); then the head file (``{"hash": …, "seq": …}``, ``<name>.head`` beside ``<name>.jsonl``) is
rewritten in place and fsynced (``Ledger._write_head``). Creating the ledger file fsyncs its directory, so the file itself survives a
crash.

Recovery (``Ledger.open``) may drop exactly one thing: an incomplete final line — no trailing
newline, or bytes at the very end that are not a JSON value (a torn write is a prefix of a record;
canonical JSON escapes newlines, so no proper prefix holds one, and no proper prefix of an object
parses). Everything else refuses with ``"<file>: record <n>: <rule>"``: an unparsable or
non-canonical line before the end, a final line that parses but carries trailing bytes, a bad hash,
a broken chain, a gap in ``seq``, and a head that disagrees with the ledger. The head may lag
behind by the records of the last append (a crash between the ledger fsync and the head rewrite:
one record, or a group of at most the domain's ``max_group``), never further, and may name the
record whose torn line was dropped; a head further ahead means complete records were lost, which
is refused.

With a key configured (``ragpipe.kernel.seals``), the head also carries a seal over ``{hash,
seq}`` in the ledger's domain, so the head — and through the chain every record up to it — is
something only key holders can write: the head must exist and verify, and a head that lags
behind leaves the records after it *uncommitted*: readers ignore it and ``Ledger.open`` drops it, as
a torn tail (its ``append`` never returned, so nobody relied on it; an evaluation cell is run
again, a history intent is resolved by release recovery). Without a key, a sealed head is refused.

This module is the superset of ``ragpipe.evaluation.ledger``: with domain ``eval-ledger-record``
v1 and the file ``ledger.jsonl`` it reads and writes byte-identical ledgers. One writer at a time:
callers that share a ledger between processes serialise ``open`` … ``append`` under a file lock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.publish import fsync_path
from ragpipe.kernel.seals import SEAL, SealKey, configured_key, sealed, unsealed

RECORD_KEYS = ("hash", "kind", "payload", "prev", "seq")
MAX_HEAD_BYTES = 65536  # a head is {hash, seq} and perhaps a seal
MAX_LEDGER_BYTES = 4 * 2**30  # far beyond any run or history; a bound, so nothing unbounded is read
S = TypeVar("S")
KeyChoice = SealKey | None | Literal["configured"]  # "configured": the environment's key, if any


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


@dataclass(frozen=True)
class Domain:
    """The hash domain of one kind of ledger: ``content_id(tag, version, …)`` of each record, and
    ``max_group``, the most records one append of this kind writes: a head may lag that many
    records behind (a crash before the head moved), never more — a replayed older head (which,
    keyed, was validly sealed once) would otherwise roll committed records back."""

    tag: str
    version: int = 1
    max_group: int = 1

    def record_hash(self, seq: int, kind: str, payload: dict[str, Any], prev: str | None) -> str:
        return content_id(self.tag, self.version, {"seq": seq, "kind": kind, "payload": payload, "prev": prev})

    def make_record(self, seq: int, kind: str, payload: dict[str, Any], prev: str | None) -> Record:
        return Record(seq, kind, payload, prev, self.record_hash(seq, kind, payload, prev))

    def head_seal_domain(self, scope: str = "") -> str:
        """The domain of a head's seal: the ledger kind, and ``scope`` — what one ledger of the
        kind is about (a release history's target), so a sealed ledger cannot stand for another."""
        return f"ledger-head/{self.tag}/v{self.version}" + (f"/{scope}" if scope else "")


def _key(key: KeyChoice) -> SealKey | None:
    return configured_key() if key == "configured" else key


def encode(record: Record) -> bytes:
    return canonical_bytes(record.as_dict()) + b"\n"


def head_path(path: Path) -> Path:
    """``x/history.jsonl`` → ``x/history.head``."""
    return path.with_suffix(".head")


def _check_record(domain: Domain, raw: bytes, seq: int, prev: str | None, where: str) -> Record:
    """Parse and verify line ``seq`` (without its newline) against the chain so far."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise LedgerError(f"{where}: record {seq}: not valid JSON") from None
    except RecursionError:  # no record of ours nests deeply: a hand-made line, refused like any other
        raise LedgerError(f"{where}: record {seq}: not valid JSON (nested too deeply)") from None
    if not isinstance(obj, dict) or tuple(sorted(obj)) != RECORD_KEYS:
        raise LedgerError(f"{where}: record {seq}: not a ledger record (keys must be {', '.join(RECORD_KEYS)})")
    if obj["seq"] != seq or isinstance(obj["seq"], bool):
        raise LedgerError(f"{where}: record {seq}: seq is {obj['seq']!r}, expected {seq} (gap or reorder)")
    if obj["prev"] != prev:
        raise LedgerError(f"{where}: record {seq}: prev does not match the hash of record {seq - 1} (broken chain)")
    if not isinstance(obj["kind"], str) or not isinstance(obj["payload"], dict):
        raise LedgerError(f"{where}: record {seq}: kind must be a string and payload an object")
    record = domain.make_record(seq, obj["kind"], obj["payload"], prev)
    if obj["hash"] != record.hash:
        raise LedgerError(f"{where}: record {seq}: hash does not match the record's content")
    if encode(record) != raw + b"\n":
        raise LedgerError(f"{where}: record {seq}: not in canonical form")
    return record


def _is_torn(tail: bytes) -> bool:
    """True if the final bytes are a torn write: no complete JSON value starts them."""
    try:
        json.JSONDecoder().raw_decode(tail.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return True
    except RecursionError:  # nested past the parser's depth: never a write of ours, so no torn one
        return False
    return False


def parse_ledger(data: bytes, domain: Domain, where: str) -> LedgerRead:
    """Verify ``data`` (a ledger's bytes) record by record; drop only a torn final line."""
    records: list[Record] = []
    pos = 0
    prev: str | None = None
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:  # no newline: the final line was never completed
            return LedgerRead(tuple(records), pos, len(data) - pos)
        line = data[pos:end]
        if end + 1 == len(data) and _is_torn(line):
            return LedgerRead(tuple(records), pos, len(data) - pos)
        record = _check_record(domain, line, len(records) + 1, prev, where)
        records.append(record)
        prev = record.hash
        pos = end + 1
    return LedgerRead(tuple(records), pos, 0)


def _head_document(path: Path) -> dict[str, Any] | None:
    head = head_path(path)
    try:  # never through a link, never waiting on a FIFO
        data = read_regular(head, MAX_HEAD_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"{head}: record ?: head file cannot be read: {exc.strerror or exc}") from None
    try:
        obj = json.loads(data)
        if not isinstance(obj, dict) or not {"hash", "seq"} <= set(obj) <= {"hash", "seq", SEAL}:
            raise ValueError
        if type(obj["seq"]) is not int or obj["seq"] < 0 or not isinstance(obj["hash"], str):
            raise ValueError
    except (ValueError, KeyError, TypeError, RecursionError):
        raise LedgerError(f"{head}: record ?: head file is not {{hash, seq}} JSON") from None
    return obj


def read_head(path: Path) -> tuple[int, str] | None:
    """``(seq, hash)`` from the head file of the ledger at ``path``, or None if there is none."""
    obj = _head_document(path)
    return None if obj is None else (int(obj["seq"]), str(obj["hash"]))


def _uncommitted(read: LedgerRead, n: int) -> LedgerRead:
    """``read`` without its records after the first ``n`` (they become a dropped tail)."""
    cut = sum(len(encode(r)) for r in read.records[n:])
    return LedgerRead(read.records[:n], read.valid_bytes - cut, read.dropped_bytes + cut)


def check_head(
    path: Path, read: LedgerRead, domain: Domain, key: KeyChoice = "configured", scope: str = ""
) -> LedgerRead:
    """Refuse when the head file says complete records are missing or differ, or (module
    docstring) when its seal does not hold; returns ``read`` without uncommitted records."""
    key = _key(key)
    obj = _head_document(path)
    n = len(read.records)
    name = head_path(path).name
    if obj is not None:
        content, problem = unsealed(obj, domain.head_seal_domain(scope), key)
        if problem is not None:
            raise LedgerError(f"{path}: record {content['seq']}: {name}: {problem}")
    if obj is None:
        if key is not None and n:
            raise LedgerError(
                f"{path}: record {n}: {name} is missing: key {key.key_id} is configured, nothing is sealed"
            )
        if n > 1:
            raise LedgerError(f"{path}: record {n}: {name} is missing")
        return read
    seq, digest = int(obj["seq"]), str(obj["hash"])
    if 1 <= seq <= n:
        if read.records[seq - 1].hash != digest:
            raise LedgerError(f"{path}: record {seq}: hash differs from the one {name} names")
        if n - seq > domain.max_group:
            raise LedgerError(
                f"{path}: record {seq + 1}: {name} lags {n - seq} records behind the ledger (one append writes at most {domain.max_group})"
            )
        return _uncommitted(read, seq) if key is not None else read
    if seq == n + 1 and read.dropped_bytes:
        if key is not None:  # a sealed record was complete when sealed: a cut line is a removal
            raise LedgerError(f"{path}: record {seq}: its line is cut, but the sealed {name} names it (record removed)")
        return read  # the head was written for the record whose line is torn: impossible by order, harmless
    raise LedgerError(f"{path}: record {n + 1}: missing (the ledger ends at record {n}; {name} names record {seq})")


def read_ledger(
    path: Path, domain: Domain, missing: str = "no ledger file", key: KeyChoice = "configured", scope: str = ""
) -> LedgerRead:
    """Read and verify the ledger at ``path`` against its chain and head (and, with a key, the
    head's seal in ``scope``), changing nothing; uncommitted records are left out of the result."""
    try:  # never through a link, never waiting on a FIFO
        data = read_regular(path, MAX_LEDGER_BYTES)
    except FileNotFoundError:
        refuse_orphan_head(path)
        raise LedgerError(f"{path}: record 1: {missing}") from None
    except OSError as exc:
        raise LedgerError(f"{path}: record 1: cannot be read: {exc.strerror or exc}") from None
    read = parse_ledger(data, domain, str(path))
    return check_head(path, read, domain, key, scope)


def refuse_orphan_head(path: Path) -> None:
    """A head without its ledger means the ledger was removed (a crash never removes one)."""
    if os.path.lexists(head_path(path)):
        raise LedgerError(
            f"{path}: record 1: the ledger is missing, but {head_path(path).name} exists (ledger removed)"
        )


def fold(records: Iterable[Record], step: Callable[[S, Record], S], state: S, where: str) -> S:
    """Reduce ``records`` with ``step``; a ``ValueError`` from ``step`` (an illegal transition)
    becomes a ``LedgerError`` naming the record."""
    for record in records:
        try:
            state = step(state, record)
        except LedgerError:
            raise
        except ValueError as exc:
            raise LedgerError(f"{where}: record {record.seq}: {exc}") from None
    return state


class Ledger:
    """The single writer of one ledger file. ``open`` verifies and recovers (truncating a torn
    tail, repairing a lagging head); ``append`` writes one durable record, ``append_group`` several. ``on_append(kind)`` runs
    after each durable append (failure-injection tests kill the process there)."""

    def __init__(
        self,
        path: Path,
        domain: Domain,
        records: tuple[Record, ...],
        on_append: Callable[[str], None] | None = None,
        key: SealKey | None = None,
        scope: str = "",
    ):
        self.path = path
        self.domain = domain
        self.key = key  # seals every head this writer writes (module docstring)
        self.scope = scope
        self.records = list(records)
        self._dropped = 0  # records ``forget_records`` let go of (they stay in the file)
        self.on_append = on_append
        # never appended through a link (read_ledger refused one already: this closes the race)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)

    @classmethod
    def create(cls, path: Path, domain: Domain, key: KeyChoice = "configured", scope: str = "") -> Ledger:
        """A new, empty ledger at ``path`` (which must not exist yet, nor its head)."""
        if path.exists():
            raise LedgerError(f"{path}: record 1: a ledger already exists here")
        refuse_orphan_head(path)
        key = _key(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        ledger = cls(path, domain, (), key=key, scope=scope)
        fsync_path(path.parent)  # the new file's name must survive a crash, not only its bytes
        return ledger

    @classmethod
    def open(
        cls,
        path: Path,
        domain: Domain,
        *,
        create: bool = False,
        missing: str = "no ledger file",
        on_append: Callable[[str], None] | None = None,
        key: KeyChoice = "configured",
        scope: str = "",
    ) -> Ledger:
        """Open for appending after full verification; with ``create`` a missing ledger is made."""
        key = _key(key)
        if create and not path.exists():
            ledger = cls.create(path, domain, key, scope)
            ledger.on_append = on_append
            return ledger
        read = read_ledger(path, domain, missing, key, scope)
        if read.dropped_bytes:  # recovery: a torn (or, keyed, uncommitted) tail is all ever removed
            with open(path, "r+b") as fh:
                fh.truncate(read.valid_bytes)
                os.fsync(fh.fileno())
        ledger = cls(path, domain, read.records, on_append, key, scope)
        if ledger.records and read_head(path) != (ledger.records[-1].seq, ledger.records[-1].hash):
            ledger._write_head()  # repairs a head that lagged behind the last append
        return ledger

    @property
    def head(self) -> str | None:
        return self.records[-1].hash if self.records else None

    def append(self, kind: str, payload: dict[str, Any]) -> Record:
        """Append one record durably (fsynced) and move the head; returns the record."""
        return self.append_group([(kind, payload)])[0]

    def append_group(self, events: Sequence[tuple[str, dict[str, Any]]]) -> list[Record]:
        """Append ``events`` as consecutive records with one ``write`` and one fsync, then move the
        head once: a crash leaves none, a prefix (a torn write), or all of them, and a head that
        lags behind them (module docstring). ``on_append`` runs once, with the last record's kind."""
        if len(events) > self.domain.max_group:
            raise LedgerError(
                f"{self.path}: {len(events)} records in one append; this ledger takes at most {self.domain.max_group}"
            )
        records, prev = [], self.head
        for offset, (kind, payload) in enumerate(events, start=1):
            record = self.domain.make_record(self._dropped + len(self.records) + offset, kind, payload, prev)
            records.append(record)
            prev = record.hash
        if not records:
            return []
        data = b"".join(map(encode, records))  # raises on a non-canonical payload before anything is written
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(f"{self.path}: short write of records {records[0].seq}..{records[-1].seq}")
        os.fsync(self._fd)
        self.records.extend(records)
        self._write_head()
        if self.on_append is not None:
            self.on_append(records[-1].kind)
        return records

    def forget_records(self) -> None:
        """Keep only the last record in memory (a long-lived writer that never reads back — a
        server's trace log — would otherwise hold every record it ever appended); appending goes
        on with the right numbers and chain."""
        if len(self.records) > 1:
            self._dropped += len(self.records) - 1
            del self.records[:-1]

    def _write_head(self) -> None:
        """Rewrite the head in place with one ``pwrite`` + ``fsync``: the file is far smaller than a
        disk sector, so a crash leaves the old or the new bytes (PostgreSQL's assumption for
        pg_control). Temp + fsync + rename + directory fsync cost ~7 ms more per append on a busy
        disk (two more journal commits). The length changes only when ``seq`` gains or loses a
        digit, and a crash between data and size leaves parseable JSON (the final newline lost, or
        one extra)."""
        last = self.records[-1]
        head = sealed({"hash": last.hash, "seq": last.seq}, self.domain.head_seal_domain(self.scope), self.key)
        data = canonical_bytes(head) + b"\n"
        path = head_path(self.path)
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_path(path.parent)  # the head's name must survive a crash too

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
