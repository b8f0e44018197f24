"""Content-addressed blobs and folder listings on an object store.

A blob is ``blobs/sha256/<hex>``: the bytes whose SHA-256 is ``<hex>``, created once and shared by
everything holding those bytes. A folder is published as its blobs and then one listing object
naming each file's relative path, size and digest (``push_folder``); the listing is created last,
create-only, so whoever finds it finds every blob it names. ``pull_folder`` checks every blob
against the listing as it downloads and publishes the folder atomically
(``ragpipe.kernel.publish.publish_directory``), so a damaged, cut or missing blob never becomes a
local file. Paths in a listing may not leave the folder, repeat, or name a file and a folder at
once. With a bundle key configured (``ragpipe.kernel.seals``) every listing carries a seal over its
content and a listing whose seal does not prove it is refused: blob digests detect damage, the
seal is what a writer without the key cannot forge.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragpipe.kernel.publish import PublishOutcome, publish_directory
from ragpipe.kernel.seals import configured_key, sealed, unsealed
from ragpipe.storage.objects import ObjectStore, StorageError

LISTING = "listing.json"
LISTING_DOMAIN = "ragpipe/folder-listing"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")


class Listing(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = Field("ragpipe.folder/v1", pattern=r"^ragpipe\.folder/v1$")
    files: tuple[FileEntry, ...]


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_key(sha256: str) -> str:
    """The object holding the bytes whose digest is ``sha256`` (``sha256:<hex>``)."""
    return "blobs/sha256/" + sha256.removeprefix("sha256:")


def put_blob(store: ObjectStore, data: bytes) -> str:
    """Store ``data`` as a blob (a no-op when it is there); its digest."""
    digest = sha256_of(data)
    store.put_new(blob_key(digest), data)  # an existing blob holds these very bytes (checked on read)
    return digest


def get_blob(store: ObjectStore, sha256: str, size: int, what: str) -> bytes:
    """The blob ``sha256`` of ``size`` bytes; ``StorageError`` naming ``what`` if it is missing or
    its bytes are not those."""
    blob = store.get(blob_key(sha256))
    if blob is None:
        raise StorageError(f"{store.url}{blob_key(sha256)}: {what}: blob is missing")
    if len(blob.data) != size or sha256_of(blob.data) != sha256:
        raise StorageError(f"{store.url}{blob_key(sha256)}: {what}: blob does not match its digest")
    return blob.data


def safe_relative_path(rel: str) -> bool:
    """Whether ``rel`` names a path inside a folder (no absolute path, ``.``, ``..`` or empty part)."""
    return not (rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")) or "\\" in rel or "\0" in rel)


def listing_of(files: dict[str, bytes]) -> Listing:
    return Listing(
        files=tuple(FileEntry(path=rel, size=len(d), sha256=sha256_of(d)) for rel, d in sorted(files.items()))
    )


def push_files(store: ObjectStore, key: str, files: dict[str, bytes]) -> bool:
    """Publish ``files`` (relative path -> bytes) as blobs, then their listing object ``key``
    (create-only, sealed when a key is configured); True if this call created the listing."""
    for data in files.values():
        put_blob(store, data)
    document = sealed(listing_of(files).model_dump(mode="json"), LISTING_DOMAIN, configured_key())
    return store.put_new(key, json.dumps(document, indent=1, sort_keys=True).encode() + b"\n")


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` by relative path (links and special files are not
    followed or read)."""
    files = {}
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            full = Path(dirpath) / name
            if stat.S_ISREG(os.lstat(full).st_mode):
                files[full.relative_to(folder).as_posix()] = full.read_bytes()
    return files


def push_folder(store: ObjectStore, key: str, folder: Path) -> bool:
    """``push_files`` of ``folder_files(folder)``."""
    return push_files(store, key, folder_files(folder))


def read_listing(store: ObjectStore, key: str) -> Listing | None:
    """The listing object ``key`` (None if absent); ``StorageError`` if it is not a valid one."""
    stored = store.get(key)
    if stored is None:
        return None
    where = f"{store.url}{key}"
    try:
        document = json.loads(stored.data.decode("utf-8"))
        content, problem = unsealed(document if isinstance(document, dict) else {}, LISTING_DOMAIN, configured_key())
        listing = Listing.model_validate(content)
    except (ValueError, ValidationError) as exc:
        raise StorageError(f"{where}: not a valid folder listing: {str(exc).splitlines()[0]}") from None
    if problem is not None:
        raise StorageError(f"{where}: {problem}")
    paths = [e.path for e in listing.files]
    for rel in paths:
        if not safe_relative_path(rel) or any(len(p.encode()) > 255 for p in rel.split("/")):
            raise StorageError(f"{where}: file path {rel!r} leaves the folder or is not a file name")
    if len(set(paths)) != len(paths):
        raise StorageError(f"{where}: a file path is listed twice")
    folders = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    if clash := sorted(folders & set(paths)):
        raise StorageError(f"{where}: {clash[0]!r} is listed as a file and holds other files")
    return listing


def pull_folder(store: ObjectStore, key: str, final: Path) -> PublishOutcome | None:
    """Download the folder listed at ``key`` to ``final`` (atomically, every blob checked); None if
    the store has no such listing, ``existing`` if ``final`` is there already."""
    listing = read_listing(store, key)
    if listing is None:
        return None

    def write(tmp: Path) -> None:
        for entry in listing.files:
            target = tmp / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(get_blob(store, entry.sha256, entry.size, f"{key}: {entry.path}"))

    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        return publish_directory(final, write, lambda tmp: None)
    except OSError as exc:
        raise StorageError(f"{store.url}{key}: cannot be written to {final}: {exc.strerror or exc}") from None
