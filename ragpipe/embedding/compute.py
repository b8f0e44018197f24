"""Embed representations through the cache: only texts the cache has not seen are encoded."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.embedding.embedder import Embedder
from ragpipe.representations.derive import Representation
from ragpipe.work.leases import KeyLeases
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.runner import Done, Step, run_step
from ragpipe.work.usage import UsageTotals

# (texts encoded so far, new texts to encode): a typed count, never a log line to parse.
Progress = Callable[[int, int], None]


class EmbeddingFailed(RuntimeError):
    """Texts left without a vector after their attempts (a remote embedder's typed failures);
    ``str(e)`` is one line with the counts by kind and the first failure. Every finished batch is
    in the cache: building again sends only the rest."""


@dataclass(frozen=True)
class EmbeddingStats:
    representations: int
    unique_texts: int
    cache_hits: int
    encoded: int
    encode_seconds: float
    usage: UsageTotals = UsageTotals()  # a remote embedder's calls (a local model makes none)
    retries: int = 0


class EmbeddingStep:
    """Embedding as a step (``ragpipe.work.runner``): one ``embed`` call per batch of texts. The
    model is loaded on the first call, so a fully cached revision never loads it."""

    name = "embed"

    def __init__(self, embedder_factory: Callable[[], Embedder]):
        self.factory = embedder_factory
        self.embedder: Embedder | None = None
        self.encode_seconds = 0.0

    def compute(self, texts: list[str]) -> list[Done[np.ndarray]]:
        if self.embedder is None:
            self.embedder = self.factory()
        t0 = time.perf_counter()
        vectors = self.embedder.embed(texts)
        self.encode_seconds += time.perf_counter() - t0
        return [Done(v) for v in vectors]

    def worst_cost(self, texts: list[str]) -> int:
        return 0  # a local model: no money


def compute_embeddings(
    reps: list[Representation],
    cache: EmbeddingCache,
    embedder_factory: Callable[[], Embedder] | None = None,
    chunk_size: int = 256,
    progress: Progress | None = None,
    *,
    step: Step | None = None,
    policy: ExecutionPolicy | None = None,
) -> tuple[np.ndarray, EmbeddingStats]:
    """Vectors for ``reps`` in their order, through the step runner: the key is the text digest
    within the cache's embedder spec; misses are encoded in batches of ``chunk_size``, each added
    to the cache as soon as it is done (a killed run keeps the work it finished), under the keys'
    leases (two runs never encode one text twice).

    ``progress(0, N)`` is called before the model loads and ``progress(k, N)`` after each batch
    (``ragpipe build`` draws its bar from these counts, which the asset records as observations).
    256 texts per batch is one update every second or two on a laptop CPU: a live bar without
    measurable overhead.

    A remote embedder passes its ``step`` (``ragpipe.embedding.remote.RemoteEmbeddingStep``) and
    ``policy`` (``execution.embedding``: batch size, concurrency, rate, retries, budget); texts
    whose attempts all failed raise ``EmbeddingFailed`` (a budget stop ``BudgetExhausted``) after
    every finished batch was committed."""
    step = step if step is not None else EmbeddingStep(embedder_factory)
    policy = policy or ExecutionPolicy(batch_size=chunk_size, max_attempts=1, retry_on=())
    items = [(str(r.digest), r.text) for r in reps]
    found, report = run_step(
        step, items, cache, policy, leases=KeyLeases(cache.directory / "leases"), progress=progress
    )
    if report.failures:
        first = report.failures[0]
        counts = ", ".join(f"{kind}: {n}" for kind, n in report.failure_counts().items())
        raise EmbeddingFailed(
            f"{len(report.failures)} text(s) have no vector after their attempts ({counts}); first: {first.detail} "
            f"after {first.attempts} attempt(s): {first.message} ({report.computed} embedded and cached: build again "
            "to continue)"
        )
    matrix = np.stack([found[r.digest] for r in reps]) if reps else np.zeros((0, cache.dimensions), np.float32)
    stats = EmbeddingStats(
        representations=len(reps),
        unique_texts=report.unique,
        cache_hits=report.cache_hits + report.waited_hits,
        encoded=report.computed,
        encode_seconds=getattr(step, "encode_seconds", 0.0),
        usage=report.usage,
        retries=sum(report.retries.values()),
    )
    return matrix.astype(np.float32, copy=False), stats


def embeddings_table(reps: list[Representation], vectors: np.ndarray) -> pa.Table:
    dim = vectors.shape[1]
    flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
    return pa.table(
        {
            "representation_id": pa.array([str(r.representation_id) for r in reps]),
            "text_digest": pa.array([str(r.digest) for r in reps]),
            "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
        }
    )


def write_embeddings(path: Path, reps: list[Representation], vectors: np.ndarray) -> None:
    pq.write_table(embeddings_table(reps, vectors), path)


def read_embeddings(path: Path) -> tuple[list[str], np.ndarray]:
    table = pq.read_table(path)
    ids = table.column("representation_id").to_pylist()
    vec = table.column("vector").combine_chunks()
    dim = vec.type.list_size
    return ids, vec.flatten().to_numpy(zero_copy_only=False).reshape(len(ids), dim)


def embeddings_digest(representation_ids: list[str], vectors: np.ndarray) -> str:
    """Digest of the exact vectors, in representation-ID order."""
    order = sorted(range(len(representation_ids)), key=representation_ids.__getitem__)
    h = hashlib.sha256(b"ragpipe/embeddings/v1\0")
    for i in order:
        h.update(representation_ids[i].encode() + b"\0")
        h.update(np.ascontiguousarray(vectors[i], dtype="<f4").tobytes())
    return "sha256:" + h.hexdigest()
