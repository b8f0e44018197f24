"""The filesystem backend of ``ObjectStore``: one file per key under a root directory.

``put_new`` is ``write_file_atomic(replace=False)`` — temp, fsync, ``renameat2(RENAME_NOREPLACE)``
— so the first writer wins and a reader never sees a partial file. ``put_if`` compares the current
content's digest with the writer's token under an exclusive ``flock`` of a per-key lock file in
``.locks/`` (all writers must share this filesystem: flock does not reach across machines, which
is what the S3 backend is for), then replaces with ``os.replace``. Temporaries (``.tmp-*``) and
lock files sit in dot-names that no key can name, so ``list`` never returns them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.storage.objects import Conflict, StorageError, Stored, check_key, check_prefix


def etag_of(data: bytes) -> str:
    """The local version token: the SHA-256 of the content (an S3 ETag is likewise content-derived)."""
    return '"' + hashlib.sha256(data).hexdigest() + '"'


class LocalObjectStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def url(self) -> str:
        return (self.root.as_uri() if self.root.is_absolute() else str(self.root)) + "/"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def get(self, key: str) -> Stored | None:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StorageError(f"{self.url}: {key}: cannot be read: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
        return Stored(data=data, etag=etag_of(data))

    def version(self, key: str) -> str | None:
        held = self.get(key)  # the token is the content's digest: reading it is the only way to know
        return held.etag if held is not None else None

    def put_new(self, key: str, data: bytes) -> bool:
        try:
            return write_file_atomic(self._path(key), data, replace=False)
        except OSError as exc:
            raise StorageError(f"{self.url}: {key}: cannot be written: {exc.strerror or exc}") from None

    def put_if(self, key: str, data: bytes, etag: str | None) -> str:
        path = self._path(key)
        lock = self.root / ".locks" / (hashlib.sha256(key.encode("utf-8")).hexdigest() + ".lock")
        with file_lock(lock, exclusive=True):
            current = self.get(key)
            if (current.etag if current is not None else None) != etag:
                raise Conflict(f"{self.url}: {key}: changed since it was read (expected version {etag})")
            try:
                write_file_atomic(path, data, replace=True)
            except OSError as exc:
                raise StorageError(f"{self.url}: {key}: cannot be written: {exc.strerror or exc}") from None
        return etag_of(data)

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        keys = []
        # walk only the folder the prefix's last complete segment names
        start = self.root / prefix.rpartition("/")[0]
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = Path(dirpath).relative_to(self.root)
            for name in filenames:
                if not name.startswith("."):
                    key = (rel / name).as_posix()
                    if key.startswith(prefix):
                        keys.append(key)
        return sorted(keys)
