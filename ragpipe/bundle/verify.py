"""Open a bundle only after verifying everything; fail closed with messages naming each problem.

Checks, in order: the path is a real directory; ``manifest.json`` parses, validates and is
byte-canonical; the bundle ID recomputes from the semantic section and matches the directory
name; the material digest recomputes from the material section; the seal proves both under the
configured bundle key (or unkeyed when none is configured); every file on disk is a regular file
listed with its size and digest (symlinks, extra, missing, truncated and altered files are
refused); then the payload is recomputed and both indexes are cross-checked
(``ragpipe.bundle.payload_checks``).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import ValidationError

from ragpipe.bundle.manifest import MANIFEST_NAME, BundleManifest, bundle_id_of, manifest_bytes, material_digest_of
from ragpipe.bundle.payload_checks import check_payload
from ragpipe.bundle.payload_checks import check_vector_table as check_vector_table_content
from ragpipe.bundle.seal import seal_problems
from ragpipe.bundle.tables import CHUNKS, DOCUMENTS, REPRESENTATIONS, TABLE_FILES, VerifiedTables, release_free_memory
from ragpipe.index.rows import index_columns
from ragpipe.index.vector_file import VECTORS_FILE
from ragpipe.kernel.seals import SealKey, SealKeyError, configured_key
from ragpipe.representations.generations import GENERATIONS_FILE
from ragpipe.spec import EmbedderSpec

# Files whose verified bytes are kept: the tables, and the vectors the in-memory engine searches.
KEPT_FILES = (*TABLE_FILES, VECTORS_FILE, GENERATIONS_FILE)
READ_BLOCK = 1 << 20


class BundleVerificationError(ValueError):
    def __init__(self, path: Path, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__(f"bundle {path} failed verification:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class VerifiedBundle:
    """A bundle that passed ``open_bundle``. ``vector_table_checked`` False: the lance table's
    content checks were deferred (``check_vector_table`` runs them before lancedb serves); its
    files' digests were checked all the same."""

    path: Path
    manifest: BundleManifest
    tables: VerifiedTables
    vector_table_checked: bool = True

    @property
    def bundle_id(self) -> str:
        return self.manifest.bundle_id


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return "sha256:" + h.hexdigest()


def _read_listed(full: Path, keep: bool) -> tuple[int, str, np.ndarray | None]:
    """(size, digest, bytes if ``keep``) of one regular file, read through one descriptor opened
    without following links and without blocking, so a file swapped for a link or a FIFO after
    the directory walk is refused instead of followed or waited on.

    Kept bytes are read straight into one buffer of the file's size (no list of blocks joined
    into a second copy) and digested as they arrive; the buffer is private memory, made
    read-only, so what is digested here is what every later reader uses — nothing another
    process writes to the file afterwards (in place or by rename) can reach it, as it could a
    memory map of the file. A file longer than when it was opened is read to its end, digested
    and refused by its size (its extra bytes are not kept)."""
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb", buffering=0) as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError("not a regular file when opened")
        h = hashlib.sha256()
        kept = np.empty(info.st_size, dtype=np.uint8) if keep else None
        view = memoryview(kept) if kept is not None else None
        size = 0
        while True:
            if view is not None and size < len(view):
                got = fh.readinto(view[size : size + READ_BLOCK])
                block = view[size : size + (got or 0)]
            else:
                block = fh.read(READ_BLOCK)
                got = len(block)
            if not got:
                break
            h.update(block)
            size += got
    if kept is not None:
        if size != len(kept):
            kept = None  # refused by its size: nothing of it is used
        else:
            kept.setflags(write=False)
    return size, "sha256:" + h.hexdigest(), kept


