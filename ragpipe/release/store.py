"""Where releases live, under ``$RAGPIPE_HOME/releases/`` (derived from ``Workspace.home``).

```
releases/manifests/<release id hex>.json     immutable release manifests, named by content ID
releases/decisions/<decision id hex>.json    the gate decision (and comparison) a manifest binds
releases/targets/<target>/pointer.json       the target's pointer (replaced atomically, CAS)
releases/targets/<target>/history.jsonl      the target's hash-chained history ledger
releases/targets/<target>/history.head       its head
releases/targets/<target>/.synced.json       with a store: the history last agreed with it
locks/release-<target>.lock                  serialises writers of one target (flock)
```

With an object store configured (``RAGPIPE_STORE``), manifests and kept decisions are also put
there (``ragpipe.release.replica``) and a target's folder is a working copy of the store's
``releases/targets/<target>/target.json``, pulled and put back by ``target_lock``
(``ragpipe.release.target_sync``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.target_sync import TARGET_OBJECT, TargetMoved, TargetSync, TargetSyncError
from ragpipe.storage.location import store_from_env
from ragpipe.storage.objects import StorageError

RELEASE_ID = re.compile(r"^sha256:[0-9a-f]{64}\Z")
TARGET_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}\Z")
_held = threading.local()  # the (home, target) locks this thread holds: flock does not nest


class ReleaseError(ValueError):
    """An expected refusal (bad input, missing release, refused activation); the message says why."""


class ConflictError(ReleaseError):
    """A compare-and-swap on a target's pointer lost against another writer; nothing was changed."""


def check_release_id(release_id: str) -> str:
    if not isinstance(release_id, str) or not RELEASE_ID.match(release_id):
        raise ReleaseError(f"release ID {release_id!r} is not of the form sha256:<64 hex digits>")
    return release_id


def check_target_name(target: str) -> str:
    if not isinstance(target, str) or not TARGET_NAME.match(target):
        raise ReleaseError(f"target name {target!r} must match [a-z][a-z0-9_-]{{0,62}}")
    return target


@dataclass(frozen=True)
class ReleaseStore:
    """Paths of the release store of one workspace."""

    ws: Workspace

    @property
    def root(self) -> Path:
        return self.ws.releases

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    def manifest_path(self, release_id: str) -> Path:
        return self.manifests / f"{check_release_id(release_id).split(':', 1)[1]}.json"

    def target_dir(self, target: str) -> Path:
        return self.root / "targets" / check_target_name(target)

    def pointer_path(self, target: str) -> Path:
        return self.target_dir(target) / "pointer.json"

    def history_path(self, target: str) -> Path:
        return self.target_dir(target) / "history.jsonl"

    def known_targets(self) -> list[str]:
        """Targets that have a folder (a pointer or a history) in this store (or an object in the
        object store)."""
        folder = self.root / "targets"
        local = {p.name for p in folder.iterdir() if p.is_dir()} if folder.is_dir() else set()
        remote = store_from_env()
        if remote is not None:  # with an object store: the targets it holds, too
            keys = _synced(lambda: remote.list("releases/targets/"))
            local |= {key.split("/")[2] for key in keys if key.endswith(f"/{TARGET_OBJECT}")}
        return sorted(name for name in local if TARGET_NAME.match(name))

    @contextmanager
    def target_lock(self, target: str) -> Iterator[None]:
        """Hold the target's writer lock (blocking): one writer of pointer and history at a time.
        With an object store, the store's target object is pulled into the folder on entry and
        what changed is put back on exit — also when the block raises an ``Exception`` (which the
        caller then sees, the push's failure as a note), since a refusal it recorded
        (a ``rejected`` record) is history too; ``ConflictError`` when another machine changed the
        target first, nothing changed (``ragpipe.release.target_sync``)."""
        with file_lock(self.ws.locks / f"release-{check_target_name(target)}.lock", exclusive=True):
            held, mine = _holding(), self._holder(target)
            held.add(mine)
            try:
                remote = store_from_env()
                if remote is None:
                    yield
                    return
                sync = TargetSync(remote, self.target_dir(target), target)
                _synced(sync.pull)
                try:
                    yield
                except Exception as exc:
                    # The block's own error is what the caller must see; a push that fails too
                    # is added to it as a note (the working copy is then reset at the next pull).
                    try:
                        _synced(sync.push)
                    except (ConflictError, ReleaseError) as pushed:
                        exc.add_note(f"and its record did not reach the store: {pushed}")
                    raise
                _synced(sync.push)
            finally:
                held.discard(mine)

    def _holder(self, target: str) -> tuple[Path, str]:
        # Keyed on the resolved lock folder: two spellings of one home are one holder.
        return (self.ws.locks.resolve(), target)

    @contextmanager
    def current(self, target: str) -> Iterator[None]:
        """For a reader of the target's files: with an object store, and unless this thread holds
        the target's lock already, hold it (the folder is then the store's latest); without a
        store, nothing (files are replaced atomically, and read lock-free)."""
        if store_from_env() is None or self._holder(target) in _holding():
            yield
            return
        with self.target_lock(target):
            yield


def _holding() -> set[tuple[Path, str]]:
    if not hasattr(_held, "targets"):
        _held.targets = set()
    return _held.targets


def _synced(operation):
    try:
        return operation()
    except TargetMoved as exc:
        raise ConflictError(str(exc)) from None
    except (TargetSyncError, StorageError) as exc:
        raise ReleaseError(str(exc)) from None
