"""Advisory file locks (``fcntl.flock``) that keep concurrent ragpipe processes out of each other's way.

Three locks exist, all files under ``$RAGPIPE_HOME/locks/``:

- ``workspace.lock``: every stage materialization holds it *shared* while it reads its inputs and
  publishes its output; garbage collection holds it *exclusive*. So collection never runs while a
  stage has published a version but not yet pointed at it, or is reading a version that a newer
  materialization has just stopped pointing at.
- ``build-<revision>.lock``: held exclusively by ``ragpipe build`` for one revision, so two builds
  of one revision run one after the other (the second finds the first's bundle up to date).
- ``query-graph-<key hex>.lock``: held exclusively while a query-graph entry whose manifest is not
  trusted is rebuilt (``ragpipe.embedding.query_graph``), so concurrent processes rebuild it once
  and never remove the entry another has just rebuilt.

``flock`` locks belong to an open file description and vanish when the process dies, so a killed
holder never leaves a lock behind. They are advisory: only ragpipe code takes them.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


class LockBusy(RuntimeError):
    """A non-blocking lock attempt found the lock held by another process."""


@contextmanager
def file_lock(
    path: Path, *, exclusive: bool, blocking: bool = True, on_wait: Callable[[], None] | None = None
) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (created if missing) for the ``with`` block.

    Without ``blocking`` a held lock raises ``LockBusy``; with it, ``on_wait`` (if given) is called
    once before waiting, so a caller can say why it is waiting.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if not blocking:
                raise LockBusy(f"{path} is held by another process") from None
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
