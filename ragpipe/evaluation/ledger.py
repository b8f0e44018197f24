"""The evaluation run's custody ledger: the kernel ledger bound to the run folder and the reducer.

Everything about records, the chain, recovery and the head file is ``ragpipe.kernel.ledger``
(read its docstring); this module fixes only what is evaluation-specific:

* the hash domain ``eval-ledger-record`` v1 (``DOMAIN``);
* the file names ``ledger.jsonl`` / ``ledger.head`` inside a run folder, addressed by the folder;
* the refusal for a folder without a ledger: ``… record 1: no ledger file (not an evaluation run
  folder)``;
* the binding to the pure reducer (``run_state.apply``): ``RunLedger.append`` checks the
  transition *before* writing, so a refused event never reaches the disk, and ``reduce_records``
  names the record of an illegal transition.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ragpipe.evaluation.run_state import RunState, apply, initial_state
from ragpipe.kernel import ledger as kernel
from ragpipe.kernel.ledger import Domain, LedgerError, LedgerRead, Record, encode

LEDGER = "ledger.jsonl"
HEAD = "ledger.head"
# A group commit appends at most MAX_CELLS_PER_COMMIT starts or closes (runner.py).
MAX_CELLS_PER_COMMIT = 256
DOMAIN = Domain("eval-ledger-record", 1, max_group=MAX_CELLS_PER_COMMIT)
MISSING = "no ledger file (not an evaluation run folder)"

record_hash = DOMAIN.record_hash
make_record = DOMAIN.make_record

__all__ = [
    "DOMAIN",
    "HEAD",
    "LEDGER",
    "Ledger",
    "LedgerError",
    "LedgerRead",
    "Record",
    "encode",
    "make_record",
    "parse_ledger",
    "read_head",
    "read_ledger",
    "record_hash",
    "reduce_records",
]


def parse_ledger(data: bytes, where: str = LEDGER) -> LedgerRead:
    """Verify a ledger's bytes record by record; drop only a torn final line."""
    return kernel.parse_ledger(data, DOMAIN, where)


def read_head(folder: Path) -> tuple[int, str] | None:
    """``(seq, hash)`` from ``folder/ledger.head``, or None if there is none."""
    return kernel.read_head(folder / LEDGER)


def read_ledger(folder: Path) -> LedgerRead:
    """Read and verify ``folder/ledger.jsonl`` against its chain and ``ledger.head``; changes nothing."""
    return kernel.read_ledger(folder / LEDGER, DOMAIN, MISSING)


def _exclusive(path: Path) -> int:
    """A descriptor of ``path`` holding its exclusive ``flock`` (-1 when there is no such file);
    ``LedgerError`` if another process (or another open ledger of this process) holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1  # nothing to guard: reading the folder names what is missing
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LedgerError(
            f"{path}: another process is writing this run (an evaluation or a resume of it); "
            "wait for it to end, then resume"
        ) from None
    return fd


def _step(state: RunState, record: Record) -> RunState:
    return apply(state, record.kind, record.payload)


def reduce_records(records: Iterable[Record], where: str = LEDGER) -> RunState:
    """Fold the records into run state; an illegal transition refuses with its record number."""
    return kernel.fold(records, _step, initial_state(), where)


class Ledger(kernel.Ledger):
    """The single writer of one run's ledger, carrying the reduced run ``state``. ``open``
    verifies and reduces before recovering (truncating a torn tail, repairing a lagging head), so
    a ledger the reducer refuses is left as it was."""

    state: RunState = initial_state()
    _held: int = -1  # the descriptor holding the writer's lock (``open``)

    @classmethod
    def create(cls, folder: Path) -> Ledger:  # type: ignore[override]
        """A new, empty ledger in ``folder`` (which must not hold one yet)."""
        return super().create(folder / LEDGER, DOMAIN)  # type: ignore[return-value]

    @classmethod
    def open(cls, folder: Path) -> Ledger:  # type: ignore[override]
        """The ledger of the run folder ``folder``, verified, reduced, then recovered — by this
        writer alone: an exclusive ``flock`` on the ledger file, taken before recovery and held
        until ``close``, refuses a second writer (two ``ragpipe eval --resume`` of one folder would
        each truncate, append and run the same cells). A killed holder's lock vanishes with it."""
        held = _exclusive(folder / LEDGER)
        try:
            state = reduce_records(read_ledger(folder).records, str(folder / LEDGER))
            ledger = super().open(folder / LEDGER, DOMAIN, missing=MISSING)
        except BaseException:
            if held >= 0:
                os.close(held)
            raise
        ledger.state = state
        ledger._held = held
        return ledger  # type: ignore[return-value]

    def close(self) -> None:
        super().close()
        held, self._held = self._held, -1
        if held >= 0:
            os.close(held)  # releases the writer's lock

    @property
    def folder(self) -> Path:
        return self.path.parent

    def append_group(self, events: Sequence[tuple[str, dict[str, Any]]]) -> list[Record]:
        """Check every transition with the reducer (raising before anything is written), then
        append the events durably as one group and move the head (``append`` is a group of one)."""
        state = self.state
        for kind, payload in events:
            state = apply(state, kind, payload)
        records = super().append_group(events)
        self.state = state
        return records
