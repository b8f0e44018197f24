"""Chunkers over exact UTF-8 bytes.

``SlidingWindowChunker`` cuts windows of at most ``max_bytes`` with about ``overlap_bytes`` of
overlap, preferring to end at a line break, then a sentence end, then a space, and never inside a
UTF-8 character. ``MarkdownHeadingChunker`` splits at ATX headings (outside fenced code), keeps the
heading path of each section, and windows sections larger than ``max_bytes``; text without
headings is windowed as a single section, so it is a safe default for any corpus.
"""

from __future__ import annotations

import re
from typing import Protocol

from ragpipe.chunking.models import Chunk, make_chunk_id
from ragpipe.corpus.models import Document
from ragpipe.kernel.ids import ContentDigest, SpecId, bytes_digest
from ragpipe.spec import ChunkerSpec

_HEADING = re.compile(rb"^(#{1,6})[ \t]+(.*?)[ \t#]*$")
_FENCE = re.compile(rb"^(```|~~~)")


class Chunker(Protocol):
    def chunk(self, document: Document) -> list[Chunk]: ...


def _char_start(data: bytes, pos: int) -> int:
    """Move ``pos`` back to the first byte of the UTF-8 character containing it."""
    while 0 < pos < len(data) and (data[pos] & 0xC0) == 0x80:
        pos -= 1
    return pos


def _break_before(data: bytes, lo: int, hi: int) -> int:
    """Best cut in ``(lo, hi]``: after a newline, a sentence end, a space; else a char boundary."""
    window = data[lo:hi]
    for sep in (b"\n", b". ", b"? ", b"! ", b"; ", b" "):
        i = window.rfind(sep)
        if i >= 0:
            return lo + i + len(sep)
    return _char_start(data, hi)


def _start_after(data: bytes, pos: int, limit: int) -> int:
    """First position at or after ``pos`` that begins a word (after whitespace), before ``limit``."""
    if pos > 0 and data[pos - 1 : pos] in (b" ", b"\n"):
        return pos
    for sep in (b" ", b"\n"):
        i = data.find(sep, pos, limit)
        if i >= 0:
            return i + 1
    p = pos
    while p < limit and (data[p] & 0xC0) == 0x80:
        p += 1
    return p


def window_spans(data: bytes, lo: int, hi: int, max_bytes: int, overlap: int) -> list[tuple[int, int]]:
    """Spans ``[s, e)`` covering ``data[lo:hi]`` with windows of at most ``max_bytes``."""
    spans: list[tuple[int, int]] = []
    start = lo
    while start < hi:
        if hi - start <= max_bytes:
            spans.append((start, hi))
            break
        end = _break_before(data, start + max_bytes // 2, start + max_bytes)
        spans.append((start, end))
        nxt = _start_after(data, max(end - overlap, start + 1), end)
        start = nxt if nxt > start else end
    return [(s, e) for s, e in spans if data[s:e].strip()]


def _sections(data: bytes) -> list[tuple[int, int, tuple[str, ...]]]:
    """Heading sections ``(start, end, heading_path)`` of Markdown bytes."""
    sections: list[tuple[int, int, tuple[str, ...]]] = []
    stack: list[tuple[int, str]] = []
    start, path = 0, ()
    in_fence = False
    pos = 0
    for line in data.splitlines(keepends=True):
        body = line.rstrip(b"\n")
        if _FENCE.match(body):
            in_fence = not in_fence
        elif not in_fence and (m := _HEADING.match(body)):
            if pos > start:
                sections.append((start, pos, path))
            level = len(m.group(1))
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, m.group(2).decode("utf-8").strip()))
            start, path = pos, tuple(title for _, title in stack)
        pos += len(line)
    if pos > start:
        sections.append((start, pos, path))
    return sections


class _ByteChunker:
    def __init__(self, spec: ChunkerSpec, spec_id: SpecId):
        self.spec = spec
        self.spec_id = spec_id

    def _sections(self, data: bytes) -> list[tuple[int, int, tuple[str, ...]]]:
        return [(0, len(data), ())]

    def chunk(self, document: Document) -> list[Chunk]:
        data = document.text.encode("utf-8")
        chunks: list[Chunk] = []
        for lo, hi, path in self._sections(data):
            for s, e in window_spans(data, lo, hi, self.spec.max_bytes, self.spec.overlap_bytes):
                text = data[s:e]
                chunks.append(
                    Chunk(
                        chunk_id=make_chunk_id(document.document_id, document.content_digest, self.spec_id, s, e),
                        document_id=document.document_id,
                        ordinal=len(chunks),
                        byte_start=s,
                        byte_end=e,
                        text=text.decode("utf-8"),
                        digest=ContentDigest(bytes_digest(text)),
                        chunker_spec_id=self.spec_id,
                        heading_path=path,
                    )
                )
        return chunks


class SlidingWindowChunker(_ByteChunker):
    pass


class MarkdownHeadingChunker(_ByteChunker):
    def _sections(self, data: bytes) -> list[tuple[int, int, tuple[str, ...]]]:
        return _sections(data)


def make_chunker(spec: ChunkerSpec, spec_id: SpecId) -> Chunker:
    cls = {"markdown_heading": MarkdownHeadingChunker, "sliding_window": SlidingWindowChunker}[spec.kind]
    return cls(spec, spec_id)


def chunk_documents(documents: list[Document], chunker: Chunker) -> list[Chunk]:
    return [c for d in documents for c in chunker.chunk(d)]


def verify_chunks(documents: list[Document], chunks: list[Chunk]) -> list[str]:
    """Re-check every chunk against its source document; returns problems (empty = all good)."""
    by_id = {d.document_id: d for d in documents}
    data_cache: dict[str, bytes] = {}
    problems: list[str] = []
    seen: set[str] = set()
    for c in chunks:
        where = f"chunk {c.chunk_id} (document {c.document_id}, ordinal {c.ordinal})"
        if c.chunk_id in seen:
            problems.append(f"{where}: duplicate chunk ID")
        seen.add(c.chunk_id)
        doc = by_id.get(c.document_id)
        if doc is None:
            problems.append(f"{where}: unknown document")
            continue
        data = data_cache.get(doc.document_id)
        if data is None:  # encode each document once, not once per chunk (quadratic on a 20 MB document)
            data = data_cache[doc.document_id] = doc.text.encode("utf-8")
        if not 0 <= c.byte_start < c.byte_end <= len(data):
            problems.append(f"{where}: span [{c.byte_start}, {c.byte_end}) outside document of {len(data)} bytes")
            continue
        if data[c.byte_start : c.byte_end] != c.text.encode("utf-8"):
            problems.append(f"{where}: text differs from document bytes [{c.byte_start}, {c.byte_end})")
        if bytes_digest(c.text.encode("utf-8")) != c.digest:
            problems.append(f"{where}: digest does not match text")
        expected = make_chunk_id(doc.document_id, doc.content_digest, c.chunker_spec_id, c.byte_start, c.byte_end)
        if expected != c.chunk_id:
            problems.append(f"{where}: chunk ID does not derive from document digest, spec and span")
    return problems
