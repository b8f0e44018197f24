"""The revision registry: one immutable JSON record per corpus revision key.

Registering reads the source's bytes once, validates those bytes (so a bad corpus is refused
before any record or partition exists, and the key stays free for the fixed corpus) and pins the
digest of the same bytes. Re-registering a key with the same source is a no-op; with different
bytes, options or format it is refused, because a revision key names one immutable revision.
Reading a registered revision likewise reads the bytes once, checks their digest and parses that
same buffer: a file swapped between check and parse is never parsed unverified. Within one
process the parse of those bytes is remembered by (format, path, digest) for the last source parsed, so
``ragpipe build`` — which registers and then snapshots the revision in the same process —
parses its corpus once (a run executed by another process parses it there, once).

With an object store configured (``RAGPIPE_STORE``) registration also publishes the source (as a
folder listing of its regular files under ``sources/<digest hex>/``) and then the record
(``revisions/<key>.json``, create-only, refused if another record holds the key), so a step on a
machine that shares no disk with the registering one finds both: ``load_revision`` falls back to
the store's record and ``read_registered_corpus`` downloads the source into a local cache when the
recorded path is not there — checked against the registered digest like any other read (a
Markdown tree whose links or special files were excluded at registration cannot be rebuilt from
the store: its digest names those exclusions, so it is refused, never read differently).

A revision key is a partition name, a file name here and a folder name under ``work/``:
``check_revision_key`` is the one rule for it, applied by every function taking a key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from ragpipe.corpus.bounds import DEFAULT_BOUNDS, CorpusBounds, bound_problems
from ragpipe.corpus.connectors import CorpusFormat, CorpusRead, load_source, parse_source
from ragpipe.corpus.models import REVISION_PATTERN, SCOPE_PATTERN
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.records import unscoped_refusal
from ragpipe.corpus.source import TreeSource
from ragpipe.corpus.wxr import DEFAULT_WXR_STATUSES, check_wxr_statuses
from ragpipe.kernel.publish import discard, write_file_atomic
from ragpipe.storage.blobs import LISTING, pull_folder, push_files, read_listing
from ragpipe.storage.location import store_from_env
from ragpipe.storage.objects import ObjectStore, StorageError

# (format, source path, source digest) -> the parse of exactly those bytes at that path: the last
# source parsed in this process. A clean parse is a pure function of the bytes and the path
# (exclusions name their location), so reusing it for an equal key changes nothing but time; a
# source the walk found problems in is never served from here.
_last_parse: dict[tuple[str, str, str], CorpusRead] = {}


def _parse(loaded, fmt: str) -> CorpusRead:
    if getattr(loaded, "problems", ()):  # not in the digest (bad names, unreadable entries): refuse afresh
        return parse_source(loaded)
    where = loaded.root if hasattr(loaded, "root") else loaded.path
    key = (fmt, str(where), loaded.digest())
    found = _last_parse.get(key)
    if found is None:
        found = parse_source(loaded)  # raises CorpusError naming file/line/ID; nothing is remembered
        _last_parse.clear()  # one entry: a long-lived process (the daemon's sensors) keeps no more
        _last_parse[key] = found
    return CorpusRead(list(found), found.excluded)  # records are frozen; the list is the caller's


class RevisionError(ValueError):
    pass


class RevisionRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    revision: str
    source_path: str
    format: CorpusFormat
    default_scope: str | None  # None: every document declared its scopes at registration
    source_digest: str
    # the post statuses a WordPress export is read for (format wxr only; in its source digest too);
    # absent from the JSON of other formats, whose records stay as they were
    wxr_statuses: tuple[str, ...] | None = None


def check_revision_key(revision: str) -> str:
    """Return ``revision`` if it is a valid key: 1-128 ASCII letters, digits, ``.``, ``_``, ``-``,
    starting with a letter or digit (so no ``/``, ``..`` segment, leading dot, NUL or newline)."""
    if not isinstance(revision, str) or not REVISION_PATTERN.match(revision):
        raise RevisionError(
            f"invalid revision key {revision!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return revision


def _record_path(registry: Path, revision: str) -> Path:
    return registry / f"{check_revision_key(revision)}.json"


def _statuses(
    fmt: CorpusFormat, given: tuple[str, ...] | None, recorded: RevisionRecord | None
) -> tuple[str, ...] | None:
    """The WXR statuses to read: as given, else as recorded for the key, else ``publish``; None
    for other formats (giving them there is refused: they would change nothing)."""
    if fmt != "wxr":
        if given is not None:
            raise RevisionError(f"--wxr-status applies to --format wxr only (this source is read as {fmt})")
        return None
    if given is None:
        return recorded.wxr_statuses if recorded is not None and recorded.wxr_statuses else DEFAULT_WXR_STATUSES
    try:
        return check_wxr_statuses(given)
    except ValueError as exc:
        raise RevisionError(str(exc)) from None


def register_revision(
    registry: Path,
    revision: str,
    source: Path,
    fmt: CorpusFormat,
    default_scope: str | None,
    wxr_statuses: tuple[str, ...] | None = None,
    bounds: CorpusBounds = DEFAULT_BOUNDS,
) -> tuple[RevisionRecord, bool]:
    """Validate and register a revision. Returns (record, newly_registered).

    ``default_scope`` is the scope of documents that declare none; None (none given) refuses a
    corpus with such documents, naming them, before anything is written — unless ``revision`` is
    registered already: then its recorded default applies (building a registered revision again
    needs no flag; the record, not a guess, says what its default is). ``wxr_statuses`` (format
    ``wxr`` only) are the post statuses read; None: as recorded for the key, else ``publish``.
    A corpus beyond ``bounds`` (``ragpipe.corpus.bounds``) is refused, every violation one line."""
    path = _record_path(registry, revision)
    recorded = load_revision(registry, revision) if path.exists() else None
    if default_scope is None and recorded is not None:
        default_scope = recorded.default_scope
    if default_scope is not None and not SCOPE_PATTERN.match(default_scope):
        raise RevisionError(f"invalid default scope {default_scope!r}")
    statuses = _statuses(fmt, wxr_statuses, recorded)
    source = source.resolve()
    if not source.exists():
        raise RevisionError(f"{source}: corpus path does not exist")
    loaded = _load(source, fmt, statuses)
    read = _parse(loaded, fmt)  # raises CorpusError naming file/line/ID; nothing is written
    too_large = bound_problems(read, str(source), bounds)
    if too_large:
        raise CorpusError(too_large)
    refusal = unscoped_refusal(read, default_scope, str(source))
    if refusal is not None:
        raise RevisionError(refusal)
    record = RevisionRecord(
        revision=revision,
        source_path=str(source),
        format=fmt,
        default_scope=default_scope,
        source_digest=loaded.digest(),
        wxr_statuses=statuses,
    )
    data = (record.model_dump_json(indent=2, exclude_defaults=True) + "\n").encode()
    store = store_from_env()
    if store is not None:  # the store is the record: a key it holds for other content is refused first
        _publish(store, record, loaded, data)
    try:
        created = write_file_atomic(path, data, replace=False)
    except OSError as exc:
        raise RevisionError(f"{path}: cannot write the revision record: {exc.strerror}") from None
    if not created:
        _refuse_other(load_revision(registry, revision), record)
    return record, created


def _identity(record: RevisionRecord) -> tuple:
    """What a revision is: its key, format, default scope, source bytes and (WXR) the statuses read
    — not the path they were read from (one corpus registered from two machines is one revision)."""
    return record.revision, record.format, record.default_scope, record.source_digest, record.wxr_statuses


def _refuse_other(existing: RevisionRecord, record: RevisionRecord) -> None:
    if _identity(existing) != _identity(record):
        raise RevisionError(
            f"revision {record.revision!r} is already registered with different content "
            f"(source {existing.source_path}, digest {existing.source_digest}, "
            f"{'no default scope' if existing.default_scope is None else 'default scope ' + existing.default_scope}"
            f"{'' if existing.wxr_statuses is None else ', statuses ' + ','.join(existing.wxr_statuses)}); "
            "revision keys name immutable revisions: register the new content under a new key"
        )


def _source_key(record: RevisionRecord) -> str:
    return f"sources/{record.source_digest.removeprefix('sha256:')}/{LISTING}"


def _publish(store: ObjectStore, record: RevisionRecord, loaded, data: bytes) -> None:
    """The source (its bytes as read at registration), then the record: a record in the store
    always has its source there. A key the store holds for other content is refused."""
    if isinstance(loaded, TreeSource):
        files = {f.rel: f.data for f in loaded.files}
    else:
        files = {loaded.path.name: loaded.raw}
    try:
        push_files(store, _source_key(record), files)
        if not store.put_new(f"revisions/{record.revision}.json", data):
            _refuse_other(_stored_record(store, record.revision), record)
    except StorageError as exc:
        raise RevisionError(str(exc)) from None


def _stored_record(store: ObjectStore, revision: str) -> RevisionRecord:
    key = f"revisions/{revision}.json"
    stored = store.get(key)
    if stored is None:
        raise RevisionError(f"revision {revision!r} is not registered (neither here nor in {store.url})")
    try:
        record = RevisionRecord.model_validate(json.loads(stored.data))
    except (ValueError, ValidationError) as exc:
        raise RevisionError(f"{store.url}{key}: not a valid revision record ({str(exc).splitlines()[0]})") from None
    if record.revision != revision or not re.fullmatch(r"sha256:[0-9a-f]{64}", record.source_digest):
        raise RevisionError(f"{store.url}{key}: not the record of revision {revision!r} (names {record.revision!r})")
    return record


def load_revision(registry: Path, revision: str) -> RevisionRecord:
    path = _record_path(registry, revision)
    if not path.exists():
        store = store_from_env()
        if store is not None:
            try:
                return _stored_record(store, revision)
            except StorageError as exc:
                raise RevisionError(str(exc)) from None
        raise RevisionError(f"revision {revision!r} is not registered (no {path})")
    return RevisionRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))


def list_revisions(registry: Path) -> list[str]:
    """Registered keys; a file whose name is not a valid key (put there by hand) is not one."""
    if not registry.is_dir():
        return []
    return sorted(p.stem for p in registry.glob("*.json") if REVISION_PATTERN.match(p.stem))


def read_registered_corpus(record: RevisionRecord, sources_cache: Path | None = None) -> CorpusRead:
    """Read a registered revision's source once, refuse it if its bytes changed since
    registration, and parse exactly the bytes whose digest matched. A source missing here is
    taken from the configured store into ``sources_cache`` (module docstring)."""
    check_revision_key(record.revision)
    source = Path(record.source_path)
    store = store_from_env()
    if not source.exists() and store is not None and sources_cache is not None:
        source = _pulled_source(store, record, sources_cache)
        if _load(source, record.format, record.wxr_statuses).digest() != record.source_digest:
            # a damaged local copy of the store's source: the store is the record, fetch it again
            discard(sources_cache / record.source_digest.removeprefix("sha256:"))
            source = _pulled_source(store, record, sources_cache)
    if not source.exists():
        raise RevisionError(f"revision {record.revision!r}: source {source} no longer exists")
    loaded = _load(source, record.format, record.wxr_statuses)
    if loaded.problems:  # e.g. a file no longer readable: say so rather than "changed"
        raise CorpusError(list(loaded.problems))
    digest = loaded.digest()
    if digest != record.source_digest:
        raise RevisionError(
            f"revision {record.revision!r}: source {source} changed since registration "
            f"({record.source_digest} -> {digest}); register the new content under a new revision key"
        )
    return _parse(loaded, record.format)


def _load(source: Path, fmt: CorpusFormat, wxr_statuses: tuple[str, ...] | None):
    """``load_source``, with the statuses only for the format that reads them."""
    return load_source(source, fmt) if wxr_statuses is None else load_source(source, fmt, wxr_statuses)


def _pulled_source(store: ObjectStore, record: RevisionRecord, cache: Path) -> Path:
    """The store's copy of the source as a local path: the folder, or the one file in it."""
    folder = cache / record.source_digest.removeprefix("sha256:")
    try:
        if pull_folder(store, _source_key(record), folder) is None:
            raise RevisionError(
                f"revision {record.revision!r}: source {record.source_path} is neither here nor in {store.url}"
            )
        listing = read_listing(store, _source_key(record))
    except StorageError as exc:
        raise RevisionError(str(exc)) from None
    if record.format in ("beir", "wxr") and listing is not None and len(listing.files) == 1:
        return folder / listing.files[0].path
    return folder
