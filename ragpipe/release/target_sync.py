"""A target's pointer and history on the object store (``RAGPIPE_STORE``): one object per target,
replaced by compare-and-swap on its ETag.

```
releases/targets/<target>/target.json   {"files": {"history.head": …, "history.jsonl": …,
                                         "pointer.json": …}, "schema": "ragpipe.release-target/v1"}
```

Each member is the text of the file of that name in the target's folder, or null when it has none;
the object is canonical JSON. With a store configured, the store's object is the record and the
local folder ``releases/targets/<target>/`` a working copy: ``ReleaseStore.target_lock`` — held by
every writer (activate, rollback, approve, recovery) and by the readers that need the pointer and
the history as of one moment — pulls the object into the folder on entry (replacing what the folder
holds when it differs: a working copy left by a writer killed on this machine, or one another
machine has moved since), and on exit puts the folder back with ``If-Match`` on the ETag it pulled.
If another machine replaced the object in between, the put fails: the working copy is reset to the
store's, and the writer gets ``ConflictError`` with nothing changed. So an activation's intent,
pointer swap and observed record reach the store as one object: no machine sees a pointer ahead of
its history, and a writer killed at any step leaves the store as it was.

Two rules keep the store from taking what a machine holds:

* **Turning the store on uploads, never deletes.** When the store has no object for a target whose
  folder holds files, and this machine has never synced that target, the folder is the record so
  far: it is put create-only as the first object (a machine that loses that race pulls the
  winner's).
* **The history only grows.** After each pull and push the folder keeps ``.synced.json``: the length
  and SHA-256 of the history text it then agreed with the store on. A later pull whose history does
  not begin with exactly those bytes — an older object put back, the object erased, another store
  configured — is refused with one line, and the working copy is left as it was.

Nothing here is trusted for coming from the store: the pointer is parsed and (with a key) its seal
checked, the history is a hash-chained ledger whose head (with a key) is sealed, exactly as the
local files are (docs/trust.md).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.storage.objects import Conflict, ObjectStore, StorageError

SCHEMA = "ragpipe.release-target/v1"
# Writer order: the ledger, then its head, then the pointer (a kill in between leaves a pointer
# that the history explains).
FILES = ("history.jsonl", "history.head", "pointer.json")
TARGET_OBJECT = "target.json"
SYNCED = ".synced.json"

Files = dict[str, str | None]

MAX_FILE_BYTES = 2**30  # a target's history, pointer or sync mark; a bound on what is read


class TargetSyncError(ValueError):
    """The store's object (or the local working copy) cannot be read or written; one line."""


class TargetMoved(TargetSyncError):
    """Another machine replaced the target's object first; the working copy is the store's again."""


def target_key(target: str) -> str:
    return f"releases/targets/{target}/{TARGET_OBJECT}"


def _read_local(folder: Path) -> Files:
    files: Files = {}
    for name in FILES:
        path = folder / name
        try:
            files[name] = read_regular(path, MAX_FILE_BYTES).decode("utf-8")  # no link, no FIFO
        except FileNotFoundError:
            files[name] = None
        except UnicodeDecodeError:
            raise TargetSyncError(f"{path}: not UTF-8 text (damaged)") from None
        except OSError as exc:
            raise TargetSyncError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return files


def _local_differs(folder: Path, files: Files) -> bool:
    """Whether the working copy is other than ``files``; a copy that cannot be read (torn inside a
    multi-byte character by a killed writer) differs, so the pull replaces it."""
    try:
        return _read_local(folder) != files
    except TargetSyncError:
        return True


def _history_mark(files: Files) -> dict[str, object]:
    history = (files["history.jsonl"] or "").encode("utf-8")
    return {"history_bytes": len(history), "history_sha256": hashlib.sha256(history).hexdigest()}


def _extends(files: Files, mark: dict[str, object]) -> bool:
    history = (files["history.jsonl"] or "").encode("utf-8")
    size = mark.get("history_bytes")
    return (
        isinstance(size, int)
        and len(history) >= size
        and hashlib.sha256(history[:size]).hexdigest() == mark.get("history_sha256")
    )


def _document(files: Files) -> bytes:
    return canonical_bytes({"files": files, "schema": SCHEMA}) + b"\n"


