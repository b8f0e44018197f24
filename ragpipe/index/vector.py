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

from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.index.rows import IndexRow
from ragpipe.retrieval.fusion import Hit

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


def scope_predicate(scopes: tuple[str, ...]) -> str:
    """SQL prefilter for lancedb. Scope names are validated identifiers, never free text."""
    for s in scopes:
        if not SCOPE_PATTERN.match(s):
            raise ValueError(f"invalid scope name {s!r}")
    return "array_has_any(access_scopes, [" + ", ".join(f"'{s}'" for s in scopes) + "])"


class VectorSearcher:
    """Exact nearest-neighbour search over one bundle's lancedb table, scope-prefiltered."""

    def __init__(self, directory: Path, metric: str):
        self.table = lancedb.connect(str(directory)).open_table(TABLE_NAME)
        self.metric = metric

    def search(self, vector: np.ndarray, k: int, scopes: tuple[str, ...]) -> list[Hit]:
        if not scopes:
            return []
        result = (
            self.table.search(vector.astype(np.float32))
            .distance_type(self.metric)
            .where(scope_predicate(scopes), prefilter=True)
            .select(["representation_id", "chunk_id", "document_id", "_distance"])
            .limit(k)
            .to_arrow()
        )
        ids = result.column("representation_id").to_pylist()
        chunks = result.column("chunk_id").to_pylist()
        docs = result.column("document_id").to_pylist()
        distances = result.column("_distance").to_pylist()
        # cosine/dot distances are 1 - similarity; l2 is a distance: negate so higher is better.
        to_score = (lambda d: -d) if self.metric == "l2" else (lambda d: 1.0 - d)
        return [
            Hit(channel="vector", representation_id=r, chunk_id=c, document_id=d, score=float(to_score(x)))
            for r, c, d, x in zip(ids, chunks, docs, distances)
        ]
