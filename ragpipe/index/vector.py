"""The lancedb vector table: the only module that imports lancedb.

One row per representation with its vector, IDs, ``access_scopes`` and ``source_role``, so a
search can apply a ``where`` prefilter on scopes (backed by a LABEL_LIST scalar index).

The table is the store of record of a bundle's vectors. Queries do not score through it: exact
scores are the project's own (``ragpipe.index.vector_memory``), because lance's float32 kernels
are chosen per CPU at run time and round differently from one host to another. Tables of
``IVF_MIN_ROWS`` rows or more get an IVF_FLAT index (full vectors, no quantisation) that
``VectorSearcher`` probes in full, so its searches rank every vector by lance's own distances.

A vector-index spec with ``ann`` gets that approximate-nearest-neighbour index instead (named
``ANN_INDEX_NAME``: IVF_HNSW_SQ or IVF_PQ, with the spec's parameters; no IVF_FLAT beside it, so
lance never has two vector indexes to choose from). It serves only approximate query plans
(``ragpipe.index.vector_ann``), as a source of candidates; ``VectorSearcher.search`` bypasses it.
"""

from __future__ import annotations

import asyncio
import re
import threading
import weakref
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import lancedb
import numpy as np
import pyarrow as pa
from lancedb.index import HnswSq, IvfFlat, IvfPq, LabelList

from ragpipe.index.hits import Hit
from ragpipe.index.ivf import ivf_partitions
from ragpipe.index.predicates import exclusion_predicate, role_predicate, scope_predicate, selection_predicate
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexColumns, IndexRow
from ragpipe.spec import HnswSqIndex, PqIndex

T = TypeVar("T")
TABLE_NAME = "representations"
VECTOR_INDEX_NAME = "vector_idx"
ANN_INDEX_NAME = "vector_ann"
PQ_8BIT_MIN_ROWS = 256  # an 8-bit product quantiser's codebook has 256 centroids per sub-vector
PQ_ROWS_PER_PARTITION = 256  # lance trains at most rows // 256 IVF_PQ partitions (at least one)
# lance's executed plan of an ANN query: the IVF node ranks every centroid of the index
_RANKED = re.compile(r"ANNIvfPartition: .*partitions_ranked=(\d+)")


def build_vector_index(
    directory: Path,
    rows: list[IndexRow],
    vectors: np.ndarray,
    metric: str = "cosine",
    ann: HnswSqIndex | PqIndex | None = None,
) -> int:
    """Write the lancedb table into folder ``directory``; returns its row count. ``ann``: the
    spec's approximate-nearest-neighbour index, built instead of IVF_FLAT (``ValueError``, one
    line, when lance cannot build it over every row)."""
    if len(rows) != len(vectors):
        raise ValueError(f"{len(rows)} rows but {len(vectors)} vectors")
    if ann is not None and not rows:
        raise ValueError(f"vector_index.ann: a {ann.kind} index trains on the table's vectors, and there are none")
    write_vector_table(directory, vector_table(rows, vectors))
    return index_vector_table(directory, metric, ann)


def vector_table(rows: Sequence[IndexRow] | IndexColumns, vectors: np.ndarray) -> pa.Table:
    """The table's rows as Arrow: ``rows`` (objects, or the columns of ``index_columns``) beside
    ``vectors``, which the table wraps without a copy (float32, C order) — a caller that drops
    its own references leaves the table the only holder of the vectors."""
    if len(rows) != len(vectors):
        raise ValueError(f"{len(rows)} rows but {len(vectors)} vectors")
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    flat = pa.Array.from_buffers(pa.float32(), matrix.size, [None, pa.py_buffer(matrix)])
    if isinstance(rows, IndexColumns):
        fields = {name: rows.column(name) for name in ("representation_id", "chunk_id", "document_id", "kind")}
        groups = pa.array([list(g) for g in rows.scopes.groups], type=pa.list_(pa.string()))
        scopes = groups.take(pa.array(rows.scopes.index)) if len(rows) else pa.array([], pa.list_(pa.string()))
        role = rows.source_role
    else:
        fields = {
            name: pa.array([getattr(r, name) for r in rows], type=pa.string())
            for name in ("representation_id", "chunk_id", "document_id", "kind")
        }
        scopes = pa.array([list(r.access_scopes) for r in rows], type=pa.list_(pa.string()))
        role = pa.array([r.source_role for r in rows], type=pa.string())
    return pa.table(
        {
            "row": pa.array(np.arange(len(rows), dtype=np.uint32)),
            **fields,
            "access_scopes": scopes,
            "source_role": role,
            "vector": pa.FixedSizeListArray.from_arrays(flat, matrix.shape[1]),
        }
    )


def write_vector_table(directory: Path, table: pa.Table) -> None:
    """Create the lancedb table (``vector_table``'s rows) in folder ``directory``, without indexes."""
    lancedb.connect(str(directory)).create_table(TABLE_NAME, data=table)