def _parse(where: str, data: bytes) -> Files:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise TargetSyncError(f"{where}: not valid JSON") from None
    files = obj.get("files") if isinstance(obj, dict) else None
    if (
        not isinstance(obj, dict)
        or sorted(obj) != ["files", "schema"]
        or obj["schema"] != SCHEMA
        or not isinstance(files, dict)
        or sorted(files) != sorted(FILES)
        or not all(v is None or isinstance(v, str) for v in files.values())
    ):
        raise TargetSyncError(
            f"{where}: not a {SCHEMA} object (keys files and schema; files {', '.join(sorted(FILES))})"
        )
    return files


def _write_local(folder: Path, files: Files) -> None:
    """Make the working copy ``files``: the history before the pointer, as a writer orders them."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        path, text = folder / name, files[name]
        if text is None:
            path.unlink(missing_ok=True)
        else:
            write_file_atomic(path, text.encode("utf-8"))


@dataclass
class TargetSync:
    """One hold of a target's lock on a machine with a store (module docstring)."""

    store: ObjectStore
    folder: Path
    target: str
    etag: str | None = None
    pulled: Files = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.store.url}{target_key(self.target)}"

    def pull(self) -> None:
        """The store's object into the working copy (replacing a copy that differs); on a store
        without the object, the folder's files as its first version (module docstring)."""
        held = self._get()
        mark = self._mark()
        if held is None and mark is None and _local_differs(self.folder, _empty()):
            self._seed()
            return
        files = _empty() if held is None else _parse(self.where, held.data)
        if mark is not None and not _extends(files, mark):
            raise TargetSyncError(
                f"{self.where}: target {self.target!r}'s history there does not begin with the "
                f"{mark['history_bytes']} bytes this machine last synced (an older object put back, "
                f"the object erased, or another store?); nothing was changed — to accept the store's, delete "
                f"{self.folder / SYNCED}"
            )
        self.etag = None if held is None else held.etag
        self.pulled = files
        if _local_differs(self.folder, files):
            try:
                _write_local(self.folder, files)
            except OSError as exc:
                raise TargetSyncError(f"{self.folder}: cannot write the working copy: {exc.strerror or exc}") from None
        if mark != _history_mark(files):
            self._remember(files)

    def push(self) -> bool:
        """The working copy to the store if it changed, on the pulled ETag; True if it was put.
        ``TargetMoved`` (the working copy reset) if another machine replaced the object first. A
        put whose response was lost and retried finds its own document there: that is success."""
        now = _read_local(self.folder)
        if now == self.pulled:
            return False
        document = _document(now)
        try:
            self.etag = self.store.put_if(target_key(self.target), document, self.etag)
        except Conflict:
            held = self._get()
            if held is None or held.data != document:
                self.pull()
                raise TargetMoved(
                    f"target {self.target!r}: another machine changed it first ({self.where}); nothing was changed"
                ) from None
            self.etag = held.etag
        except StorageError as exc:
            raise TargetSyncError(str(exc)) from None
        self.pulled = now
        self._remember(now)
        return True

    def _seed(self) -> None:
        """Put the folder's files create-only as the target's first object; if another machine
        did so first, pull theirs (the mark is not set yet, so that is no replay)."""
        files = _read_local(self.folder)
        try:
            self.etag = self.store.put_if(target_key(self.target), _document(files), None)
        except Conflict:
            self.pull()
            return
        except StorageError as exc:
            raise TargetSyncError(str(exc)) from None
        self.pulled = files
        self._remember(files)

    def _get(self):
        try:
            return self.store.get(target_key(self.target))
        except StorageError as exc:
            raise TargetSyncError(str(exc)) from None

    def _mark(self) -> dict[str, object] | None:
        path = self.folder / SYNCED
        try:
            mark = json.loads(read_regular(path, MAX_FILE_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            raise TargetSyncError(
                f"{path}: not this machine's sync mark (damaged); delete it to trust the store's history"
            ) from None
        return mark if isinstance(mark, dict) else {}

    def _remember(self, files: Files) -> None:
        try:
            write_file_atomic(self.folder / SYNCED, canonical_bytes(_history_mark(files)) + b"\n")
        except OSError as exc:
            raise TargetSyncError(f"{self.folder}: cannot write the sync mark: {exc.strerror or exc}") from None


def _empty() -> Files:
    return dict.fromkeys(FILES)
