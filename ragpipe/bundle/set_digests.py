"""The set digests of a bundle's tables, computed while the tables are streamed.

``corpus_digest``, ``chunk_set_digest`` and ``representation_set_digest`` are content IDs of one
list of rows, sorted. Computed as they are defined, they hold every row of a table as Python lists
— about 2 KB per bundle row for the three, at a million rows the largest thing verification
holds. These compute the same IDs, bit for bit, from rows handed over a record batch at a time:

* ``CorpusDigest``: the documents arrive in ID order (verification requires it), so each row's
  canonical bytes go straight into the hash — RFC 8785 writes an array as ``[``, the items'
  bytes joined by ``,``, ``]``, with no whitespace — and nothing is kept;
* ``SortedSetDigest``: chunk and representation rows are sorted by their first element, an ID of
  the form ``sha256:<64 hex>``, so each row is kept as its canonical bytes (one buffer for all)
  and its ID as 32 bytes; the rows are sorted by those bytes (the hex order), rows with the same
  ID among themselves as Python sorts the lists (their bytes decoded back: a tie exists only in a
  forged table), then hashed in that order. About 200 bytes a row.

``ragpipe_tests/bundle/test_set_digests.py`` checks both against the definitions.
"""

from __future__ import annotations

import json
from array import array

import numpy as np

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import domain_hash

_HEX_ID = len("sha256:")


class CorpusDigest:
    """``corpus.models.corpus_digest`` of documents added in strictly increasing ID order: the
    caller checks the order, and computes the digest the other way when it does not hold."""

    def __init__(self, normalization: str, default_scope: str | None):
        head = canonical_bytes({"default_scope": default_scope, "documents": [], "normalization": normalization})
        at = head.index(b'"documents":[]') + len(b'"documents":[')
        self._hash = domain_hash("corpus", 1)
        self._hash.update(head[:at])
        self._tail = head[at:]
        self._first = True

    def add(self, row: list) -> None:
        """One document's ``corpus_digest_row``."""
        if not self._first:
            self._hash.update(b",")
        self._first = False
        self._hash.update(canonical_bytes(row))

    def digest(self) -> str:
        self._hash.update(self._tail)
        return "sha256:" + self._hash.hexdigest()


class SortedSetDigest:
    """``content_id(kind, version, sorted(rows))`` of rows whose first element is an ID
    ``sha256:<64 hex>`` (a chunk's or a representation's), added in any order."""

    def __init__(self, kind: str, version: int):
        self.kind, self.version = kind, version
        self._data = bytearray()
        self._ends = array("q")  # where each row's bytes end in ``_data``
        self._keys = bytearray()

    def add(self, row: list) -> None:
        self._keys += bytes.fromhex(str(row[0])[_HEX_ID:])  # 32 bytes; the ID was validated as sha256:<hex>
        self._data += canonical_bytes(row)
        self._ends.append(len(self._data))

    def __len__(self) -> int:
        return len(self._ends)

    def digest(self) -> str:
        n = len(self._ends)
        ends = np.frombuffer(self._ends, dtype=np.int64) if n else np.empty(0, dtype=np.int64)
        starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]]) if n else ends
        words = np.frombuffer(self._keys, dtype=">u8").reshape(n, 4)
        order = np.lexsort(words.T[::-1])  # by the 32 bytes, most significant word first; stable
        ties: dict[int, list[bytes]] = {}
        if n > 1:
            ordered = words[order]
            same = np.flatnonzero((ordered[1:] == ordered[:-1]).all(axis=1))
            if same.size:  # the same ID twice: those rows in the order Python sorts the lists
                ties = _tie_runs(self._data, starts, ends, order, same)
        h = domain_hash(self.kind, self.version)
        h.update(b"[")
        data = memoryview(self._data)
        at = 0
        positions = order.tolist()
        while at < n:
            if at:
                h.update(b",")
            run = ties.get(at)
            if run is None:
                i = positions[at]
                h.update(data[starts[i] : ends[i]])
                at += 1
            else:
                h.update(b",".join(run))
                at += len(run)
        data.release()
        h.update(b"]")
        return "sha256:" + h.hexdigest()


def _tie_runs(
    data: bytearray, starts: np.ndarray, ends: np.ndarray, order: np.ndarray, same: np.ndarray
) -> dict[int, list[bytes]]:
    """Per run of rows with one ID (``same``: sorted positions ``i`` whose row ``i + 1`` has row
    ``i``'s ID), keyed by the run's first sorted position: its rows' bytes, sorted by the decoded
    rows as ``sorted`` sorts the lists."""
    runs: list[list[int]] = []
    for i in same.tolist():
        if runs and runs[-1][-1] == i:
            runs[-1].append(i + 1)
        else:
            runs.append([i, i + 1])
    out = {}
    for run in runs:
        rows = [bytes(data[starts[order[i]] : ends[order[i]]]) for i in run]
        out[run[0]] = sorted(rows, key=json.loads)
    return out
