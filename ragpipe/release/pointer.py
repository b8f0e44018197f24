"""A target's pointer: which release is active, at which generation (docs/releases.md).

``pointer.json`` is canonical JSON ``{schema, target, release_id, generation, previous,
ledger_head}``: ``generation`` counts swaps from 1 (no file = generation 0, nothing active),
``previous`` is the release the swap replaced (None for the first), ``ledger_head`` the hash of the
history record that announced the swap (its *intent*), which ties pointer and ledger together.
With a key configured (``ragpipe.kernel.seals``) the file also carries a ``seal`` over the rest,
and a pointer without it (or sealed with another key) is refused.

A swap is a compare-and-swap on the generation the caller read: under the target's lock the current
generation is re-read, and if it moved the swap refuses with ``ConflictError`` and changes nothing,
so two racing activations give one winner and one clear conflict, never a lost update. The write
itself is temp file → fsync → rename over the pointer → fsync the directory, so a reader sees the
old or the new pointer, never a mix, and after a crash at any point the file is one of the two.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.publish import StepHook, fsync_path, remove_stale_temps
from ragpipe.kernel.seals import SEAL, SealKey, configured_key, sealed, unsealed
from ragpipe.release.store import RELEASE_ID, ConflictError, ReleaseError, ReleaseStore

POINTER_SCHEMA = "ragpipe.release-pointer/v1"
POINTER_KEYS = ["generation", "ledger_head", "previous", "release_id", "schema", "target"]
SEAL_DOMAIN = "release-pointer/v1"
# The points of ``write_pointer`` where a crash leaves a distinct state on disk.
POINTER_STEPS = ("pointer_temp_written", "pointer_temp_fsynced", "pointer_renamed", "pointer_dir_fsynced")

MAX_POINTER_BYTES = 65536  # a pointer is a few hundred bytes


@dataclass(frozen=True)
class Pointer:
    target: str
    release_id: str
    generation: int
    previous: str | None
    ledger_head: str

    def as_dict(self) -> dict[str, object]:
        return {
            "schema": POINTER_SCHEMA,
            "target": self.target,
            "release_id": self.release_id,
            "generation": self.generation,
            "previous": self.previous,
            "ledger_head": self.ledger_head,
        }


def _noop(_: str) -> None:
    return None


def parse_pointer(path: Path, data: bytes, target: str) -> Pointer:
    """The pointer in ``data``; anything malformed or non-canonical refuses, naming the file."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ReleaseError(f"{path}: pointer is not valid JSON") from None
    if (
        not isinstance(obj, dict)
        or sorted(k for k in obj if k != SEAL) != POINTER_KEYS
        or obj["schema"] != POINTER_SCHEMA
    ):
        raise ReleaseError(f"{path}: not a {POINTER_SCHEMA} pointer (keys must be {', '.join(POINTER_KEYS)})")
    key = configured_key()
    _, problem = unsealed(obj, SEAL_DOMAIN, key)
    if problem is not None:
        raise ReleaseError(f"{path}: {problem}")
    gen = obj["generation"]
    if not isinstance(gen, int) or isinstance(gen, bool) or gen < 1:
        raise ReleaseError(f"{path}: generation must be an integer >= 1, not {gen!r}")
    ids_ok = all(isinstance(obj[k], str) and RELEASE_ID.match(obj[k]) for k in ("release_id", "ledger_head"))
    if not ids_ok or not (
        obj["previous"] is None or (isinstance(obj["previous"], str) and RELEASE_ID.match(obj["previous"]))
    ):
        raise ReleaseError(
            f"{path}: release_id, previous and ledger_head must be sha256:<64 hex> (previous may be null)"
        )
    if obj["target"] != target:
        raise ReleaseError(f"{path}: pointer names target {obj['target']!r}, not {target!r}")
    pointer = Pointer(target, obj["release_id"], gen, obj["previous"], obj["ledger_head"])
    if data != pointer_bytes(pointer, key):
        raise ReleaseError(f"{path}: bytes are not the canonical rendering of the pointer (edited by hand?)")
    return pointer


def pointer_bytes(pointer: Pointer, key: SealKey | None) -> bytes:
    """The file: canonical JSON of the pointer, sealed with ``key`` when one is given."""
    return canonical_bytes(sealed(pointer.as_dict(), SEAL_DOMAIN, key)) + b"\n"


def read_pointer(store: ReleaseStore, target: str) -> Pointer | None:
    """The target's pointer, or None when nothing was ever activated on it. Lock-free without an
    object store: the file is only ever replaced by an atomic rename."""
    path = store.pointer_path(target)
    try:
        with store.current(target):  # with an object store: the store's pointer
            data = read_regular(path, MAX_POINTER_BYTES)  # never through a link, never waiting on a FIFO
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReleaseError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_pointer(path, data, target)


def current_generation(store: ReleaseStore, target: str) -> int:
    pointer = read_pointer(store, target)
    return 0 if pointer is None else pointer.generation


def write_pointer(store: ReleaseStore, pointer: Pointer, on_step: StepHook | None = None) -> None:
    """Replace the pointer file atomically (temp, fsync, rename, fsync dir); caller holds the lock."""
    step = on_step or _noop
    path = store.pointer_path(pointer.target)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)  # temps of killed writers; they never became the pointer
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(pointer_bytes(pointer, configured_key()))
            fh.flush()
            step("pointer_temp_written")
            os.fsync(fh.fileno())
        step("pointer_temp_fsynced")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    step("pointer_renamed")
    fsync_path(path.parent)
    step("pointer_dir_fsynced")


def check_generation(store: ReleaseStore, target: str, expected: int) -> Pointer | None:
    """The current pointer if its generation is ``expected``; ``ConflictError`` otherwise.
    Must be called under the target's lock, immediately before the swap it guards."""
    pointer = read_pointer(store, target)
    current = 0 if pointer is None else pointer.generation
    if current != expected:
        raise ConflictError(
            f"target {target!r}: pointer is at generation {current}, expected {expected} "
            "(another activation or rollback changed it first); nothing was changed"
        )
    return pointer
