"""Verification of a vector table's search path, beyond its stored rows (lancedb adapter).

A query reaches rows through lance's ``access_scopes`` LABEL_LIST index (the prefilter) and its
IVF_FLAT index (exact because every partition is probed). Both are files a forger can rewrite
while the column values stay right, so for each scope the prefiltered, all-partition search must
return exactly the rows whose column has that scope — which also proves that every row is
reachable through the vector index.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import lancedb
import numpy as np

from ragpipe.index.predicates import scope_predicate
from ragpipe.index.vector import TABLE_NAME, VECTOR_INDEX_NAME, ivf_partitions

LABEL = "vector"


def search_path_problems(directory: Path, metric: str, row_scopes: Sequence[Sequence[str]]) -> list[str]:
    """Rows reached by a prefiltered search per scope against ``row_scopes`` (row ``i``'s scopes)."""
    table = lancedb.connect(str(directory)).open_table(TABLE_NAME)
    rows = table.count_rows()
    indexed = any(index.name == VECTOR_INDEX_NAME for index in table.list_indices())
    dimension = table.schema.field("vector").type.list_size
    probe = np.zeros(dimension, dtype=np.float32)
    probe[0] = 1.0  # any finite direction: every admitted row is returned, whatever its distance
    problems: list[str] = []
    for scope in sorted({s for scopes in row_scopes for s in scopes}):
        query = table.search(probe).distance_type(metric).where(scope_predicate((scope,)), prefilter=True)
        if indexed:
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
