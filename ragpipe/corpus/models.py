"""Documents and source snapshots."""

from __future__ import annotations

import re
from bisect import bisect_right

from pydantic import BaseModel, ConfigDict, Field

from ragpipe.corpus.metadata import Metadata, metadata_json
from ragpipe.kernel.ids import ContentDigest, DocumentId, content_id

NORMALIZATION = "utf8-nfc-lf/v1"
# ``\Z``, not ``$``: ``$`` also matches before a trailing newline, so "hr\n" would pass as a scope.
SCOPE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
REVISION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")


class Document(BaseModel):
    """One normalised source document. ``text`` is exact: chunk spans index its UTF-8 bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    document_id: DocumentId
    title: str
    text: str
    content_digest: ContentDigest
    access_scopes: tuple[str, ...]
    source_role: str
    metadata: Metadata = Field(default_factory=dict)
    # (byte offset in ``text`` where a page starts, page number), by offset, the first at 0; ()
    # for documents without pages
    pages: tuple[tuple[int, int], ...] = ()

    def pages_of(self, byte_start: int, byte_end: int) -> tuple[int, int] | None:
        """(first, last) page number of the span ``[byte_start, byte_end)``; None without pages."""
        return pages_of(self.pages, byte_start, byte_end)


def pages_of(pages: tuple[tuple[int, int], ...], byte_start: int, byte_end: int) -> tuple[int, int] | None:
    """``Document.pages_of`` for a document whose ``pages`` are these."""
    if not pages:
        return None
    starts = [start for start, _ in pages]
    first = bisect_right(starts, byte_start) - 1
    last = bisect_right(starts, max(byte_start, byte_end - 1)) - 1
    return pages[max(first, 0)][1], pages[max(last, 0)][1]


class Exclusion(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    document_id: str
    location: str
    reason: str


class NotKept(BaseModel):
    """A metadata key the sources gave that no document keeps, why, and where it was first met."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    reason: str
    documents: int
    first: str


class SnapshotSummary(BaseModel):
    """What ``source_snapshot`` records beside its documents."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    revision: str
    corpus_digest: ContentDigest
    default_scope: str | None
    normalization: str = NORMALIZATION
    documents: int
    excluded: list[Exclusion] = Field(default_factory=list)
    # metadata key -> {type name (``integer``, ``list<string>`` …): documents holding it}
    metadata_fields: dict[str, dict[str, int]] = Field(default_factory=dict)
    metadata_not_kept: list[NotKept] = Field(default_factory=list)


def corpus_digest(documents: list[Document], default_scope: str | None) -> ContentDigest:
    """Digest over the documents sorted by ID: every field that can change a result. A document
    with metadata or pages has one more element in its row, ``{"metadata": …, "pages": …}`` with
    what it has (typed metadata as ``corpus.metadata.metadata_json``), so corpora without either
    keep the digests they always had."""
    return corpus_digest_of_rows([corpus_digest_row(d) for d in documents], default_scope)


def corpus_digest_of_rows(rows: list[list], default_scope: str | None) -> ContentDigest:
    """``corpus_digest`` of the documents whose ``corpus_digest_row`` are ``rows`` (sorted here by
    document ID, in place: a reader that streams the documents keeps only these rows)."""
    rows.sort(key=lambda row: row[0])
    return ContentDigest(
        content_id("corpus", 1, {"normalization": NORMALIZATION, "default_scope": default_scope, "documents": rows})
    )


def corpus_digest_row(d: Document) -> list:
    """What ``corpus_digest`` takes of one document."""
    row: list = [d.document_id, d.content_digest, d.title, list(d.access_scopes), d.source_role]
    extra = {"metadata": metadata_json(d.metadata)} if d.metadata else {}
    if d.pages:
        extra["pages"] = [list(p) for p in d.pages]
    return row + [extra] if extra else row
