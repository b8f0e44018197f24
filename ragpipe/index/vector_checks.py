"""Verification of a vector table's search path, beyond its stored rows (lancedb adapter).

A query reaches rows through lance's ``access_scopes`` LABEL_LIST index (the prefilter) and, in a
table without an ANN index, its IVF_FLAT index (exact because every partition is probed). Both are
files a forger can rewrite while the column values stay right, so for each scope the prefiltered
search must return exactly the rows whose column has that scope — through the all-partition
IVF_FLAT search, which also proves that every row is reachable through the vector index, or, in a
table with an ANN index, through a flat scan (an approximate index promises no row; what it may
return is restricted and scored from the verified tables, ``ragpipe.index.vector_ann``).

``ann_index_problems``: the table's vector index is exactly the one its spec declares — the ANN
index with the spec's kind, metric and graph or quantiser parameters, covering every row, and no
other vector index beside it — or, without ``ann`` in the spec, no ANN index at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lancedb
import numpy as np

from ragpipe.index.ivf import ANN_INDEX_TYPES
from ragpipe.index.predicates import scope_predicate
from ragpipe.index.vector import ANN_INDEX_NAME, TABLE_NAME, VECTOR_INDEX_NAME, ivf_partitions
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
    for scope in sorted({s for scopes in row_scopes for s in scopes}):
        query = table.search(probe).distance_type(metric).where(scope_predicate((scope,)), prefilter=True)
        if ann is not None:
            query = query.bypass_vector_index()  # an approximate index need not return every row
        elif indexed:
            query = query.nprobes(ivf_partitions(rows))
        # _distance selected explicitly: lance warns (on stderr, every build) when it adds it implicitly
        found = query.select(["row", "_distance"]).limit(max(1, rows)).to_arrow().column("row").to_pylist()
        actual = sorted(found)
        wanted = [i for i, scopes in enumerate(row_scopes) if scope in scopes]
        if actual != wanted:
            extra, missing = sorted(set(actual) - set(wanted)), sorted(set(wanted) - set(actual))
            problems.append(
                f"{LABEL}: a search prefiltered to {scope!r} returns rows {extra[:5]} that lack the scope and "
                f"misses rows {missing[:5]} that have it (scope or vector index altered)"
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
    if stats.index_type != wanted:
        problems.append(f"{LABEL}: the ANN index is {stats.index_type}, the spec declares {wanted} ({ann.kind})")
    if stats.distance_type != metric:
        problems.append(
            f"{LABEL}: the ANN index measures {stats.distance_type!r} distances, the spec's metric is {metric!r}"
        )
    if stats.num_indexed_rows != rows or stats.num_unindexed_rows:
        problems.append(
            f"{LABEL}: the ANN index covers {stats.num_indexed_rows} of {rows} rows "
            f"({stats.num_unindexed_rows} unindexed)"
        )
    details = found.index_details or {}
    if isinstance(ann, HnswSqIndex):
        graph = details.get("hnsw") or {}
        declared = {"max_connections": ann.m, "construction_ef": ann.ef_construction}
    else:
        graph = details.get("compression") or {}
        declared = {"num_sub_vectors": ann.num_sub_vectors, "num_bits": ann.num_bits}
    for name, value in declared.items():
        if graph.get(name) != value:
            problems.append(
                f"{LABEL}: the ANN index was built with {name} {graph.get(name)!r}, the spec declares {value}"
            )
    return problems
