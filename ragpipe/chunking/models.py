"""Chunks and their IDs, Parquet form and set digest."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from ragpipe.kernel.ids import ChunkId, ContentDigest, DocumentId, SpecId, content_id, require


class Chunk(BaseModel):
    """``text == document.text.encode()[byte_start:byte_end].decode()``, always."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_id: ChunkId
    document_id: DocumentId
    ordinal: int
    byte_start: int
    byte_end: int
    text: str
    digest: ContentDigest
    chunker_spec_id: SpecId
    heading_path: tuple[str, ...] = ()


def make_chunk_id(
    document_id: DocumentId, document_digest: ContentDigest, chunker_spec_id: SpecId, byte_start: int, byte_end: int
) -> ChunkId:
    """Chunk ID from the document (ID and content digest), the chunker spec and the span.

    The document ID is included so two documents with identical text still get distinct chunks.
    """
    return ChunkId(
        content_id(
            "chunk",
            1,
            {
                "document_id": require(document_id, DocumentId),
                "document_digest": require(document_digest, ContentDigest),
                "chunker_spec_id": require(chunker_spec_id, SpecId),
                "span": [byte_start, byte_end],
            },
        )
    )


CHUNKS_SCHEMA = pa.schema(
    [
        ("chunk_id", pa.string()),
        ("document_id", pa.string()),
        ("ordinal", pa.int32()),
        ("byte_start", pa.int64()),
        ("byte_end", pa.int64()),
        ("text", pa.string()),
        ("digest", pa.string()),
        ("chunker_spec_id", pa.string()),
        ("heading_path", pa.list_(pa.string())),
    ]
)


def chunks_table(chunks: list[Chunk]) -> pa.Table:
    return pa.Table.from_pylist([c.model_dump(mode="json") for c in chunks], schema=CHUNKS_SCHEMA)


def write_chunks(path: Path, chunks: list[Chunk]) -> None:
    pq.write_table(chunks_table(chunks), path)


def read_chunks(path: Path) -> list[Chunk]:
    return chunks_from_arrow(pq.read_table(path, schema=CHUNKS_SCHEMA))


def chunks_from_arrow(table: pa.Table | pa.RecordBatch) -> list[Chunk]:
    """The chunks of an Arrow table (or one record batch of it) in ``CHUNKS_SCHEMA``."""
    return [
        Chunk(
            chunk_id=ChunkId(r["chunk_id"]),
            document_id=DocumentId(r["document_id"]),
            ordinal=r["ordinal"],
            byte_start=r["byte_start"],
            byte_end=r["byte_end"],
            text=r["text"],
            digest=ContentDigest(r["digest"]),
            chunker_spec_id=SpecId(r["chunker_spec_id"]),
            heading_path=tuple(r["heading_path"]),
        )
        for r in table.to_pylist()
    ]


def chunk_set_digest(chunks: list[Chunk]) -> ContentDigest:
    """Digest of the chunk set: every chunk's ID, span, ordinal, heading path and text digest."""
    return chunk_set_digest_of_rows([chunk_digest_row(c) for c in chunks])


def chunk_digest_row(c: Chunk) -> list:
    """What ``chunk_set_digest`` takes of one chunk (a reader that streams the chunks keeps these)."""
    return [c.chunk_id, c.document_id, c.ordinal, c.byte_start, c.byte_end, c.digest, list(c.heading_path)]


def chunk_set_digest_of_rows(rows: list[list]) -> ContentDigest:
    """``chunk_set_digest`` of the chunks whose ``chunk_digest_row`` are ``rows`` (sorted here, in place)."""
    rows.sort()
    return ContentDigest(content_id("chunk-set", 1, rows))
