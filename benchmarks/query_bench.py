"""Query-path benchmark on a SciFact bundle: latency, throughput under threads, retrieval quality.

    python -m benchmarks.query_bench --bundle PATH --scifact PATH
        [--torch-threads 1] [--warmup 30] [--threads 1,2,4] [--limit N]
        [--vector-engine retriever|lancedb|factory]

For each mode (lexical, vector, hybrid) of the default query plan, in one process:

* latency: p50/p95 of ``Retriever.query(k=10)`` over the SciFact test claims after a warm-up
  (query embedding and hydration included);
* vector components: the query embedding alone, the lancedb search alone and the two in sequence
  (``vector_components``), p50 — the floor of a vector or hybrid query on this machine;
* throughput: the same claims shared out to 1, 2 and 4 threads (``--threads``) querying one
  ``Retriever`` at once; queries per second of wall time, and a check that every threaded result
  equals the single-threaded one;
* quality at document level (chunk rankings mapped to documents, first occurrence): nDCG@10 and
  recall@100 from ``k=1000`` rankings, and recall@100 of a plain ``k=100`` query (what a caller
  asking for 100 hits gets), with the mean number of hits such a query returned.

``--limit N`` uses the first N test claims (a quick run on a small bundle). ``--vector-engine``
chooses the vector searcher: ``retriever`` (default) keeps the one the ``Retriever`` opened,
``lancedb`` forces lancedb's ``VectorSearcher``, ``factory`` takes what
``ragpipe.index.vector_memory.open_vector_searcher`` chooses (memory up to its default size) — so a
before/after of the vector engine runs the same code otherwise. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path

from benchmarks.scifact import add_scifact_argument
from ragpipe.bundle.verify import check_vector_table
from ragpipe.evaluation.metrics import aggregate, collapse, default_metric_specs, score_cases
from ragpipe.evaluation.suite import Case
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import index_rows
from ragpipe.index.vector import VectorSearcher
from ragpipe.index.vector_memory import open_vector_searcher
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever

MODES = ("lexical", "vector", "hybrid")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency(retriever: Retriever, texts: list[str], mode: str) -> dict[str, float]:
    samples = []
    for text in texts:
        t0 = time.perf_counter()
        retriever.query(text, Subject.default(), k=10, mode=mode)
        samples.append((time.perf_counter() - t0) * 1000)
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p95_ms": round(percentile(samples, 0.95), 2),
        "mean_ms": round(statistics.fmean(samples), 2),
    }


def use_vector_engine(retriever: Retriever, engine: str) -> None:
    """Replace ``retriever.vector`` by the searcher ``engine`` names (module docstring), built from
    the bundle's verified tables exactly as the ``Retriever`` builds its own."""
    if engine == "retriever" or retriever.vector is None:
        return
    bundle = retriever.bundle
    rows = index_rows(bundle.tables.documents, bundle.tables.representations)
    ids = [(r.representation_id, r.chunk_id, r.document_id) for r in rows]
    metric = bundle.manifest.semantic.specs["vector_index"].spec["metric"]
    retriever.vector.close()
    check_vector_table(bundle)  # the lance table's checks, if the open deferred them
    if engine == "lancedb":
        retriever.vector = VectorSearcher(bundle.path / "vector", metric, ids)
    elif engine == "factory":
        retriever.vector = open_vector_searcher(
            bundle.path / "vector",
            metric,
            ids,
            row_scopes=[r.access_scopes for r in rows],
            embeddings_digest=bundle.manifest.material.embeddings_digest,
        )
    else:
        raise ValueError(f"unknown vector engine {engine!r} (retriever, lancedb, factory)")


def vector_components(retriever: Retriever, texts: list[str]) -> dict[str, object]:
    """The vector channel's two native steps, p50 in ms: the query embedding alone (back to back),
    the vector search alone (``engine``: lancedb or memory; pre-embedded vectors, back to back, the
    first request of a ``k = 10`` query: ``request_multiple × max(depth, 10)`` rows, public scope),
    and the two one after the other, as a vector query runs them. The last minus the sum of the
    first two is what handing the cores from onnxruntime's threads to the search costs
    (docs/benchmarks.md)."""
    plan = retriever.plan
    rows = plan.depth_policy.request_multiple * max(plan.channels["vector"].depth, 10)
    embedder, searcher, where = retriever.embedder(), retriever.vector, Prefilter(Subject.default().scopes)
    if searcher is None:
        raise ValueError(f"bundle {retriever.bundle_id} has no vector index")

    def p50(step, items) -> float:
        samples = []
        for item in items:
            t0 = time.perf_counter()
            step(item)
            samples.append((time.perf_counter() - t0) * 1000)
        return round(statistics.median(samples), 2)

    vectors = [embedder.embed_query(t) for t in texts]
    embed = p50(embedder.embed_query, texts)
    search = p50(lambda v: searcher.search(v, rows, where), vectors)
    both = p50(lambda t: searcher.search(embedder.embed_query(t), rows, where), texts)
    return {
        "engine": searcher.engine,
        "rows": rows,
        "embed_p50_ms": embed,
        "search_p50_ms": search,
        "embed_then_search_p50_ms": both,
        "hand_over_ms": round(both - embed - search, 2),
    }