def _load_manifest(root: Path, check_name: bool, key: SealKey | None) -> tuple[BundleManifest, str]:
    """The manifest, validated, and the SHA-256 of its exact bytes."""
    mpath = root / MANIFEST_NAME
    if mpath.is_symlink():
        raise BundleVerificationError(root, [f"{MANIFEST_NAME}: is a symlink"])
    if not mpath.is_file():
        raise BundleVerificationError(root, [f"{MANIFEST_NAME}: missing"])
    raw = mpath.read_bytes()
    try:
        manifest = BundleManifest.model_validate(json.loads(raw.decode("utf-8")))
    except (ValueError, ValidationError) as exc:
        raise BundleVerificationError(root, [f"{MANIFEST_NAME}: not a valid manifest: {exc}"]) from None
    if not _all_nfc(json.loads(raw.decode("utf-8"))):
        # the canonical encoder refuses a non-NFC string (it has no ID), so say so before any ID is computed
        raise BundleVerificationError(root, [f"{MANIFEST_NAME}: holds a string that is not NFC-normalised"])
    problems = []
    if manifest_bytes(manifest) != raw:
        # Byte-exact: any edit, even whitespace, means someone changed the file after publication.
        problems.append(f"{MANIFEST_NAME}: bytes are not the canonical rendering of its content (manifest edited)")
    if bundle_id_of(manifest.semantic) != manifest.bundle_id:
        problems.append(f"{MANIFEST_NAME}: bundle_id does not match the manifest's semantic fields (manifest edited)")
    if material_digest_of(manifest.bundle_id, manifest.material) != manifest.material_digest:
        problems.append(
            f"{MANIFEST_NAME}: material_digest does not match the file list and vectors digest (manifest edited)"
        )
    problems += [
        f"{MANIFEST_NAME}: {p}" for p in seal_problems(manifest.seal, manifest.bundle_id, manifest.material_digest, key)
    ]
    if check_name and root.name != manifest.bundle_id.hex:
        problems.append(f"directory name {root.name!r} is not the bundle ID hex {manifest.bundle_id.hex}")
    if problems:
        raise BundleVerificationError(root, problems)
    return manifest, hashlib.sha256(raw).hexdigest()


