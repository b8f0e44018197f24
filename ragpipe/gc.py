"""Garbage collection: remove stage versions and bundles that nothing references any more.

Roots are the ``latest.json`` pointer of every (revision, stage) in the workspace, plus
``extra_roots``: bundle IDs to keep besides (releases will pass the bundle IDs they pin; a bundle
is self-contained, so the stage versions that built it need not stay). Kept are:

- the version folder each pointer names, and, following the ``inputs`` recorded in kept versions,
  the upstream versions they were built from (so a kept output's lineage stays on disk);
- the bundle each kept ``index_bundle`` version names (its data version is the bundle ID), wherever
  else that bundle is no longer latest: a bundle stays while any revision points at it;
- every bundle whose ID is an extra root;
- every bundle a live process holds a lease on (``ragpipe.kernel.leases``: a server serving it),
  whatever its release history says.

Removed are every other version folder under ``work/<revision>/<stage>/`` and every other bundle
under ``bundles/``, ``.trash-`` siblings (garbage by construction), and ``.tmp-`` siblings older
than ``tmp_min_age`` whose publishing process is gone. Nothing else is touched: not the registry,
not the embedding cache, not the query-graph cache (``query_graphs/``: a query re-creates a missing
entry), not a name ragpipe did not create.

Collection holds the workspace lock exclusively (stage materializations hold it shared), so it
never runs while a stage has published a version but not yet pointed at it, and it refuses rather
than waits when a materialization is running. Removal is crash-safe: each target is renamed to a
``.trash-`` sibling before it is deleted (``ragpipe.kernel.publish.discard``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ragpipe.kernel.leases import held_bundles
from ragpipe.kernel.locks import LockBusy
from ragpipe.kernel.publish import StepHook, discard, pid_alive, temp_owner_pid, tree_size
from ragpipe.kernel.workspace import Workspace
from ragpipe.stages.stage_store import (
    POINTER,
    STAGE_RECORD,
    VERSION_NAME,
    StageError,
    parse_record,
    version_name,
    workspace_lock,
)

DEFAULT_TMP_MIN_AGE = 3600.0  # seconds; a publisher on another machine sharing the folder may still be writing
KINDS = ("stage_version", "bundle", "trash", "temp")


class GcError(RuntimeError):
    pass


@dataclass(frozen=True)
class Removal:
    """One removed (or, in a dry run, removable) entry: ``path`` is relative to the workspace home."""

    kind: str  # one of KINDS
    path: str
    bytes: int


@dataclass(frozen=True)
class GcReport:
    dry_run: bool
    removed: tuple[Removal, ...]
    kept_stage_versions: int
    kept_bundles: int

    @property
    def removed_bytes(self) -> int:
        return sum(r.bytes for r in self.removed)

    def as_dict(self) -> dict[str, object]:
        return {
            "dry_run": self.dry_run,
            "removed": [asdict(r) for r in self.removed],
            "removed_bytes": self.removed_bytes,
            "kept_stage_versions": self.kept_stage_versions,
            "kept_bundles": self.kept_bundles,
        }


def _stage_dirs(ws: Workspace) -> list[Path]:
    if not ws.work.is_dir():
        return []
    return sorted(
        stage
        for rev in ws.work.iterdir()
        if rev.is_dir() and not rev.name.startswith(".")
        for stage in rev.iterdir()
        if stage.is_dir() and not stage.is_symlink() and not stage.name.startswith(".")
    )


def _inputs_of(folder: Path) -> dict[str, str]:
    path = folder / STAGE_RECORD
    return parse_record(path, path.read_bytes()).inputs if path.is_file() else {}


def _roots(ws: Workspace, extra_roots: frozenset[str]) -> tuple[set[Path], set[str]]:
    """(kept version folders, kept bundle directory names). Fails closed on an unreadable pointer."""
    bundles: set[str] = set()
    for root in extra_roots:
        try:
            bundles.add(version_name(root))
        except StageError:
            raise GcError(f"extra root {root!r} is not a bundle ID (sha256:<64 hex>)") from None
    kept: set[Path] = set()
    pending: list[tuple[Path, dict[str, str]]] = []
    for stage_dir in _stage_dirs(ws):
        pointer = stage_dir / POINTER
        if not pointer.exists():
            continue
        try:
            record = parse_record(pointer, pointer.read_bytes())
            hex_ = version_name(record.data_version)
        except (OSError, StageError) as exc:
            raise GcError(f"cannot read {pointer} ({exc}): fix or remove it; nothing was removed") from None
        if (record.revision, record.stage) != (stage_dir.parent.name, stage_dir.name):
            raise GcError(f"{pointer} names {record.stage} of revision {record.revision!r}; nothing was removed")
        if record.stage == "index_bundle":
            bundles.add(hex_)
        pending.append((stage_dir / hex_, record.inputs))
    while pending:  # lineage closure within each revision
        folder, inputs = pending.pop()
        if folder in kept:
            continue
        kept.add(folder)
        try:
            for upstream, version in inputs.items():
                up = folder.parent.parent / upstream / version_name(version)
                if up not in kept and up.is_dir():
                    pending.append((up, _inputs_of(up)))
        except StageError as exc:
            raise GcError(f"lineage of {folder}: {exc}; nothing was removed") from None
    return kept, bundles


def _leftover(entry: Path, now: float, tmp_min_age: float) -> str | None:
    """'trash' or 'temp' if ``entry`` is a removable leftover of a crashed remover or publisher."""
    if entry.name.startswith(".trash-"):
        return "trash"
    if entry.name.startswith(".tmp-"):
        pid = temp_owner_pid(entry.name)
        old = now - entry.lstat().st_mtime >= tmp_min_age
        if pid is not None and old and not pid_alive(pid):
            return "temp"
    return None


def _candidates(
    ws: Workspace, kept: set[Path], bundles: set[str], now: float, tmp_min_age: float
) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    parents = [*_stage_dirs(ws), *([ws.bundles] if ws.bundles.is_dir() else [])]
    for parent in parents:
        for entry in sorted(parent.iterdir()):
            if (kind := _leftover(entry, now, tmp_min_age)) is not None:
                found.append((kind, entry))
            elif VERSION_NAME.match(entry.name) and entry.is_dir() and not entry.is_symlink():
                if parent == ws.bundles and entry.name not in bundles:
                    found.append(("bundle", entry))
                elif parent != ws.bundles and entry not in kept:
                    found.append(("stage_version", entry))
    return sorted(found, key=lambda kp: (KINDS.index(kp[0]), kp[1].relative_to(ws.home).as_posix()))


def collect_garbage(
    ws: Workspace,
    extra_roots: frozenset[str] = frozenset(),
    *,
    dry_run: bool = False,
    tmp_min_age: float = DEFAULT_TMP_MIN_AGE,
    now: float | None = None,
    on_step: StepHook | None = None,
) -> GcReport:
    """Remove (or with ``dry_run`` only list) what no root references; see the module docstring.

    Raises ``GcError`` when a stage materialization holds the workspace lock, when a pointer cannot
    be read, or when an extra root is not a bundle ID; nothing is removed then.
    """
    try:
        with workspace_lock(ws, exclusive=True, blocking=False):
            kept, bundles = _roots(ws, frozenset(extra_roots) | held_bundles(ws))
            now = time.time() if now is None else now
            removed = []
            for kind, path in _candidates(ws, kept, bundles, now, tmp_min_age):
                removed.append(Removal(kind, path.relative_to(ws.home).as_posix(), tree_size(path)))
                if not dry_run:
                    discard(path, on_step)
            kept_versions = sum(1 for k in kept if k.is_dir())
            kept_bundles = sum(1 for b in bundles if (ws.bundles / b).is_dir())
    except LockBusy:
        raise GcError(
            f"stage materializations are running in {ws.home} ({ws.locks / 'workspace.lock'} is held): "
            "run garbage collection when they have finished"
        ) from None
    return GcReport(dry_run, tuple(removed), kept_versions, kept_bundles)
