"""Verification of a vector table's search path, beyond its stored rows (lancedb adapter).

A query reaches rows through lance's ``access_scopes`` LABEL_LIST index (the prefilter) and, in a
table without an ANN index, its IVF_FLAT index (exact because every partition is probed). Both are
files a forger can rewrite while the column values stay right, so for each scope the prefiltered
search must return exactly the rows whose column has that scope — through the all-partition
IVF_FLAT search, which also proves that every row is reachable through the vector index, or, in a
table with an ANN index, through a flat scan (an approximate index promises no row; what it may
return is restricted and scored from the verified tables, ``ragpipe.index.vector_ann``).

``ann_index_problems``: the table's vector index is exactly the one its spec declares — the ANN
index with the spec's kind, metric, IVF partition count and graph or quantiser parameters, as lance
recorded them, in one segment covering every row, and no other vector index beside it — or,
without ``ann`` in the spec, no ANN index at all. A mismatch is one line naming the spec's field,
its value and the index's: ``vector: vector_index.ann.num_partitions is 2 in the spec, 3 in the
lance index``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lancedb
import numpy as np

from ragpipe.index.ivf import ANN_INDEX_TYPES
from ragpipe.index.predicates import scope_predicate
from ragpipe.index.rows import RowScopes
from ragpipe.index.vector import ANN_INDEX_NAME, TABLE_NAME, VECTOR_INDEX_NAME, ann_partitions, ivf_partitions
from ragpipe.spec import HnswSqIndex, PqIndex

LABEL = "vector"


def search_path_problems(
    directory: Path, metric: str, row_scopes: Sequence[Sequence[str]], ann: HnswSqIndex | PqIndex | None = None
) -> list[str]:
    """Rows reached by a prefiltered search per scope against ``row_scopes`` (row ``i``'s scopes),
    after the table's vector index is checked against the spec's ``ann`` (``ann_index_problems``)."""
    table = lancedb.connect(str(directory)).open_table(TABLE_NAME)
    rows = table.count_rows()
    problems = ann_index_problems(table, metric, ann, rows)
    if problems:
        return problems
    indexed = any(index.name == VECTOR_INDEX_NAME for index in table.list_indices())
    dimension = table.schema.field("vector").type.list_size
    probe = np.zeros(dimension, dtype=np.float32)
    probe[0] = 1.0  # any finite direction: every admitted row is returned, whatever its distance
    expected = RowScopes.of(row_scopes)
    for scope in sorted(expected.scopes()):
        query = table.search(probe).distance_type(metric).where(scope_predicate((scope,)), prefilter=True)
        if ann is not None:
            query = query.bypass_vector_index()  # an approximate index need not return every row
        elif indexed:
            query = query.nprobes(ivf_partitions(rows))
        # _distance selected explicitly: lance warns (on stderr, every build) when it adds it implicitly
        found = query.select(["row", "_distance"]).limit(max(1, rows)).to_arrow().column("row")
        if wrong := expected.scope_mismatch(scope, found.to_numpy()):
            extra, missing = wrong
            problems.append(
                f"{LABEL}: a search prefiltered to {scope!r} returns rows {extra} that lack the scope and "
                f"misses rows {missing} that have it (scope or vector index altered)"
            )
    return problems


def ann_index_problems(table, metric: str, ann: HnswSqIndex | PqIndex | None, rows: int) -> list[str]:
    """The lance table's vector indexes against the spec's ``ann`` (module docstring)."""
    indices = {index.name: index for index in table.list_indices()}
    if ann is None:
        if ANN_INDEX_NAME in indices:
            return [
                f"{LABEL}: the lance table holds an ANN index ({ANN_INDEX_NAME!r}) its vector-index spec does not declare"
            ]
        return []
    found = indices.get(ANN_INDEX_NAME)
    if found is None:
        return [f"{LABEL}: the spec's {ann.kind} index ({ANN_INDEX_NAME!r}) is missing from the lance table"]
    problems = []
    others = sorted(
        name for name, index in indices.items() if name != ANN_INDEX_NAME and list(index.columns) == ["vector"]
    )
    if others:
        problems.append(f"{LABEL}: vector index {others[0]!r} beside the ANN index (a query could use it instead)")
    stats = table.index_stats(ANN_INDEX_NAME)
    wanted = ANN_INDEX_TYPES[ann.kind]
    if stats.index_type != wanted:  # another kind's parameters would not compare: this line says it all
        found_kind = next((k for k, t in ANN_INDEX_TYPES.items() if t == stats.index_type), None)
        shown = stats.index_type if found_kind is None else f"{found_kind} ({stats.index_type})"
        return problems + [_mismatch("vector_index.ann.kind", f"{ann.kind} ({wanted})", shown)]
    if stats.distance_type != metric:
        problems.append(_mismatch("vector_index.metric", repr(metric), repr(stats.distance_type)))
    if stats.num_indexed_rows != rows or stats.num_unindexed_rows:
        problems.append(
            f"{LABEL}: the ANN index covers {stats.num_indexed_rows} of {rows} rows "
            f"({stats.num_unindexed_rows} unindexed)"
        )
    if stats.num_indices != 1:  # a build writes one segment; the partition count below is per index
        problems.append(f"{LABEL}: the ANN index is in {stats.num_indices} segments, a build writes one")
    if not others:  # a query reads one vector index: with another beside it, not necessarily this one
        problems += _partition_problems(table, stats.distance_type, ann.num_partitions)
    details = found.index_details or {}
    if isinstance(ann, HnswSqIndex):
        recorded = details.get("hnsw") or {}
        declared = {"m": ("max_connections", ann.m), "ef_construction": ("construction_ef", ann.ef_construction)}
    else:
        recorded = details.get("compression") or {}
        declared = {
            "num_sub_vectors": ("num_sub_vectors", ann.num_sub_vectors),
            "num_bits": ("num_bits", ann.num_bits),
        }
    for field, (name, value) in declared.items():
        if recorded.get(name) != value:
            note = "" if name == field else f" (lance's {name})"
            problems.append(_mismatch(f"vector_index.ann.{field}", value, repr(recorded.get(name)), note))
    return problems


def _partition_problems(table, metric: str, declared: int) -> list[str]:
    partitions = ann_partitions(table, metric)
    if partitions is None:
        return [
            f"{LABEL}: lance's query plan does not report the ANN index's IVF partitions "
            "(vector_index.ann.num_partitions cannot be checked)"
        ]
    return [] if partitions == declared else [_mismatch("vector_index.ann.num_partitions", declared, partitions)]


def _mismatch(field: str, declared: object, found: object, note: str = "") -> str:
    return f"{LABEL}: {field} is {declared} in the spec, {found} in the lance index{note}"
