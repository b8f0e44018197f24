"""``vectors.arrow``: a bundle's vectors as one Arrow IPC file, readable without lancedb.

The lance table stays the store of record (and lancedb the engine for large tables); this file
holds the same rows' representation IDs and float32 vectors, in row order, so that opening a
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
    table = pa.table(
        {
            "representation_id": pa.array(representation_ids, type=pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1]),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_vectors_file(data: bytes) -> tuple[list[str], np.ndarray]:
    """(representation IDs, float32 matrix) from the file's bytes; ``ValueError`` naming the
    file and the rule when they are not this layout."""
    try:
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{VECTORS_FILE}: not an Arrow IPC file: {exc}") from None
    if table.schema.names != ["representation_id", "vector"]:
        raise ValueError(f"{VECTORS_FILE}: columns {table.schema.names}, expected representation_id and vector")
    kind = table.schema.field("vector").type
    if not pa.types.is_fixed_size_list(kind) or kind.value_type != pa.float32() or kind.list_size < 1:
        raise ValueError(f"{VECTORS_FILE}: vector column is {kind}, expected a fixed-size list of float32")
    if not pa.types.is_string(table.schema.field("representation_id").type):
        raise ValueError(f"{VECTORS_FILE}: representation_id column is not a string column")
    if table.column("representation_id").null_count or table.column("vector").null_count:
        raise ValueError(f"{VECTORS_FILE}: null values")
    column = table.column("vector").combine_chunks()
    if column.values.null_count:
        raise ValueError(f"{VECTORS_FILE}: null vector components")
    matrix = column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), kind.list_size)
    return table.column("representation_id").to_pylist(), np.ascontiguousarray(matrix, dtype=np.float32)
