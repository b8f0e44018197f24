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
"""

from __future__ import annotations

from pathlib import Path

from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.store import ReleaseError
from ragpipe.storage.blobs import LISTING, folder_files, listing_of, pull_folder, push_folder, read_listing
from ragpipe.storage.location import store_from_env
from ragpipe.storage.objects import ObjectStore, StorageError


def _key(ws: Workspace, path: Path) -> str:
    return path.relative_to(ws.home).as_posix()


def _run_key(run_id: str) -> str:
    return f"evaluations/{run_id}/{LISTING}"


def push_file(ws: Workspace, path: Path) -> None:
    """Put the release-store file ``path`` on the store (create-only); a no-op without a store."""
    store = store_from_env()
    if store is None:
        return
    key, data = _key(ws, path), path.read_bytes()
    try:
        if not store.put_new(key, data) and _held(store, key) != data:
            raise ReleaseError(f"{store.url}{key}: the store holds other bytes under this name")
    except StorageError as exc:
        raise ReleaseError(str(exc)) from None


def _held(store: ObjectStore, key: str) -> bytes | None:
    held = store.get(key)
    return None if held is None else held.data


def fetch_file(ws: Workspace, path: Path) -> None:
    """Fetch ``path`` from the store when this home lacks it (its reader verifies it)."""
    store = store_from_env()
    if store is None or path.exists():
        return
    try:
        data = _held(store, _key(ws, path))
        if data is not None:
            write_file_atomic(path, data, replace=False)
    except StorageError as exc:
        raise ReleaseError(str(exc)) from None


def fetch_folder_files(ws: Workspace, folder: Path) -> None:
    """Fetch every file the store holds under ``folder`` (the manifests, before they are listed)."""
    store = store_from_env()
    if store is None:
        return
    try:
        keys = store.list(_key(ws, folder) + "/")
    except StorageError as exc:
        raise ReleaseError(str(exc)) from None
    for key in keys:
        if "/" not in key[len(_key(ws, folder)) + 1 :]:
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
    except (StorageError, OSError) as exc:
        raise ReleaseError(f"evaluation run {folder.name}: cannot be put on the store: {exc}") from None


def fetch_run(folder: Path) -> None:
    """Fetch the run folder from the store when this home lacks it (each file checked against its
    listing; the ledger verified by its reader)."""
    store = store_from_env()
    if store is None or folder.is_dir():
        return
    try:
        pull_folder(store, _run_key(folder.name), folder)
    except StorageError as exc:
        raise ReleaseError(str(exc)) from None
