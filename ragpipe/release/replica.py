"""The object-store copies of what a release names (``RAGPIPE_STORE``): manifests, kept gate
evidence and evaluation run folders.

With a store configured, the chain's steps run on whichever machine took them, so what one step
writes another must find. Each is written locally as before and then put on the store under its
path relative to ``$RAGPIPE_HOME``, create-only:

```
releases/manifests/<release id hex>.json     the manifest file's bytes
releases/decisions/<decision id hex>.json    the kept gate evidence's bytes
evaluations/<run id>/listing.json            a completed run folder (``ragpipe.storage.blobs``)
```

A machine that lacks one fetches it into its home before reading it. Nothing is trusted for having
been fetched: the readers verify a fetched file as they verify a local one (a manifest is named by
its content ID and its bytes are canonical; gate evidence is made again; a run's ledger, inputs and
traces verify and its head is the one the manifest binds). A name the store already holds with
other bytes is refused: every name here is a content ID or a run ID that is made once.

Publication order travels too: ``releases/manifests/<hex>.json.published`` holds the time the
publisher's file was made (``{"published_ns": "<decimal>"}``, sealed when a key is configured), and a fetched
manifest takes it as its file time, so every machine lists manifests oldest publication first as
the publisher does — the activation sensor's "newest" is the same everywhere. A time that is
missing, malformed or not sealed with the configured key is ignored (the file keeps its fetch
time) with a warning. Only files named as this module writes them (``<64 hex>.json``) are fetched
from a folder: anything else under the prefix is never copied here.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.seals import configured_key, sealed, unsealed
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.store import ReleaseError
from ragpipe.storage.blobs import LISTING, folder_files, listing_of, pull_folder, push_folder, read_listing
from ragpipe.storage.location import store_from_env
from ragpipe.storage.objects import ObjectStore, StorageError

log = logging.getLogger(__name__)
FILE_NAME = re.compile(r"[0-9a-f]{64}\.json")
PUBLISHED = ".published"  # the sidecar with a file's publication time
PUBLISHED_DOMAIN = "release-published"


def _key(ws: Workspace, path: Path) -> str:
    return path.relative_to(ws.home).as_posix()


def _run_key(run_id: str) -> str:
    return f"evaluations/{run_id}/{LISTING}"


def push_file(ws: Workspace, path: Path) -> None:
    """Put the release-store file ``path`` on the store (create-only), then its publication time;
    a no-op without a store."""
    store = store_from_env()
    if store is None:
        return
    key, data = _key(ws, path), path.read_bytes()
    # nanoseconds as a decimal string: they exceed the integers canonical JSON holds exactly (2^53)
    stamp = canonical_bytes(sealed({"published_ns": str(path.stat().st_mtime_ns)}, PUBLISHED_DOMAIN, configured_key()))
    try:
        if store.put_new(key, data):
            store.put_new(key + PUBLISHED, stamp)
        elif _held(store, key) != data:
            raise ReleaseError(f"{store.url}{key}: the store holds other bytes under this name")
        elif not store.put_new(key + PUBLISHED, stamp):  # published before: its first time stays
            _take_publication_time(store, key, path)
    except (StorageError, ValueError) as exc:
        raise ReleaseError(str(exc)) from None


def _held(store: ObjectStore, key: str) -> bytes | None:
    held = store.get(key)
    return None if held is None else held.data


def fetch_file(ws: Workspace, path: Path) -> None:
    """Fetch ``path`` from the store when this home lacks it (its reader verifies it), with its
    publication time as its file time."""
    store = store_from_env()
    if store is None or path.exists():
        return
    try:
        key = _key(ws, path)
        data = _held(store, key)
        if data is not None:
            write_file_atomic(path, data, replace=False)
            _take_publication_time(store, key, path)
    except (StorageError, ValueError) as exc:
        raise ReleaseError(str(exc)) from None


def _take_publication_time(store: ObjectStore, key: str, path: Path) -> None:
    raw = _held(store, key + PUBLISHED)
    try:
        stamp, problem = unsealed(json.loads(raw or b"null"), PUBLISHED_DOMAIN, configured_key())
        ns = stamp["published_ns"]
        if (
            problem
            or sorted(stamp) != ["published_ns"]
            or not isinstance(ns, str)
            or not ns.isascii()
            or not ns.isdigit()
        ):
            raise ValueError(problem or "not {published_ns: <decimal nanoseconds>}")
        ns = int(ns)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        log.warning("%s%s%s: %s; %s keeps its fetch time as its publication time", store.url, key, PUBLISHED, exc, path)
        return
    os.utime(path, ns=(ns, ns))


def fetch_folder_files(ws: Workspace, folder: Path) -> None:
    """Fetch every file named ``<64 hex>.json`` the store holds under ``folder`` (the manifests,
    before they are listed)."""
    store = store_from_env()
    if store is None:
        return
    prefix = _key(ws, folder) + "/"
    try:
        keys = store.list(prefix)
    except StorageError as exc:
        raise ReleaseError(str(exc)) from None
    for key in keys:
        if FILE_NAME.fullmatch(key[len(prefix) :]):
            fetch_file(ws, ws.home / key)


def push_run(ws: Workspace, folder: Path) -> None:
    """Put the completed run folder on the store (blobs, then its listing; create-only)."""
    store = store_from_env()
    if store is None:
        return
    key = _run_key(folder.name)
    try:
        if not push_folder(store, key, folder) and read_listing(store, key) != listing_of(folder_files(folder)):
            raise ReleaseError(f"{store.url}{key}: the store holds another folder for evaluation run {folder.name}")
    except (StorageError, OSError, ValueError) as exc:
        raise ReleaseError(f"evaluation run {folder.name}: cannot be put on the store: {exc}") from None


def fetch_run(folder: Path) -> None:
    """Fetch the run folder from the store when this home lacks it (each file checked against its
    listing; the ledger verified by its reader)."""
    store = store_from_env()
    if store is None or folder.is_dir():
        return
    try:
        pull_folder(store, _run_key(folder.name), folder)
    except (StorageError, ValueError) as exc:  # ValueError: a run ID that is no store key
        raise ReleaseError(f"evaluation run {folder.name}: cannot be fetched from the store: {exc}") from None


def run_dir(ws: Workspace, run_id: str) -> Path:
    """``evaluations/<run id>``, fetched from the object store when this home lacks it
    (``ragpipe.release.replica``); ``ReleaseError`` for a run ID that is not a plain folder name (run
    IDs come from manifests and decisions, which are input: they must not point outside)."""
    if not isinstance(run_id, str) or run_id in ("", ".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id:
        raise ReleaseError(f"evaluation run ID {run_id!r} is not a folder name")
    if (
        len(run_id.encode("utf-8", "surrogatepass")) > 200
    ):  # run IDs are UUIDs; a long one would fail in the file system
        raise ReleaseError(f"evaluation run ID {run_id[:40]!r}… is longer than 200 bytes")
    folder = ws.evaluations / run_id
    fetch_run(folder)
    return folder
