"""Reading one file of a folder others can write: never through a link, never waiting on a FIFO.

``read_regular(path, max_bytes)`` opens ``path`` once with ``O_NOFOLLOW | O_NONBLOCK`` — a
symbolic link is refused instead of followed, a FIFO or device opens without blocking — checks on
that descriptor that it is a regular file of at most ``max_bytes``, and reads it through the same
descriptor, so a file swapped for a link or a FIFO between a listing and the read is refused,
not followed or waited on. Every refusal is a ``NotARegularFile`` (an ``OSError``) whose message
names the rule; ``FileNotFoundError`` passes through.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotARegularFile(OSError):
    """The path is a link, a FIFO, a device, a folder or larger than allowed (the message says
    which; ``link``: it is a symbolic link)."""

    def __init__(self, message: str, *, link: bool = False):
        super().__init__(message)
        self.link = link


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` (module docstring)."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symbolic link
            raise NotARegularFile("a symbolic link (never followed)", link=True) from None
        raise
    try:
        info = os.fstat(fd)  # before fdopen, which refuses a folder with an error of its own
        if not stat.S_ISREG(info.st_mode):
            raise NotARegularFile(f"not a regular file ({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise NotARegularFile(f"{info.st_size} bytes, more than the {max_bytes} allowed")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # grew while it was read
        raise NotARegularFile(f"more than the {max_bytes} bytes allowed")
    return data


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"
