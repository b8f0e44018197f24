"""Read a corpus source's bytes exactly once, without following symbolic links.

Registration digests the bytes it validates, and the snapshot stage parses the bytes whose digest
it checked: both take a ``BeirSource``/``TreeSource`` (the bytes in memory) from here, digest it and
parse that same object, so a file swapped between digest and parse can never be parsed unverified.

Markdown folders are walked with directory file descriptors (``openat`` with ``O_NOFOLLOW``).
Every entry that is not read is excluded with a reason, never skipped silently:

- a hidden entry (name starting with ``.``) is not read: ``hidden file: not read``, or for a
  directory ``hidden directory: not walked`` (nothing inside it is listed);
- a regular file is read when its name ends in ``.md``, ``.markdown`` or ``.txt`` in any letter case
  (``PAY.MD`` is read: the suffix names a format, and on case-insensitive file systems its case is
  an accident); any other regular file is excluded with ``NOT_MARKDOWN_REASON``;
- a symbolic link (to a file, a directory or nothing) is never followed: it is excluded with the
  reason ``symbolic link: not followed``; nothing outside the root is ever opened;
- a special file (FIFO, socket, device) is never opened (opening a FIFO blocks): it is excluded
  with the reason ``special file (<kind>): not read``;
- an entry name that is not valid UTF-8 (whatever the entry) is a problem naming the escaped path.

The root itself is the operator's choice and is opened as given (registration resolves it).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.rules import escape_controls
from ragpipe.kernel.ids import bytes_digest, content_id

CorpusFormat = Literal["beir", "markdown"]
MARKDOWN_SUFFIXES = (".md", ".markdown", ".txt")
SYMLINK_REASON = "symbolic link: not followed"
HIDDEN_FILE_REASON = "hidden file: not read"
HIDDEN_DIRECTORY_REASON = "hidden directory: not walked"
NOT_MARKDOWN_REASON = "not a .md, .markdown or .txt file (any letter case): not read"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: if a FIFO is swapped in after the lstat, opening it must not block.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


@dataclass(frozen=True)
class BeirSource:
    """The bytes of a BEIR JSONL(.gz) file as stored (compressed if ``.gz``)."""

    path: Path
    raw: bytes
    problems: tuple[str, ...] = ()  # reading a single file either works or raises

    def digest(self) -> str:
        return bytes_digest(self.raw)


@dataclass(frozen=True)
class SourceFile:
    rel: str  # POSIX path relative to the root, exactly as on disk (valid UTF-8)
    path: Path
    data: bytes


@dataclass(frozen=True)
class SkippedEntry:
    rel: str  # POSIX path relative to the root, exactly as on disk (valid UTF-8)
    path: Path
    reason: str


@dataclass(frozen=True)
class TreeSource:
    """The Markdown/text files of a folder (sorted by relative path), its excluded entries and the
    problems met while walking it (bad names, unreadable entries)."""

    root: Path
    files: tuple[SourceFile, ...]
    excluded: tuple[SkippedEntry, ...]
    problems: tuple[str, ...]

    def digest(self) -> str:
        """Every file's relative path and bytes digest, and every exclusion with its reason: a
        symlink added after registration changes the snapshot's exclusions, hence the digest."""
        files = [[f.rel, bytes_digest(f.data)] for f in self.files]
        excluded = [[e.rel, e.reason] for e in self.excluded]
        return content_id("source-tree", 2, {"files": files, "excluded": excluded})


Source = BeirSource | TreeSource


def is_markdown_name(name: str) -> bool:
    """A file read as a document: suffix ``.md``, ``.markdown`` or ``.txt`` in any letter case."""
    return name.lower().endswith(MARKDOWN_SUFFIXES)


def _special_kind(mode: int) -> str:
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "unknown file type")


def escaped_path(path: Path | str) -> str:
    """A path for messages: bytes that are not UTF-8, and control characters, shown as ``\\xNN``."""
    return escape_controls(os.fsencode(path).decode("utf-8", "backslashreplace"))


