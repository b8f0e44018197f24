"""Document encoding: torch (sentence-transformers) against onnxruntime, fp32 fused and int8.

Speed: the same N SciFact representation texts (the first N by digest: what a cold build of
SciFact encodes, in no particular order) are encoded by each runtime of the default embedder —
``sentence_transformers`` (batches of ``execution.embed_batch_size``, length-sorted by
sentence-transformers), ``onnxruntime`` (the BERT-fused fp32 graph, one text per run) and
``onnxruntime`` + ``quantization: int8`` — in alternating rounds; the median time per arm and the
median per-round ratio to torch are reported, with the largest component difference from torch's
vectors (fp32) and the least cosine to them (int8). The graphs are created first, in a temporary
cache (their creation time is reported apart: a build pays it once per embedder); the int8 graph is
this host's, and its digest (the ``graph_sha256`` that pins it) is reported.

Quality (``--quality``): every SciFact abstract (title and text) and every query of ``--split``
is embedded by each runtime; the vector channel's nDCG@10 (exact cosine ranking, ``ir_measures``)
is reported per runtime. This is the figure the gate would judge an int8 embedder on.

    python -m benchmarks.encode_bench --scifact PATH --texts 2000 --rounds 2 --quality
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time
from pathlib import Path

import ir_measures
import numpy as np
from ir_measures import nDCG

from benchmarks.build_bench import representation_texts
from benchmarks.scifact import add_scifact_argument
from ragpipe.embedding.embedder import SentenceTransformerEmbedder
from ragpipe.embedding.query_graph import pin_graph, query_encoder
from ragpipe.spec import EmbedderSpec, load_pipeline_spec

ARMS = ("torch", "onnxruntime", "onnxruntime_int8")


def load_arms(root: Path) -> tuple[dict[str, object], dict[str, float], str]:
    """The three arms; the int8 arm's graph is this host's, pinned as ``ragpipe embedder
    pin-graph`` pins it (its digest is in the report)."""
    spec = load_pipeline_spec()
    threads = spec.execution.torch_threads
    arms: dict[str, object] = {
        "torch": SentenceTransformerEmbedder(spec.embedder, spec.execution.embed_batch_size, threads)
    }
    created = {}
    t0 = time.perf_counter()
    fp32 = EmbedderSpec.model_validate({**spec.embedder.model_dump(), "runtime": "onnxruntime"})
    arms["onnxruntime"] = query_encoder(root, fp32, threads=threads)
    created["onnxruntime"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pinned, arms["onnxruntime_int8"] = pin_graph(root, spec.embedder, threads=threads, st_embedder=arms["torch"])
    created["onnxruntime_int8"] = time.perf_counter() - t0
    for arm in arms.values():
        arm.embed(["warm up"])
    return arms, created, pinned.graph_sha256


def speed(arms: dict[str, object], texts: list[str], rounds: int) -> dict:
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for name in ARMS:
            t0 = time.perf_counter()
            vectors[name] = arms[name].embed(texts)
            times[name].append(time.perf_counter() - t0)
    torch_vectors = vectors["torch"]
    ratios = {name: statistics.median(t / base for t, base in zip(times[name], times["torch"])) for name in ARMS[1:]}
    cosines = np.sum(vectors["onnxruntime_int8"] * torch_vectors, axis=1)  # unit vectors
    return {
        "texts": len(texts),
        "seconds": {name: round(statistics.median(t), 2) for name, t in times.items()},
        "texts_per_second": {name: round(len(texts) / statistics.median(t), 1) for name, t in times.items()},
        "ratio_to_torch": {name: round(r, 3) for name, r in ratios.items()},
        "fp32_max_difference": float(np.abs(vectors["onnxruntime"] - torch_vectors).max()),
        "int8_cosine_to_torch": {"min": round(float(cosines.min()), 4), "mean": round(float(cosines.mean()), 4)},
    }


def quality(arms: dict[str, object], scifact: Path, split: str) -> dict[str, float]:
    docs = [json.loads(line) for line in gzip.open(scifact / "corpus.jsonl.gz", "rt")]
    doc_ids = [d["_id"] for d in docs]
    texts = [f"{d.get('title', '')}\n{d['text']}" for d in docs]
    qrels = [
        ir_measures.Qrel(q, d, int(s))
        for q, d, s in (line.split("\t") for line in (scifact / "qrels" / f"{split}.tsv").read_text().splitlines()[1:])
    ]
    judged = {q.query_id for q in qrels}
    queries = [json.loads(line) for line in (scifact / "queries.jsonl").read_text().splitlines()]
    queries = [q for q in queries if q["_id"] in judged]
    result = {}
    for name in ARMS:
        matrix = arms[name].embed(texts)
        run = []
        for query in queries:
            scores = matrix @ arms[name].embed_query(query["text"])
            for i in np.argsort(-scores, kind="stable")[:10]:
                run.append(ir_measures.ScoredDoc(query["_id"], doc_ids[i], float(scores[i])))
        result[name] = round(ir_measures.calc_aggregate([nDCG @ 10], qrels, run)[nDCG @ 10], 4)
    return {"split": split, "queries": len(queries), "documents": len(docs), "ndcg@10": result}


def main() -> None:
    parser = argparse.ArgumentParser()
    add_scifact_argument(parser)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quality", action="store_true")
    parser.add_argument("--split", default="train")
    args = parser.parse_args()
    texts = [text for _, text in sorted(representation_texts((args.scifact / "corpus.jsonl.gz").resolve()).items())]
    with tempfile.TemporaryDirectory() as home:
        arms, created, pin = load_arms(Path(home) / "query_graphs")
        report = {"graph_creation_seconds": {k: round(v, 1) for k, v in created.items()}, "int8_graph_sha256": pin}
        report["speed"] = speed(arms, texts[: args.texts], args.rounds)
        if args.quality:
            report["quality"] = quality(arms, args.scifact.resolve(), args.split)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
