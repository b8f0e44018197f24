"""The in-memory vector searcher returns lancedb's exact search, bit for bit.

Laws on real lancedb tables (flat scans below ``IVF_MIN_ROWS``, IVF_FLAT with every partition
probed above it): random vectors (continuous, small integers with many tied distances, sparse,
duplicated rows), random scopes, subjects, exclusions and ``k``. Distances must be bitwise equal
(tolerance 0) and rows in the same order; through IVF_FLAT, which of several rows tying at the
``k``-th place lancedb returns depends on its partitions, so there the tied group is compared as a
set and the channel rankings built on both searchers must be identical.

These laws hold where lance picks the kernels the engine reproduces (AVX-512 hosts): elsewhere
each law that compares with lancedb is skipped with the host's reason, per metric and index kind
(``ragpipe_tests.support.lance_kernels``), and the rest — the engine's own arithmetic, filters,
limits and refusals — runs on every host.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragpipe.embedding.compute import embeddings_digest
from ragpipe.index import vector_memory
from ragpipe.index.hits import Hit
from ragpipe.index.ivf import IVF_MIN_ROWS
from ragpipe.index.rows import IndexRow
from ragpipe.index.vector import VectorSearcher, build_vector_index
from ragpipe.index.vector_memory import (
    MemoryVectorSearcher,
    VectorVerificationError,
    calibration_problem,
    open_vector_searcher,
    verified_vectors,
)
from ragpipe.retrieval.channels import VectorBackend, rank_channel
from ragpipe.retrieval.plan import DepthPolicy
from ragpipe_tests.support.lance_kernels import require_lance_kernels

SCOPES = ("public", "staff", "secret")
STYLES = ("normal", "integers", "sparse", "scaled")


def make_vectors(rng: np.random.Generator, n: int, dim: int, style: str, distinct: int) -> np.ndarray:
    """``n`` rows drawn from ``distinct`` base vectors (exact duplicates when distinct < n)."""
    if style == "integers":  # exact products: many exactly tied distances between different rows
        base = rng.integers(-3, 4, size=(distinct, dim)).astype(np.float32)
    elif style == "sparse":
        base = rng.normal(size=(distinct, dim)).astype(np.float32) * (rng.random((distinct, dim)) < 0.2)
    elif style == "scaled":
        base = (rng.normal(size=(distinct, dim)) * 10.0 ** rng.uniform(-3, 3, size=(distinct, 1))).astype(np.float32)
    else:
        base = rng.normal(size=(distinct, dim)).astype(np.float32)
    base[~base.any(axis=1), 0] = 1.0  # no zero rows: lance never returns them under cosine
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


def searchers(directory: Path, rows: list[IndexRow], vectors: np.ndarray, metric: str):
    build_vector_index(directory, rows, vectors, metric)
    lance = VectorSearcher(directory, metric, ids(rows))
    memory = MemoryVectorSearcher(
        metric, ids(rows), [r.access_scopes for r in rows], lance.read_vectors(), lance.indexed
    )
    return lance, memory


def bits(hits: list[Hit]) -> list[int]:
    return np.array([h.score for h in hits], dtype=np.float64).view(np.int64).tolist()


def assert_same_search(lance: VectorSearcher, memory: MemoryVectorSearcher, query, k, scopes, exclude) -> None:
    expected = lance.search(query, k, scopes, exclude)
    actual = memory.search(query, k, scopes, exclude)
    assert bits(actual) == bits(expected)  # same distances, tolerance 0, in the same order
    if not lance.indexed or not expected:
        assert actual == expected  # flat scan: lancedb orders ties by row, as memory does
        return
    # IVF_FLAT: identical except which rows of a tie spanning the k-th place are returned
    boundary = expected[-1].score
    assert [h for h in actual if h.score != boundary] == [h for h in expected if h.score != boundary]
    everything = lance.search(query, max(1, len(lance.rows)), scopes, exclude)
    tied = sorted(h.representation_id for h in everything if h.score == boundary)
    got = [h.representation_id for h in actual if h.score == boundary]
    assert got == tied[: len(got)]  # memory: the lowest rows of the tie
    assert {h.representation_id for h in expected if h.score == boundary} <= set(tied)


def assert_same_channel(lance, memory, query, scopes, units: int, policy: DepthPolicy) -> None:
    size = len(lance.rows)
    for level in ("chunk", "document"):
        rankings = [
            rank_channel(VectorBackend(searcher, query, scopes, size), units, level, policy)
            for searcher in (lance, memory)
        ]
        assert rankings[0].ranked == rankings[1].ranked


queries_strategy = st.lists(
    st.tuples(
        st.integers(0, 2**32 - 1),  # query seed
        st.sets(st.sampled_from(SCOPES + ("nobody",)), min_size=0, max_size=3),
        st.integers(1, 1200),  # k
        st.integers(0, 3),  # excluded documents
        st.booleans(),  # the query is a stored row
    ),
    min_size=1,
    max_size=4,
)


def check_tables(tmp_path: Path, n: int, seed: int, metric: str, dim: int, style: str, distinct: int, queries) -> None:
    rng = np.random.default_rng(seed)
    vectors = make_vectors(rng, n, dim, style, max(1, min(distinct, n)))
    rows = make_rows(rng, n)
    directory = Path(tempfile.mkdtemp(dir=tmp_path))  # hypothesis shares tmp_path between examples
    lance, memory = searchers(directory, rows, vectors, metric)
    try:
        documents = sorted({r.document_id for r in rows})
        for query_seed, subject, k, excluded, stored in queries:
            q_rng = np.random.default_rng(query_seed)
            query = vectors[q_rng.integers(0, n)] if stored else make_vectors(q_rng, 1, dim, style, 1)[0]
            scopes = tuple(sorted(subject))
            exclude = [documents[int(i)] for i in q_rng.integers(0, len(documents), size=excluded)]
            assert_same_search(lance, memory, query, min(k, n + 3), scopes, exclude)
        query_seed, subject, k, _, _ = queries[0]
        query = make_vectors(np.random.default_rng(query_seed), 1, dim, style, 1)[0]
        assert_same_channel(lance, memory, query, tuple(sorted(subject)), 1 + k % 20, DepthPolicy(request_multiple=2))
    finally:
        lance.close()


METRICS = ("cosine", "dot", "l2")


@pytest.fixture(params=METRICS)
def flat_metric(request) -> str:
    require_lance_kernels(request.param, indexed=False)
    return request.param


@pytest.fixture(params=METRICS)
def ivf_metric(request) -> str:
    require_lance_kernels(request.param, indexed=True)
    return request.param


@settings(max_examples=34, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 150),
    seed=st.integers(0, 2**32 - 1),
    dim=st.sampled_from([32, 48]),
    style=st.sampled_from(STYLES),
    distinct=st.integers(1, 200),
    queries=queries_strategy,
)
def test_flat_tables_search_exactly_as_lancedb(tmp_path, flat_metric, n, seed, dim, style, distinct, queries):
    check_tables(tmp_path, n, seed, flat_metric, dim, style, distinct, queries)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    extra=st.integers(0, 150),
    seed=st.integers(0, 2**32 - 1),
    dim=st.sampled_from([32, 48]),
    style=st.sampled_from(STYLES),
    distinct=st.sampled_from([40, 400, 2000]),
    queries=queries_strategy,
)
def test_ivf_tables_search_exactly_as_lancedb(tmp_path, ivf_metric, extra, seed, dim, style, distinct, queries):
    check_tables(tmp_path, IVF_MIN_ROWS + extra, seed, ivf_metric, dim, style, distinct, queries)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("n", [300, IVF_MIN_ROWS + 10])
def test_embedding_sized_vectors_search_exactly_as_lancedb(tmp_path, metric, n):
    """384 dimensions, as the default embedder: the kernels' chunk count of a real bundle."""
    require_lance_kernels(metric, indexed=n >= IVF_MIN_ROWS)
    rng = np.random.default_rng(n)
    vectors = make_vectors(rng, n, 384, "normal", n)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    rows = make_rows(rng, n)
    lance, memory = searchers(tmp_path / "v", rows, vectors, metric)
    for i in range(8):
        query = rng.normal(size=384).astype(np.float32)
        assert_same_search(lance, memory, query, [1, 10, 200, n][i % 4], ("public", "staff")[: 1 + i % 2], ())
    lance.close()


