"""Where releases live, under ``$RAGPIPE_HOME/releases/`` (derived from ``Workspace.home``).

```
releases/manifests/<release id hex>.json     immutable release manifests, named by content ID
releases/decisions/<decision id hex>.json    the gate decision (and comparison) a manifest binds
releases/targets/<target>/pointer.json       the target's pointer (replaced atomically, CAS)
releases/targets/<target>/history.jsonl      the target's hash-chained history ledger
releases/targets/<target>/history.head       its head
locks/release-<target>.lock                  serialises writers of one target (flock)
```
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.workspace import Workspace

RELEASE_ID = re.compile(r"^sha256:[0-9a-f]{64}\Z")
TARGET_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}\Z")


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
        return self.ws.home / "releases"

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
        """Targets that have a folder (a pointer or a history) in this store."""
        folder = self.root / "targets"
        return (
            sorted(p.name for p in folder.iterdir() if p.is_dir() and TARGET_NAME.match(p.name))
            if folder.is_dir()
            else []
        )

    @contextmanager
    def target_lock(self, target: str) -> Iterator[None]:
        """Hold the target's writer lock (blocking): one writer of pointer and history at a time."""
        with file_lock(self.ws.locks / f"release-{check_target_name(target)}.lock", exclusive=True):
            yield
