"""Atomic publication of immutable directories and files (docs/trust.md).

A directory is populated in a temporary sibling, every file and directory in it is fsynced, and it
is renamed into place with ``renameat2(RENAME_NOREPLACE)`` so an existing target is never
replaced; then the parent is fsynced. A reader therefore sees either no target or a complete one.
Two racing publishers of one name both succeed: the loser finds the winner's directory, discards
its own temp and reports ``existing``. Temp siblings left by killed publishers are recognisable
(``.tmp-<name>-<pid>-<token>``) and removed by the next publisher once their pid is gone.

Removal is the mirror image (``discard``): the target is first renamed to a ``.trash-`` sibling
(atomic: it vanishes from its name at once), then deleted; a crash in between leaves only the
``.trash-`` sibling, which is garbage by construction.

``on_step`` is called with a step name at every point where a crash would leave a distinct state
on disk; failure-injection tests kill the process there.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
from collections.abc import Callable
from enum import Enum
from pathlib import Path

StepHook = Callable[[str], None]

PUBLISH_STEPS = (
    "temp_created",
    "data_written",
    "manifest_written",
    "files_fsynced",
    "dirs_fsynced",
    "renamed",
    "parent_fsynced",
)

# The points of ``write_file_atomic`` where a crash leaves a distinct state on disk.
FILE_STEPS = ("file_temp_written", "file_renamed", "file_parent_fsynced")

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True)


class PublishOutcome(str, Enum):
    published = "published"
    existing = "existing"


def _noop(_: str) -> None:
    return None


def fsync_path(path: Path) -> None:
    """fsync a file or directory by path."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_noreplace(src: Path, dst: Path) -> bool:
    """Rename ``src`` to ``dst`` unless ``dst`` exists. True if renamed, False if ``dst`` existed."""
    rc = _libc.renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EEXIST, errno.ENOTEMPTY):
        return False
    raise OSError(err, f"renameat2({src} -> {dst}): {os.strerror(err)}")


def pid_alive(pid: int) -> bool:
    """True if a process ``pid`` exists on this machine (or may: it is not ours to signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(parent: Path) -> list[Path]:
    """Remove temp siblings in ``parent`` whose publishing process no longer exists."""
    removed = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if not entry.name.startswith(".tmp-"):
            continue
        pid = temp_owner_pid(entry.name)
        if pid is None:
            continue
        if pid != os.getpid() and not pid_alive(pid):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def _temp_sibling(final: Path, prefix: str = ".tmp-") -> Path:
    return final.parent / f"{prefix}{final.name}-{os.getpid()}-{secrets.token_hex(4)}"


def temp_owner_pid(name: str) -> int | None:
    """The pid in a ``.tmp-<name>-<pid>-<token>`` (or ``.trash-``) entry name, if there is one."""
    try:
        return int(name.rsplit("-", 2)[-2])
    except (ValueError, IndexError):
        return None


def tree_size(path: Path) -> int:
    """Bytes held by the files under ``path`` (or by the file ``path``); symlinks not followed."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size
    total = 0
    for root, _, filenames in os.walk(path):
        for name in filenames:
            total += (Path(root) / name).lstat().st_size
    return total


def discard(path: Path, on_step: StepHook | None = None) -> None:
    """Remove a file or directory crash-safely: rename it to a ``.trash-`` sibling, fsync the
    parent, then delete the sibling. After any crash ``path`` is either intact or gone, and what
    remains is a ``.trash-`` sibling that can be deleted at any time."""
    step = on_step or _noop
    trash = _temp_sibling(path, ".trash-")
    os.rename(path, trash)
    fsync_path(path.parent)
    step("trashed")
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash)
    else:
        trash.unlink()
    step("deleted")


def publish_directory(
    final: Path,
    write_data: Callable[[Path], None],
    write_manifest: Callable[[Path], None],
    on_step: StepHook | None = None,
    validate: Callable[[Path], None] | None = None,
) -> PublishOutcome:
    """Publish a directory at ``final`` atomically; never replace an existing one.

    ``write_data(tmp)`` writes the payload files, then ``write_manifest(tmp)`` writes the manifest
    last (so a temp dir with a manifest is known to hold all data); ``validate(tmp)`` may then
    raise to abandon the publication before anything is visible. If ``final`` already exists
    nothing is written and ``existing`` is returned; the caller must verify what is there.
    """
    step = on_step or _noop
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final.parent)
    if final.exists() or final.is_symlink():
        return PublishOutcome.existing
    tmp = _temp_sibling(final)
    tmp.mkdir()
    try:
        step("temp_created")
        write_data(tmp)
        step("data_written")
        write_manifest(tmp)
        step("manifest_written")
        if validate is not None:
            validate(tmp)
        dirs = [tmp]
        for root, dirnames, filenames in os.walk(tmp):
            for name in filenames:
                fsync_path(Path(root) / name)
            dirs.extend(Path(root) / d for d in dirnames)
        step("files_fsynced")
        for d in reversed(dirs):
            fsync_path(d)
        step("dirs_fsynced")
        if not rename_noreplace(tmp, final):
            shutil.rmtree(tmp, ignore_errors=True)
            return PublishOutcome.existing
        step("renamed")
        fsync_path(final.parent)
        step("parent_fsynced")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PublishOutcome.published


def write_file_atomic(
    path: Path, data: bytes, *, replace: bool = True, sync: bool = True, on_step: StepHook | None = None
) -> bool:
    """Write ``data`` to ``path`` via temp + fsync + rename, then fsync the parent.

    With ``replace=True`` (a pointer file) the rename is ``os.replace``: a reader sees the old or
    the new bytes, never a mix. With ``replace=False`` an existing file is kept and False is
    returned. ``on_step`` is called at each of ``FILE_STEPS``. ``sync=False`` skips both fsyncs:
    the rename still makes the write all-or-nothing for readers and for a killed writer (the page
    cache survives a process), but a power loss may leave a cut or empty file — only for files
    verified on every load whose loss costs a recomputation (a cache entry), never a record.
    """
    step = on_step or _noop
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        step("file_temp_written")
        if replace:
            os.replace(tmp, path)
            done = True
        else:
            done = rename_noreplace(tmp, path)
            if not done:
                tmp.unlink()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    step("file_renamed")
    if sync:
        fsync_path(path.parent)
    step("file_parent_fsynced")
    return done
