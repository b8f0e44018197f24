"""One `Retriever` shared by 8 threads returns exactly what the same queries return sequentially."""

from __future__ import annotations

import gc
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ragpipe.answer.answering import answer
from ragpipe.index.prefilter import Prefilter
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever

THREADS = 8
QUERIES = [
    "aspirin stroke",
    "secret aspirin stroke trial",
    "statins cholesterol",
    "who may read a document",
    "twin text aspirin",
]
SUBJECTS = [
    Subject("anon", ("public",)),
    Subject("nurse", ("public", "staff")),
    Subject("admin", ("public", "secret", "staff")),
    Subject("spy", ("secret",)),
    Subject("stranger", ("nobody",)),
]
CASES = [
    (query, subject, mode, k)
    for i, query in enumerate(QUERIES)
    for j, subject in enumerate(SUBJECTS)
    for mode, k in (("lexical", 1 + (i + j) % 7), ("vector", 3), ("hybrid", 10))
]


def outcome(retriever: Retriever, case: tuple) -> tuple:
    """Everything a query returns — hits and the subject trace — except timings."""
    query, subject, mode, k = case
    result = retriever.query(query, subject, k=k, mode=mode, trace=True).as_dict()
    del result["trace"]["timings_ms"]
    return result


def answer_outcome(retriever: Retriever, case: tuple) -> dict:
    query, subject, mode, _ = case
    return answer(retriever, query, subject, mode=mode).as_dict()


def run_concurrently(retriever: Retriever, cases: list[tuple], work, rounds: int = 2) -> list[list[tuple[int, object]]]:
    """Each of THREADS threads runs every case ``rounds`` times in its own random order, all
    starting together; returns, per thread, (case index, outcome) pairs."""
    barrier = threading.Barrier(THREADS)

    def worker(seed: int) -> list[tuple[int, object]]:
        order = [i for _ in range(rounds) for i in range(len(cases))]
        random.Random(seed).shuffle(order)
        barrier.wait()
        return [(i, work(retriever, cases[i])) for i in order]

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(worker, range(THREADS)))


@pytest.fixture(scope="module")
def sequential(scoped_bundles):
    retriever = Retriever(scoped_bundles[0])
    expected = [outcome(retriever, case) for case in CASES]
    answers = [answer_outcome(retriever, case) for case in CASES[::3]]
    yield retriever, expected, answers
    retriever.close()


@pytest.mark.parametrize("max_views", [8, 1])
def test_eight_threads_on_a_cold_retriever_match_sequential_results(scoped_bundles, sequential, max_views):
    """A fresh Retriever: the threads race to load the query embedder, memoise plans, open
    audience views and create their event loops — and every result equals the sequential one.
    With ``max_views=1`` every other restricted query evicts a view another thread may hold."""
    reference, expected, _ = sequential
    shared = Retriever(scoped_bundles[0], max_views=max_views)
    try:
        per_thread = run_concurrently(shared, CASES, outcome)
        for results in per_thread:
            assert len(results) == 2 * len(CASES)
            for i, got in results:
                assert got == expected[i], CASES[i]
        assert shared.embedder() is shared.embedder() and type(shared.embedder()) is type(reference.embedder())
    finally:
        shared.close()


def test_answers_from_eight_threads_match_sequential_answers(sequential):
    retriever, _, answers = sequential
    for results in run_concurrently(retriever, CASES[::3], answer_outcome, rounds=1):
        for i, got in results:
            assert got == answers[i]


def test_sentence_transformers_runtime_is_serialised_and_equal(scoped_bundles, sequential):
    """An embedder that does not declare itself thread-safe is called under the Retriever's lock."""
    reference, _, _ = sequential
    plan = load_plan()
    torch_plan = plan.model_copy(
        update={"query_embedding": plan.query_embedding.model_copy(update={"runtime": "sentence_transformers"})}
    )
    shared = Retriever(scoped_bundles[0], plan=torch_plan)
    cases = [c for c in CASES if c[2] == "vector"][:10]
    try:
        expected = [outcome(shared, case) for case in cases]
        assert not getattr(shared.embedder(), "thread_safe", False)
        for results in run_concurrently(shared, cases, outcome):
            for i, got in results:
                assert got == expected[i]
        # same chunks as the onnxruntime runtime (vectors equal within 1e-5, so scores differ slightly)
        assert [[h["chunk_id"] for h in outcome(reference, c)["hits"]] for c in cases] == [
            [h["chunk_id"] for h in e["hits"]] for e in expected
        ]
    finally:
        shared.close()


def test_vector_event_loops_end_with_their_threads(scoped_bundles):
    """lancedb's searcher runs one event loop per calling thread; each ends with its thread."""
    from ragpipe.index.vector import VectorSearcher

    retriever = Retriever(scoped_bundles[0])
    lance = VectorSearcher(retriever.bundle.path / "vector", retriever.vector.metric, retriever.vector.rows)
    loops = lance._loops
    try:
        vector = retriever.embedder().embed_query("aspirin")
        alive = sum(f.alive for f in loops._finalizers)  # the loop of the thread that opened the table
        with ThreadPoolExecutor(4) as pool:
            found = list(pool.map(lambda _: lance.search(vector, 3, Prefilter(("public",))), range(16)))
        assert all(hits == found[0] for hits in found) and len(found[0]) == 3
        gc.collect()
        assert sum(f.alive for f in loops._finalizers) == alive  # the 4 workers' loops were closed with them
    finally:
        lance.close()
        retriever.close()
    assert sum(f.alive for f in loops._finalizers) == 0
