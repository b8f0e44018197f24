"""Approximate vector search at scale: ANN index build, memory, latency and recall against exact.

    python -m benchmarks.ann_bench [--n 1000000] [--dim 384] [--sigma 0.02] [--real 4000]
        [--queries 200] [--kind ivf_hnsw_sq|ivf_pq] [--partitions P] [--m 20] [--ef-construction 300]
        [--sub-vectors 48] [--bits 8] [--settings 1:40,2:100,4:100,8:200] [--refine 4] [--ks 10,200]
        [--work var/ann_bench] [--keep] [--markdown]

**Vectors.** N vectors (default 1,000,000 of 384 dimensions) sampled from a real embedding
distribution: ``--real`` (default 4,000) real all-MiniLM-L6-v2 document vectors — the first
documents of the SciFact corpus (``/work/shared/datasets/scifact/corpus.jsonl.gz``, else the
sample's ``data/scifact-sample/rev-1.jsonl``: title, a blank line and the abstract), embedded with
the project's embedder (the checked-in pipeline spec's ``embedder``, sentence-transformers, in a
child process so torch never counts in this process's memory) and cached under ``--work`` by the
embedder's spec ID and the texts' digest — are the seeds; each synthetic vector is a seed chosen
uniformly at random plus Gaussian noise of standard deviation ``--sigma`` (default 0.02) per
component, renormalised to unit length (σ = 0.02 in 384 dimensions moves a seed by ≈ 0.39 in
norm: cosine ≈ 0.93 to its seed, so the table is clusters around real documents rather than
uniform noise). The queries are ``--queries`` (default 200) held-out real query vectors: SciFact
claims embedded with the same embedder's query path — none is, or seeds, a table row. Rows carry
the ``public`` scope; every search is the ``public`` subject's (the LABEL_LIST prefilter runs).

**Measured**, in one process after the vectors exist (the random generator is seeded; lance's
k-means and HNSW builds are not, so recall varies a little from build to build):

* build: ``build_vector_index`` with the ANN spec (table, scope index, ANN index) and, within it,
  the ANN index alone (seconds of wall time);
* memory: peak RSS (``resource.getrusage``, ``ru_maxrss``) after generating the vectors, after the
  build and after opening both searchers — the exact searcher holds the float32 matrix and its
  norms, as every query process does;
* per ``k`` of ``--ks`` (10: a caller's top 10; 200: the first request of a ``k = 10`` query
  under the checked-in plan, 2 × depth 100): exact search p50/p95 (``MemoryVectorSearcher``) and,
  per ``nprobes:ef`` setting of ``--settings`` (nprobes capped at the partition count), approximate
  search p50/p95 (``ApproximateVectorSearcher`` with ``refine_factor`` ``--refine``), recall@k
  against exact search (mean over queries of ``recall_of``) and how many searches the index
  answered short (answered exactly instead);
* the machine: CPU count and load averages at start and end (2 shared cores here).

Prints one JSON object (and a Markdown table with ``--markdown``). Nothing here is imported by
the package.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SCIFACT = Path("/work/shared/datasets/scifact")
SAMPLE = REPO / "data" / "scifact-sample"


def rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(np.ceil(q * len(ordered))) - 1))]


# --- real vectors (seeds and queries), cached ----------------------------------------------------


def seed_texts(n: int) -> list[str]:
    corpus = SCIFACT / "corpus.jsonl.gz"
    if corpus.exists():
        with gzip.open(corpus, "rt", encoding="utf-8") as fh:
            lines = [line for _, line in zip(range(n), fh)]
    else:
        lines = (SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    docs = [json.loads(line) for line in lines]
    return [f"{d.get('title', '')}\n\n{d['text']}".strip() for d in docs]


def query_texts(n: int) -> list[str]:
    path = SCIFACT / "queries.jsonl" if (SCIFACT / "queries.jsonl").exists() else SAMPLE / "queries.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line)["text"] for line in lines]


def embed_child(texts_file: Path, out: Path, queries: bool) -> None:
    """In a child process: embed the texts of ``texts_file`` (JSON list) with the checked-in
    embedder, documents or queries, into ``out`` (.npy, float32)."""
    from ragpipe.embedding.embedder import SentenceTransformerEmbedder
    from ragpipe.spec import load_pipeline_spec

    embedder = SentenceTransformerEmbedder(load_pipeline_spec().embedder, batch_size=64, threads=2)
    texts = json.loads(texts_file.read_text(encoding="utf-8"))
    if queries:
        vectors = np.stack([embedder.embed_query(t) for t in texts])
    else:
        vectors = embedder.embed(texts)
    np.save(out, np.ascontiguousarray(vectors, dtype=np.float32))


def real_vectors(work: Path, texts: list[str], queries: bool) -> tuple[np.ndarray, dict[str, object]]:
    """The texts' vectors, from the cache under ``work`` (key: embedder spec ID, documents or
    queries, and the texts' digest) or embedded in a child process."""
    from ragpipe.spec import load_pipeline_spec

    spec_id = load_pipeline_spec().own_spec_ids["embeddings"]
    digest = hashlib.sha256(json.dumps([spec_id, queries, texts]).encode("utf-8")).hexdigest()[:16]
    path = work / f"{'queries' if queries else 'seeds'}-{len(texts)}-{digest}.npy"
    fact = {"texts": len(texts), "cache": str(path), "cached": path.exists()}
    if not path.exists():
        work.mkdir(parents=True, exist_ok=True)
        texts_file = path.with_suffix(".json")
        texts_file.write_text(json.dumps(texts), encoding="utf-8")
        t0 = time.perf_counter()
        args = [sys.executable, "-m", "benchmarks.ann_bench", "--embed-child", str(texts_file), str(path)]
        subprocess.run(args + (["--queries-child"] if queries else []), check=True, cwd=REPO)
        fact["embed_seconds"] = round(time.perf_counter() - t0, 1)
        texts_file.unlink()
    return np.load(path), fact


