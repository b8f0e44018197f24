"""Corpus connectors: BEIR-style JSONL(.gz) files and folders of Markdown/text files.

Both yield ``SourceRecord``s (normalised, validated, with the file/line they came from) or raise
``CorpusError`` listing every problem as ``file:line [id=…]: rule``. Nothing is returned when any
record is bad, so a bad corpus can never be half-registered.

Reading is two steps so that callers can digest exactly what they parse: ``load_source`` reads the
bytes once (``ragpipe.corpus.source``), ``parse_source`` validates those bytes (``beir``,
``markdown``). ``read_corpus`` does both, for callers that need no digest.
"""

from __future__ import annotations

from pathlib import Path

from ragpipe.corpus.beir import parse_beir
from ragpipe.corpus.markdown import parse_tree
from ragpipe.corpus.records import DEFAULT_SOURCE_ROLE, CorpusRead, SourceRecord
from ragpipe.corpus.source import (
    MARKDOWN_SUFFIXES,
    BeirSource,
    CorpusFormat,
    Source,
    load_source,
    load_tree,
    read_regular_file,
)

__all__ = [
    "DEFAULT_SOURCE_ROLE",
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
    return "markdown" if path.is_dir() else "beir"


def parse_source(source: Source) -> CorpusRead:
    """Validate the bytes ``load_source`` read; raises ``CorpusError`` naming file/line/ID."""
    return parse_beir(source) if isinstance(source, BeirSource) else parse_tree(source)


def read_beir(path: Path) -> CorpusRead:
    return parse_beir(BeirSource(path=path, raw=read_regular_file(path)))


def read_markdown_folder(root: Path) -> CorpusRead:
    return parse_tree(load_tree(root))


def read_corpus(path: Path, fmt: CorpusFormat) -> CorpusRead:
    return parse_source(load_source(path, fmt))


def source_digest(path: Path, fmt: CorpusFormat) -> str:
    """Digest of the raw source bytes, recorded at registration to keep a revision immutable."""
    return load_source(path, fmt).digest()
