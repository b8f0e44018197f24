"""Build a source snapshot from connector records, and store/load it as Parquet + JSON."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.corpus.connectors import CorpusRead, SourceRecord
from ragpipe.corpus.metadata import metadata_from_json, metadata_json
from ragpipe.corpus.models import Document, Exclusion, NotKept, SnapshotSummary, corpus_digest
from ragpipe.corpus.normalize import CorpusError
from ragpipe.corpus.records import unscoped_refusal
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import ContentDigest, DocumentId, bytes_digest
from ragpipe.spec import SnapshotSpec

DOCUMENTS_SCHEMA = pa.schema(
    [
        ("document_id", pa.string()),
        ("title", pa.string()),
        ("text", pa.string()),
        ("content_digest", pa.string()),
        ("access_scopes", pa.list_(pa.string())),
        ("source_role", pa.string()),
        # canonical JSON of ``corpus.metadata.metadata_json`` ({} when the document has none)
        ("metadata", pa.string()),
        ("pages", pa.list_(pa.list_(pa.int64(), 2))),  # (byte offset, page number); [] without pages
    ]
)


def _scopes_of(rec: SourceRecord, default_scope: str | None) -> tuple[str, ...]:
    """The record's declared scopes, or the default, which ``build_snapshot``'s
    ``unscoped_refusal`` has made sure exists; an empty declaration is refused, never defaulted."""
    if rec.access_scopes is None:
        return (str(default_scope),)
    if not rec.access_scopes:
        raise CorpusError([f"{rec.location} [id={rec.document_id}]: access_scopes is empty"])
    return rec.access_scopes


def build_snapshot(
    records: list[SourceRecord], revision: str, default_scope: str | None, spec: SnapshotSpec
) -> tuple[list[Document], SnapshotSummary]:
    """Apply the default scope and the exclusion policy; documents come back sorted by ID. With no
    default scope, a document that declares none is refused (``unscoped_refusal``), never guessed.

    The exclusions list the connector's (symbolic links, special files: ``CorpusRead.excluded``)
    and the policy's, sorted by ID.
    """
    refusal = unscoped_refusal(records, default_scope, f"revision {revision!r}")
    if refusal is not None:
        raise CorpusError([refusal])
    documents: list[Document] = []
    excluded: list[Exclusion] = list(records.excluded) if isinstance(records, CorpusRead) else []
    for rec in sorted(records, key=lambda r: r.document_id):
        if len(rec.text.strip()) < spec.min_text_chars:
            excluded.append(
                Exclusion(
                    document_id=rec.document_id,
                    location=rec.location,
                    reason=f"text shorter than min_text_chars={spec.min_text_chars}",
                )
            )
            continue
        documents.append(
            Document(
                document_id=DocumentId(rec.document_id),
                title=rec.title,
                text=rec.text,
                content_digest=ContentDigest(bytes_digest(rec.text.encode("utf-8"))),
                access_scopes=_scopes_of(rec, default_scope),
                source_role=rec.source_role,
                metadata=rec.metadata,
                pages=rec.pages,
            )
        )
    summary = SnapshotSummary(
        revision=revision,
        corpus_digest=corpus_digest(documents, default_scope),
        default_scope=default_scope,
        documents=len(documents),
        excluded=sorted(excluded, key=lambda e: (e.document_id, e.location)),
        metadata_fields=metadata_fields(documents),
        metadata_not_kept=not_kept_keys(records, {k for d in documents for k in d.metadata}),
    )
    return documents, summary


def metadata_fields(documents: list[Document]) -> dict[str, dict[str, int]]:
    """Per metadata key, how many documents hold it as each type (``integer``, ``list<string>`` …)."""
    fields: dict[str, Counter[str]] = {}
    for d in documents:
        for key, value in d.metadata.items():
            fields.setdefault(key, Counter())[value.type_name()] += 1
    return {k: dict(sorted(c.items())) for k, c in sorted(fields.items())}


def not_kept_keys(records: list[SourceRecord], kept: set[str]) -> list[NotKept]:
    """The keys some source gave that no document keeps (a key kept in one document and refused in
    another is a type conflict the metadata facts show), with the first reason and location."""
    found: dict[str, NotKept] = {}
    for rec in records:
        for key, reason in rec.not_kept:
            if key in kept:
                continue
            first = found.get(key)
            count = first.documents + 1 if first else 1
            found[key] = NotKept(
                key=key,
                reason=first.reason if first else reason,
                documents=count,
                first=first.first if first else f"{rec.location} [id={rec.document_id}]",
            )
    return [found[k] for k in sorted(found)]


def documents_table(documents: list[Document]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "document_id": str(d.document_id),
                "title": d.title,
                "text": d.text,
                "content_digest": str(d.content_digest),
                "access_scopes": list(d.access_scopes),
                "source_role": d.source_role,
                "metadata": canonical_bytes(metadata_json(d.metadata)).decode("utf-8"),
                "pages": [list(p) for p in d.pages],
            }
            for d in documents
        ],
        schema=DOCUMENTS_SCHEMA,
    )


def write_snapshot(directory: Path, documents: list[Document], summary: SnapshotSummary) -> None:
    pq.write_table(documents_table(documents), directory / "documents.parquet")
    (directory / "snapshot.json").write_text(summary.model_dump_json(indent=2), encoding="utf-8")


def read_snapshot_documents(path: Path) -> list[Document]:
    return documents_from_arrow(pq.read_table(path, schema=DOCUMENTS_SCHEMA))


def documents_from_arrow(table: pa.Table | pa.RecordBatch) -> list[Document]:
    """The documents of an Arrow table (or one record batch of it) in ``DOCUMENTS_SCHEMA``."""
    return [
        Document(
            document_id=DocumentId(r["document_id"]),
            title=r["title"],
            text=r["text"],
            content_digest=ContentDigest(r["content_digest"]),
            access_scopes=tuple(r["access_scopes"]),
            source_role=r["source_role"],
            metadata=metadata_from_json(json.loads(r["metadata"])),
            pages=tuple((start, page) for start, page in r["pages"]),
        )
        for r in table.to_pylist()
    ]


def read_snapshot(directory: Path) -> tuple[list[Document], SnapshotSummary]:
    documents = read_snapshot_documents(directory / "documents.parquet")
    summary = SnapshotSummary.model_validate(json.loads((directory / "snapshot.json").read_text(encoding="utf-8")))
    return documents, summary
