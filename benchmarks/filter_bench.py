"""Metadata filters, timed: query p50 filtered vs unfiltered, same bundle, one run.

    python -m benchmarks.filter_bench --scifact PATH [--documents 600]
        [--home DIR] [--queries 300] [--warmup 30]

Builds (once per ``--home``) a bundle of the first ``--documents`` SciFact abstracts with metadata
drawn deterministically from each document's position: ``year`` (2000–2024), ``category`` (one of
three), ``tags`` (one or two of four). Then one ``Retriever`` answers the SciFact test claims
(``--queries``) in every mode, once without a filter and once under each filter below, in turn
per query (so drift hits all arms alike), after ``--warmup`` warm-up queries; prints p50/p95 per
mode and filter, the documents each filter admits, and the filter overhead against unfiltered.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import time
from pathlib import Path

from benchmarks.query_bench import percentile
from benchmarks.scifact import add_scifact_argument
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever

FILTERS = {
    "none": None,
    "category = faq": {"field": "category", "eq": "faq"},
    "year >= 2012": {"field": "year", "gte": 2012},
    "(faq or tag b) and not year < 2005": {
        "and": [
            {"or": [{"field": "category", "eq": "faq"}, {"field": "tags", "in": ["b"]}]},
            {"not": {"field": "year", "lt": 2005}},
        ]
    },
    "tags in (c)": {"field": "tags", "in": ["c"]},  # matches one document in four
}
MODES = ("lexical", "vector", "hybrid")


def write_corpus(scifact: Path, n: int, path: Path) -> None:
    with gzip.open(scifact / "corpus.jsonl.gz", "rt", encoding="utf-8") as src, path.open("w") as out:
        i = 0
        for line in src:
            doc = json.loads(line)
            if not doc["text"].strip():
                continue
            tags = ["a", "b", "c", "d"][i % 4 : i % 4 + 1 + i % 2]
            meta = {"year": 2000 + (i * 7) % 25, "category": ("faq", "guide", "policy")[i % 3], "tags": tags}
            out.write(json.dumps({"_id": doc["_id"], "title": doc["title"], "text": doc["text"], "metadata": meta}))
            out.write("\n")
            i += 1
            if i == n:
                break


def build(home: Path, scifact: Path, n: int) -> Path:
    from ragpipe.corpus.registry import register_revision
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.spec import load_pipeline_spec
    from ragpipe.stages import steps
    from ragpipe.stages.stage_store import read_output

    ws = Workspace(home)
    spec = load_pipeline_spec()
    corpus = home / "corpus.jsonl"
    if not corpus.exists():
        home.mkdir(parents=True, exist_ok=True)
        write_corpus(scifact, n, corpus)
        register_revision(ws.registry, "f1", corpus, "beir", "public")
    for run in steps.BUILD_STEPS:
        run(ws, "f1", spec)
    return ws.located(str(read_output(ws, "f1", "index_bundle").record.facts["bundle_path"]))


def claims(scifact: Path, n: int) -> list[str]:
    ids = {line.split("\t")[0] for line in (scifact / "qrels" / "test.tsv").read_text().splitlines()[1:]}
    texts = []
    for line in (scifact / "queries.jsonl").read_text().splitlines():
        q = json.loads(line)
        if q["_id"] in ids:
            texts.append(q["text"])
    return texts[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    add_scifact_argument(ap)
    ap.add_argument("--documents", type=int, default=600)
    ap.add_argument("--home", type=Path, default=Path("var/bench/filters"))
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args()
    bundle = build(args.home, args.scifact, args.documents)
    retriever = Retriever(bundle)
    subject = Subject.default()
    texts = claims(args.scifact, args.queries)
    for text in texts[: args.warmup]:
        for mode in MODES:
            for f in FILTERS.values():
                retriever.query(text, subject, k=10, mode=mode, filter=f)
    samples: dict[tuple[str, str], list[float]] = {(m, name): [] for m in MODES for name in FILTERS}
    for text in texts:
        for mode in MODES:
            for name, f in FILTERS.items():
                started = time.perf_counter()
                retriever.query(text, subject, k=10, mode=mode, filter=f)
                samples[(mode, name)].append((time.perf_counter() - started) * 1000)
    admitted = {
        name: (len(retriever.filters.selection(retriever.filters.parse(f)).documents) if f else args.documents)
        for name, f in FILTERS.items()
    }
    for mode in MODES:
        base = statistics.median(samples[(mode, "none")])
        for name in FILTERS:
            p50 = statistics.median(samples[(mode, name)])
            print(
                json.dumps(
                    {
                        "mode": mode,
                        "filter": name,
                        "documents_admitted": admitted[name],
                        "p50_ms": round(p50, 3),
                        "p95_ms": round(percentile(samples[(mode, name)], 0.95), 3),
                        "p50_overhead_ms": round(p50 - base, 3),
                        "queries": len(texts),
                        "vector_engine": retriever.vector_engine.engine if retriever.vector_engine else None,
                        "python": platform.python_version(),
                    }
                ),
                flush=True,
            )
    retriever.close()


if __name__ == "__main__":
    main()