def read_regular_file(path: Path) -> bytes:
    """Read a file the operator named (following links), refusing FIFOs and devices unopened."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise CorpusError([f"{escaped_path(path)}: not a regular file"])
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise CorpusError([f"{escaped_path(path)}: not a regular file"])
            return fh.read()
    except OSError as exc:
        raise CorpusError([f"{escaped_path(path)}: cannot read corpus file: {exc.strerror}"]) from None


class _Walk:
    """One walk of a folder: every entry is classified by ``lstat`` and opened relative to its
    directory's descriptor with ``O_NOFOLLOW``, so no path component is ever resolved through a
    link, even one swapped in after the listing."""

    def __init__(self, root: Path):
        self.root = root
        self.files: list[SourceFile] = []
        self.excluded: list[SkippedEntry] = []
        self.problems: list[str] = []

    def exclude(self, rel: str, reason: str) -> None:
        self.excluded.append(SkippedEntry(rel=rel, path=self.root / rel, reason=reason))

    def walk(self, dir_fd: int, prefix: str) -> None:
        with os.scandir(dir_fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            self.entry(dir_fd, entry, prefix + entry.name)

    def entry(self, dir_fd: int, entry: os.DirEntry, rel: str) -> None:
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except OSError as exc:  # removed since the directory was listed
            self.problems.append(f"{escaped_path(self.root / rel)}: cannot read: {exc.strerror}")
            return
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:
            self.problems.append(f"{escaped_path(self.root / rel)}: file name is not valid UTF-8")
            return
        if entry.name.startswith("."):
            self.exclude(rel, HIDDEN_DIRECTORY_REASON if stat.S_ISDIR(mode) else HIDDEN_FILE_REASON)
        elif stat.S_ISLNK(mode):
            self.exclude(rel, SYMLINK_REASON)
        elif stat.S_ISDIR(mode):
            self.directory(dir_fd, entry.name, rel)
        elif stat.S_ISREG(mode):
            if is_markdown_name(entry.name):
                self.regular(dir_fd, entry.name, rel)
            else:
                self.exclude(rel, NOT_MARKDOWN_REASON)
        else:
            self.exclude(rel, f"special file ({_special_kind(mode)}): not read")

    def directory(self, dir_fd: int, name: str, rel: str) -> None:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self.swapped_or_unreadable(rel, exc)
            return
        try:
            self.walk(fd, rel + "/")
        except OSError as exc:
            self.problems.append(f"{escaped_path(self.root / rel)}: cannot read directory: {exc.strerror}")
        finally:
            os.close(fd)

    def regular(self, dir_fd: int, name: str, rel: str) -> None:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            self.swapped_or_unreadable(rel, exc)
            return
        with os.fdopen(fd, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if not stat.S_ISREG(mode):  # swapped for a FIFO/device after the lstat
                self.exclude(rel, f"special file ({_special_kind(mode)}): not read")
                return
            try:
                data = fh.read()
            except OSError as exc:
                self.problems.append(f"{escaped_path(self.root / rel)}: cannot read: {exc.strerror}")
                return
        self.files.append(SourceFile(rel=rel, path=self.root / rel, data=data))

    def swapped_or_unreadable(self, rel: str, exc: OSError) -> None:
        # ELOOP (file) / ENOTDIR (directory): the entry became a symlink after the lstat.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            self.exclude(rel, SYMLINK_REASON)
        else:
            self.problems.append(f"{escaped_path(self.root / rel)}: cannot read: {exc.strerror}")


def load_tree(root: Path) -> TreeSource:
    """Walk ``root`` once (see the module docstring) and hold every Markdown file's bytes."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        reasons = {errno.ENOTDIR: "not a directory", errno.ENOENT: "does not exist"}
        reason = reasons.get(exc.errno or 0, f"cannot read: {exc.strerror}")
        raise CorpusError([f"{escaped_path(root)}: {reason}"]) from None
    walk = _Walk(root)
    try:
        walk.walk(root_fd, "")
    except OSError as exc:
        walk.problems.append(f"{escaped_path(root)}: cannot read directory: {exc.strerror}")
    finally:
        os.close(root_fd)
    return TreeSource(
        root=root,
        files=tuple(sorted(walk.files, key=lambda f: f.rel)),
        excluded=tuple(sorted(walk.excluded, key=lambda e: e.rel)),
        problems=tuple(walk.problems),
    )


def load_source(path: Path, fmt: CorpusFormat) -> Source:
    """The source's bytes, read once; raises ``CorpusError`` if the path cannot be read at all."""
    if fmt == "beir":
        if path.is_dir():
            raise CorpusError([f"{escaped_path(path)}: is a directory; --format beir expects a JSONL(.gz) file"])
        return BeirSource(path=path, raw=read_regular_file(path))
    return load_tree(path)