@pytest.fixture
def small(tmp_path):
    rng = np.random.default_rng(3)
    rows = make_rows(rng, 40)
    vectors = make_vectors(rng, 40, 32, "normal", 40)
    lance, memory = searchers(tmp_path / "v", rows, vectors, "cosine")
    yield lance, memory, rows, vectors
    lance.close()


def test_no_scopes_unknown_scopes_and_excluded_documents_give_nothing(small):
    lance, memory, rows, vectors = small
    for args in [((), ()), (("nobody",), ()), (SCOPES, sorted({r.document_id for r in rows}))]:
        assert memory.search(vectors[0], 5, *args) == lance.search(vectors[0], 5, *args) == []


def test_k_above_the_visible_rows_returns_every_visible_row(small):
    lance, memory, rows, vectors = small
    visible = [r for r in rows if "secret" in r.access_scopes]
    hits = memory.search(vectors[1], 1000, ("secret",))
    # the same rows as lancedb's (their last bits are the kernel law's business, above)
    assert {h.representation_id for h in hits} == {
        h.representation_id for h in lance.search(vectors[1], 1000, ("secret",))
    }
    assert sorted(h.representation_id for h in hits) == [r.representation_id for r in visible]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_invalid_scope_names_k_and_dimensions_are_refused_as_lancedb_does(small):
    lance, memory, _, vectors = small
    for searcher in (lance, memory):
        with pytest.raises(ValueError, match=r"invalid scope name \"x'\) OR true --\""):
            searcher.search(vectors[0], 3, ("public", "x') OR true --"))
        with pytest.raises(ValueError, match="k must be positive"):
            searcher.search(vectors[0], 0, ("public",))
        with pytest.raises(ValueError, match="dimension"):
            searcher.search(vectors[0][:31], 3, ("public",))


