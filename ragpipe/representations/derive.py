"""Representations: retrieval text derived from exactly one parent chunk.

Kinds: ``raw`` (the chunk text) and ``title_breadcrumb`` (document title and heading path, then
the chunk text). Whatever is retrieved through a representation, evidence is its parent chunk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from ragpipe.chunking.models import Chunk
from ragpipe.corpus.models import Document
from ragpipe.kernel.ids import ChunkId, ContentDigest, DocumentId, RepresentationId, SpecId, bytes_digest, content_id

RepresentationKind = Literal["raw", "title_breadcrumb"]


class Representation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    representation_id: RepresentationId
    chunk_id: ChunkId
    document_id: DocumentId
    kind: RepresentationKind
    text: str
    digest: ContentDigest
    producer_spec_id: SpecId


def breadcrumb_text(title: str, heading_path: tuple[str, ...], text: str) -> str:
    """``title > heading > subheading`` then a blank line and the chunk text."""
    crumbs = [title] if title else []
    crumbs += [h for h in heading_path if h and h != title]
    return (" > ".join(crumbs) + "\n\n" + text) if crumbs else text


def derive_representations(
    documents: list[Document], chunks: list[Chunk], kinds: tuple[RepresentationKind, ...], producer_spec_id: SpecId
) -> list[Representation]:
    titles = {d.document_id: d.title for d in documents}
    out: list[Representation] = []
    for chunk in chunks:
        for kind in kinds:
            text = (
                chunk.text
                if kind == "raw"
                else breadcrumb_text(titles[chunk.document_id], chunk.heading_path, chunk.text)
            )
            digest = ContentDigest(bytes_digest(text.encode("utf-8")))
            rep_id = content_id(
                "representation",
                1,
                {"chunk_id": chunk.chunk_id, "kind": kind, "producer_spec_id": producer_spec_id, "digest": digest},
            )
            out.append(
                Representation(
                    representation_id=RepresentationId(rep_id),
                    chunk_id=chunk.chunk_id,
                    document_id=chunk.document_id,
                    kind=kind,
                    text=text,
                    digest=digest,
                    producer_spec_id=producer_spec_id,
                )
            )
    return out


REPRESENTATIONS_SCHEMA = pa.schema(
    [
        ("representation_id", pa.string()),
        ("chunk_id", pa.string()),
        ("document_id", pa.string()),
        ("kind", pa.string()),
        ("text", pa.string()),
        ("digest", pa.string()),
        ("producer_spec_id", pa.string()),
    ]
)


def write_representations(path: Path, reps: list[Representation]) -> None:
    pq.write_table(pa.Table.from_pylist([r.model_dump(mode="json") for r in reps], schema=REPRESENTATIONS_SCHEMA), path)


def read_representations(path: Path) -> list[Representation]:
    rows = pq.read_table(path, schema=REPRESENTATIONS_SCHEMA).to_pylist()
    return [
        Representation(
            representation_id=RepresentationId(r["representation_id"]),
            chunk_id=ChunkId(r["chunk_id"]),
            document_id=DocumentId(r["document_id"]),
            kind=r["kind"],
            text=r["text"],
            digest=ContentDigest(r["digest"]),
            producer_spec_id=SpecId(r["producer_spec_id"]),
        )
        for r in rows
    ]


def representation_set_digest(reps: list[Representation]) -> ContentDigest:
    rows = sorted([r.representation_id, r.chunk_id, r.kind, r.digest] for r in reps)
    return ContentDigest(content_id("representation-set", 1, rows))
