"""The lancedb vector table: the only module that imports lancedb.

One row per representation with its vector, IDs, ``access_scopes`` and ``source_role``, so a
search can apply a ``where`` prefilter on scopes. No ANN index is trained: at the sizes ragpipe
targets an exact flat scan is fast and, unlike IVF/PQ, fully deterministic.
"""

from __future__ import annotations

from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa

from ragpipe.index.rows import IndexRow

TABLE_NAME = "representations"


def build_vector_index(directory: Path, rows: list[IndexRow], vectors: np.ndarray) -> int:
    """Write the lancedb table into folder ``directory``; returns its row count."""
    if len(rows) != len(vectors):
        raise ValueError(f"{len(rows)} rows but {len(vectors)} vectors")
    dim = vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    table = pa.table(
        {
            "representation_id": [r.representation_id for r in rows],
            "chunk_id": [r.chunk_id for r in rows],
            "document_id": [r.document_id for r in rows],
            "kind": [r.kind for r in rows],
            "access_scopes": pa.array([list(r.access_scopes) for r in rows], type=pa.list_(pa.string())),
            "source_role": [r.source_role for r in rows],
            "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
        }
    )
    db = lancedb.connect(str(directory))
    db.create_table(TABLE_NAME, data=table)
    return vector_row_count(directory)


def vector_row_count(directory: Path) -> int:
    return lancedb.connect(str(directory)).open_table(TABLE_NAME).count_rows()
