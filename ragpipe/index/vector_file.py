"""``vectors.arrow``: a bundle's vectors as one Arrow IPC file, readable without lancedb.

The lance table stays the store of record; this file holds the same rows' representation IDs and float32 vectors, in row order, so that opening a
bundle for the in-memory engine (``ragpipe.index.vector_memory``) needs pyarrow only — importing
lancedb costs seconds, more than a whole ``ragpipe query`` may take. The bundle manifest lists it
with its size and SHA-256 like every file, and verification recomputes its embeddings digest and
checks it equals ``material.embeddings_digest``, the digest the lance table must also have
(``ragpipe.bundle.payload_checks``): the two stores hold the same vectors, bit for bit.

Schema: ``representation_id: string``, ``vector: fixed_size_list<float32>[dimension]``; one record
batch, uncompressed (it is read once per open, from bytes already digested).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

VECTORS_FILE = "vectors.arrow"


def vectors_file_bytes(representation_ids: list[str], vectors: np.ndarray) -> bytes:
    """The file for ``vectors`` (row ``i`` is representation ``representation_ids[i]``)."""
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or len(matrix) != len(representation_ids):
        raise ValueError(f"{matrix.shape} vectors for {len(representation_ids)} representation IDs")
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(representation_ids, type=pa.string()),
            pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1]),
        ],
        names=["representation_id", "vector"],
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)  # exactly one batch, also when there are no rows
    return sink.getvalue().to_pybytes()


def read_vectors_file(data: bytes, shape: tuple[int, int] | None = None) -> tuple[list[str], np.ndarray]:
    """(representation IDs, float32 matrix) from the file's bytes; ``ValueError`` naming the
    file and the rule when they are not exactly what ``vectors_file_bytes`` writes for them.

    Hostile bytes are refused before anything trusts them: one record batch, the schema above,
    no more than ``shape`` (rows, dimensions) — the manifest's — can hold uncompressed (a small
    compressed file never expands into memory), every buffer and offset validated in full before
    a value is read (a forged string offset would otherwise read outside the buffer), and the
    bytes must be the canonical rendering of what they hold (no compression, metadata or other
    batch layout: one file per content)."""
    try:
        reader = pa.ipc.open_file(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{VECTORS_FILE}: not an Arrow IPC file: {_line(exc)}") from None
    schema = reader.schema
    if schema.names != ["representation_id", "vector"]:
        raise ValueError(f"{VECTORS_FILE}: columns {schema.names}, expected representation_id and vector")
    kind = schema.field("vector").type
    if not pa.types.is_fixed_size_list(kind) or kind.value_type != pa.float32() or kind.list_size < 1:
        raise ValueError(f"{VECTORS_FILE}: vector column is {kind}, expected a fixed-size list of float32")
    if not pa.types.is_string(schema.field("representation_id").type):
        raise ValueError(f"{VECTORS_FILE}: representation_id column is not a string column")
    if reader.num_record_batches != 1:
        raise ValueError(f"{VECTORS_FILE}: {reader.num_record_batches} record batches, expected one")
    if shape is not None:
        rows, dimension = shape
        if kind.list_size != dimension:
            raise ValueError(f"{VECTORS_FILE}: {kind.list_size} dimensions, the manifest's vectors have {dimension}")
        if len(data) < rows * dimension * 4:
            raise ValueError(
                f"{VECTORS_FILE}: {len(data)} bytes cannot hold {rows} vectors of {dimension} float32 uncompressed"
            )
    try:
        batch = reader.get_batch(0)
        batch.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise ValueError(f"{VECTORS_FILE}: invalid record batch: {_line(exc)}") from None
    if shape is not None and batch.num_rows != shape[0]:
        raise ValueError(f"{VECTORS_FILE}: holds {batch.num_rows} rows, the manifest counts {shape[0]} vectors")
    if batch.column(0).null_count or batch.column(1).null_count or batch.column(1).values.null_count:
        raise ValueError(f"{VECTORS_FILE}: null values")
    column = batch.column(1)
    flat = column.values.slice(column.offset * kind.list_size, len(column) * kind.list_size)
    matrix = np.ascontiguousarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(
        len(column), kind.list_size
    )
    ids = batch.column(0).to_pylist()
    if vectors_file_bytes(ids, matrix) != data:
        raise ValueError(f"{VECTORS_FILE}: not in the canonical layout (compression, metadata or batch layout differ)")
    return ids, matrix


def _line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
