"""Exact vector search: the project's definition of a score, the same bits on every host.

The law: ``MemoryVectorSearcher.search`` returns exactly what a plain-Python reference computes
from the definition in ``ragpipe.index.vector_memory`` — binary64 products added left to right in
dimension order, then ranked by (score descending, row) — for random vectors (continuous, small
integers with many exact ties, sparse, scaled over 60 decades so float32 estimates underflow and
overflow, duplicated rows), scopes, subjects, exclusions and ``k``: the same rows and the same
score bits (tolerance 0). Python's ``float`` is IEEE binary64 evaluated one operation at a time, so
the reference shares no code and no kernel with numpy.

Host independence: the same cases run again in a child process with every numpy dispatch target
disabled (``NPY_DISABLE_CPU_FEATURES``: baseline SSE kernels only, no AVX2, FMA or AVX-512 loops),
which checks them against the reference there and prints its scores; they must equal this
process's bit for bit. Golden scores of a fixed, formula-generated table pin the definition: any
host, any numpy, must reproduce them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.embedding.compute import embeddings_digest
from ragpipe.index.hits import Hit
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexRow
from ragpipe.index.vector import build_vector_index
from ragpipe.index.vector_memory import (
    EXACT_SCORES,
    METRICS,
    MemoryVectorSearcher,
    VectorVerificationError,
    exact_scores,
    open_vector_searcher,
    verified_vectors,
)
from ragpipe.retrieval.plan import VectorSearchPlan

SCOPES = ("public", "staff", "secret")
STYLES = ("normal", "integers", "sparse", "scaled", "extreme")


def make_vectors(rng: np.random.Generator, n: int, dim: int, style: str, distinct: int) -> np.ndarray:
    """``n`` rows drawn from ``distinct`` base vectors (exact duplicates when distinct < n)."""
    if style == "integers":  # exact products: many exactly tied scores between different rows
        base = rng.integers(-3, 4, size=(distinct, dim)).astype(np.float32)
    elif style == "sparse":
        base = rng.normal(size=(distinct, dim)).astype(np.float32) * (rng.random((distinct, dim)) < 0.2)
    elif style == "scaled":
        base = (rng.normal(size=(distinct, dim)) * 10.0 ** rng.uniform(-3, 3, size=(distinct, 1))).astype(np.float32)
    elif style == "extreme":  # float32 products underflow to subnormals or overflow to infinity
        base = (rng.normal(size=(distinct, dim)) * 10.0 ** rng.uniform(-30, 30, size=(distinct, dim))).astype(
            np.float32
        )
    else:
        base = rng.normal(size=(distinct, dim)).astype(np.float32)
    return base[rng.integers(0, distinct, size=n)]


def make_rows(rng: np.random.Generator, n: int) -> list[IndexRow]:
    per_document = int(rng.integers(1, 5))
    rows = []
    for i in range(n):
        scopes = tuple(sorted({SCOPES[j] for j in rng.integers(0, len(SCOPES), size=int(rng.integers(1, 3)))}))
        rows.append(IndexRow(f"r{i:05d}", f"c{i:05d}", f"d{i // per_document:05d}", "raw", "", scopes, "primary"))
    return rows


def ids(rows: list[IndexRow]) -> list[tuple[str, str, str]]:
    return [(r.representation_id, r.chunk_id, r.document_id) for r in rows]


def searcher_of(rows: list[IndexRow], vectors: np.ndarray, metric: str) -> MemoryVectorSearcher:
    return MemoryVectorSearcher(metric, ids(rows), [r.access_scopes for r in rows], vectors.copy())


# --- the reference: the definition, one binary64 operation at a time ---------------------------


def reference_score(metric: str, row: np.ndarray, query: np.ndarray) -> float:
    x, q = [float(v) for v in row], [float(v) for v in query]

    def running(terms: list[float]) -> float:
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    if metric == "l2":
        return -running([(a - b) * (a - b) for a, b in zip(x, q)])
    dot = running([a * b for a, b in zip(x, q)])
    if metric == "dot":
        return dot
    denominator = math.sqrt(running([a * a for a in x])) * math.sqrt(running([b * b for b in q]))
    return dot / denominator if denominator else math.nan  # a zero row or query: 0 / 0


def reference_search(metric, rows, vectors, query, k, scopes, exclude) -> list[Hit]:
    scored = []
    for i, row in enumerate(rows):
        if not set(row.access_scopes) & set(scopes) or row.document_id in exclude:
            continue
        score = reference_score(metric, vectors[i], query)
        if math.isfinite(score):
            scored.append((-score, i))
    scored.sort()
    return [Hit("vector", *ids(rows)[i], -negated) for negated, i in scored[:k]]


def bits(hits: list[Hit]) -> list[tuple[str, str]]:
    return [(h.representation_id, np.float64(h.score).tobytes().hex()) for h in hits]


# --- the law, over random tables --------------------------------------------------------------


def cases(seed: int, n: int, dim: int, style: str, distinct: int, queries) -> list[dict]:
    """Searches of one random table: each with its reference and actual hits."""
    rng = np.random.default_rng(seed)
    vectors = make_vectors(rng, n, dim, style, max(1, min(distinct, n)))
    rows = make_rows(rng, n)
    documents = sorted({r.document_id for r in rows})
    out = []
    for metric in METRICS:
        searcher = searcher_of(rows, vectors, metric)
        for query_seed, subject, k, excluded, stored in queries:
            q_rng = np.random.default_rng(query_seed)
            query = vectors[q_rng.integers(0, n)] if stored else make_vectors(q_rng, 1, dim, style, 1)[0]
            scopes = tuple(sorted(subject))
            exclude = {documents[int(i)] for i in q_rng.integers(0, len(documents), size=excluded)}
            k = min(k, n + 3)
            out.append(
                {
                    "expected": bits(reference_search(metric, rows, vectors, query, k, scopes, exclude)),
                    "actual": bits(searcher.search(query, k, Prefilter(scopes, exclude))),
                }
            )
    return out


queries_strategy = st.lists(
    st.tuples(
        st.integers(0, 2**32 - 1),  # query seed
        st.sets(st.sampled_from(SCOPES + ("nobody",)), min_size=0, max_size=3),
        st.integers(1, 400),  # k
        st.integers(0, 3),  # excluded documents
        st.booleans(),  # the query is a stored row
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
    dim=st.sampled_from([1, 3, 16, 37]),
    style=st.sampled_from(STYLES),
    distinct=st.integers(1, 300),
    queries=queries_strategy,
)
def test_searches_return_the_definitions_top_k_bit_for_bit(n, seed, dim, style, distinct, queries):
    for case in cases(seed, n, dim, style, distinct, queries):
        assert case["actual"] == case["expected"]


# Fixed cases for the restricted-dispatch child: every style and metric, embedding-sized rows.
FIXED = [
    (seed, n, dim, style, distinct, [(seed + j, ("public", "staff", "secret")[: 1 + j % 3], k, j % 2, j == 2)])
    for seed, (n, dim, style, distinct) in enumerate(
        [(400, 384, "normal", 400), (300, 384, "integers", 40), (250, 48, "sparse", 250), (200, 32, "scaled", 50)]
        + [(150, 24, "extreme", 150), (64, 384, "normal", 8)]
    )
    for j, k in enumerate((1, 10, 100))
]


def fixed_case_bits() -> list[list[dict]]:
    return [cases(*case) for case in FIXED]


def test_scores_are_the_same_bits_with_numpys_simd_dispatch_restricted():
    """The child disables every numpy dispatch target this numpy has (AVX2/FMA3 and AVX-512 groups
    on x86-64), checks it took effect, checks every fixed case against the reference there, and
    prints its scores: they equal the unrestricted ones here."""
    from numpy._core._multiarray_umath import __cpu_dispatch__

    here = fixed_case_bits()
    for table in here:
        for case in table:
            assert case["actual"] == case["expected"]
    env = {**os.environ, "NPY_DISABLE_CPU_FEATURES": " ".join(__cpu_dispatch__)}
    child = (
        "import json\n"
        "from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__\n"
        "assert not any(__cpu_features__.get(f) for f in __cpu_dispatch__), __cpu_features__\n"
        "from ragpipe_tests.index.test_vector_memory import fixed_case_bits\n"
        "print(json.dumps(fixed_case_bits()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    there = json.loads(done.stdout)
    assert there == [[{k: [list(p) for p in v] for k, v in c.items()} for c in t] for t in here]
    assert sum(len(c["actual"]) for t in here for c in t) > 1000  # the cases return hits to compare


# --- golden scores: a fixed table any host must reproduce ---------------------------------------


def golden_table(n: int = 48, dim: int = 384) -> tuple[np.ndarray, np.ndarray]:
    """Rows and a query from integer formulas (no random generator whose stream could change)."""
    i = np.arange(n, dtype=np.int64)[:, None]
    j = np.arange(dim, dtype=np.int64)[None, :]
    rows = ((i * 7919 + j * 104729 + i * j * 31) % 20011 / 20011.0 - 0.5).astype(np.float32)
    query = ((np.arange(dim) * 2654435761 % 1000003) / 1000003.0 - 0.5).astype(np.float32)
    return rows, query


GOLDEN = {
    "cosine": [
        ("r06", "0x1.22890bbbd9e6cp-4"),
        ("r18", "0x1.01bec8a98f060p-4"),
        ("r31", "0x1.00158dd1522f8p-4"),
        ("r36", "0x1.d77ae4db4eedbp-5"),
        ("r35", "0x1.8ac289890fe1bp-5"),
    ],
    "dot": [
        ("r06", "0x1.22f0109414b20p+1"),
        ("r18", "0x1.029e23b496ed0p+1"),
        ("r31", "0x1.00a171b2aeb5fp+1"),
        ("r36", "0x1.d8bd9d771ba70p+0"),
        ("r35", "0x1.8c6171f586fc4p+0"),
    ],
    "l2": [
        ("r06", "-0x1.dc58535b31263p+5"),
        ("r31", "-0x1.e103fe0246ac6p+5"),
        ("r18", "-0x1.e1680f8f89641p+5"),
        ("r36", "-0x1.e3d2eabee692cp+5"),
        ("r35", "-0x1.e954141715b51p+5"),
    ],
}


@pytest.mark.parametrize("metric", METRICS)
def test_golden_scores_of_a_fixed_table(metric):
    rows, query = golden_table()
    table = [IndexRow(f"r{i:02d}", f"c{i:02d}", f"d{i:02d}", "raw", "", ("public",), "primary") for i in range(48)]
    hits = searcher_of(table, rows, metric).search(query, 5, Prefilter(("public",)))
    got = [(h.representation_id, float(h.score).hex()) for h in hits]
    assert got == GOLDEN[metric]
    assert got == [(h.representation_id, float(h.score).hex()) for h in reference_search(
        metric, table, rows, query, 5, ("public",), set()
    )]  # fmt: skip


def test_the_plan_names_this_definition():
    assert VectorSearchPlan().scores == EXACT_SCORES == "float64_sequential/v1"


def test_exact_scores_of_one_row():
    row = np.array([[1.0, 2.0, 2.0]], dtype=np.float32)
    query = np.array([0.0, 3.0, 4.0], dtype=np.float32)
    assert exact_scores("dot", row, query).tolist() == [14.0]
    assert exact_scores("cosine", row, query).tolist() == [14.0 / (3.0 * 5.0)]
    assert exact_scores("l2", row, query).tolist() == [-(1.0 + 1.0 + 4.0)]


def test_an_order_dependent_sum_follows_dimension_order():
    """1 + 2⁻⁵³ + 2⁻⁵³ is 1 added left to right (each half-ulp rounds to even), 1 + 2⁻⁵² in any
    order that adds the small terms first: the definition says which."""
    row = np.array([[1.0, 2.0**-27, 2.0**-27]], dtype=np.float32)  # products 1, 2⁻⁵³, 2⁻⁵³
    query = np.array([1.0, 2.0**-26, 2.0**-26], dtype=np.float32)
    assert exact_scores("dot", row, query).tolist() == [1.0]
    assert reference_score("dot", row[0], query) == 1.0
    assert 1.0 + (2.0**-53 + 2.0**-53) == 1.0 + 2.0**-52  # the other order


# --- filters, limits, refusals ----------------------------------------------------------------


@pytest.fixture
def small():
    rng = np.random.default_rng(3)
    rows = make_rows(rng, 40)
    vectors = make_vectors(rng, 40, 32, "normal", 40)
    return searcher_of(rows, vectors, "cosine"), rows, vectors


def test_no_scopes_unknown_scopes_and_excluded_documents_give_nothing(small):
    memory, rows, vectors = small
    for args in [((), ()), (("nobody",), ()), (SCOPES, sorted({r.document_id for r in rows}))]:
        assert memory.search(vectors[0], 5, Prefilter(*args)) == []


def test_k_above_the_visible_rows_returns_every_visible_row(small):
    memory, rows, vectors = small
    visible = [r for r in rows if "secret" in r.access_scopes]
    hits = memory.search(vectors[1], 1000, Prefilter(("secret",)))
    assert sorted(h.representation_id for h in hits) == [r.representation_id for r in visible]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_invalid_scope_names_k_and_dimensions_are_refused(small):
    memory, _, vectors = small
    with pytest.raises(ValueError, match=r"invalid scope name \"x'\) OR true --\""):
        memory.search(vectors[0], 3, Prefilter(("public", "x') OR true --")))
    with pytest.raises(ValueError, match="k must be positive"):
        memory.search(vectors[0], 0, Prefilter(("public",)))
    with pytest.raises(ValueError, match="query has 31 dimensions, the vectors 32"):
        memory.search(vectors[0][:31], 3, Prefilter(("public",)))


def test_a_zero_cosine_query_or_row_scores_nothing(small):
    memory, rows, vectors = small
    assert memory.search(np.zeros(vectors.shape[1], dtype=np.float32), 5, Prefilter(SCOPES)) == []
    with_zero = vectors.copy()
    with_zero[4] = 0.0
    hits = searcher_of(rows, with_zero, "cosine").search(vectors[4], 40, Prefilter(SCOPES))
    assert len(hits) == 39 and "r00004" not in {h.representation_id for h in hits}
    with_infinity = vectors.copy()
    with_infinity[7, 3] = np.inf  # its dot score is an infinity: no ranking, never a hit
    for metric in METRICS:
        hits = searcher_of(rows, with_infinity, metric).search(vectors[7], 40, Prefilter(SCOPES))
        assert len(hits) == 39 and "r00007" not in {h.representation_id for h in hits}, metric


def test_a_closed_searcher_refuses_searches(small):
    memory, _, vectors = small
    memory.search(vectors[0], 3, Prefilter(("public",)))
    memory.close()
    with pytest.raises(RuntimeError, match="vector searcher is closed"):
        memory.search(vectors[0], 3, Prefilter(("public",)))


def test_concurrent_searches_equal_sequential_ones(small):
    memory, _, vectors = small
    cases_ = [(vectors[i % len(vectors)], 1 + i % 17, Prefilter(SCOPES[: 1 + i % 3])) for i in range(64)]
    expected = [memory.search(*case) for case in cases_]
    barrier = threading.Barrier(8)

    def run(i: int):
        if i < 8:
            barrier.wait()
        return memory.search(*cases_[i])

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(run, range(len(cases_)))) == expected


def test_the_searcher_keeps_the_matrix_read_only(small):
    memory, _, _ = small
    with pytest.raises(ValueError, match="read-only"):
        memory._tables.matrix[0, 0] = 1.0


# --- opening: verified vectors, from vectors.arrow or the lance table ---------------------------


def digest(rows: list[IndexRow], vectors: np.ndarray) -> str:
    return embeddings_digest([r.representation_id for r in rows], vectors)


def test_the_factory_serves_verified_vectors_from_either_store(tmp_path):
    rng = np.random.default_rng(5)
    rows, vectors = make_rows(rng, 60), make_vectors(rng, 60, 32, "normal", 60)
    build_vector_index(tmp_path / "v", rows, vectors, "dot")
    options = {"row_scopes": [r.access_scopes for r in rows], "embeddings_digest": digest(rows, vectors)}
    given = open_vector_searcher(tmp_path / "v", "dot", ids(rows), vectors=vectors.copy(), **options)
    checked: list[str] = []
    read = open_vector_searcher(tmp_path / "v", "dot", ids(rows), before_lance=lambda: checked.append("x"), **options)
    assert checked == ["x"]  # the deferred table check ran before the table was read
    assert given.engine == read.engine == "memory"
    assert given.why == (
        "exact scores (float64_sequential/v1) in memory: 60 vectors of 32 dimensions, 7,680 bytes, read from vectors.arrow"
    )
    assert read.why.endswith("read from the lance table (this bundle has no vectors.arrow)")
    assert given.search(vectors[2], 7, Prefilter(("public", "staff"))) == read.search(
        vectors[2], 7, Prefilter(("public", "staff"))
    )


def test_vectors_that_are_not_the_manifests_are_refused(tmp_path):
    rng = np.random.default_rng(6)
    rows, vectors = make_rows(rng, 20), make_vectors(rng, 20, 32, "normal", 20)
    build_vector_index(tmp_path / "v", rows, vectors, "cosine")
    scopes = [r.access_scopes for r in rows]
    tampered = vectors.copy()
    tampered[3, 5] = np.nextafter(tampered[3, 5], np.float32(np.inf))  # one ulp of one component
    swapped = vectors[[1, 0] + list(range(2, 20))]  # the right vectors, two rows exchanged
    for options in (
        {"embeddings_digest": "sha256:" + "0" * 64},
        {"embeddings_digest": digest(rows, vectors), "vectors": tampered},
        {"embeddings_digest": digest(rows, vectors), "vectors": swapped},
    ):
        with pytest.raises(VectorVerificationError, match="embeddings digest"):
            open_vector_searcher(tmp_path / "v", "cosine", ids(rows), row_scopes=scopes, **options)
    assert verified_vectors(ids(rows), vectors, digest(rows, vectors)).dtype == np.float32


def test_retriever_scores_are_the_definitions(scoped_bundles):
    """End to end on a real bundle (MiniLM vectors): every vector hit's score is the reference's
    for the query vector the retriever embedded."""
    from ragpipe.retrieval.retriever import Retriever

    retriever = Retriever(scoped_bundles[0])
    try:
        tables = retriever.vector._tables
        row_of = {r[0]: i for i, r in enumerate(retriever.vector.rows)}
        metric = retriever.vector.metric
        for text in ("aspirin stroke", "secret trial"):
            query = retriever.embedder().embed_query(text)
            hits = retriever.vector.search(query, 10, Prefilter(("public", "secret", "staff")))
            assert len(hits) == 10
            for hit in hits:
                row = tables.matrix[row_of[hit.representation_id]]
                assert hit.score == reference_score(metric, row, np.asarray(query, dtype=np.float32))
    finally:
        retriever.close()


def test_this_module_is_importable_without_lancedb():
    code = "import sys, ragpipe.index.vector_memory, ragpipe.retrieval.vector_engine; print('lancedb' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"
