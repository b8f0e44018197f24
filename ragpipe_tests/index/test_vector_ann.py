"""ANN indexes: built into the lance table as the vector-index spec says, checked on open.

lance's k-means and HNSW builds are not seeded, so nothing here depends on which rows a given
build happens to return: only on laws that hold for any build.
"""

from __future__ import annotations

from pathlib import Path

import lancedb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexRow
from ragpipe.index.vector import (
    ANN_INDEX_NAME,
    TABLE_NAME,
    VECTOR_INDEX_NAME,
    VectorSearcher,
    ann_partitions,
    build_vector_index,
)
from ragpipe.index.vector_ann import ApproximateVectorSearcher, open_approximate_searcher
from ragpipe.index.vector_checks import search_path_problems
from ragpipe.index.vector_memory import MemoryVectorSearcher, exact_scores
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
        "vector: vector_index.ann.m is 9 in the spec, 8 in the lance index (lance's max_connections)",
        "vector: vector_index.ann.ef_construction is 65 in the spec, 64 in the lance index (lance's construction_ef)",
    ]
    # the IVF partition count lance's statistics leave out, read from its executed query plan
    assert search_path_problems(folder, "cosine", scopes, HNSW.model_copy(update={"num_partitions": 3})) == [
        "vector: vector_index.ann.num_partitions is 3 in the spec, 2 in the lance index"
    ]
    # another kind: its parameters would not compare, one line says it
    assert search_path_problems(folder, "cosine", scopes, PQ) == [
        "vector: vector_index.ann.kind is ivf_pq (IVF_PQ) in the spec, ivf_hnsw_sq (IVF_HNSW_SQ) in the lance index"
    ]
    assert search_path_problems(folder, "dot", scopes, HNSW) == [
        "vector: vector_index.metric is 'dot' in the spec, 'cosine' in the lance index"
    ]
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
    rows, vectors = table_rows(600), unit_vectors(600, 16, seed=1)
    assert build_vector_index(tmp_path / "pq", rows, vectors, "cosine", PQ) == 600
    scopes = scopes_of(rows)
    assert search_path_problems(tmp_path / "pq", "cosine", scopes, PQ) == []
    assert indices(tmp_path / "pq")[ANN_INDEX_NAME].index_type == "IVF_PQ"
    assert search_path_problems(tmp_path / "pq", "cosine", scopes, PQ.model_copy(update={"num_sub_vectors": 8})) == [
        "vector: vector_index.ann.num_sub_vectors is 8 in the spec, 4 in the lance index"
    ]
    assert search_path_problems(tmp_path / "pq", "cosine", scopes, PQ.model_copy(update={"num_bits": 8})) == [
        "vector: vector_index.ann.num_bits is 8 in the spec, 4 in the lance index"
    ]
    # lance trains at most one IVF_PQ partition per 256 rows, silently: the build refuses the
    # index rather than publish one the spec (and so the bundle ID) misdescribes
    with pytest.raises(ValueError) as err:
        build_vector_index(tmp_path / "few", rows[:300], vectors[:300], "cosine", PQ)
    assert str(err.value) == (
        "vector_index.ann.num_partitions: lance's ivf_pq index over 300 rows has 1 IVF partitions, the spec "
        "declares 2 (lance trains at most one IVF_PQ partition per 256 rows: use num_partitions: 1 or fewer)"
    )
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


# --- approximate search: candidates from the index, ranked by the exact scores -----------------

ROLES = ("primary", "appendix")


def row_ids(rows: list[IndexRow]) -> list[tuple[str, str, str]]:
    return [(r.representation_id, r.chunk_id, r.document_id) for r in rows]


def exact_searcher(rows: list[IndexRow], vectors: np.ndarray, metric: str = "cosine") -> MemoryVectorSearcher:
    roles = [ROLES[i % 7 == 0] for i in range(len(rows))]  # every 7th row an appendix
    return MemoryVectorSearcher(metric, row_ids(rows), scopes_of(rows), vectors.copy(), roles)


class FakeIndex:
    """An ANN index that returns ``found`` whatever is asked, and records the requests."""

    def __init__(self, found):
        self.found, self.calls, self.closed = np.asarray(found, dtype=np.intp), [], False

    def ann_rows(self, vector, limit, where, *, nprobes, ef):
        self.calls.append(
            (limit, tuple(where.scopes), tuple(sorted(where.exclude_documents)), where.source_roles, nprobes, ef)
        )
        return self.found

    def close(self):
        self.closed = True


