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

Nothing here is trusted for coming from the store: the pointer is parsed and (with a key) its seal
checked, the history is a hash-chained ledger whose head (with a key) is sealed, exactly as the
local files are (docs/trust.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.storage.objects import Conflict, ObjectStore, StorageError

SCHEMA = "ragpipe.release-target/v1"
FILES = ("history.head", "history.jsonl", "pointer.json")
TARGET_OBJECT = "target.json"

Files = dict[str, str | None]


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
            files[name] = path.read_bytes().decode("utf-8")
        except FileNotFoundError:
            files[name] = None
        except UnicodeDecodeError:
            raise TargetSyncError(f"{path}: not UTF-8 text (damaged)") from None
        except OSError as exc:
            raise TargetSyncError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return files


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
        raise TargetSyncError(f"{where}: not a {SCHEMA} object (keys files and schema; files {', '.join(FILES)})")
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
        """The store's object into the working copy (replacing a copy that differs)."""
        try:
            held = self.store.get(target_key(self.target))
        except StorageError as exc:
            raise TargetSyncError(str(exc)) from None
        self.etag = None if held is None else held.etag
        self.pulled = {n: None for n in FILES} if held is None else _parse(self.where, held.data)
        if _read_local(self.folder) != self.pulled:
            try:
                _write_local(self.folder, self.pulled)
            except OSError as exc:
                raise TargetSyncError(f"{self.folder}: cannot write the working copy: {exc.strerror or exc}") from None

    def push(self) -> bool:
        """The working copy to the store if it changed, on the pulled ETag; True if it was put.
        ``TargetMoved`` (the working copy reset) if another machine replaced the object first."""
        now = _read_local(self.folder)
        if now == self.pulled:
            return False
        try:
            self.store.put_if(target_key(self.target), _document(now), self.etag)
        except Conflict:
            self.pull()
            raise TargetMoved(
                f"target {self.target!r}: another machine changed it first ({self.where}); nothing was changed"
            ) from None
        except StorageError as exc:
            raise TargetSyncError(str(exc)) from None
        return True
