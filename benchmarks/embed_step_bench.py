"""Embedding throughput before and after moving embedding onto the step runner.

Both arms encode the same N SciFact representation texts (the first N by digest) into a fresh
cache, with one model loaded once: the *bare* arm is the former loop (encode a slice of 256, add it
to the cache as one shard), the *step* arm is ``compute_embeddings`` (``ragpipe.work.runner``:
lookups, leases, one shard per batch). Rounds alternate and the median per-round ratio step/bare
is reported.

    python -m benchmarks.embed_step_bench --scifact PATH --texts 1024 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.build_bench import representation_texts
from benchmarks.scifact import add_scifact_argument
from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.embedding.compute import compute_embeddings
from ragpipe.embedding.embedder import SentenceTransformerEmbedder
from ragpipe.kernel.ids import ChunkId, ContentDigest, DocumentId, RepresentationId, SpecId
from ragpipe.representations.derive import Representation
from ragpipe.spec import load_pipeline_spec

SLICE = 256


def main() -> None:
    parser = argparse.ArgumentParser()
    add_scifact_argument(parser)
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    spec = load_pipeline_spec()
    texts = sorted(representation_texts((args.scifact / "corpus.jsonl.gz").resolve()).items())[: args.texts]
    spec_id = spec.own_spec_ids["embeddings"]
    embedder = SentenceTransformerEmbedder(spec.embedder, spec.execution.embed_batch_size, spec.execution.torch_threads)
    embedder.embed(["warm up"])
    zero = "sha256:" + "0" * 64
    reps = [
        Representation(
            representation_id=RepresentationId(zero),
            chunk_id=ChunkId(zero),
            document_id=DocumentId("d"),
            kind="raw",
            text=text,
            digest=ContentDigest(digest),
            producer_spec_id=SpecId(zero),
        )
        for digest, text in texts
    ]

    def bare(root: Path) -> float:
        cache = EmbeddingCache(root, spec_id, spec.embedder.dimensions)
        t0 = time.perf_counter()
        for start in range(0, len(texts), SLICE):
            part = texts[start : start + SLICE]
            cache.add([d for d, _ in part], embedder.embed([t for _, t in part]))
        return time.perf_counter() - t0

    def step(root: Path) -> float:
        t0 = time.perf_counter()
        _, stats = compute_embeddings(reps, EmbeddingCache(root, spec_id, spec.embedder.dimensions), lambda: embedder)
        assert stats.encoded == len(texts)
        return time.perf_counter() - t0

    bares, steps = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            bares.append(bare(Path(tmp) / f"bare{i}"))
            steps.append(step(Path(tmp) / f"step{i}"))
    ratios = [s / b for s, b in zip(steps, bares)]
    print(
        json.dumps(
            {
                "texts": len(texts),
                "bare_s": [round(b, 2) for b in bares],
                "step_s": [round(s, 2) for s in steps],
                "bare_texts_per_s": round(len(texts) / statistics.median(bares), 2),
                "step_texts_per_s": round(len(texts) / statistics.median(steps), 2),
                "ratios": [round(r, 4) for r in ratios],
                "median_ratio": round(statistics.median(ratios), 4),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
