"""The object-store interface every store of record is written through (docs/operations.md,
"Object storage").

Two write disciplines, nothing else:

* **create-only** (``put_new``) for content-addressed objects: the first writer of a key wins; a
  second writer finds the object and is told so (``False``), whatever bytes it carried. Two racing
  publishers of one ID therefore leave exactly one object, complete.
* **compare-and-swap** (``put_if``) for the few mutable records (pointers, heads): a write names
  the version token (``etag``) of the object it read, or ``None`` for "must not exist"; any other
  current version refuses the write with ``Conflict``. On S3 the token is the object's ETag and the
  condition is ``If-Match`` / ``If-None-Match: *``; on a filesystem it is the content digest and
  the comparison runs under an exclusive lock.

A reader sees an object whole or not at all: both backends publish a write in one step (a rename,
an S3 PUT). Keys are relative, ``/``-separated names of ``[A-Za-z0-9._=+-]`` segments; no segment
is empty, ``.``, ``..`` or starts with ``.`` (the local backend keeps its temporaries and locks in
dot-names, which no key can reach).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

_SEGMENT = re.compile(r"[A-Za-z0-9_=+-][A-Za-z0-9._=+-]*")
MAX_KEY_BYTES = 1024  # S3's own limit


class StorageError(RuntimeError):
    """The store could not be used (unreachable, refused credentials, no such bucket, a damaged
    object): one line naming the store, the key and what happened."""


class Conflict(StorageError):
    """A compare-and-swap lost: the object is not at the version the writer read."""


def check_key(key: str) -> str:
    """``key`` if it is a valid object key; ``ValueError`` naming the rule otherwise."""
    if not isinstance(key, str) or not key:
        raise ValueError("an object key must be a non-empty string")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"object key {key[:60]!r}…: longer than {MAX_KEY_BYTES} bytes")
    for segment in key.split("/"):
        if not _SEGMENT.fullmatch(segment):
            raise ValueError(
                f"object key {key!r}: segment {segment!r} is not [A-Za-z0-9._=+-]+ (nor empty, nor starting with '.')"
            )
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a key followed by ``/``."""
    if prefix:
        check_key(prefix.removesuffix("/"))
    return prefix


@dataclass(frozen=True)
class Stored:
    """An object's bytes and the version token a ``put_if`` must name to replace them."""

    data: bytes
    etag: str


class ObjectStore(Protocol):
    """A flat namespace of immutable and compare-and-swap objects (module docstring)."""

    @property
    def url(self) -> str:
        """Where the store is, for messages (never a credential)."""
        ...

    def get(self, key: str) -> Stored | None:
        """The object at ``key``, or ``None`` if there is none."""
        ...

    def version(self, key: str) -> str | None:
        """The version token ``get`` would return with the object at ``key`` (``None`` if there is
        none), without its bytes: for watching a mutable record for change."""
        ...

    def put_new(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists; True if this call created it."""
        ...

    def put_if(self, key: str, data: bytes, etag: str | None) -> str:
        """Replace ``key`` if its version is ``etag`` (``None``: create it if absent); the new
        version token. ``Conflict`` if the object is at any other version."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""
        ...
