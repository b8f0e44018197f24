"""Approximate vector search at scale: ANN index build, memory, latency and recall against exact.

    python -m benchmarks.ann_bench [--n 1000000] [--dim 384] [--sigma 0.02] [--real 4000] [--scifact PATH]
        [--queries 200] [--kind ivf_hnsw_sq|ivf_pq] [--partitions P] [--m 20] [--ef-construction 300]
        [--sub-vectors 48] [--bits 8] [--settings 1:40,2:100,4:100,8:200] [--refine 4] [--ks 10,200]
        [--work var/ann_bench] [--keep] [--markdown]
        [--hybrid [--hybrid-k 10] [--hybrid-search 20:100:4] [--no-vector-only]]

**Vectors.** N vectors (default 1,000,000 of 384 dimensions) sampled from a real embedding
distribution: ``--real`` (default 4,000) real all-MiniLM-L6-v2 document vectors — the first
documents of the SciFact corpus (``--scifact PATH``'s ``corpus.jsonl.gz``; without ``--scifact``, the
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

**Hybrid** (``--hybrid``; without it nothing below runs and the figures above are computed exactly
as before). Hybrid and lexical queries need what only a bundle holds — the ``Retriever`` serves a
verified bundle: the tantivy index in its scope groups, the chunks that hydrate the evidence, the
tables its checks cross-read — so the benchmark builds a real one, in a home of its own under
``--work``, through every build stage (``ragpipe.stages.steps.BUILD_STEPS``: the functions
``ragpipe build`` runs, without Dagster), each step in a child process of its own (as Dagster's
executor runs each asset, so each step's peak RSS is its own):

* the corpus: row ``i``'s document (``d00000000`` …, scope ``public``) is made from the SciFact
  document its vector was drawn around (``chosen[i]``, one of the ``--real`` seed documents): that
  document's title, two to four sentences of its abstract in a random order, and one sentence of a
  random document of the whole SciFact corpus (``corpus.jsonl.gz``: 5,183 abstracts, ≈ 45,000
  sentences) at a random place, cut at a sentence boundary to at most 900 bytes (≈ 630 on
  average) — all drawn by ``random.Random(--seed)``, so the same rows give the same texts. A
  query's two channels thus find related documents, as in a real corpus; unlike a real corpus, at
  a million documents each seed sentence recurs ≈ 80 times, which makes term statistics flatter
  and posting lists longer than a real corpus of that size would have;
* the spec: the checked-in pipeline spec with the benchmark's ANN index (``--kind`` …) and one
  representation kind, ``raw`` — every document is one chunk (checked), so documents, chunks,
  representations and vectors correspond one to one;
* the vectors: the only thing not computed as a build computes it. The synthetic vectors (the same
  generator calls as above, so the same vectors) are put into the home's embedding cache under
  each representation's key (embedder spec ID, text digest) — the key every build looks up — so
  the embeddings stage finds every text there and never runs the model (checked: it encodes
  nothing), and the bundle binds exactly these vectors like any other (its embeddings digest,
  verified on open). The bundle claims the checked-in embedder, whose model never saw these texts:
  the figures are about cost, not quality.

Measured: per step (the corpus, each stage, the cache fill), seconds and peak RSS, the ANN index
alone and the bundle's bytes; then, per plan, in a child process of its own (one serving process:
its RSS is a query process's, ``rss_mib`` at each step): ``open_bundle`` (every file's digest and
table check; the lance table's checks deferred as a query process defers them), the
``Retriever``'s opening (the approximate one runs the lance table's checks), and
``Retriever.query`` with ``k`` ``--hybrid-k`` (10) for each held-out query, the ``public`` subject —
the checked-in query plan (its fusion: ``normalized_convex`` over z-scores, depth 100 per channel)
in ``lexical``, ``vector`` (exact) and ``hybrid`` mode, and the same plan with ``vector_search:
{kind: approximate}`` (``--hybrid-search nprobes:ef:refine_factor``, default the plan's defaults
20:100:4) in ``vector`` and ``hybrid`` mode: p50/p95 over one pass, and
the median parts of a query over a second pass with the trace (its ``timings_ms``: ``lexical``, run
on a worker thread beside ``vector``, and what the two leave — fusion, collapse, hydration, the
trace). The queries are embedded beforehand (``PrecomputedQueries``: the same real query vectors as
above), so no query encoder is timed — add ≈ 3.5–4 ms of onnxruntime query embedding
(docs/benchmarks.md) to the vector and hybrid figures of a real query. The bundle's home is keyed by
the recipe, ``--n``, ``--sigma``, ``--seed``, ``--real`` and the ANN spec; with ``--keep`` it stays,
and a later run with the same key reuses the bundle (``"reused": true``) instead of building again.

Prints one JSON object (and Markdown tables with ``--markdown``). Nothing here is imported by the
package.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.scifact import add_scifact_argument

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "scifact-sample"


def rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def rss_now_mib() -> float:
    """Resident set size of this process now, in MiB (``VmRSS``; Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(np.ceil(q * len(ordered))) - 1))]