def test_a_zero_cosine_query_returns_nothing_as_lancedb_does(small):
    lance, memory, _, vectors = small
    zero = np.zeros(vectors.shape[1], dtype=np.float32)
    assert memory.search(zero, 5, SCOPES) == lance.search(zero, 5, SCOPES) == []


def test_a_closed_searcher_refuses_searches(small):
    _, memory, _, vectors = small
    memory.search(vectors[0], 3, ("public",))
    memory.close()
    with pytest.raises(RuntimeError, match="vector searcher is closed"):
        memory.search(vectors[0], 3, ("public",))


def test_concurrent_searches_equal_sequential_ones(small):
    _, memory, _, vectors = small
    cases = [(vectors[i % len(vectors)], 1 + i % 17, SCOPES[: 1 + i % 3]) for i in range(64)]
    expected = [memory.search(*case) for case in cases]
    barrier = threading.Barrier(8)

    def run(i: int):
        if i < 8:
            barrier.wait()
        return memory.search(*cases[i])

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(run, range(len(cases)))) == expected


def digest(rows: list[IndexRow], vectors: np.ndarray) -> str:
    return embeddings_digest([r.representation_id for r in rows], vectors)


def test_the_factory_serves_verified_vectors_from_memory_up_to_the_limit(tmp_path):
    rng = np.random.default_rng(5)
    rows, vectors = make_rows(rng, 60), make_vectors(rng, 60, 32, "normal", 60)
    build_vector_index(tmp_path / "v", rows, vectors, "dot")
    scopes = [r.access_scopes for r in rows]

    def open_with(**options):
        options.setdefault("embeddings_digest", digest(rows, vectors))
        options.setdefault("engine", "memory")  # the limit, not this host's lance kernels
        return open_vector_searcher(tmp_path / "v", "dot", ids(rows), row_scopes=scopes, **options)

    memory = open_with()
    assert isinstance(memory, MemoryVectorSearcher) and memory.engine == "memory"
    assert memory.why == "in memory, as the vector engine setting asks (not compared with lancedb)"
    exact = 60 * 32 * 4
    assert open_with(memory_limit_bytes=exact).engine == "memory"
    lance = open_with(memory_limit_bytes=exact - 1)
    assert isinstance(lance, VectorSearcher) and lance.engine == "lancedb"
    assert lance.why == "lancedb: 60 vectors of 32 dimensions, 7,680 bytes, exceed the in-memory limit of 7,679 bytes"
    assert [h.representation_id for h in memory.search(vectors[2], 7, ("public", "staff"))] == [
        h.representation_id for h in lance.search(vectors[2], 7, ("public", "staff"))
    ]
    assert open_with(vectors=vectors).engine == "memory"
    lance.close()
    memory.close()


