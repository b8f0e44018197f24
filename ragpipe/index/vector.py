"""The lancedb vector table: the only module that imports lancedb.

One row per representation with its vector, IDs, ``access_scopes`` and ``source_role``, so a
search can apply a ``where`` prefilter on scopes (backed by a LABEL_LIST scalar index).

Search is **exact**. Tables of ``IVF_MIN_ROWS`` rows or more get an IVF_FLAT index (full vectors,
no quantisation) and every search probes *all* its partitions, so every vector is scored exactly as
in a flat scan — the partitioning (k-means, not byte-reproducible) changes speed, never results. On
2 cores this path is about 3x faster than lancedb's plain flat scan (docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

import math

import lancedb
import numpy as np
import pyarrow as pa
from lancedb.index import IvfFlat, LabelList

from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.index.rows import IndexRow
from ragpipe.retrieval.fusion import Hit

TABLE_NAME = "representations"
IVF_MIN_ROWS = 1024
VECTOR_INDEX_NAME = "vector_idx"


def build_vector_index(directory: Path, rows: list[IndexRow], vectors: np.ndarray, metric: str = "cosine") -> int:
    """Write the lancedb table into folder ``directory``; returns its row count."""
    if len(rows) != len(vectors):
        raise ValueError(f"{len(rows)} rows but {len(vectors)} vectors")
    dim = vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    table = pa.table(
        {
            "row": pa.array(range(len(rows)), type=pa.uint32()),
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
    created = db.create_table(TABLE_NAME, data=table)
    created.create_index("access_scopes", config=LabelList())
    if (partitions := ivf_partitions(len(rows))) is not None:
        created.create_index("vector", config=IvfFlat(distance_type=metric, num_partitions=partitions), name=VECTOR_INDEX_NAME)
    return vector_row_count(directory)


def ivf_partitions(rows: int) -> int | None:
    """IVF partition count for a table of ``rows`` (None: too small, plain flat scan)."""
    return max(2, min(256, round(math.sqrt(rows) / 2))) if rows >= IVF_MIN_ROWS else None


def vector_row_count(directory: Path) -> int:
    return lancedb.connect(str(directory)).open_table(TABLE_NAME).count_rows()


def scope_predicate(scopes: tuple[str, ...]) -> str:
    """SQL prefilter for lancedb. Scope names are validated identifiers, never free text."""
    for s in scopes:
        if not SCOPE_PATTERN.match(s):
            raise ValueError(f"invalid scope name {s!r}")
    return "array_has_any(access_scopes, [" + ", ".join(f"'{s}'" for s in scopes) + "])"


class VectorSearcher:
    """Exact nearest-neighbour search over one bundle's lancedb table, scope-prefiltered.

    Hits are resolved through the integer ``row`` column and ``rows`` — (representation_id,
    chunk_id, document_id) in build order — which is cheaper than reading three string columns."""

    def __init__(self, directory: Path, metric: str, rows: list[tuple[str, str, str]]):
        self.rows = rows
        self.table = lancedb.connect(str(directory)).open_table(TABLE_NAME)
        self.metric = metric
        indexed = any(i.name == VECTOR_INDEX_NAME for i in self.table.list_indices())
        # probing every partition keeps the search exact (see module docstring)
        self.nprobes = ivf_partitions(self.table.count_rows()) if indexed else None

    def search(self, vector: np.ndarray, k: int, scopes: tuple[str, ...]) -> list[Hit]:
        if not scopes:
            return []
        search = self.table.search(vector.astype(np.float32)).distance_type(self.metric)
        if self.nprobes is not None:
            search = search.nprobes(self.nprobes)
        result = (
            search.where(scope_predicate(scopes), prefilter=True)
            .select(["row", "_distance"])
            .limit(k)
            .to_arrow()
        )
        positions = result.column("row").to_pylist()
        distances = result.column("_distance").to_pylist()
        # cosine/dot distances are 1 - similarity; l2 is a distance: negate so higher is better.
        to_score = (lambda d: -d) if self.metric == "l2" else (lambda d: 1.0 - d)
        return [Hit("vector", *self.rows[p], float(to_score(x))) for p, x in zip(positions, distances)]
