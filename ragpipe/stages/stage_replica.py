"""The object-store side of the stage store (``RAGPIPE_STORE``): the store is the record, local
version folders a cache.

A published version folder is pushed as ``work/<revision>/<stage>/<hex>/listing.json`` plus its
blobs (``ragpipe.storage.blobs``; the listing sealed when a bundle key is configured), then the
store's ``latest.json`` is moved by compare-and-swap (last writer wins, as ``os.replace`` does
locally; sealed likewise). A version the store already holds with other bytes — an output that
is not byte-reproducible (an index) built again on another machine — is replaced here by the
store's, so every machine reads the same bytes under one data version. Readers take the pointer
from the store and download a version folder they lack, each file checked against its listing.
"""

from __future__ import annotations

import json
from pathlib import Path

from ragpipe.corpus.registry import check_revision_key
from ragpipe.kernel.publish import StepHook, discard
from ragpipe.kernel.seals import configured_key, sealed, unsealed
from ragpipe.stages.stage_record import POINTER, StageError, StageRecord, version_name
from ragpipe.storage.blobs import LISTING, folder_files, listing_of, pull_folder, push_folder, read_listing
from ragpipe.storage.objects import Conflict, ObjectStore, StorageError

# The points of a stage publication, after the local ones, where a crash leaves a distinct state
# in the store.
STORE_STEPS = ("store_folder_pushed", "store_latest_moved")
_LATEST_ATTEMPTS = 50


def store_key(revision: str, stage: str, name: str) -> str:
    return f"work/{revision}/{stage}/{name}"


def push_version(store: ObjectStore, record: StageRecord, folder: Path, step: StepHook) -> None:
    """The version folder to the store (create-only), then the store's pointer to it."""
    key = store_key(record.revision, record.stage, f"{version_name(record.data_version)}/{LISTING}")
    if not push_folder(store, key, folder) and read_listing(store, key) != listing_of(folder_files(folder)):
        # The store holds this version already, with other bytes: an output that is not
        # byte-reproducible (an index) built again here. The store's is the record every other
        # machine reads, so this machine reads it too.
        discard(folder)
        pull_folder(store, key, folder)
    step("store_folder_pushed")
    key = store_key(record.revision, record.stage, POINTER)
    for _ in range(_LATEST_ATTEMPTS):  # bounded: each lost round means another writer moved it
        current = store.get(key)
        try:
            store.put_if(key, _sealed_pointer(record), current.etag if current else None)
            break
        except Conflict:
            continue
    else:
        raise StageError(f"{store.url}{key}: other writers kept moving it; materialize {record.stage} again")
    step("store_latest_moved")


def store_pointer(store: ObjectStore, revision: str, stage: str) -> tuple[str, bytes | None]:
    """Where the store's pointer of a partition's stage is, and its record's bytes (None: never
    materialized), its seal checked."""
    key = store_key(check_revision_key(revision), stage, POINTER)
    try:
        stored = store.get(key)
    except StorageError as exc:
        raise StageError(str(exc)) from None
    where = store.url + key  # a URL: a Path would fold its slashes
    return where, None if stored is None else _unsealed_pointer(where, stored.data)


POINTER_DOMAIN = "ragpipe/stage-pointer"


def _sealed_pointer(record: StageRecord) -> bytes:
    """The store's pointer: the record, sealed when a bundle key is configured (a writer of the
    store without the key cannot name another version or other facts)."""
    return (
        json.dumps(sealed(record.model_dump(mode="json"), POINTER_DOMAIN, configured_key()), indent=2) + "\n"
    ).encode()


def _unsealed_pointer(where: str, data: bytes) -> bytes:
    try:
        document = json.loads(data)
        content, problem = unsealed(document if isinstance(document, dict) else {}, POINTER_DOMAIN, configured_key())
    except ValueError as exc:
        raise StageError(f"{where}: not a valid stage record ({str(exc).splitlines()[0]})") from None
    if problem is not None:
        raise StageError(f"{where}: {problem}")
    return json.dumps(content).encode()


def pull_version(store: ObjectStore | None, revision: str, stage: str, data_version: str, folder: Path) -> None:
    """Download a version folder from the store unless it is here (a cache miss); a version the
    store does not hold is left to the caller's "missing" message."""
    if store is None or folder.exists():
        return
    try:
        pull_folder(store, store_key(revision, stage, f"{version_name(data_version)}/{LISTING}"), folder)
    except StorageError as exc:
        raise StageError(str(exc)) from None