# --- real vectors (seeds and queries), cached ----------------------------------------------------


def corpus_documents(scifact: Path | None, n: int | None = None) -> list[dict]:
    """The first ``n`` (None: every) document of the SciFact folder ``scifact``, else (None) of the
    sample."""
    if scifact is not None:
        corpus = scifact / "corpus.jsonl.gz"
        with gzip.open(corpus, "rt", encoding="utf-8") as fh:
            lines = [line for _, line in zip(range(n), fh)] if n is not None else fh.read().splitlines()
    else:
        lines = (SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line) for line in lines if line.strip()]


def seed_texts(scifact: Path | None, n: int) -> list[str]:
    return [f"{d.get('title', '')}\n\n{d['text']}".strip() for d in corpus_documents(scifact, n)]


def query_texts(scifact: Path | None, n: int) -> list[str]:
    """The first ``n`` queries of the SciFact folder ``scifact``, else (None) of the sample."""
    path = (scifact if scifact is not None else SAMPLE) / "queries.jsonl"
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
    return synthetic_with_seeds(seeds, n, sigma, rng)[0]


def synthetic_with_seeds(
    seeds: np.ndarray, n: int, sigma: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``synthetic``'s vectors (the same generator calls, so the same vectors) and, per row, the
    index of the seed it was drawn around — the document its synthetic text is made from."""
    out = np.empty((n, seeds.shape[1]), dtype=np.float32)
    chosen = np.empty(n, dtype=np.int64)
    block = 65_536
    for start in range(0, n, block):
        m = min(block, n - start)
        picks = rng.integers(0, len(seeds), size=m)
        part = seeds[picks] + rng.normal(0.0, sigma, size=(m, seeds.shape[1]))
        part /= np.linalg.norm(part, axis=1, keepdims=True)
        out[start : start + m] = part
        chosen[start : start + m] = picks
    return out, chosen


# --- hybrid: a real bundle over synthetic texts aligned with the vectors ---------------------------

TEXT_RECIPE = "sentences/v1"  # in the cache key of a built bundle: change it with the recipe
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\[])")
BODY_BYTES = 900  # a body and its title stay below the chunker's 1,200 bytes: one chunk per document


def sentences(text: str) -> list[str]:
    """A SciFact abstract's sentences (a split after ``.``, ``!`` or ``?`` before a capital, a
    digit or a bracket: good enough to recombine, not linguistics)."""
    return [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]


def synthetic_documents(chosen: np.ndarray, seed_docs: list[dict], all_docs: list[dict], seed: int):
    """Per row ``i``: ``(title, body)`` of the document aligned with vector ``i`` (module
    docstring, "Hybrid"): the title of seed document ``chosen[i]``, two to four of its sentences
    in a random order and one sentence of a random SciFact document at a random place, cut to
    ``BODY_BYTES`` at a sentence (or, for one long sentence, a word) boundary. ``random.Random(seed)``:
    the same rows give the same texts on every run."""
    rnd = random.Random(seed)
    own = [sentences(d["text"]) or [d.get("title") or "untitled"] for d in seed_docs]
    noise = [sentence for d in all_docs for sentence in sentences(d["text"])]
    for picked in chosen.tolist():
        pool = own[picked]
        parts = rnd.sample(pool, min(len(pool), rnd.randint(2, 4)))
        parts.insert(rnd.randint(0, len(parts)), noise[rnd.randrange(len(noise))])
        body, size = [], 0
        for part in parts:
            extra = len(part.encode("utf-8")) + (1 if body else 0)
            if size + extra > BODY_BYTES:
                break
            body.append(part)
            size += extra
        if not body:  # the first sentence alone is too long: cut it at a word
            body = [parts[0].encode("utf-8")[:BODY_BYTES].decode("utf-8", "ignore").rsplit(" ", 1)[0]]
        yield seed_docs[picked].get("title", ""), " ".join(body)


def write_corpus(path: Path, chosen: np.ndarray, seed_docs: list[dict], seed: int) -> int:
    """The synthetic documents as a BEIR corpus (``_id`` ``d00000000`` … in row order); returns
    its byte size."""
    with path.open("w", encoding="utf-8") as fh:
        for i, (title, body) in enumerate(synthetic_documents(chosen, seed_docs, corpus_documents(), seed)):
            fh.write(json.dumps({"_id": f"d{i:08d}", "title": title, "text": body}, ensure_ascii=False) + "\n")
    return path.stat().st_size


def bench_spec(ann):
    """The checked-in pipeline spec with the benchmark's ANN index and one representation kind
    (``raw``), so documents, chunks, representations and vectors correspond one to one."""
    from ragpipe.spec import PipelineSpec, load_pipeline_spec

    spec = load_pipeline_spec()
    raw = spec.model_dump(by_alias=True)
    raw["vector_index"] = {"metric": spec.vector_index.metric, "ann": ann.model_dump()}
    raw["representations"] = {**raw["representations"], "kinds": ["raw"]}
    return PipelineSpec.model_validate(raw)


BUILD_STEPS = (
    "corpus",
    "source_snapshot",
    "chunks",
    "representations",
    "embedding_cache",
    "embeddings",
    "lexical_index",
    "vector_index",
    "index_bundle",
)


def build_step(home: Path, step: str, args: argparse.Namespace) -> dict[str, object]:
    """In a child process of its own (as Dagster's executor runs each asset), one step of the
    hybrid bundle's build in ``home`` (module docstring, "Hybrid"): the corpus, a build stage, or
    the embedding cache's fill. Returns its facts: seconds and peak RSS, and the bundle's path
    after the last."""
    os.environ.pop("RAGPIPE_STORE", None)  # the benchmark's own home: nothing shared, nothing fetched
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.stages import steps

    ws = Workspace(home / "ragpipe")
    spec = bench_spec(ann_spec(args))
    facts: dict[str, object] = {}
    t0 = time.perf_counter()
    if step == "corpus":
        from ragpipe.corpus.bounds import CorpusBounds
        from ragpipe.corpus.registry import register_revision

        seeds, _ = real_vectors(args.work, seed_texts(args.scifact, args.real), queries=False)
        _, chosen = synthetic_with_seeds(seeds, args.n, args.sigma, np.random.default_rng(args.seed))
        home.mkdir(parents=True, exist_ok=True)
        corpus = home / "corpus.jsonl"
        facts["corpus_bytes"] = write_corpus(corpus, chosen, corpus_documents(args.scifact, args.real), args.seed)
        register_revision(ws.registry, "bench", corpus, "beir", "public", bounds=CorpusBounds(documents=max(args.n, 1)))
    elif step == "embedding_cache":
        # The vectors enter through the embedding cache, keyed as every build keys them (embedder
        # spec ID, text digest): the embeddings stage then finds every text, never runs the model.
        import pyarrow.parquet as pq

        from ragpipe.embedding.cache import EmbeddingCache
        from ragpipe.stages.stage_store import read_output

        # two columns, not the representations as objects (a million of them are gigabytes)
        reps = pq.read_table(
            read_output(ws, "bench", "representations", spec).path / "representations.parquet",
            columns=["document_id", "digest"],
        )
        if reps.num_rows != args.n:
            raise SystemExit(
                f"{reps.num_rows} representations for {args.n} documents: a document was split or excluded"
            )
        rows = np.array([int(d[1:]) for d in reps.column("document_id").to_pylist()])  # d00000042 -> row 42
        digests = reps.column("digest").to_pylist()
        del reps
        seeds, _ = real_vectors(args.work, seed_texts(args.scifact, args.real), queries=False)
        vectors = synthetic(seeds, args.n, args.sigma, np.random.default_rng(args.seed))
        cache = EmbeddingCache(ws.embedding_cache, spec.own_spec_ids["embeddings"], spec.embedder.dimensions)
        for start in range(0, len(digests), 250_000):  # shards well below the cache's 2 GiB bound
            cache.add(digests[start : start + 250_000], vectors[rows[start : start + 250_000]])
    elif step == "vector_index":
        from ragpipe.index import vector as vector_module

        index_seconds: list[float] = []
        create = vector_module._create_ann_index

        def timed_create(*a, **kw):  # the ANN index alone, inside the stage
            t = time.perf_counter()
            try:
                return create(*a, **kw)
            finally:
                index_seconds.append(time.perf_counter() - t)

        vector_module._create_ann_index = timed_create
        steps.run_vector_index(ws, "bench", spec)
        facts["ann_index_seconds"] = round(index_seconds[0], 1)
    else:
        getattr(steps, f"run_{step}")(ws, "bench", spec)
    facts["seconds"] = round(time.perf_counter() - t0, 1)
    facts["rss_peak_mib"] = rss_mib()
    if step == "embeddings":
        encoded = int(steps.read_stage_record(ws, "bench", "embeddings").facts["encoded"])
        if encoded:
            raise SystemExit(f"the embeddings stage encoded {encoded} texts: the cache should hold them all")
    if step == "index_bundle":
        bundle = ws.located(str(steps.read_stage_record(ws, "bench", "index_bundle").facts["bundle_path"]))
        facts["bundle"] = str(bundle)
        facts["bundle_bytes"] = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
    return facts


class PrecomputedQueries:
    """The query embedder of the bundle's embedder spec, answering from the real query vectors
    ``real_vectors`` embedded for these texts (``embed_query`` of a text it does not hold raises):
    retrieval is timed without the query encoder, as the vector-only figures are."""

    thread_safe = True

    def __init__(self, spec, texts: list[str], vectors: np.ndarray):
        self.spec = spec
        self.vectors = dict(zip(texts, vectors))

    def embed_query(self, text: str) -> np.ndarray:
        return self.vectors[text]


def plans(args: argparse.Namespace):
    """(the checked-in query plan, the same plan with approximate vector search: ``--hybrid-search``)."""
    from ragpipe.retrieval.plan import load_plan, parse_plan

    exact = load_plan()
    nprobes, ef, refine = (int(x) for x in args.hybrid_search.split(":"))
    raw = exact.model_dump(mode="json", by_alias=True)
    search = {**raw["vector_search"], "kind": "approximate", "nprobes": nprobes, "ef": ef, "refine_factor": refine}
    return exact, parse_plan({**raw, "vector_search": search}, "approximate plan")


def query_child(bundle: Path, kind: str, args: argparse.Namespace) -> dict[str, object]:
    """In a child process of its own — one serving process, so its RSS is a query process's — open
    the bundle (verified) and a Retriever of the ``kind`` plan (``plans``), and time
    ``Retriever.query`` in each of its modes (module docstring, "Hybrid")."""
    os.environ.pop("RAGPIPE_STORE", None)
    from ragpipe.bundle.verify import open_bundle
    from ragpipe.retrieval.authz import Subject
    from ragpipe.retrieval.retriever import Retriever
    from ragpipe.spec import load_pipeline_spec

    texts = query_texts(args.scifact, args.queries)
    vectors, _ = real_vectors(args.work, texts, queries=True)
    embedder = PrecomputedQueries(load_pipeline_spec().embedder, texts, vectors)
    exact, approximate = plans(args)
    plan, modes = (exact, ("lexical", "vector", "hybrid")) if kind == "exact" else (approximate, ("vector", "hybrid"))
    subject = Subject("bench", ("public",))
    out: dict[str, object] = {"plan_id": plan.plan_id}
    memory = {"before_open": rss_now_mib()}
    t0 = time.perf_counter()
    verified = open_bundle(bundle, defer_vector_table=True)  # every file's digest and every table's check
    out["open_bundle_seconds"] = round(time.perf_counter() - t0, 1)
    memory |= {"verified_bundle": rss_now_mib(), "verification_peak": rss_mib()}
    t0 = time.perf_counter()
    retriever = Retriever(verified, plan=plan, embedder=embedder, query_graph_dir=args.work / "query_graphs")
    out["retriever_open_seconds"] = round(time.perf_counter() - t0, 1)  # approximate: the lance checks
    memory["retriever_open"] = rss_now_mib()
    measured: list[dict[str, object]] = []
    try:
        for mode in modes:
            retriever.query(texts[0], subject, k=args.hybrid_k, mode=mode)  # warm: views, worker pool
            samples, parts = [], {}
            for text in texts:
                t = time.perf_counter()
                retriever.query(text, subject, k=args.hybrid_k, mode=mode)
                samples.append((time.perf_counter() - t) * 1000)
            top: list[list[str]] = []  # each query's chunk IDs: recall against the exact plan's
            for text in texts:  # where the time goes: a second pass, with the trace's timings
                t = time.perf_counter()
                result = retriever.query(text, subject, k=args.hybrid_k, mode=mode, trace=True)
                total = (time.perf_counter() - t) * 1000
                top.append([hit["chunk_id"] for hit in result.hits])
                timings = result.trace["timings_ms"]
                for part, value in timings.items():
                    parts.setdefault(part, []).append(value)
                channels = [timings[c] for c in ("lexical", "vector") if c in timings]
                # fusion, collapse, hydration, the trace itself: what the channels (side by side) leave
                parts.setdefault("rest", []).append(max(0.0, total - max(channels)))
            measured.append(
                {
                    "plan": kind,
                    "mode": mode,
                    "p50_ms": round(statistics.median(samples), 3),
                    "p95_ms": round(percentile(samples, 0.95), 3),
                    "n": len(samples),
                    "median_parts_ms": {k: round(statistics.median(v), 3) for k, v in sorted(parts.items())},
                    "top": top,
                }
            )
        if kind == "approximate":  # what every evaluation of an approximate plan records (ann_recall@10)
            from ragpipe.index.hits import recall_of

            found = [retriever.ann_comparison(text, subject, k=10) for text in texts]
            out["ann_recall@10"] = round(statistics.fmean(recall_of(c.approximate_ids, c.exact_ids) for c in found), 4)
        memory["queried"] = rss_now_mib()
    finally:
        retriever.close()
    out["queries"] = measured
    out["rss_mib"] = memory  # VmRSS at each step
    out["rss_peak_mib"] = rss_mib()
    return out


def recall_against_exact(queries: list[dict[str, object]]) -> None:
    """Per approximate plan and mode, ``recall@k`` of its results against the exact plan's in the
    same mode (mean over the queries of ``recall_of``, by chunk ID); each query's lists are then
    dropped from the output."""
    from ragpipe.index.hits import recall_of

    exact = {q["mode"]: q["top"] for q in queries if q["plan"] == "exact"}
    for q in queries:
        truth = exact.get(q["mode"])  # type: ignore[call-overload]
        if q["plan"] == "approximate" and truth is not None:
            q["recall_vs_exact"] = round(statistics.fmean(recall_of(a, e) for a, e in zip(q["top"], truth)), 4)  # type: ignore[call-overload]
    for q in queries:
        q.pop("top", None)


def ann_spec(args: argparse.Namespace):
    from ragpipe.spec import HnswSqIndex, PqIndex

    partitions = args.partitions or max(1, args.n // 50_000)
    if args.kind == "ivf_hnsw_sq":
        return HnswSqIndex(
            kind="ivf_hnsw_sq", num_partitions=partitions, m=args.m, ef_construction=args.ef_construction
        )
    return PqIndex(kind="ivf_pq", num_partitions=partitions, num_sub_vectors=args.sub_vectors, num_bits=args.bits)


def child(argv: list[str], *extra: str) -> dict[str, object]:
    """Run this script with ``argv`` and ``extra`` in a child process; its JSON result."""
    args = [sys.executable, "-m", "benchmarks.ann_bench", *argv, *extra]
    done = subprocess.run(args, check=True, cwd=REPO, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout)


def hybrid(args: argparse.Namespace, argv: list[str]) -> dict[str, object]:
    """Build (or reuse, under ``--work``) the hybrid bundle, one child process per step, then time
    each plan's queries in a child process of its own."""
    key = json.dumps(
        [TEXT_RECIPE, args.n, args.sigma, args.seed, args.real, ann_spec(args).model_dump()], sort_keys=True
    )
    home = args.work / f"hybrid-{args.n}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    marker = home / "build.json"
    if marker.exists() and Path(json.loads(marker.read_text(encoding="utf-8"))["bundle"]).is_dir():
        built = {**json.loads(marker.read_text(encoding="utf-8")), "reused": True}
    else:
        shutil.rmtree(home, ignore_errors=True)
        t0 = time.perf_counter()
        done = {step: child(argv, "--build-child", str(home), "--build-step", step) for step in BUILD_STEPS}
        built = {
            "ann": ann_spec(args).model_dump(),
            "representations": ["raw"],
            "steps": done,
            "wall_seconds": round(time.perf_counter() - t0, 1),
            "rss_peak_mib": max(float(facts["rss_peak_mib"]) for facts in done.values()),  # type: ignore[arg-type]
            "bundle": done["index_bundle"]["bundle"],
            "bundle_bytes": done["index_bundle"]["bundle_bytes"],
        }
        marker.write_text(json.dumps(built), encoding="utf-8")
    exact, approximate = plans(args)
    raw = exact.model_dump(mode="json", by_alias=True)
    result: dict[str, object] = {
        "build": built,
        "k": args.hybrid_k,
        "plan": {
            "fusion": raw["fusion"],
            "channels": raw["channels"],
            "approximate": approximate.vector_search.model_dump(),
        },
        "processes": {},
        "queries": [],
    }
    for kind in ("exact", "approximate"):
        facts = child(argv, "--query-child", str(built["bundle"]), "--query-plan", kind)
        result["queries"] += facts.pop("queries")  # type: ignore[operator]
        result["processes"][kind] = facts  # type: ignore[index]
    recall_against_exact(result["queries"])  # type: ignore[arg-type]
    if not args.keep:
        shutil.rmtree(home)
    return result


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


def vector_only(
    args: argparse.Namespace, seeds: np.ndarray, queries: np.ndarray, inputs: dict[str, object], out: dict[str, object]
) -> None:
    """The searcher figures (module docstring, "Measured"): a lance table built with the ANN spec,
    exact search and approximate search per setting; into ``out``."""
    from ragpipe.index import vector as vector_module
    from ragpipe.index.hits import recall_of
    from ragpipe.index.prefilter import Prefilter
    from ragpipe.index.rows import IndexRow
    from ragpipe.index.vector import VectorSearcher, build_vector_index
    from ragpipe.index.vector_ann import ApproximateVectorSearcher
    from ragpipe.index.vector_memory import MemoryVectorSearcher

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
        **inputs,
        "generate_seconds": round(time.perf_counter() - t0, 1),
        "rss_mib": rss_mib(),
    }
    ann = ann_spec(args)
    partitions = ann.num_partitions
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
    where = Prefilter(("public",))
    results: dict[str, object] = {}
    for k in (int(x) for x in args.ks.split(",")):
        truth, exact_latency = timed(lambda q, k=k: exact.search(q, k, where), queries)
        per_k: dict[str, object] = {"exact": exact_latency, "approximate": []}
        for nprobes, ef in parse_settings(args.settings, partitions):
            searcher = ApproximateVectorSearcher(
                exact, index, kind=ann.kind, nprobes=nprobes, ef=ef, refine_factor=args.refine
            )
            short = 0
            for q in queries:  # short answers: the index returned fewer candidates than asked
                query, visible = exact.prepare(q, k, where)
                short += searcher.candidates(query, k, visible, where).size < min(k * args.refine, visible.size)
            found, latency = timed(lambda q, k=k, s=searcher: s.search(q, k, where), queries)
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
    index.close()
    if not args.keep:
        shutil.rmtree(folder)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=384, help="must be the embedder's (384 for MiniLM)")
    parser.add_argument("--sigma", type=float, default=0.02)
    parser.add_argument("--real", type=int, default=4000)
    parser.add_argument("--queries", type=int, default=200)
    add_scifact_argument(parser, fallback="the in-repo sample data/scifact-sample")
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
    parser.add_argument("--hybrid", action="store_true", help="also build a real bundle and time Retriever queries")
    parser.add_argument("--hybrid-k", type=int, default=10, help="k of the timed Retriever queries")
    parser.add_argument(
        "--hybrid-search", default="20:100:4", help="nprobes:ef:refine_factor of the approximate plan (its defaults)"
    )
    parser.add_argument("--no-vector-only", action="store_true", help="with --hybrid: skip the searcher figures")
    parser.add_argument("--embed-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--queries-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--build-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--build-step", choices=BUILD_STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--query-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--query-plan", choices=["exact", "approximate"], help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.embed_child:
        embed_child(*args.embed_child, queries=args.queries_child)
        return {}
    if args.build_child or args.query_child:
        if args.build_child:
            facts = build_step(args.build_child, args.build_step, args)
        else:
            facts = query_child(args.query_child, args.query_plan, args)
        print(json.dumps(facts))
        return facts
    if args.no_vector_only and not args.hybrid:
        raise SystemExit("--no-vector-only needs --hybrid")

    started = time.time()
    out: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "load_start": [round(x, 2) for x in os.getloadavg()]},
        "python": platform.python_version(),
    }
    seeds, seed_fact = real_vectors(args.work, seed_texts(args.scifact, args.real), queries=False)
    queries, query_fact = real_vectors(args.work, query_texts(args.scifact, args.queries), queries=True)
    if seeds.shape[1] != args.dim:
        raise SystemExit(f"the embedder gives {seeds.shape[1]} dimensions, not --dim {args.dim}")
    inputs = {"seeds": seed_fact, "queries": query_fact}
    if args.no_vector_only:
        out["vectors"] = {"n": args.n, "dim": args.dim, "sigma": args.sigma, **inputs}
    else:
        vector_only(args, seeds, queries, inputs, out)
    if args.hybrid:
        out["hybrid"] = hybrid(args, argv)
    out["rss_peak_mib"] = rss_mib()
    out["machine"]["load_end"] = [round(x, 2) for x in os.getloadavg()]  # type: ignore[index]
    out["wall_seconds"] = round(time.time() - started, 1)
    print(json.dumps(out, indent=2))
    if args.markdown:
        print(markdown(out))
    return out


