"""Read a corpus source's bytes exactly once, without following symbolic links.

Registration digests the bytes it validates, and the snapshot stage parses the bytes whose digest
it checked: both take a ``BeirSource``/``WxrSource``/``TreeSource`` (the bytes in memory) from
here, digest it and parse that same object, so a file swapped between digest and parse can never be
parsed unverified.

Folders (Markdown, HTML, PDF: one format per folder, ``TREE_SUFFIXES``) are walked with directory
file descriptors (``openat`` with ``O_NOFOLLOW``). Every entry that is not read is excluded with a
reason, never skipped silently:

- a hidden entry (name starting with ``.``) is not read: ``hidden file: not read``, or for a
  directory ``hidden directory: not walked`` (nothing inside it is listed);
- a regular file is read when its name ends in one of the format's suffixes in any letter case
  (``.md``, ``.mdx``, ``.markdown``, ``.txt``; ``.html``, ``.htm``; ``.pdf`` — ``PAY.MD`` is read: the suffix
  names a format, and on case-insensitive file systems its case is an accident); any other regular
  file is excluded with the format's reason (``NOT_MARKDOWN_REASON`` …);
- a file of a format with a byte bound (``DOCUMENT_BYTE_LIMITS``) that is larger is a problem
  naming the limit, and is never read into memory;
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ragpipe.corpus.models import Exclusion
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.records import CorpusRead, SourceRecord
from ragpipe.corpus.rules import escape_controls, id_problem, normalize_id, shown_id
from ragpipe.kernel.ids import bytes_digest, content_id

CorpusFormat = Literal["beir", "markdown", "html", "pdf", "wxr"]
TreeFormat = Literal["markdown", "html", "pdf"]
TREE_FORMATS: tuple[TreeFormat, ...] = ("markdown", "html", "pdf")
MARKDOWN_SUFFIXES = (".md", ".mdx", ".markdown", ".txt")
HTML_SUFFIXES = (".html", ".htm")
PDF_SUFFIXES = (".pdf",)
SYMLINK_REASON = "symbolic link: not followed"
HIDDEN_FILE_REASON = "hidden file: not read"
HIDDEN_DIRECTORY_REASON = "hidden directory: not walked"
NOT_MARKDOWN_REASON = "not a .md, .mdx, .markdown or .txt file (any letter case): not read"
NOT_HTML_REASON = "not a .html or .htm file (any letter case; --format html): not read"
NOT_PDF_REASON = "not a .pdf file (any letter case; --format pdf): not read"
# the files a folder of each format reads, and the reason every other regular file is excluded
TREE_SUFFIXES: dict[str, tuple[tuple[str, ...], str]] = {
    "markdown": (MARKDOWN_SUFFIXES, NOT_MARKDOWN_REASON),
    "html": (HTML_SUFFIXES, NOT_HTML_REASON),
    "pdf": (PDF_SUFFIXES, NOT_PDF_REASON),
}

_MIB = 1024 * 1024
# The one place for the byte bounds of one document, per format: an HTML page, a PDF file, one
# WordPress item's content (its HTML). A file beyond its bound is refused unread, one line naming
# the limit; an item beyond it refuses the export. Markdown and BEIR documents are their text: it
# is bound after parsing (``ragpipe.corpus.bounds``, ``--max-document-bytes``).
# (WXR: below libxml2's own 10 MB bound on one text node, which refuses larger ones as malformed.)
DOCUMENT_BYTE_LIMITS: dict[str, int] = {"html": 16 * _MIB, "pdf": 50 * _MIB, "wxr": 8 * _MIB}
# A WordPress export is one file holding every item: its own bound, checked before it is read.
WXR_FILE_BYTE_LIMIT = 512 * _MIB

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
class WxrSource:
    """The bytes of a WordPress export (WXR) file as stored, and the post statuses to read."""

    path: Path
    raw: bytes
    statuses: tuple[str, ...]  # sorted; ("publish",) unless told otherwise
    problems: tuple[str, ...] = ()  # reading a single file either works or raises

    def digest(self) -> str:
        """The file's bytes and the statuses read: the same export read with drafts is another
        source (another set of documents), so it is another revision."""
        return content_id("source-wxr", 1, {"file": bytes_digest(self.raw), "statuses": list(self.statuses)})


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
    """The files of a folder read in one format (sorted by relative path), its excluded entries and
    the problems met while walking it (bad names, unreadable entries, files over a byte bound)."""

    root: Path
    files: tuple[SourceFile, ...]
    excluded: tuple[SkippedEntry, ...]
    problems: tuple[str, ...]
    fmt: TreeFormat = "markdown"

    def digest(self) -> str:
        """Every file's relative path and bytes digest, and every exclusion with its reason: a
        symlink added after registration changes the snapshot's exclusions, hence the digest. A
        folder read as HTML or PDF also names its format (Markdown folders keep their digest)."""
        files = [[f.rel, bytes_digest(f.data)] for f in self.files]
        excluded = [[e.rel, e.reason] for e in self.excluded]
        body: dict = {"files": files, "excluded": excluded}
        if self.fmt != "markdown":
            body["format"] = self.fmt
        return content_id("source-tree", 2, body)


Source = BeirSource | WxrSource | TreeSource


def is_markdown_name(name: str) -> bool:
    """A file read as a document: suffix ``.md``, ``.markdown`` or ``.txt`` in any letter case."""
    return name.lower().endswith(MARKDOWN_SUFFIXES)


def limit_problem(size: int, fmt: str, what: str) -> str:
    """The rule a document of ``size`` bytes breaks, or '' within the format's bound."""
    limit = DOCUMENT_BYTE_LIMITS.get(fmt)
    if limit is None or size <= limit:
        return ""
    return f"{what} of {size} bytes is over the {fmt} document limit ({shown_bytes(limit)})"