def test_the_setting_chooses_the_engine_and_auto_calibrates(tmp_path, caplog):
    """``lancedb`` never serves from memory; ``memory`` serves without lancedb's table being
    searched; ``auto`` serves from memory exactly where this host's calibration passes, and says
    so — the same table gives the other answer on a host whose lance kernels differ."""
    rng = np.random.default_rng(8)
    rows, vectors = make_rows(rng, 60), make_vectors(rng, 60, 32, "normal", 60)
    build_vector_index(tmp_path / "v", rows, vectors, "cosine")
    options = {"row_scopes": [r.access_scopes for r in rows], "embeddings_digest": digest(rows, vectors)}
    lance = open_vector_searcher(tmp_path / "v", "cosine", ids(rows), engine="lancedb", **options)
    assert (lance.engine, lance.why) == ("lancedb", "lancedb, as the vector engine setting asks")
    lance.close()
    with pytest.raises(ValueError, match=r"unknown vector engine 'fast' \(auto, memory, lancedb\)"):
        open_vector_searcher(tmp_path / "v", "cosine", ids(rows), engine="fast", **options)
    with caplog.at_level(logging.WARNING, logger="ragpipe.index.vector_memory"):
        auto = open_vector_searcher(tmp_path / "v", "cosine", ids(rows), **options)
    reference = MemoryVectorSearcher("cosine", ids(rows), options["row_scopes"], vectors, False)
    problem = calibration_problem(reference, VectorSearcher(tmp_path / "v", "cosine", ids(rows)), options["row_scopes"])
    if problem is None:
        assert (auto.engine, caplog.text) == ("memory", "")
        assert auto.why == "in memory: it reproduced lancedb's distances on this host's calibration probes"
    else:
        assert auto.engine == "lancedb" and auto.why.startswith(f"lancedb: calibration on this host: {problem}")
        assert "reproduces lance's AVX-512 kernels" in auto.why and problem in caplog.text
    auto.close()


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


def test_unsupported_dimensions_and_failed_calibration_are_served_by_lancedb(tmp_path, monkeypatch, caplog):
    rng = np.random.default_rng(7)
    rows = make_rows(rng, 30)
    for dim, name in ((20, "v20"), (16, "v16")):
        vectors = make_vectors(rng, 30, dim, "normal", 30)
        build_vector_index(tmp_path / name, rows, vectors, "l2")
        searcher = open_vector_searcher(
            tmp_path / name, "l2", ids(rows), row_scopes=[r.access_scopes for r in rows],
            embeddings_digest=digest(rows, vectors),
        )  # fmt: skip
        assert searcher.engine == "lancedb"
        searcher.close()
    vectors = make_vectors(rng, 30, 32, "normal", 30)
    build_vector_index(tmp_path / "v32", rows, vectors, "l2")
    # another lance build would sum in another order: the probes see it and lancedb serves
    monkeypatch.setattr(vector_memory, "_lane_dot", lambda products: products.sum(axis=1, dtype=np.float32))
    with caplog.at_level(logging.WARNING, logger="ragpipe.index.vector_memory"):
        searcher = open_vector_searcher(
            tmp_path / "v32", "l2", ids(rows), row_scopes=[r.access_scopes for r in rows],
            embeddings_digest=digest(rows, vectors),
        )  # fmt: skip
    assert searcher.engine == "lancedb" and "differ from the in-memory kernels" in caplog.text
    searcher.close()


def test_retriever_results_are_identical_with_either_engine(scoped_bundles):
    """End to end on a real bundle (MiniLM vectors, public/staff/secret documents): every mode
    and subject gives the same hits, scores and channel traces with lancedb or memory serving."""
    from ragpipe.retrieval.authz import Subject
    from ragpipe.retrieval.retriever import Retriever

    require_lance_kernels("cosine", indexed=False)  # the bundle's metric and size
    lance_side = Retriever(scoped_bundles[0], vector_engine="lancedb")
    memory_side = Retriever(lance_side.bundle, vector_engine="memory")
    assert (lance_side.vector.engine, memory_side.vector.engine) == ("lancedb", "memory")
    memory_side._embedder = lance_side.embedder()
    subjects = [
        Subject("anon", ("public",)),
        Subject("admin", ("public", "secret", "staff")),
        Subject("spy", ("secret",)),
    ]
    try:
        for text in ("aspirin stroke", "secret trial", "heart"):
            for subject in subjects:
                for mode in ("vector", "hybrid"):
                    for k in (1, 5, 50):
                        got = [
                            r.query(text, subject, k=k, mode=mode, trace=True).as_dict()
                            for r in (lance_side, memory_side)
                        ]
                        for result in got:
                            result["trace"].pop("timings_ms")
                        assert got[0] == got[1]
    finally:
        lance_side.close()
        memory_side.close()


def round_to_float32(value: Fraction) -> np.float32:
    """``value`` rounded once to the nearest float32, ties to even (subnormals included)."""
    guess = np.float32(float(value))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(np.array(c).view(np.int32)) & 1))