def bits(hits) -> list[tuple[str, bytes]]:
    return [(h.representation_id, np.float64(h.score).tobytes()) for h in hits]


@pytest.fixture(scope="module")
def small() -> tuple[list[IndexRow], np.ndarray]:
    return table_rows(120), unit_vectors(120, 8, seed=3)


def test_the_index_can_narrow_the_candidates_never_widen_them(small):
    rows, vectors = small
    exact = exact_searcher(rows, vectors)
    query = unit_vectors(1, 8, seed=4)[0]
    everything = FakeIndex(np.arange(len(rows))[::-1])  # hidden rows included, in any order
    searcher = ApproximateVectorSearcher(exact, everything, kind="ivf_hnsw_sq", nprobes=3, ef=7, refine_factor=2)
    for scopes in (("public",), ("staff", "secret"), ("nobody",)):
        assert bits(searcher.search(query, 5, Prefilter(scopes))) == bits(exact.search(query, 5, Prefilter(scopes)))
    assert everything.calls[0] == (10, ("public",), (), (), 3, 7)
    searcher.search(query, 4, Prefilter(("staff",), exclude_documents={"d00002"}, source_roles=("primary",)))
    assert everything.calls[-1] == (8, ("staff",), ("d00002",), ("primary",), 3, 7)


def test_candidates_are_ranked_by_exact_scores_and_a_short_answer_is_exact(small):
    rows, vectors = small
    exact = exact_searcher(rows, vectors)
    query = unit_vectors(1, 8, seed=5)[0]
    visible = exact.prepare(query, 3, Prefilter(("public",)))[1]
    chosen = visible[::3][:12]  # 12 visible candidates, plus hidden ones the searcher must drop
    hidden = np.setdiff1d(np.arange(len(rows)), visible)[:5]
    searcher = ApproximateVectorSearcher(
        exact, FakeIndex(np.concatenate([hidden, chosen])), kind="ivf_pq", nprobes=1, ef=1, refine_factor=4
    )
    hits = searcher.search(query, 3, Prefilter(("public",)))
    scores = exact_scores("cosine", vectors[chosen], query)
    best = chosen[np.lexsort((chosen, -scores))[:3]]
    assert [h.representation_id for h in hits] == [rows[i].representation_id for i in best]
    assert bits(hits) == [
        (rows[i].representation_id, np.float64(scores[list(chosen).index(i)]).tobytes()) for i in best
    ]
    assert "approximate" in searcher.why and searcher.approximate and not exact.approximate
    # 12 visible candidates for k = 4 and refine_factor 4: fewer than the 16 asked, so exact search answers
    assert bits(searcher.search(query, 4, Prefilter(("public",)))) == bits(
        exact.search(query, 4, Prefilter(("public",)))
    )
    searcher.close()
    assert searcher.index.closed
    with pytest.raises(RuntimeError, match="closed"):
        searcher.search(query, 3, Prefilter(("public",)))


def test_arguments_are_checked_as_exact_search_checks_them(small):
    rows, vectors = small
    searcher = ApproximateVectorSearcher(
        exact_searcher(rows, vectors), FakeIndex([]), kind="ivf_hnsw_sq", nprobes=1, ef=1, refine_factor=1
    )
    query = vectors[0]
    assert searcher.search(query, 3, Prefilter(())) == []
    with pytest.raises(ValueError, match="invalid scope name"):
        searcher.search(query, 3, Prefilter(("x') OR true --",)))
    with pytest.raises(ValueError, match="k must be positive"):
        searcher.search(query, 0, Prefilter(("public",)))
    with pytest.raises(ValueError, match="query has 4 dimensions"):
        searcher.search(query[:4], 3, Prefilter(("public",)))
    with pytest.raises(ValueError, match="must be >= 1"):
        ApproximateVectorSearcher(searcher.exact, FakeIndex([]), kind="ivf_pq", nprobes=0, ef=1, refine_factor=1)


@pytest.fixture(scope="module")
def hnsw_searchers(hnsw_table):
    folder, rows, vectors = hnsw_table
    exact = exact_searcher(rows, vectors)
    index = VectorSearcher(folder, "cosine", row_ids(rows))
    searcher = ApproximateVectorSearcher(exact, index, kind="ivf_hnsw_sq", nprobes=1, ef=10, refine_factor=2)
    yield exact, searcher
    index.close()