def synthetic(seeds: np.ndarray, n: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` unit vectors: a seed chosen uniformly plus N(0, sigma²) noise per component, renormalised."""
    out = np.empty((n, seeds.shape[1]), dtype=np.float32)
    block = 65_536
    for start in range(0, n, block):
        m = min(block, n - start)
        part = seeds[rng.integers(0, len(seeds), size=m)] + rng.normal(0.0, sigma, size=(m, seeds.shape[1]))
        part /= np.linalg.norm(part, axis=1, keepdims=True)
        out[start : start + m] = part
    return out


# --- timing ---------------------------------------------------------------------------------------


def timed(search, queries: np.ndarray) -> tuple[list[list[str]], dict[str, float]]:
    results, samples = [], []
    for q in queries:
        t0 = time.perf_counter()
        hits = search(q)
        samples.append((time.perf_counter() - t0) * 1000)
        results.append([h.representation_id for h in hits])
    return results, {
        "p50_ms": round(statistics.median(samples), 3),
        "p95_ms": round(percentile(samples, 0.95), 3),
        "n": len(samples),
    }


def parse_settings(text: str, partitions: int) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        nprobes, ef = (int(x) for x in item.split(":"))
        setting = (min(nprobes, partitions), ef)
        if setting not in out:
            out.append(setting)
    return out


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384, help="must be the embedder's (384 for MiniLM)")
    parser.add_argument("--sigma", type=float, default=0.02)
    parser.add_argument("--real", type=int, default=4000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--kind", choices=["ivf_hnsw_sq", "ivf_pq"], default="ivf_hnsw_sq")
    parser.add_argument("--partitions", type=int, default=None, help="default: max(1, n // 50,000)")
    parser.add_argument("--m", type=int, default=20)
    parser.add_argument("--ef-construction", type=int, default=300)
    parser.add_argument("--sub-vectors", type=int, default=48)
    parser.add_argument("--bits", type=int, default=8)
    parser.add_argument("--settings", default="1:40,2:100,4:100,8:200")
    parser.add_argument("--refine", type=int, default=4)
    parser.add_argument("--ks", default="10,200")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work", type=Path, default=REPO / "var" / "ann_bench")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the lance table under --work")
    parser.add_argument("--embed-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--queries-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.embed_child:
        embed_child(*args.embed_child, queries=args.queries_child)
        return {}

    from ragpipe.index import vector as vector_module
    from ragpipe.index.hits import recall_of
    from ragpipe.index.rows import IndexRow
    from ragpipe.index.vector import VectorSearcher, build_vector_index
    from ragpipe.index.vector_ann import ApproximateVectorSearcher
    from ragpipe.index.vector_memory import MemoryVectorSearcher
    from ragpipe.spec import HnswSqIndex, PqIndex

    started = time.time()
    out: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "load_start": [round(x, 2) for x in os.getloadavg()]},
        "python": platform.python_version(),
    }
    seeds, seed_fact = real_vectors(args.work, seed_texts(args.real), queries=False)
    queries, query_fact = real_vectors(args.work, query_texts(args.queries), queries=True)
    if seeds.shape[1] != args.dim:
        raise SystemExit(f"the embedder gives {seeds.shape[1]} dimensions, not --dim {args.dim}")
    # σ's effect, on 2,000 draws around one seed: the mean cosine of a row to its seed
    unit = seeds[0] / np.linalg.norm(seeds[0])
    to_seed = float(np.mean(synthetic(seeds[:1], 2000, args.sigma, np.random.default_rng(0)) @ unit))
    t0 = time.perf_counter()
    vectors = synthetic(seeds, args.n, args.sigma, np.random.default_rng(args.seed))
    out["vectors"] = {
        "n": args.n,
        "dim": args.dim,
        "sigma": args.sigma,
        "mean_cosine_to_seed": round(to_seed, 4),
        "seeds": seed_fact,
        "queries": query_fact,
        "generate_seconds": round(time.perf_counter() - t0, 1),
        "rss_mib": rss_mib(),
    }
    partitions = args.partitions or max(1, args.n // 50_000)
    if args.kind == "ivf_hnsw_sq":
        ann = HnswSqIndex(kind="ivf_hnsw_sq", num_partitions=partitions, m=args.m, ef_construction=args.ef_construction)
    else:
        ann = PqIndex(kind="ivf_pq", num_partitions=partitions, num_sub_vectors=args.sub_vectors, num_bits=args.bits)
    rows = [IndexRow(f"r{i:08d}", f"c{i:08d}", f"d{i:08d}", "raw", "", ("public",), "primary") for i in range(args.n)]
    folder = args.work / f"table-{args.kind}-{args.n}-{os.getpid()}"
    index_seconds: list[float] = []
    create = vector_module._create_ann_index

    def timed_create(*a, **kw):  # the ANN index alone, inside the stage's build
        t = time.perf_counter()
        try:
            return create(*a, **kw)
        finally:
            index_seconds.append(time.perf_counter() - t)

    vector_module._create_ann_index = timed_create
    t0 = time.perf_counter()
    build_vector_index(folder, rows, vectors, "cosine", ann)
    out["build"] = {
        "ann": ann.model_dump(),
        "total_seconds": round(time.perf_counter() - t0, 1),
        "ann_index_seconds": round(index_seconds[0], 1),
        "table_bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
        "rss_mib": rss_mib(),
    }
    ids = [(r.representation_id, r.chunk_id, r.document_id) for r in rows]
    del rows
    exact = MemoryVectorSearcher("cosine", ids, [("public",)] * args.n, vectors)
    index = VectorSearcher(folder, "cosine", ids)
    out["searchers_rss_mib"] = rss_mib()
    scopes = ("public",)
    results: dict[str, object] = {}
    for k in (int(x) for x in args.ks.split(",")):
        truth, exact_latency = timed(lambda q, k=k: exact.search(q, k, scopes), queries)
        per_k: dict[str, object] = {"exact": exact_latency, "approximate": []}
        for nprobes, ef in parse_settings(args.settings, partitions):
            searcher = ApproximateVectorSearcher(
                exact, index, kind=ann.kind, nprobes=nprobes, ef=ef, refine_factor=args.refine
            )
            short = 0
            for q in queries:  # short answers: the index returned fewer candidates than asked
                query, visible = exact.prepare(q, k, scopes)
                short += searcher.candidates(query, k, visible, scopes).size < min(k * args.refine, visible.size)
            found, latency = timed(lambda q, k=k, s=searcher: s.search(q, k, scopes), queries)
            recall = statistics.fmean(recall_of(a, e) for a, e in zip(found, truth))
            per_k["approximate"].append(
                {
                    "nprobes": nprobes,
                    "ef": ef,
                    "refine_factor": args.refine,
                    **latency,
                    f"recall@{k}": round(recall, 4),
                    "short_answers": short,
                }
            )
        results[str(k)] = per_k
    out["search"] = results
    out["rss_peak_mib"] = rss_mib()
    out["machine"]["load_end"] = [round(x, 2) for x in os.getloadavg()]  # type: ignore[index]
    out["wall_seconds"] = round(time.time() - started, 1)
    index.close()
    if not args.keep:
        shutil.rmtree(folder)
    print(json.dumps(out, indent=2))
    if args.markdown:
        print(markdown(out))
    return out


def markdown(out: dict[str, object]) -> str:
    lines = ["| k | search | nprobes | ef | p50 ms | p95 ms | recall@k | short |", "|---|---|---|---|---|---|---|---|"]
    for k, per_k in out["search"].items():  # type: ignore[union-attr]
        e = per_k["exact"]
        lines.append(f"| {k} | exact | | | {e['p50_ms']} | {e['p95_ms']} | 1 | |")
        for a in per_k["approximate"]:
            lines.append(
                f"| {k} | approximate | {a['nprobes']} | {a['ef']} | {a['p50_ms']} | {a['p95_ms']} | "
                f"{a[f'recall@{k}']} | {a['short_answers']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