def _all_nfc(value: object) -> bool:
    if isinstance(value, str):
        return unicodedata.is_normalized("NFC", value)
    if isinstance(value, dict):
        return all(_all_nfc(k) and _all_nfc(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_all_nfc(v) for v in value)
    return True


def _check_files(root: Path, manifest: BundleManifest, tables: dict[str, np.ndarray]) -> list[str]:
    """Every file on disk against the manifest's list; the Parquet tables' bytes land in ``tables``."""
    problems: list[str] = []
    listed = {f.path: f for f in manifest.material.files}
    on_disk: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                problems.append(f"{rel}: symlink not allowed in a bundle")
            elif stat.S_ISDIR(mode):
                continue
            elif not stat.S_ISREG(mode):
                problems.append(f"{rel}: not a regular file")
            elif rel != MANIFEST_NAME:
                on_disk.add(rel)
                entry = listed.get(rel)
                if entry is None:
                    problems.append(f"{rel}: extra file not listed in the manifest")
                elif (size := os.lstat(full).st_size) != entry.size:
                    problems.append(
                        f"{rel}: size {size} differs from manifest size {entry.size} (truncated or extended)"
                    )
                else:
                    try:
                        size, digest, data = _read_listed(full, keep=rel in KEPT_FILES)
                    except OSError as exc:
                        problems.append(f"{rel}: cannot be read: {exc.strerror or exc}")
                        continue
                    if size != entry.size:
                        problems.append(
                            f"{rel}: size {size} differs from manifest size {entry.size} (truncated or extended)"
                        )
                    elif digest != entry.sha256:
                        problems.append(f"{rel}: content digest differs from the manifest")
                    elif rel in KEPT_FILES and data is None:  # its size moved while it was read
                        problems.append(f"{rel}: changed while it was read")
                    elif data is not None:
                        tables[rel] = data
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    for rel in sorted(set(listed) - on_disk):
        if not any(p.startswith(f"{rel}:") for p in problems):
            problems.append(f"{rel}: listed in the manifest but missing")
    return problems


def open_bundle(
    path: Path,
    check_name: bool = True,
    key: SealKey | None | Literal["configured"] = "configured",
    defer_vector_table: bool = False,
) -> VerifiedBundle:
    """Verify the bundle at ``path`` completely; raise ``BundleVerificationError`` otherwise.

    ``check_name=False`` skips only the directory-name check (for a temp dir before publication).
    ``key``: the bundle key the seal must be made with (default: the configured one, if any).
    ``defer_vector_table``: for a bundle whose vectors are in ``vectors.arrow`` (verified here),
    leave the lance table's content checks — they need lancedb, seconds of imports — to
    ``check_vector_table``, which a query path runs only if lancedb is to serve. Every file's
    digest is checked either way; a bundle without ``vectors.arrow`` is checked completely.
    """
    path = Path(path)
    if key == "configured":
        try:
            key = configured_key()
        except SealKeyError as exc:
            raise BundleVerificationError(path, [str(exc)]) from None
    if path.is_symlink():
        raise BundleVerificationError(path, ["bundle path is a symlink"])
    if not path.is_dir():
        raise BundleVerificationError(path, ["not a bundle directory"])
    manifest, manifest_digest = _load_manifest(path, check_name, key)
    data: dict[str, np.ndarray] = {}
    problems = _check_files(path, manifest, data)
    missing = [name for name in TABLE_FILES if name not in data]
    if problems or missing:
        raise BundleVerificationError(path, problems or [f"{name}: missing from the bundle" for name in missing])
    counts = manifest.semantic.counts
    rows = {DOCUMENTS: counts.documents, CHUNKS: counts.chunks, REPRESENTATIONS: counts.representations}
    tables = VerifiedTables(data, _vector_shape(manifest), rows)
    del data
    deferred = defer_vector_table and tables.vectors_file is not None and manifest.semantic.has_vector_index
    scope = "payload" if deferred else "complete"
    if not (_known_good(manifest_digest, scope) or _known_good(manifest_digest, "complete")):
        try:
            problems = check_payload(path, manifest, tables, vector_table=not deferred)
        except Exception as exc:  # a corrupt-but-digest-matching file is impossible; anything else is still a refusal
            problems = [f"content check failed: {type(exc).__name__}: {exc}"]
        finally:
            release_free_memory()  # what the checks freed, before the caller serves or builds on
        if problems:
            raise BundleVerificationError(path, problems)
        _remember(manifest_digest, scope)
    checked = not deferred or _known_good(manifest_digest, "complete")
    return VerifiedBundle(path=path, manifest=manifest, tables=tables, vector_table_checked=checked)


def _vector_shape(manifest: BundleManifest) -> tuple[int, int] | None:
    """(rows, dimensions) the manifest gives its vectors (None: no vector index, or an embedder
    spec that does not parse, which the payload checks refuse)."""
    sem = manifest.semantic
    if not sem.has_vector_index or "embeddings" not in sem.specs:
        return None
    try:
        return sem.counts.vectors, EmbedderSpec.model_validate(sem.specs["embeddings"].spec).dimensions
    except ValueError:
        return None


def check_vector_table(bundle: VerifiedBundle) -> None:
    """The lance table content checks ``open_bundle(defer_vector_table=True)`` left out
    (``BundleVerificationError`` naming each problem); nothing to do when they ran. Call before
    lancedb serves the bundle."""
    if bundle.vector_table_checked:
        return
    digest = manifest_digest_of(bundle)
    if _known_good(digest, "complete"):
        return
    tables = bundle.tables
    try:
        expected = index_columns(
            tables.table(DOCUMENTS, ["document_id", "access_scopes", "source_role"]),
            tables.table(REPRESENTATIONS, ["representation_id", "chunk_id", "document_id", "kind"]),
        )
        # the payload (vectors.arrow's IDs and digest included) passed when the bundle was opened
        problems = check_vector_table_content(bundle.path, bundle.manifest, expected, tables.vectors)
    except Exception as exc:
        problems = [f"content check failed: {type(exc).__name__}: {exc}"]
    if problems:
        raise BundleVerificationError(bundle.path, problems)
    _remember(digest, "complete")


def manifest_digest_of(bundle: VerifiedBundle) -> str:
    """The SHA-256 hex of ``bundle``'s manifest file (byte-canonical, checked on open: its bytes
    are these), which binds every file's digest."""
    return hashlib.sha256(manifest_bytes(bundle.manifest)).hexdigest()


def trust_payload(manifest_digest: str) -> None:
    """Let later opens in this process skip the payload checks of the bundle whose manifest has
    ``manifest_digest`` (every file's digest is checked all the same): only for a manifest whose
    payload a full verification accepted, as a sealed verification record vouches
    (``ragpipe.release.verified_record``)."""
    _remember(manifest_digest, "payload")


# The payload checks are a pure function of the manifest and the files' bytes, and the manifest
# binds every file's SHA-256 (re-checked on every open above). So once the payload of one exact
# manifest passed in this process, a later open of the same bytes need not recompute it: a build
# verifies its bundle before the rename, after it, and in the ``bundle_verifies`` check, and each
# full recomputation costs ~3 s on SciFact. ``complete``: every check passed; ``payload``: all but
# the lance table's (deferred).
_PAYLOAD_OK: OrderedDict[tuple[str, str], None] = OrderedDict()
_PAYLOAD_LOCK = threading.Lock()
_PAYLOAD_MEMO_SIZE = 64


def _known_good(manifest_digest: str, scope: str) -> bool:
    with _PAYLOAD_LOCK:
        return (manifest_digest, scope) in _PAYLOAD_OK


def _remember(manifest_digest: str, scope: str) -> None:
    with _PAYLOAD_LOCK:
        _PAYLOAD_OK[(manifest_digest, scope)] = None
        _PAYLOAD_OK.move_to_end((manifest_digest, scope))
        while len(_PAYLOAD_OK) > _PAYLOAD_MEMO_SIZE:
            _PAYLOAD_OK.popitem(last=False)