SUBJECTS = st.lists(st.sampled_from(["public", "staff", "secret", "nobody"]), min_size=1, max_size=3, unique=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    scopes=SUBJECTS,
    k=st.integers(1, 80),
    excluded=st.lists(st.integers(0, 366), max_size=20),
    roles=st.sampled_from([(), ("primary",), ("appendix",)]),
)
def test_laws_of_approximate_search_on_a_real_hnsw_index(hnsw_searchers, seed, scopes, k, excluded, roles):
    """For any build: hits are visible rows with exact search's score bits, in exact search's
    order, ``min(k, visible)`` of them, never better rank for rank than exact search's, and exact
    search's own whenever refine_factor × k reaches the visible rows."""
    exact, searcher = hnsw_searchers
    query = unit_vectors(1, 16, seed=seed)[0]
    args = (tuple(scopes), {f"d{d:05d}" for d in excluded}, roles)
    approximate = searcher.search(query, k, Prefilter(*args))
    everything = exact.search(query, len(exact.rows), Prefilter(*args))  # every visible row, exactly ranked
    score_of = dict(bits(everything))
    position = {r[0]: i for i, r in enumerate(exact.rows)}
    assert len(approximate) == min(k, len(everything))
    assert all(score_of[rep] == score for rep, score in bits(approximate))  # visible, the same bits
    keys = [(-h.score, position[h.representation_id]) for h in approximate]
    assert keys == sorted(keys)  # exact search's ranking rule and tie order
    assert all(a.score <= e.score for a, e in zip(approximate, everything))  # a subset's i-th best
    if k * searcher.refine_factor >= len(everything):
        assert bits(approximate) == bits(everything[:k])


def test_with_every_partition_probed_a_pq_index_returns_every_visible_row_asked_for(tmp_path: Path):
    """IVF_PQ scans the codes of every probed partition: probing all of them, the index returns
    ``min(limit, visible)`` candidates for any build, so a request whose limit covers the visible
    rows is answered from the index with exact search's result."""
    rows, vectors = table_rows(600), unit_vectors(600, 16, seed=6)
    build_vector_index(tmp_path / "pq", rows, vectors, "cosine", PQ)
    exact = exact_searcher(rows, vectors)
    index = VectorSearcher(tmp_path / "pq", "cosine", row_ids(rows))
    searcher = ApproximateVectorSearcher(exact, index, kind="ivf_pq", nprobes=PQ.num_partitions, ef=1, refine_factor=3)
    try:
        for seed in range(5):
            query = unit_vectors(1, 16, seed=100 + seed)[0]
            for scopes, k in ((("public",), 10), (("secret",), 50), (("public", "staff", "secret"), 20)):
                query32, visible = exact.prepare(query, k, Prefilter(scopes))
                found = searcher.candidates(query32, k, visible, Prefilter(scopes))
                assert len(found) == min(3 * k, len(visible))
                if 3 * k >= len(visible):
                    assert found.tolist() == visible.tolist()
                    assert bits(searcher.search(query, k, Prefilter(scopes))) == bits(
                        exact.search(query, k, Prefilter(scopes))
                    )
    finally:
        index.close()


def test_a_table_without_an_ann_index_cannot_serve_approximately(tmp_path: Path, small):
    rows, vectors = small
    build_vector_index(tmp_path / "v", rows, vectors, "cosine")
    with pytest.raises(ValueError, match="has no ANN index"):
        open_approximate_searcher(
            exact_searcher(rows, vectors), tmp_path / "v", kind="ivf_hnsw_sq", nprobes=1, ef=1, refine_factor=1
        )


def test_ann_partitions_reads_the_partition_count_lance_built(hnsw_table, small, tmp_path: Path):
    """``ann_partitions``: the IVF partitions of the index a query uses, from lance's executed plan
    (its index statistics leave them out); None when no IVF index answers (a flat table)."""
    folder, _, _ = hnsw_table
    table = lancedb.connect(str(folder)).open_table(TABLE_NAME)
    assert ann_partitions(table, "cosine") == HNSW.num_partitions
    rows, vectors = small
    build_vector_index(tmp_path / "flat", rows, vectors, "cosine")  # 120 rows: no vector index at all
    assert ann_partitions(lancedb.connect(str(tmp_path / "flat")).open_table(TABLE_NAME), "cosine") is None
    rows, vectors = table_rows(600), unit_vectors(600, 16, seed=8)
    three = HNSW.model_copy(update={"num_partitions": 3})
    build_vector_index(tmp_path / "three", rows, vectors, "cosine", three)
    assert ann_partitions(lancedb.connect(str(tmp_path / "three")).open_table(TABLE_NAME), "cosine") == 3
