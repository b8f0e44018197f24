"""Documents and source snapshots."""

from __future__ import annotations

import re

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
    """Digest over the documents sorted by ID: every field that can change a result. A document's
    row carries its typed metadata (``corpus.metadata.metadata_json``) when it has any, so corpora
    without metadata keep the digests they always had."""
    rows = [_digest_row(d) for d in sorted(documents, key=lambda d: d.document_id)]
    return ContentDigest(
        content_id("corpus", 1, {"normalization": NORMALIZATION, "default_scope": default_scope, "documents": rows})
    )


def _digest_row(d: Document) -> list:
    row = [d.document_id, d.content_digest, d.title, list(d.access_scopes), d.source_role]
    return row + [metadata_json(d.metadata)] if d.metadata else row
