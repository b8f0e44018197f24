"""Approximate vector search through the Retriever: a plan field, served only from a bundle's ANN
index, with exact search's scores and results that say they are approximate.

lance's index builds are not seeded: nothing here depends on which candidates a build returns,
only on laws that hold for any build.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragpipe.bundle.verify import open_bundle
from ragpipe.evaluation.ann import ANN_RECALL
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import read_ledger
from ragpipe.evaluation.runner import run_evaluation
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.index.hits import recall_of
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.vector_ann import ApproximateVectorSearcher
from ragpipe.index.vector_memory import MemoryVectorSearcher
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.plan import ApproximateVectorSearchPlan, load_plan, parse_plan
from ragpipe.retrieval.results import QueryError
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.ann_support import ANN, ann_bundle  # noqa: F401  (fixture)
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401  (fixture)

PUBLIC = Subject("reader", ("public",))


def approximate_plan(**parameters):
    plan = load_plan()
    return plan.model_copy(update={"vector_search": ApproximateVectorSearchPlan(kind="approximate", **parameters)})


def queries(suite: Path, n: int) -> list[str]:
    return [json.loads(line)["query"] for line in suite.read_text(encoding="utf-8").splitlines()[:n]]


@pytest.fixture(scope="module")
def retrievers(ann_bundle):  # noqa: F811
    """Over the ANN bundle: the exact plan, the default approximate plan (nprobes 20 covers both
    partitions), and a narrow one (one partition, ef 10, no extra candidates)."""
    bundle, _ = ann_bundle
    exact = Retriever(bundle, plan=load_plan())
    embedder = exact.embedder()
    out = {
        "exact": exact,
        "approximate": Retriever(bundle, plan=approximate_plan(), embedder=embedder),
        "narrow": Retriever(bundle, plan=approximate_plan(nprobes=1, ef=10, refine_factor=1), embedder=embedder),
    }
    yield out
    for r in out.values():
        r.close()


def test_the_approximate_plan_is_a_plan_field_and_the_default_plan_stays_exact():
    plan = load_plan()
    assert plan.vector_search.model_dump() == {"kind": "exact", "scores": "float64_sequential/v1"}
    raw = plan.model_dump(mode="json", by_alias=True)
    approximate = parse_plan({**raw, "vector_search": {"kind": "approximate"}}, "plan.yaml")
    assert approximate.vector_search.model_dump() == {
        "kind": "approximate",
        "nprobes": 20,
        "ef": 100,
        "refine_factor": 4,
        "scores": "float64_sequential/v1",
    }
    assert approximate.plan_id != plan.plan_id
    assert approximate_plan(nprobes=21).plan_id != approximate.plan_id
    # a field of the other kind, or a bad value, is refused with the field named as the file spells it
    with pytest.raises(ValueError) as err:
        parse_plan({**raw, "vector_search": {"kind": "exact", "nprobes": 3}}, "plan.yaml")
    assert str(err.value) == "plan.yaml: invalid query plan: vector_search.nprobes: Extra inputs are not permitted"
    with pytest.raises(ValueError) as err:
        parse_plan({**raw, "vector_search": {"kind": "approximate", "refine_factor": 0}}, "plan.yaml")
    assert str(err.value) == (
        "plan.yaml: invalid query plan: vector_search.refine_factor: Input should be greater than or equal to 1"
    )


def test_approximate_search_on_a_bundle_without_an_ann_index_is_refused_in_one_line(eval_bundle):  # noqa: F811
    """Every query of a mode that searches vectors (the plan's own hybrid included) is refused with
    one line naming the bundle; a lexical query does not need the vector index and is served, as
    the exact plan serves it."""
    bundle, suite = eval_bundle
    bundle_id = open_bundle(bundle).bundle_id
    refusal = (
        "the query plan asks for approximate vector search (vector_search.kind: approximate), but bundle "
        f"{bundle_id} has no ANN index (its vector-index spec declares no ann)"
    )
    retriever = Retriever(bundle, plan=approximate_plan())
    exact = Retriever(bundle, plan=load_plan())
    try:
        assert retriever.vector is None and retriever.vector_engine is None and not retriever.approximate
        for mode in (None, "hybrid", "vector"):
            with pytest.raises(QueryError) as err:
                retriever.query("aspirin", PUBLIC, k=5, mode=mode)
            assert str(err.value) == refusal
            with pytest.raises(QueryError) as err:
                retriever.check_mode(mode)
            assert str(err.value) == refusal
        with pytest.raises(QueryError) as err:
            retriever.ann_comparison("aspirin", PUBLIC)
        assert str(err.value) == refusal
        assert retriever.check_mode("lexical") == "lexical"
        for text in queries(suite, 5):
            served = retriever.query(text, PUBLIC, k=10, mode="lexical", trace=True).as_dict()
            wanted = exact.query(text, PUBLIC, k=10, mode="lexical", trace=True).as_dict()
            assert served["mode"] == "lexical" and "approximate" not in served
            assert list(served["trace"]["channels"]) == ["lexical"] and "vector_search" not in served["trace"]
            assert [(h["chunk_id"], h["score"]) for h in served["hits"]] == [
                (h["chunk_id"], h["score"]) for h in wanted["hits"]
            ]
        # the server's warm-up queries every mode the retriever serves: here, lexical only
        from ragpipe.server.follower import warm

        warm(retriever)
    finally:
        retriever.close()
        exact.close()
    # a plan whose channels never search vectors does not need one either
    Retriever(bundle, plan=approximate_plan().with_channels(("lexical",))).close()


def test_an_evaluation_of_an_approximate_plan_on_a_bundle_without_an_ann_index(eval_bundle, tmp_path: Path):  # noqa: F811
    """A lexical run of the plan is made (it declares no ann_recall@10); a hybrid or vector run is
    refused before its run folder exists, with the query's line, not cell by cell."""
    bundle, suite_path = eval_bundle
    suite = load_suite(suite_path)
    retriever = Retriever(bundle, plan=approximate_plan())
    try:
        for mode in ("hybrid", "vector"):
            spec = EvaluationSpec.build(suite, retriever.plan, bundle, retriever.bundle_id, mode=mode, k=10)
            with pytest.raises(QueryError, match="has no ANN index"):
                run_evaluation(spec, tmp_path / mode, retriever_factory=lambda _: retriever)
            assert not (tmp_path / mode).exists()
        spec = EvaluationSpec.build(suite, retriever.plan, bundle, retriever.bundle_id, mode="lexical", k=10)
        run_evaluation(spec, tmp_path / "lexical", retriever_factory=lambda _: retriever)
        assert ANN_RECALL not in [m.name for m in spec.body.metrics]
        kinds = [r.kind for r in read_ledger(tmp_path / "lexical").records]
        assert kinds[-1] == "RunCompleted" and "CellFailed" not in kinds and "CellCompleted" in kinds
    finally:
        retriever.close()


def test_an_ann_bundle_verifies_and_says_what_serves(ann_bundle, retrievers):  # noqa: F811
    bundle, _ = ann_bundle
    verified = open_bundle(bundle)  # every check, the lance table and its ANN index included
    assert verified.manifest.semantic.specs["vector_index"].spec == {"enabled": True, "metric": "cosine", "ann": ANN}
    approximate = retrievers["approximate"]
    assert isinstance(approximate.vector, ApproximateVectorSearcher) and approximate.approximate
    engine = approximate.vector_engine
    assert engine.engine == "memory+ann"
    assert engine.why.startswith(
        "approximate: candidates from the lance IVF_HNSW_SQ index (nprobes 20, ef 100, refine_factor 4), "
        "ranked by exact scores (float64_sequential/v1) in memory: "
    )
    # an ANN bundle under an exact plan is served exactly, never reading the index
    exact = retrievers["exact"]
    assert isinstance(exact.vector, MemoryVectorSearcher) and not exact.approximate
    assert exact.vector_engine.engine == "memory"
    result = exact.query("aspirin", PUBLIC, k=5, mode="vector", trace=True)
    assert "approximate" not in result.as_dict() and "vector_search" not in result.trace


def test_approximate_results_say_so_and_carry_exact_search_scores(ann_bundle, retrievers):  # noqa: F811
    """Under the narrow plan (one partition, ef 10, no extra candidates), whatever its candidates, every vector hit is a row
    exact search scores with the same bits, and a query still returns ``min(k, units)`` hits."""
    _, suite = ann_bundle
    narrow = retrievers["narrow"]
    searcher = narrow.vector
    embedder = narrow.embedder()
    for text in queries(suite, 8):
        result = narrow.query(text, PUBLIC, k=10, mode="vector", trace=True, rankings=True)
        data = result.as_dict()
        assert data["approximate"] is True
        assert data["trace"]["vector_search"] == {
            "kind": "approximate",
            "nprobes": 1,
            "ef": 10,
            "refine_factor": 1,
            "scores": "float64_sequential/v1",
            "approximate": True,
        }
        assert len(data["hits"]) == 10
        everything = searcher.exact.search(embedder.embed_query(text), len(searcher.rows), Prefilter(PUBLIC.scopes))
        score_of = {h.representation_id: np.float64(h.score).tobytes() for h in everything}
        for ranked in result.rankings.channels["vector"]:
            assert np.float64(ranked.hit.score).tobytes() == score_of[ranked.hit.representation_id]
        # the lexical channel of the same retriever is not approximate
        assert "approximate" not in narrow.query(text, PUBLIC, k=10, mode="lexical").as_dict()


@pytest.mark.parametrize("mode", ["vector", "hybrid"])
def test_with_every_partition_probed_on_a_small_table_approximate_equals_exact(ann_bundle, retrievers, mode):  # noqa: F811
    """nprobes 20 covers the index's two partitions and a channel's first request (2 × 100 units ×
    refine_factor 4 = 800 candidates) reaches every row of this bundle: the index returns every
    visible row or the request is answered exactly — for any build, the result is exact search's."""
    _, suite = ann_bundle
    exact, approximate = retrievers["exact"], retrievers["approximate"]
    assert len(approximate.vector.rows) <= 2 * 100 * 4
    for text in queries(suite, 6):
        got = approximate.query(text, PUBLIC, k=20, mode=mode).hits
        want = exact.query(text, PUBLIC, k=20, mode=mode).hits
        assert [(h["chunk_id"], h["score"]) for h in got] == [(h["chunk_id"], h["score"]) for h in want]


def test_the_comparison_helper_returns_both_top_lists(retrievers):
    with pytest.raises(QueryError, match="searches vectors exactly: nothing to compare"):
        retrievers["exact"].ann_comparison("aspirin")
    narrow = retrievers["narrow"]
    comparison = narrow.ann_comparison("aspirin and stroke", PUBLIC, k=10)
    vector = narrow.embedder().embed_query("aspirin and stroke")
    assert comparison.exact == narrow.vector.exact.search(vector, 10, Prefilter(PUBLIC.scopes))
    assert len(comparison.approximate) == 10
    assert comparison.recall == recall_of(comparison.approximate_ids, comparison.exact_ids)
    with pytest.raises(QueryError, match="k must be an integer >= 1"):
        narrow.ann_comparison("aspirin", k=0)