def index_vector_table(directory: Path, metric: str = "cosine", ann: HnswSqIndex | PqIndex | None = None) -> int:
    """Index the table ``write_vector_table`` wrote: the ``access_scopes`` LABEL_LIST index, then
    ``ann`` (``ValueError``, one line, when lance cannot build it over every row) or, from
    ``IVF_MIN_ROWS`` rows, IVF_FLAT. Returns the row count. The vectors are read from the table:
    the caller need not hold them any more."""
    created = lancedb.connect(str(directory)).open_table(TABLE_NAME)
    rows = created.count_rows()
    if ann is not None and not rows:
        raise ValueError(f"vector_index.ann: a {ann.kind} index trains on the table's vectors, and there are none")
    created.create_index("access_scopes", config=LabelList())
    if ann is not None:
        _create_ann_index(created, metric, ann, rows)
    elif (partitions := ivf_partitions(rows)) is not None:
        created.create_index(
            "vector", config=IvfFlat(distance_type=metric, num_partitions=partitions), name=VECTOR_INDEX_NAME
        )
    return vector_row_count(directory)


def _create_ann_index(table, metric: str, ann: HnswSqIndex | PqIndex, rows: int) -> None:
    """Build the spec's ANN index (lance's k-means and graph builds are not seeded: the index files
    differ from build to build, never the rows or vectors) and check that it covers every row —
    lance creates an 8-bit IVF_PQ index over fewer than 256 rows without indexing any."""
    if isinstance(ann, HnswSqIndex):
        config: HnswSq | IvfPq = HnswSq(
            distance_type=metric, num_partitions=ann.num_partitions, m=ann.m, ef_construction=ann.ef_construction
        )
    else:
        config = IvfPq(
            distance_type=metric,
            num_partitions=ann.num_partitions,
            num_sub_vectors=ann.num_sub_vectors,
            num_bits=ann.num_bits,
        )
    table.create_index("vector", config=config, name=ANN_INDEX_NAME)
    stats = table.index_stats(ANN_INDEX_NAME)
    if stats is None or stats.num_indexed_rows != rows or stats.num_unindexed_rows:
        indexed = 0 if stats is None else stats.num_indexed_rows
        hint = (
            f" (an 8-bit product quantiser trains on at least {PQ_8BIT_MIN_ROWS} rows: use num_bits: 4)"
            if isinstance(ann, PqIndex) and ann.num_bits == 8 and rows < PQ_8BIT_MIN_ROWS
            else ""
        )
        raise ValueError(f"vector_index.ann: lance's {ann.kind} index covers {indexed} of {rows} rows{hint}")
    trained = ann_partitions(table, metric)
    if trained != ann.num_partitions:  # lance trains fewer IVF_PQ partitions than asked on a small table
        most = max(1, rows // PQ_ROWS_PER_PARTITION)
        hint = (
            f" (lance trains at most one IVF_PQ partition per {PQ_ROWS_PER_PARTITION} rows: "
            f"use num_partitions: {most} or fewer)"
            if isinstance(ann, PqIndex) and ann.num_partitions > most
            else ""
        )
        raise ValueError(
            f"vector_index.ann.num_partitions: lance's {ann.kind} index over {rows} rows has {trained} IVF "
            f"partitions, the spec declares {ann.num_partitions}{hint}"
        )


def ann_partitions(table, metric: str) -> int | None:
    """How many IVF partitions the lance table's ANN index holds (None: lance did not say).

    lance's index statistics do not report it; its executed query plan does: an ANN query ranks
    every partition's centroid before probing the nearest (``partitions_ranked`` of the
    ``ANNIvfPartition`` node, one node per index segment). One probed partition, one row asked
    for: the cost of one small query. A lance upgrade that renames the metric makes this None,
    which the checks refuse (``ragpipe.index.vector_checks``)."""
    dimension = table.schema.field("vector").type.list_size
    probe = np.zeros(dimension, dtype=np.float32)
    probe[0] = 1.0
    query = table.search(probe).distance_type(metric).nprobes(1).select(["row", "_distance"]).limit(1)
    found = _RANKED.findall(query.analyze_plan())
    return int(found[0]) if len(found) == 1 else None


def vector_row_count(directory: Path) -> int:
    return lancedb.connect(str(directory)).open_table(TABLE_NAME).count_rows()


class _ThreadLoops:
    """One asyncio event loop per calling thread.

    lancedb's async API completes each call on its own (Rust) runtime and hands the result to the
    event loop that awaited it, so one table can serve several loops at once. A loop may only be
    driven by one thread, hence one per thread; a thread's loop is closed when the thread ends
    (finaliser on its thread-local holder) or by ``close``."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._finalizers: list[weakref.finalize] = []
        self._closed = False

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        holder = getattr(self._local, "holder", None)
        if holder is None:
            with self._lock:
                if self._closed:
                    coroutine.close()
                    raise RuntimeError("vector searcher is closed")
                holder = self._local.holder = _LoopHolder(asyncio.new_event_loop())
                self._finalizers = [f for f in self._finalizers if f.alive]
                self._finalizers.append(weakref.finalize(holder, holder.loop.close))
        return holder.loop.run_until_complete(coroutine)

    def close(self) -> None:
        """Close every thread's loop. Call once no search is in flight."""
        with self._lock:
            self._closed = True
            finalizers, self._finalizers = self._finalizers, []
        for finalizer in finalizers:
            finalizer()


class _LoopHolder:
    __slots__ = ("loop", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop


class VectorSearcher:
    """One bundle's lancedb table: its vectors (``read_vectors``, for a bundle without
    ``vectors.arrow``) and lance's own scope-prefiltered nearest-neighbour search, whose float32
    distances depend on the kernels lance picks for the CPU (so queries never rank by them).

    Uses lancedb's async API on an event loop of the calling thread: the sync wrapper makes about
    six round trips to lancedb's background loop per search (schema look-ups included), which
    costs ~1 ms here. Hits are resolved through the integer ``row`` column and ``rows`` —
    (representation_id, chunk_id, document_id) in build order — which is cheaper than reading three
    string columns. Thread-safe: any number of threads may search at once (one loop each, the
    table and the read-only row maps shared)."""

    engine = "lancedb"

    def __init__(self, directory: Path, metric: str, rows: Sequence[tuple[str, str, str]]):
        self.rows = rows
        self.metric = metric
        self._loops = _ThreadLoops()
        run = self._loops.run
        self.table = run(self._open(directory))
        names = {i.name for i in run(self.table.list_indices())}
        # probing every partition keeps the search exact (see module docstring)
        self.nprobes = ivf_partitions(run(self.table.count_rows())) if VECTOR_INDEX_NAME in names else None
        # an ANN index is searched only through ``ann_rows``; ``search`` scans past it
        self.ann_indexed = ANN_INDEX_NAME in names
        self.dimension: int = run(self.table.schema()).field("vector").type.list_size
        # lancedb row IDs -> our row positions, read once: a search then returns only _rowid and
        # _distance, and skips the per-search read of the ``row`` column (~0.4 ms). Two sorted
        # arrays, not a dict: 16 bytes a row (a million-row table's dict would take ~100 MB).
        ids = run(self.table.query().select(["row"]).with_row_id().to_arrow())
        rowids = ids.column("_rowid").to_numpy().astype(np.uint64)
        order = np.argsort(rowids, kind="stable")
        self._rowids = rowids[order]
        self._row_at = ids.column("row").to_numpy().astype(np.intp)[order]

    @staticmethod
    async def _open(directory: Path):
        db = await lancedb.connect_async(str(directory))
        return await db.open_table(TABLE_NAME)

    def search(
        self,
        vector: np.ndarray,
        k: int,
        where: Prefilter,
    ) -> list[Hit]:
        """The ``k`` nearest rows ``where`` lets through (``index.prefilter``: applied before the top ``k``)."""
        if where.admits_nothing:
            return []
        query = self.table.query().nearest_to(vector.astype(np.float32)).distance_type(self.metric)
        if self.nprobes is not None:
            query = query.nprobes(self.nprobes)
        elif self.ann_indexed:
            query = query.bypass_vector_index()
        # where() on a vector query is a prefilter unless postfilter() is asked for
        query = query.where(_predicate(where)).select(["_distance"]).with_row_id().limit(k)
        result = self._loops.run(query.to_arrow())
        rows = self.rows
        positions = self._positions(result.column("_rowid").to_numpy()).tolist()
        distances = result.column("_distance").to_pylist()
        # cosine/dot distances are 1 - similarity; l2 is a distance: negate so higher is better.
        sign, offset = (-1.0, 0.0) if self.metric == "l2" else (-1.0, 1.0)
        return [Hit("vector", *rows[i], offset + sign * d) for i, d in zip(positions, distances)]

    def ann_rows(
        self,
        vector: np.ndarray,
        limit: int,
        where: Prefilter,
        *,
        nprobes: int,
        ef: int,
    ) -> np.ndarray:
        """Positions of up to ``limit`` rows the table's ANN index finds nearest to ``vector``,
        probing ``nprobes`` IVF partitions (exactly: lance's adaptive extra probing is off) with
        ``ef`` graph candidates (HNSW; raised to ``limit``, the most a graph search returns),
        prefiltered like ``search``. Candidates, not a ranking: their order and distances are the
        index's quantised ones, which callers do not use (``ragpipe.index.vector_ann``)."""
        if not self.ann_indexed:
            raise ValueError("this vector table has no ANN index")
        if where.admits_nothing:
            return np.empty(0, dtype=np.intp)
        query = (
            self.table.query()
            .nearest_to(vector.astype(np.float32))
            .distance_type(self.metric)
            .nprobes(nprobes)  # minimum and maximum: lance probes no more on a narrow filter
            .ef(max(ef, limit))
        )
        query = query.where(_predicate(where)).select(["_distance"]).with_row_id().limit(limit)
        return self._positions(self._loops.run(query.to_arrow()).column("_rowid").to_numpy())

    def _positions(self, rowids: np.ndarray) -> np.ndarray:
        """Our row positions of lancedb row IDs (every one a row of this table)."""
        found = np.searchsorted(self._rowids, rowids.astype(np.uint64))
        if found.size and (found.max() >= len(self._rowids) or (self._rowids[found] != rowids).any()):
            raise ValueError("lancedb returned a row ID the table did not hold when it was opened")
        return self._row_at[found]

    @property
    def indexed(self) -> bool:
        """Whether searches go through the IVF_FLAT index (else a flat scan)."""
        return self.nprobes is not None

    def read_vectors(self) -> np.ndarray:
        """Every stored vector as one C-contiguous float32 matrix, row ``i`` at position ``i``
        (read once, for ``ragpipe.index.vector_memory``, which checks it against the manifest's
        embeddings digest before using it)."""
        table = self._loops.run(self.table.query().select(["row", "vector"]).to_arrow()).sort_by("row")
        if table.column("row").to_pylist() != list(range(table.num_rows)):
            raise ValueError(f"vector table rows are not exactly 0..{table.num_rows - 1} once each")
        column = table.column("vector").combine_chunks()
        flat = column.flatten().to_numpy(zero_copy_only=False)
        return np.ascontiguousarray(flat, dtype=np.float32).reshape(len(column), self.dimension)

    def close(self) -> None:
        """Close the event loops. Call once no search is in flight."""
        self._loops.close()


def _predicate(where: Prefilter) -> str:
    """The lancedb ``where`` prefilter of a search (``index.prefilter``)."""
    predicate = scope_predicate(where.scopes)
    if where.source_roles:
        predicate = f"{predicate} AND {role_predicate(where.source_roles)}"
    selection = where.selection
    if selection is not None and not selection.everything:
        predicate = f"{predicate} AND {selection.compiled('lancedb', lambda: selection_predicate(selection))}"
    if where.exclude_documents:
        predicate = f"{predicate} AND {exclusion_predicate(where.exclude_documents)}"
    return predicate


VECTOR_WINDOW_ROWS = 8192  # rows of the table's vectors read per query by ``vectors_equal``


def vectors_equal(directory: Path, matrix: np.ndarray) -> bool:
    """Whether the table's vectors are ``matrix``, row ``i`` at row ``i``, bit for bit — read a
    window of rows at a time (a plain scan with offset and limit, in the order the table was
    written), so they are never all in memory at once. False also when the table's rows do not
    come back in row order (the caller then reads them whole, sorted)."""
    table = lancedb.connect(str(directory)).open_table(TABLE_NAME)
    n = table.count_rows()
    if n != len(matrix) or (n and table.schema.field("vector").type.list_size != matrix.shape[1]):
        return False
    bits = np.ascontiguousarray(matrix, dtype=np.float32).view(np.uint32)
    for start in range(0, n, VECTOR_WINDOW_ROWS):
        window = table.search().select(["row", "vector"]).offset(start).limit(VECTOR_WINDOW_ROWS).to_arrow()
        rows = window.column("row").to_numpy()
        if not np.array_equal(rows, np.arange(start, start + len(rows))) or not len(rows):
            return False
        column = window.column("vector").combine_chunks()
        size = column.type.list_size
        values = column.values.slice(column.offset * size, len(column) * size).to_numpy(zero_copy_only=False)
        if not np.array_equal(values.view(np.uint32).reshape(len(column), size), bits[start : start + len(rows)]):
            return False
    return True


def read_vector_rows(directory: Path, columns: Sequence[str] | None = None) -> pa.Table:
    """Every stored row (``row``, IDs, ``access_scopes``, ``source_role``, ``vector``; only
    ``columns`` if given, which must include ``row``) in ``row`` order: what bundle verification
    cross-checks against the bundle's documents. Rows read in order (as lance returns a table
    written in order) are not copied again to sort them."""
    table = lancedb.connect(str(directory)).open_table(TABLE_NAME)
    if columns is None:
        found = table.to_arrow()
    else:
        found = table.search().select(list(columns)).limit(None).to_arrow()
    rows = found.column("row").to_numpy()
    if len(rows) and not np.array_equal(rows, np.arange(len(rows))):
        found = found.sort_by("row")
    return found
