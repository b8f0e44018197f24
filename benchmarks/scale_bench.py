"""Cost curve as the corpus grows: SciFact at 1×, 2× and 4× its size by re-cut variants.

    python -m benchmarks.scale_bench --scifact PATH [--scales 1,2,4]
        [--out var/bench-scale] [--claims 300]

No corpus larger than SciFact is available offline, so scale k is SciFact plus k − 1 variants of
every abstract: variant j (ID ``<doc>~<j>``, same title) is the abstract's words rotated by
j·n/k, so its chunk windows fall at other places in the text and every chunk text is new to the
embedding cache (the figures count the texts actually encoded). Rotated prose is not prose: the
variants cost what real text of that length costs to chunk, embed, index and verify; they say
nothing about retrieval quality, which this script does not measure.

For each scale, each in a fresh process with a fresh ``RAGPIPE_HOME``/``DAGSTER_HOME``:

* **build** — ``ragpipe build <corpus> --json`` as a user runs it (registration, the seven build
  assets and their blocking checks, then evaluation of the default spec's suite, gate and release
  manifest): wall time and peak RSS; the JSON the command prints is kept (texts embedded, cases
  evaluated);
* **verify** — ``open_bundle`` of the built bundle, imports excluded, three processes, median;
* **open and query** — one process: ``Retriever(bundle)`` (verification included, imports
  excluded), the first query (the query embedder loads), 30 warm-up claims per mode, then
  p50/p95 of ``query(k=10)`` per mode over SciFact **train** claims (``--claims``), torch on one
  thread as ``query_bench``; peak RSS;
* **bytes** — the bundle folder on disk, in total and by top-level entry.

Prints one JSON object; each scale's is also written to ``<out>/scale-<k>.json`` as it finishes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks.build_bench import VERIFY, run_build, run_measured, write_jsonl
from benchmarks.scifact import add_scifact_argument

OPEN_AND_QUERY = """
import json, statistics, sys, time
import torch
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
bundle, scifact, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
claims = [c.query for c in sorted(load_suite(scifact, split="train").cases, key=lambda c: int(c.id))][:limit]
t0 = time.perf_counter()
retriever = Retriever(bundle)
opened = time.perf_counter() - t0
t0 = time.perf_counter()
retriever.query(claims[0], Subject.default(), k=10, mode="hybrid")
first = time.perf_counter() - t0
torch.set_num_threads(1)
modes = ("lexical", "vector", "hybrid")
for text in claims[:30]:
    for mode in modes:
        retriever.query(text, Subject.default(), k=10, mode=mode)
latency = {}
for mode in modes:
    samples = []
    for text in claims:
        t0 = time.perf_counter()
        retriever.query(text, Subject.default(), k=10, mode=mode)
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    latency[mode] = {"p50_ms": round(statistics.median(samples), 2),
                     "p95_ms": round(samples[round(0.95 * (len(samples) - 1))], 2)}
print(json.dumps({"open_seconds": round(opened, 2), "first_query_seconds": round(first, 2),
                  "claims": len(claims), "latency": latency, "vector_engine": retriever.vector.engine}))
"""


def rotated(text: str, j: int, k: int) -> str:
    """The text's words rotated left by ``j·n/k``: the same words, cut elsewhere."""
    words = text.split(" ")
    cut = j * len(words) // k
    return " ".join(words[cut:] + words[:cut])


def scaled_corpus(docs: list[dict], k: int) -> list[dict]:
    """SciFact at ``k``× its size: every document, then its ``k − 1`` re-cut variants."""
    out = []
    for doc in docs:
        out.append(doc)
        for j in range(1, k):
            out.append({**doc, "_id": f"{doc['_id']}~{j}", "text": rotated(doc["text"], j, k)})
    return out


def tree_bytes(path: Path) -> dict[str, int]:
    """Bytes on disk under each top-level entry of ``path`` (files' sizes, recursively)."""
    sizes: dict[str, int] = {}
    for entry in sorted(path.iterdir()):
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
        sizes[entry.name] = sum(f.stat().st_size for f in files)
    return sizes


def measure(scale: int, docs: list[dict], scifact: Path, out: Path, claims: int) -> dict:
    home = out / f"scale-{scale}"
    corpus = write_jsonl(out / f"corpus-{scale}x.jsonl", scaled_corpus(docs, scale))
    built = run_build(corpus, f"scifact-{scale}x", home)
    bundle = built["bundle_path"]
    verify_runs = [
        json.loads(run_measured([sys.executable, "-c", VERIFY, bundle], dict(os.environ), home / f"logs-verify-{i}")[0])
        for i in range(3)
    ]
    stdout, _, query_rss = run_measured(
        [sys.executable, "-c", OPEN_AND_QUERY, bundle, str(scifact), str(claims)], dict(os.environ), home / "logs-query"
    )
    sizes = tree_bytes(Path(bundle))
    return {
        "scale": scale,
        "documents": len(docs) * scale,
        "corpus_bytes": corpus.stat().st_size,
        "build": built,
        "verify_seconds_runs": [round(v["seconds"], 2) for v in verify_runs],
        "verify_seconds_median": round(sorted(v["seconds"] for v in verify_runs)[1], 2),
        "open_and_query": {**json.loads(stdout), "peak_rss_mib": round(query_rss, 1)},
        "bundle_bytes": sum(sizes.values()),
        "bundle_bytes_by_entry": sizes,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    add_scifact_argument(ap)
    ap.add_argument("--scales", default="1,2,4")
    ap.add_argument("--out", type=Path, default=Path("var/bench-scale"))
    ap.add_argument("--claims", type=int, default=300, help="train claims timed per mode")
    args = ap.parse_args()
    out = args.out.resolve()
    if out.exists():
        raise SystemExit(f"{out} exists: remove it for a cold run")
    out.mkdir(parents=True)
    with gzip.open(args.scifact / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh]
    results = []
    for scale in (int(s) for s in args.scales.split(",")):
        result = measure(scale, docs, args.scifact.resolve(), out, args.claims)
        (out / f"scale-{scale}.json").write_text(json.dumps(result, indent=2))
        results.append(result)
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
                "scales": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