def fused_reference(left: np.ndarray, right: np.ndarray) -> np.float32:
    """lance's fused 16-lane kernel in exact rational arithmetic, one rounding per step."""
    lanes = [np.float32(0)] * 16
    for i in range(0, len(left), 16):
        for j in range(16):
            exact = Fraction(float(lanes[j])) + Fraction(float(left[i + j])) * Fraction(float(right[i + j]))
            lanes[j] = round_to_float32(exact)
    acc = np.array(lanes, dtype=np.float32)[None, :]
    return vector_memory._tree_sum(acc)[0]


def test_a_fused_step_that_float64_would_round_twice_is_rounded_once():
    """acc = 1 + 2⁻²³, then + (1 + 2⁻²³)·(−2⁻²⁴(1 − 2⁻²³)): the exact sum 1 + 2⁻²⁴ + 2⁻⁷⁰ lies just
    above a float32 midpoint, float64 rounds it onto the midpoint and float32 then to 1.0; an FMA
    gives 1 + 2⁻²³."""
    left = np.zeros(32, dtype=np.float32)
    right = np.zeros(32, dtype=np.float32)
    left[0], right[0] = 1 + 2.0**-23, 1.0
    left[16], right[16] = 1 + 2.0**-23, -(2.0**-24) * (1 - 2.0**-23)
    naive = np.float32(np.float64(left[0] * right[0]) + np.float64(left[16]) * np.float64(right[16]))
    assert naive == np.float32(1.0)
    assert vector_memory._fused_dot(left[None, :], right)[0] == np.float32(1 + 2.0**-23) == fused_reference(left, right)


floats32 = st.floats(-(2.0**40), 2.0**40, width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(floats32, min_size=64, max_size=64), st.booleans())
def test_fused_dot_rounds_every_step_once(values, near_cancel):
    left, right = np.array(values[:32], dtype=np.float32), np.array(values[32:], dtype=np.float32)
    if near_cancel:  # second chunk almost cancels the first: tiny, subnormal or zero accumulators
        right[16:] = -right[:16]
        left[16:] = np.nextafter(left[:16], np.float32(np.inf))
    assert vector_memory._fused_dot(left[None, :], right)[0].tobytes() == fused_reference(left, right).tobytes()


@pytest.mark.parametrize("agrees", [True, False])
def test_auto_follows_the_calibrations_verdict_on_any_host(tmp_path, monkeypatch, agrees):
    """Both outcomes of a calibration, whatever this host's kernels: the probes' verdict decides
    the engine, is recorded, and is what ``why`` says (the probes themselves are the laws above)."""
    from ragpipe.index.engine_calibration import CalibrationRecords, host_has_avx512

    rng = np.random.default_rng(9)
    rows, vectors = make_rows(rng, 40), make_vectors(rng, 40, 32, "normal", 40)
    build_vector_index(tmp_path / "v", rows, vectors, "cosine")
    verdict = (
        None if agrees else "probe 1: lance's distances differ from the in-memory kernels (another lance build or CPU)"
    )
    monkeypatch.setattr(vector_memory, "calibration_problem", lambda *args: verdict)
    records = CalibrationRecords(tmp_path / "calibrations")
    options = {"row_scopes": [r.access_scopes for r in rows], "embeddings_digest": digest(rows, vectors)}
    first = open_vector_searcher(
        tmp_path / "v", "cosine", ids(rows), calibrations=records, table_digest="sha256:" + "1" * 64, **options
    )
    again = open_vector_searcher(
        tmp_path / "v", "cosine", ids(rows), calibrations=records, table_digest="sha256:" + "1" * 64,
        vectors=vectors, **options,
    )  # fmt: skip
    cpu = "" if host_has_avx512() else "; this CPU has no AVX-512"
    if agrees:
        assert (first.engine, first.why) == (
            "memory", "in memory: it reproduced lancedb's distances on this host's calibration probes"
        )  # fmt: skip
        assert (again.engine, again.why) == (
            "memory", "in memory: this host's recorded calibration found lancedb's distances reproduced"
        )  # fmt: skip
    else:
        hint = f" — the in-memory engine reproduces lance's AVX-512 kernels{cpu}"
        assert (first.engine, first.why) == ("lancedb", f"lancedb: calibration on this host: {verdict}{hint}")
        assert (again.engine, again.why) == ("lancedb", f"lancedb: this host's recorded calibration: {verdict}{hint}")
    first.close()
    again.close()
