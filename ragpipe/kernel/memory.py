"""Hand memory a phase has freed back to the operating system (Linux, glibc).

A process that verifies a million-row bundle frees gigabytes between its phases — the streamed
tables' objects, the digests' rows, lance's read buffers — but glibc keeps freed heap memory for
later ``malloc`` calls, and grows the size above which it maps allocations of their own after
every large free, so most of it stays resident: the next phase, whose allocations come from other
allocators (Arrow's pool, lance's) or from other sizes, cannot reuse it, and a process's resident
size becomes the sum of its phases' peaks instead of the largest. ``release_free_memory`` asks
glibc to return every free page (``malloc_trim(0)``: the top of the heap and whole free pages
inside it); callers run it after a phase that freed much (docs/benchmarks.md, "Memory at a
million rows"). Nothing else about the allocator changes, so the query path's allocations cost
what they did. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_free_memory() -> None:
    """Return the C heap's free pages to the operating system (glibc's ``malloc_trim(0)``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
