"""ANN indexes: built into the lance table as the vector-index spec says, checked on open.

lance's k-means and HNSW builds are not seeded, so nothing here depends on which rows a given
build happens to return: only on laws that hold for any build.
"""

from __future__ import annotations

from pathlib import Path

import lancedb
import numpy as np
import pytest

from ragpipe.index.rows import IndexRow
from ragpipe.index.vector import ANN_INDEX_NAME, TABLE_NAME, VECTOR_INDEX_NAME, build_vector_index
from ragpipe.index.vector_checks import search_path_problems
from ragpipe.spec import HnswSqIndex, PqIndex

SCOPES = (("public",), ("staff",), ("public", "staff"), ("secret",))
HNSW = HnswSqIndex(kind="ivf_hnsw_sq", num_partitions=2, m=8, ef_construction=64)
PQ = PqIndex(kind="ivf_pq", num_partitions=2, num_sub_vectors=4, num_bits=4)


def table_rows(n: int) -> list[IndexRow]:
    return [
        IndexRow(f"r{i:05d}", f"c{i:05d}", f"d{i // 3:05d}", "raw", "", SCOPES[i % len(SCOPES)], "primary")
        for i in range(n)
    ]


def unit_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def hnsw_table(tmp_path_factory) -> tuple[Path, list[IndexRow], np.ndarray]:
    """1,100 rows: past IVF_MIN_ROWS, where a table without ``ann`` gets IVF_FLAT."""
    rows, vectors = table_rows(1100), unit_vectors(1100, 16)
    folder = tmp_path_factory.mktemp("ann") / "v"
    assert build_vector_index(folder, rows, vectors, "cosine", HNSW) == len(rows)
    return folder, rows, vectors


def indices(folder: Path) -> dict[str, object]:
    table = lancedb.connect(str(folder)).open_table(TABLE_NAME)
    return {i.name: table.index_stats(i.name) for i in table.list_indices()}


def scopes_of(rows: list[IndexRow]) -> list[tuple[str, ...]]:
    return [r.access_scopes for r in rows]


def test_the_spec_ann_index_replaces_ivf_flat_and_checks_clean(hnsw_table):
    folder, rows, _ = hnsw_table
    found = indices(folder)
    assert sorted(found) == ["access_scopes_idx", ANN_INDEX_NAME]  # no IVF_FLAT beside it
    stats = found[ANN_INDEX_NAME]
    assert (stats.index_type, stats.distance_type, stats.num_indexed_rows, stats.num_unindexed_rows) == (
        "IVF_HNSW_SQ",
        "cosine",
        len(rows),
        0,
    )
    assert search_path_problems(folder, "cosine", scopes_of(rows), HNSW) == []


def test_the_checks_refuse_an_index_the_spec_does_not_declare(hnsw_table, tmp_path: Path):
    folder, rows, vectors = hnsw_table
    scopes = scopes_of(rows)
    assert search_path_problems(folder, "cosine", scopes) == [
        f"vector: the lance table holds an ANN index ({ANN_INDEX_NAME!r}) its vector-index spec does not declare"
    ]
    other = HNSW.model_copy(update={"m": 9, "ef_construction": 65})
    assert search_path_problems(folder, "cosine", scopes, other) == [
        "vector: the ANN index was built with max_connections 8, the spec declares 9",
        "vector: the ANN index was built with construction_ef 64, the spec declares 65",
    ]
    assert search_path_problems(folder, "cosine", scopes, PQ) == [
        "vector: the ANN index is IVF_HNSW_SQ, the spec declares IVF_PQ (ivf_pq)",
        "vector: the ANN index was built with num_sub_vectors None, the spec declares 4",
        "vector: the ANN index was built with num_bits 8, the spec declares 4",  # SQ: 8-bit scalars
    ]
    assert search_path_problems(folder, "dot", scopes, HNSW)[0] == (
        "vector: the ANN index measures 'cosine' distances, the spec's metric is 'dot'"
    )
    plain = tmp_path / "plain"
    build_vector_index(plain, rows, vectors, "cosine")
    assert VECTOR_INDEX_NAME in indices(plain)
    assert search_path_problems(plain, "cosine", scopes, HNSW) == [
        f"vector: the spec's ivf_hnsw_sq index ({ANN_INDEX_NAME!r}) is missing from the lance table"
    ]
    # an IVF_FLAT index added beside the ANN one: a query could take either
    lancedb.connect(str(plain)).open_table(TABLE_NAME).create_index("vector", name=ANN_INDEX_NAME, config=_hnsw())
    assert search_path_problems(plain, "cosine", scopes, HNSW) == [
        f"vector: vector index {VECTOR_INDEX_NAME!r} beside the ANN index (a query could use it instead)"
    ]


def _hnsw():
    from lancedb.index import HnswSq

    return HnswSq(
        distance_type="cosine", num_partitions=HNSW.num_partitions, m=HNSW.m, ef_construction=HNSW.ef_construction
    )


def test_a_pq_index_records_its_quantiser_and_small_tables_are_refused(tmp_path: Path):
    rows, vectors = table_rows(300), unit_vectors(300, 16, seed=1)
    assert build_vector_index(tmp_path / "pq", rows, vectors, "cosine", PQ) == 300
    assert search_path_problems(tmp_path / "pq", "cosine", scopes_of(rows), PQ) == []
    assert indices(tmp_path / "pq")[ANN_INDEX_NAME].index_type == "IVF_PQ"
    # lance builds an 8-bit IVF_PQ index over fewer than 256 rows without indexing any row
    eight = PQ.model_copy(update={"num_bits": 8})
    with pytest.raises(ValueError) as err:
        build_vector_index(tmp_path / "small", rows[:100], vectors[:100], "cosine", eight)
    assert str(err.value) == (
        "vector_index.ann: lance's ivf_pq index covers 0 of 100 rows "
        "(an 8-bit product quantiser trains on at least 256 rows: use num_bits: 4)"
    )
    with pytest.raises(ValueError) as err:
        build_vector_index(tmp_path / "empty", [], np.zeros((0, 16), np.float32), "cosine", HNSW)
    assert str(err.value) == "vector_index.ann: a ivf_hnsw_sq index trains on the table's vectors, and there are none"
