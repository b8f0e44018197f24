"""Corpus connectors: BEIR-style JSONL(.gz) files, folders of Markdown/text files, folders of HTML
pages, folders of PDF files, and WordPress exports (WXR).

All yield ``SourceRecord``s (normalised, validated, with the file/line they came from) or raise
``CorpusError`` listing every problem as ``file:line [id=…]: rule``. Nothing is returned when any
record is bad, so a bad corpus can never be half-registered.

Reading is two steps so that callers can digest exactly what they parse: ``load_source`` reads the
bytes once (``ragpipe.corpus.source``), ``parse_source`` validates those bytes (``beir``,
``markdown``, ``html``, ``pdf``, ``wxr``). ``read_corpus`` does both, for callers that need no
digest.
"""

from __future__ import annotations

from pathlib import Path

from ragpipe.corpus.beir import parse_beir
from ragpipe.corpus.html import parse_html_tree
from ragpipe.corpus.markdown import parse_tree
from ragpipe.corpus.pdf import parse_pdf_tree
from ragpipe.corpus.records import DEFAULT_SOURCE_ROLE, CorpusRead, SourceRecord
from ragpipe.corpus.source import (
    MARKDOWN_SUFFIXES,
    BeirSource,
    CorpusFormat,
    Source,
    WxrSource,
    load_source,
    load_tree,
    read_regular_file,
)
from ragpipe.corpus.wxr import DEFAULT_WXR_STATUSES, parse_wxr

__all__ = [
    "DEFAULT_SOURCE_ROLE",
    "DEFAULT_WXR_STATUSES",
    "MARKDOWN_SUFFIXES",
    "CorpusFormat",
    "CorpusRead",
    "SourceRecord",
    "detect_format",
    "load_source",
    "parse_source",
    "read_beir",
    "read_corpus",
    "read_markdown_folder",
    "source_digest",
]


def detect_format(path: Path) -> CorpusFormat:
    """A folder is Markdown, a ``.xml`` file a WordPress export, any other file BEIR JSONL(.gz);
    HTML and PDF folders are named with ``--format``."""
    if path.is_dir():
        return "markdown"
    return "wxr" if path.name.lower().endswith(".xml") else "beir"


def parse_source(source: Source) -> CorpusRead:
    """Validate the bytes ``load_source`` read; raises ``CorpusError`` naming file/line/ID."""
    if isinstance(source, BeirSource):
        return parse_beir(source)
    if isinstance(source, WxrSource):
        return parse_wxr(source)
    if source.fmt == "html":
        return parse_html_tree(source)
    if source.fmt == "pdf":
        return parse_pdf_tree(source)
    return parse_tree(source)


def read_beir(path: Path) -> CorpusRead:
    return parse_beir(BeirSource(path=path, raw=read_regular_file(path)))


def read_markdown_folder(root: Path) -> CorpusRead:
    return parse_tree(load_tree(root))


def read_corpus(path: Path, fmt: CorpusFormat, wxr_statuses: tuple[str, ...] = DEFAULT_WXR_STATUSES) -> CorpusRead:
    return parse_source(load_source(path, fmt, wxr_statuses))


def source_digest(path: Path, fmt: CorpusFormat, wxr_statuses: tuple[str, ...] = DEFAULT_WXR_STATUSES) -> str:
    """Digest of the raw source bytes, recorded at registration to keep a revision immutable."""
    return load_source(path, fmt, wxr_statuses).digest()
