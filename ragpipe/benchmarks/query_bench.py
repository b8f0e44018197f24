"""Query-path benchmark on a SciFact bundle: latency per mode and retrieval quality.

    python -m ragpipe.benchmarks.query_bench --bundle PATH [--scifact ../shared/datasets/scifact]
        [--torch-threads 1] [--warmup 30]

For each mode (lexical, vector, hybrid) of the default query plan: p50/p95 latency of
``Retriever.query(k=10)`` over the 300 SciFact test claims after a warm-up, in one process (query
embedding included, hydration included); then nDCG@10 and recall@100 at document level (chunk
rankings mapped to documents, first occurrence); and the one-off cost of an audience index (the
in-memory lexical index a subject who may not see the whole bundle is served from) over every
row, an upper bound for any audience of this bundle. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from ragpipe.evaluation.metrics import dedupe, ndcg_at_k, read_qrels, recall_at_k
from ragpipe.index.lexical import audience_searcher
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.service import Retriever

MODES = ("lexical", "vector", "hybrid")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--scifact", type=Path, default=Path("../shared/datasets/scifact"))
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args()

    import torch

    qrels = read_qrels(args.scifact / "qrels" / "test.tsv")
    texts = {q["_id"]: q["text"] for q in map(json.loads, (args.scifact / "queries.jsonl").open(encoding="utf-8"))}
    queries = [(qid, texts[qid]) for qid in sorted(qrels, key=int)]
    retriever = Retriever(args.bundle)
    retriever.embedder()
    torch.set_num_threads(args.torch_threads)  # after loading: the adapter sets its own default
    subject = Subject.default()
    for _, text in queries[: args.warmup]:
        for mode in MODES:
            retriever.query(text, subject, k=10, mode=mode)
    latency: dict[str, dict[str, float]] = {}
    for mode in MODES:
        samples = []
        for _, text in queries:
            t0 = time.perf_counter()
            retriever.query(text, subject, k=10, mode=mode)
            samples.append((time.perf_counter() - t0) * 1000)
        latency[mode] = {
            "p50_ms": round(statistics.median(samples), 2),
            "p95_ms": round(percentile(samples, 0.95), 2),
            "mean_ms": round(statistics.fmean(samples), 2),
        }
    quality: dict[str, dict[str, float]] = {}
    for mode in MODES:
        ndcg, recall = [], []
        for qid, text in queries:
            hits = retriever.query(text, subject, k=1000, mode=mode).hits
            ranking = dedupe([h["document_id"] for h in hits])
            ndcg.append(ndcg_at_k(ranking, qrels[qid], 10))
            recall.append(recall_at_k(ranking, qrels[qid], 100))
        quality[mode] = {"ndcg@10": round(statistics.fmean(ndcg), 4), "recall@100": round(statistics.fmean(recall), 4)}
    indexes = retriever.lexical
    t0 = time.perf_counter()
    audience_searcher(indexes.rows, range(len(indexes.rows)), indexes.spec, indexes.bundle_searcher.rows)
    audience_ms = round((time.perf_counter() - t0) * 1000, 1)
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
                "bundle_id": retriever.bundle_id,
                "plan_id": retriever.plan.plan_id,
                "queries": len(queries),
                "torch_threads": args.torch_threads,
                "query_embedding_runtime": retriever.plan.query_embedding.runtime,
                "latency": latency,
                "quality": quality,
                "audience_index_build_ms": {"rows": len(indexes.rows), "ms": audience_ms},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
