"""A remote-embedder build, timed: the embeddings stage through litellm against a local server.

    python -m benchmarks.remote_embed_bench --scifact PATH [--documents 600]
        [--dimensions 384] [--batch-size 64] [--concurrency 4] [--root DIR]

The first ``--documents`` SciFact abstracts (BEIR) are built up to the representations stage, then
the embeddings stage runs with ``embedder.provider: litellm`` (``openai/text-embedding-3-small``,
priced in ``ragpipe/specs/prices.yaml``) against the test suite's OpenAI-compatible server
(``ragpipe_tests.support.embeddings_server``: deterministic vectors, real HTTP on 127.0.0.1) —
twice: cold (every text sent) and warm (every vector from the cache: zero requests). Prints one
JSON object per run: texts, requests, wall seconds, texts/s, tokens and the cost in micros the
stage reported. What it measures is ragpipe's side (batching, the step runner, litellm's client,
normalisation, the cache); a hosted API adds its own latency.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from benchmarks.filter_bench import write_corpus
from benchmarks.scifact import add_scifact_argument
from ragpipe.corpus.registry import register_revision
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages import steps
from ragpipe_tests.support.embeddings_server import EmbeddingsServer

MODEL = "openai/text-embedding-3-small"


def remote_spec(api_base: str, dimensions: int, batch_size: int, concurrency: int) -> PipelineSpec:
    data = load_pipeline_spec().model_dump(by_alias=True, exclude={"evaluation"})
    data["embedder"] = {
        "provider": "litellm",
        "model": MODEL,
        "api_base": api_base,
        "dimensions": dimensions,
        "normalize": True,
    }
    data["execution"]["embedding"] = {"batch_size": batch_size, "concurrency": concurrency}
    return PipelineSpec.model_validate(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_scifact_argument(ap)
    ap.add_argument("--documents", type=int, default=600)
    ap.add_argument("--dimensions", type=int, default=384)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--root", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddingsServer(args.dimensions) as server:
        root = args.root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        corpus = root / "corpus.jsonl"
        write_corpus(args.scifact, args.documents, corpus)
        spec = remote_spec(server.api_base, args.dimensions, args.batch_size, args.concurrency)
        for run in ("cold", "warm"):
            ws = Workspace(root / "home")
            revision = "e1" if run == "cold" else "e2"  # a second revision: same texts, from the cache
            register_revision(ws.registry, revision, corpus, "beir", "public")
            for stage in (steps.run_source_snapshot, steps.run_chunks, steps.run_representations):
                stage(ws, revision, spec)
            before = len(server.requests)
            started = time.perf_counter()
            result = steps.run_embeddings(ws, revision, spec)
            seconds = time.perf_counter() - started
            meta = result.metadata
            print(
                json.dumps(
                    {
                        "run": run,
                        "texts": meta["unique_texts"],
                        "encoded": meta["encoded"],
                        "requests": len(server.requests) - before,
                        "seconds": round(seconds, 2),
                        "texts_per_second": round(meta["unique_texts"] / seconds, 1),
                        "input_tokens": meta.get("embedding_input_tokens"),
                        "cost_micros": meta.get("embedding_cost_micros"),
                        "cost": meta.get("embedding_cost"),
                        "batch_size": args.batch_size,
                        "concurrency": args.concurrency,
                        "dimensions": args.dimensions,
                        "python": platform.python_version(),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
