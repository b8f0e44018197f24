"""Per-key leases, so concurrent runs never compute one key twice.

A lease is an exclusive ``flock`` on one of 4096 stripe files ``<folder>/<key hex[-3:]>.lock``; a
batch takes the stripes of all its keys in sorted order (no two holders can wait on each other in
a cycle), then looks its keys up again and computes only those still missing. Striping bounds the
files to 4096 whatever the cache size; its price is that two keys of one stripe wait for each other
even when distinct — a pause, never a duplicate. The stripe is the key's *last* digits because the
runner starts batches in key order: stripes by the first digits would put neighbouring batches —
the ones in flight together — on one stripe far more often than chance (measured: 256 leading
stripes cost 40 % of wall time at 4-way concurrency, ``benchmarks/step_bench.py``). ``flock`` belongs to an open file and dies with
its process: a killed holder frees its keys at once. Threads of one process contend like processes
(each lease opens its own descriptors). A batch holds one descriptor per distinct stripe of its
keys — at most min(batch size, 4096), about 250 for an embedding batch of 256 — so a process needs
that many free descriptors per concurrent batch. Builds of the 256-stripe layout (two-digit file
names) and of this one do not exclude each other: running both at once can compute a key twice
(a wasted call, never a wrong entry).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


def stripe_of(key: str) -> str:
    """The stripe of a ``sha256:<hex>`` key: its last three hex digits."""
    return key.rsplit(":", 1)[1][-3:]


class KeyLeases:
    def __init__(self, folder: Path):
        self.folder = folder

    @contextmanager
    def hold(self, keys: Iterable[str]) -> Iterator[None]:
        """Hold the leases of ``keys`` for the ``with`` block (blocking until free)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fds: list[int] = []
        try:
            for stripe in sorted({stripe_of(key) for key in keys}):
                fd = os.open(self.folder / f"{stripe}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            for fd in fds:
                os.close(fd)
