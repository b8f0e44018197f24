"""Bundle leases: a process that serves a bundle holds a lease on it, and garbage collection keeps it.

A lease is a file ``$RAGPIPE_HOME/leases/<bundle hex>.<pid>.<random>.lease`` that its holder keeps
open with an exclusive ``flock`` for as long as it serves the bundle. The lock, not the file, is the
lease: it vanishes with the holder's process, so a server killed with SIGKILL never pins a bundle
forever. ``held_bundles`` (what ``ragpipe.gc`` adds to its roots) tries each lease's lock without
blocking: held means a live holder (its bundle is a root), free means a dead one (the file is
removed). The holder takes the lock on a temporary name and only then renames the file to its
final name, so no reader ever sees a lease whose lock is not yet held.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
from pathlib import Path

from ragpipe.kernel.workspace import Workspace

_BUNDLE_ID = re.compile(r"^sha256:([0-9a-f]{64})$")
_LEASE = re.compile(r"^([0-9a-f]{64})\.[0-9]+\.[0-9a-f]{16}\.lease$")


def leases_dir(ws: Workspace) -> Path:
    return ws.leases


class BundleLease:
    """An exclusive lease on one bundle, held until ``release()`` (or the process ends)."""

    def __init__(self, ws: Workspace, bundle_id: str):
        match = _BUNDLE_ID.match(bundle_id)
        if match is None:
            raise ValueError(f"{bundle_id!r} is not a bundle ID (sha256:<64 hex>)")
        self.bundle_id = bundle_id
        folder = leases_dir(ws)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{match.group(1)}.{os.getpid()}.{secrets.token_hex(8)}.lease"
        temp = folder / f".tmp-{name}"
        self._fd: int | None = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        os.rename(temp, folder / name)  # the lock travels with the open file, not the name
        self.path = folder / name

    def release(self) -> None:
        """Remove the lease file and drop the lock; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def held_bundles(ws: Workspace) -> frozenset[str]:
    """Bundle IDs that a live process holds a lease on; leases of dead holders are removed."""
    folder = leases_dir(ws)
    if not folder.is_dir():
        return frozenset()
    held: set[str] = set()
    for path in sorted(folder.iterdir()):
        match = _LEASE.match(path.name)
        if match is None:
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # released meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.add(f"sha256:{match.group(1)}")
        else:
            path.unlink(missing_ok=True)  # its holder died: nobody serves the bundle under it
        finally:
            os.close(fd)
    return frozenset(held)