def shown_bytes(limit: int) -> str:
    """``50 MiB`` for whole mebibytes, else ``64 bytes``."""
    return f"{limit // _MIB} MiB" if limit % _MIB == 0 else f"{limit} bytes"


def _special_kind(mode: int) -> str:
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "unknown file type")


def escaped_path(path: Path | str) -> str:
    """A path for messages: bytes that are not UTF-8, and control characters, shown as ``\\xNN``."""
    return escape_controls(os.fsencode(path).decode("utf-8", "backslashreplace"))


def read_regular_file(path: Path, limit: int | None = None) -> bytes:
    """Read a file the operator named (following links), refusing FIFOs and devices unopened, and
    a file over ``limit`` bytes without reading it into memory."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise CorpusError([f"{escaped_path(path)}: not a regular file"])
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise CorpusError([f"{escaped_path(path)}: not a regular file"])
            data = fh.read() if limit is None else fh.read(limit + 1)
            if limit is not None and len(data) > limit:
                size = max(os.fstat(fh.fileno()).st_size, len(data))
                raise CorpusError(
                    [
                        f"{escaped_path(path)}: file of {size} bytes is over the limit of {limit} bytes ({limit / _MIB:g} MiB)"
                    ]
                )
            return data
    except OSError as exc:
        raise CorpusError([f"{escaped_path(path)}: cannot read corpus file: {exc.strerror}"]) from None


class _Walk:
    """One walk of a folder: every entry is classified by ``lstat`` and opened relative to its
    directory's descriptor with ``O_NOFOLLOW``, so no path component is ever resolved through a
    link, even one swapped in after the listing."""

    def __init__(self, root: Path, fmt: TreeFormat = "markdown"):
        self.root = root
        self.fmt = fmt
        self.suffixes, self.not_read_reason = TREE_SUFFIXES[fmt]
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
            if entry.name.lower().endswith(self.suffixes):
                self.regular(dir_fd, entry.name, rel)
            else:
                self.exclude(rel, self.not_read_reason)
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
            limit = DOCUMENT_BYTE_LIMITS.get(self.fmt)
            try:  # never more than the bound (plus one byte, to know it is over)
                data = fh.read() if limit is None else fh.read(limit + 1)
                over = limit_problem(max(len(data), os.fstat(fh.fileno()).st_size), self.fmt, "file")
            except OSError as exc:
                self.problems.append(f"{escaped_path(self.root / rel)}: cannot read: {exc.strerror}")
                return
        if over:
            self.problems.append(f"{escaped_path(self.root / rel)} [id={shown_id(normalize_id(rel))}]: {over}")
            return
        self.files.append(SourceFile(rel=rel, path=self.root / rel, data=data))

    def swapped_or_unreadable(self, rel: str, exc: OSError) -> None:
        # ELOOP (file) / ENOTDIR (directory): the entry became a symlink after the lstat.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            self.exclude(rel, SYMLINK_REASON)
        else:
            self.problems.append(f"{escaped_path(self.root / rel)}: cannot read: {exc.strerror}")


def load_tree(root: Path, fmt: TreeFormat = "markdown") -> TreeSource:
    """Walk ``root`` once (see the module docstring) and hold the bytes of every file of ``fmt``."""
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        reasons = {errno.ENOTDIR: "not a directory", errno.ENOENT: "does not exist"}
        reason = reasons.get(exc.errno or 0, f"cannot read: {exc.strerror}")
        raise CorpusError([f"{escaped_path(root)}: {reason}"]) from None
    walk = _Walk(root, fmt)
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
        fmt=fmt,
    )


def load_source(path: Path, fmt: CorpusFormat, wxr_statuses: tuple[str, ...] = ("publish",)) -> Source:
    """The source's bytes, read once; raises ``CorpusError`` if the path cannot be read at all.
    ``wxr_statuses`` (sorted, checked by the caller) are the post statuses a WXR export is read for."""
    if fmt in ("beir", "wxr"):
        if path.is_dir():
            expects = "a JSONL(.gz) file" if fmt == "beir" else "a WordPress export (.xml) file"
            raise CorpusError([f"{escaped_path(path)}: is a directory; --format {fmt} expects {expects}"])
        if fmt == "beir":
            return BeirSource(path=path, raw=read_regular_file(path))
        return WxrSource(path=path, raw=read_regular_file(path, WXR_FILE_BYTE_LIMIT), statuses=tuple(wxr_statuses))
    return load_tree(path, fmt)


def no_documents_problem(tree: TreeSource, what: str, excluded: list[tuple[str, str]]) -> str:
    """The refusal of a folder with nothing left to read: ``root: no <what> found (N excluded: …)``,
    naming the first three exclusions ``(ID, reason)``."""
    message = f"{escaped_path(tree.root)}: no {what} found"
    if not excluded:
        return message
    shown = "; ".join(f"{shown_id(doc_id)}: {reason}" for doc_id, reason in excluded[:3])
    more = f"; … and {len(excluded) - 3} more" if len(excluded) > 3 else ""
    return f"{message} ({len(excluded)} excluded: {shown}{more})"


def tree_documents(tree: TreeSource, problems: list[str]) -> list[tuple[SourceFile, str, str]]:
    """Each file of ``tree`` with its document ID (the relative path, NFC) and its location for
    problems (``path [id=…]``); a file whose ID breaks a rule, or equals an earlier one after NFC,
    is a problem instead (the rules Markdown folders follow, for the other folder formats)."""
    out: list[tuple[SourceFile, str, str]] = []
    first_seen: dict[str, SourceFile] = {}
    for file in tree.files:
        doc_id = normalize_id(file.rel)
        where = f"{escaped_path(file.path)} [id={shown_id(doc_id)}]"
        rule = id_problem(doc_id)
        if rule:
            problems.append(f"{where}: {rule}")
            continue
        if doc_id in first_seen:
            first = first_seen[doc_id]
            problems.append(
                f"{where}: duplicate document ID after NFC normalization: {ascii(file.rel)} and "
                f"{ascii(first.rel)} (first seen at {escaped_path(first.path)})"
            )
            continue
        first_seen[doc_id] = file
        out.append((file, doc_id, where))
    return out


FileParser = Callable[[SourceFile, str, str, list[str], list[Exclusion]], SourceRecord | None]


def parse_folder(tree: TreeSource, parse_file: FileParser, what: str) -> CorpusRead:
    """A folder format's parse of the files ``tree`` holds (never re-reading them): each file with
    its ID and location goes to ``parse_file(file, id, where, problems, excluded)``, which returns
    its record or None (a problem or an exclusion added); every problem is raised at once, and a
    folder with nothing left is refused naming ``what`` it lacks (``no_documents_problem``)."""
    problems = list(tree.problems)
    excluded = [
        Exclusion(document_id=normalize_id(e.rel), location=str(e.path), reason=e.reason) for e in tree.excluded
    ]
    records = []
    for file, doc_id, where in tree_documents(tree, problems):
        record = parse_file(file, doc_id, where, problems, excluded)
        if record is not None:
            records.append(record)
    if not records and not problems:
        problems.append(no_documents_problem(tree, what, [(e.document_id, e.reason) for e in excluded]))
    if problems:
        raise CorpusError(problems)
    return CorpusRead(records, sorted(excluded, key=lambda e: (e.document_id, e.location)))