def throughput(
    retriever: Retriever, texts: list[str], mode: str, threads: int, expected: list[list[str]]
) -> dict[str, object]:
    """All ``texts`` shared out to ``threads`` threads (each takes the next unclaimed text)."""
    claim = itertools.count()
    got: list[list[str] | None] = [None] * len(texts)
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        barrier.wait()
        while (i := next(claim)) < len(texts):
            got[i] = [h["chunk_id"] for h in retriever.query(texts[i], Subject.default(), k=10, mode=mode).hits]

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
    return {"queries_per_s": round(len(texts) / seconds, 1), "equal_to_sequential": got == expected}


def quality(retriever: Retriever, cases: list[Case], mode: str) -> dict[str, float]:
    """Document-level metrics (``ragpipe.evaluation.metrics``: ir_measures, trec_eval semantics)."""
    specs = [s for s in default_metric_specs() if s.name in ("ndcg@10", "recall@100")]
    judged = {c.id: c.judgments for c in cases}
    deep, shallow, returned = {}, {}, []
    for case in cases:
        hits = retriever.query(case.query, Subject.default(), k=1000, mode=mode).hits
        deep[case.id] = collapse([(h["document_id"], h["chunk_id"]) for h in hits], "document")
        hits = retriever.query(case.query, Subject.default(), k=100, mode=mode).hits
        returned.append(len(hits))
        shallow[case.id] = collapse([(h["document_id"], h["chunk_id"]) for h in hits], "document")
    full = aggregate(score_cases(judged, deep, specs), specs)
    k100 = aggregate(score_cases(judged, shallow, specs), specs)
    return {
        "ndcg@10": round(full["ndcg@10"].value, 4),
        "recall@100": round(full["recall@100"].value, 4),
        "recall@100_of_k100_query": round(k100["recall@100"].value, 4),
        "mean_hits_of_k100_query": round(statistics.fmean(returned), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path, required=True)
    add_scifact_argument(ap)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--threads", default="1,2,4", help="thread counts for the throughput runs")
    ap.add_argument("--limit", type=int, default=None, help="use the first N test claims only")
    ap.add_argument("--vector-engine", default="retriever", choices=("retriever", "lancedb", "factory"))
    args = ap.parse_args()
    thread_counts = [int(n) for n in args.threads.split(",")]

    import torch

    cases = sorted(load_suite(args.scifact, split="test").cases, key=lambda c: int(c.id))[: args.limit]
    claims = [case.query for case in cases]
    retriever = Retriever(args.bundle)
    use_vector_engine(retriever, args.vector_engine)
    modes = MODES if retriever.vector is not None else ("lexical",)
    if retriever.vector is not None:
        retriever.embedder()
    torch.set_num_threads(args.torch_threads)  # after loading: the adapter sets its own default
    for text in claims[: args.warmup]:
        for mode in modes:
            retriever.query(text, Subject.default(), k=10, mode=mode)
    latencies = {mode: latency(retriever, claims, mode) for mode in modes}
    components = vector_components(retriever, claims) if retriever.vector is not None else None
    throughputs: dict[str, dict[str, object]] = {}
    for mode in modes:
        expected = [
            [h["chunk_id"] for h in retriever.query(t, Subject.default(), k=10, mode=mode).hits] for t in claims
        ]
        throughputs[mode] = {f"{n}_threads": throughput(retriever, claims, mode, n, expected) for n in thread_counts}
    qualities = {mode: quality(retriever, cases, mode) for mode in modes}
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
                "bundle_id": retriever.bundle_id,
                "plan_id": retriever.plan.plan_id,
                "queries": len(cases),
                "torch_threads": args.torch_threads,
                "channel_workers": retriever.channel_workers,
                "query_embedding_runtime": retriever.plan.query_embedding.runtime,
                "vector_engine": retriever.vector.engine if retriever.vector is not None else None,
                "latency": latencies,
                "vector_components": components,
                "throughput": throughputs,
                "quality": qualities,
            },
            indent=2,
        )
    )
    retriever.close()


if __name__ == "__main__":
    main()
