"""Corpus bounds: how large one document, one revision's document count and its text may be.

Registration checks them on the parsed, normalised records, before anything is written, so a
corpus beyond them is refused like any other bad input — every violation one line, naming the
document (``file[:line] [id=…]``) or the source, the size, the limit and the flag that sets it —
and never reaches chunking and embedding (one 115 MB document was 240,000 texts to embed). They
are guards, not identity: a revision within them is the same revision whatever they are.

Formats with files of their own also bound each file's bytes before reading it
(``ragpipe.corpus.source.DOCUMENT_BYTE_LIMITS``), and every YAML or JSON a corpus holds is bound in
nesting depth (64 levels: ``ragpipe.kernel.strict_load``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ragpipe.corpus.metadata import metadata_json
from ragpipe.corpus.records import SourceRecord
from ragpipe.corpus.rules import shown_id
from ragpipe.kernel.canonical import canonical_bytes

MIB = 1024 * 1024
_SHOWN = 20


@dataclass(frozen=True)
class CorpusBounds:
    document_bytes: int = 8 * MIB  # UTF-8 bytes of one document's normalised text and its metadata
    documents: int = 1_000_000  # documents one revision may hold
    corpus_bytes: int = 4096 * MIB  # UTF-8 bytes of all documents' text together


DEFAULT_BOUNDS = CorpusBounds()


def _bytes(n: int) -> str:
    return f"{n:,} bytes"


def bound_problems(records: list[SourceRecord], source: str, bounds: CorpusBounds) -> list[str]:
    """Every bound ``records`` break (module docstring); empty when within them. Per-document
    problems are listed for the first 20 documents, then counted."""
    problems: list[str] = []
    total = 0
    large: list[str] = []
    for record in records:
        # metadata counts with the text: every hit carries it (256 keys of 1,024 long strings would
        # otherwise be gigabytes outside every bound)
        meta = len(canonical_bytes(metadata_json(record.metadata))) if record.metadata else 0
        size = len(record.text.encode("utf-8")) + meta
        total += size
        if size > bounds.document_bytes:
            what = "document text and metadata are" if meta else "document text is"
            large.append(
                f"{record.location} [id={shown_id(record.document_id)}]: {what} {_bytes(size)} "
                f"(limit {_bytes(bounds.document_bytes)}: --max-document-bytes)"
            )
    problems += large[:_SHOWN]
    if len(large) > _SHOWN:
        problems.append(f"{source}: … and {len(large) - _SHOWN} more documents over --max-document-bytes")
    if len(records) > bounds.documents:
        problems.append(f"{source}: {len(records):,} documents (limit {bounds.documents:,}: --max-documents)")
    if total > bounds.corpus_bytes:
        problems.append(
            f"{source}: the documents' text is {_bytes(total)} (limit {_bytes(bounds.corpus_bytes)}: --max-corpus-bytes)"
        )
    return problems