def markdown(out: dict[str, object]) -> str:
    lines = ["| k | search | nprobes | ef | p50 ms | p95 ms | recall@k | short |", "|---|---|---|---|---|---|---|---|"]
    if "hybrid" in out:
        lines = hybrid_markdown(out["hybrid"]) + ([""] + lines if "search" in out else [])  # type: ignore[arg-type]
    for k, per_k in out.get("search", {}).items():  # type: ignore[union-attr]
        e = per_k["exact"]
        lines.append(f"| {k} | exact | | | {e['p50_ms']} | {e['p95_ms']} | 1 | |")
        for a in per_k["approximate"]:
            lines.append(
                f"| {k} | approximate | {a['nprobes']} | {a['ef']} | {a['p50_ms']} | {a['p95_ms']} | "
                f"{a[f'recall@{k}']} | {a['short_answers']} |"
            )
    return "\n".join(lines)


def hybrid_markdown(hybrid: dict[str, object]) -> list[str]:
    """The Retriever figures: one row per plan and mode, with the median parts of a query."""
    lines = [
        f"Retriever.query, k = {hybrid['k']}: plan and mode, p50 / p95 ms, and the median parts (the trace's "
        "timings; `rest`: what the channels, run side by side, leave — fusion, hydration, the trace)",
        "",
        "| plan | mode | p50 ms | p95 ms | n | lexical ms | vector ms | rest ms | recall@k vs exact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for q in hybrid["queries"]:  # type: ignore[union-attr]
        parts = q["median_parts_ms"]
        lines.append(
            f"| {q['plan']} | {q['mode']} | {q['p50_ms']} | {q['p95_ms']} | {q['n']} | "
            f"{parts.get('lexical', '')} | {parts.get('vector', '')} | {parts['rest']} | {q.get('recall_vs_exact', '')} |"
        )
    recall = hybrid["processes"].get("approximate", {}).get("ann_recall@10")  # type: ignore[union-attr]
    if recall is not None:
        lines += ["", f"ann_recall@10 of the approximate plan (vector channel, as evaluations record it): {recall}"]
    return lines


if __name__ == "__main__":
    main()
