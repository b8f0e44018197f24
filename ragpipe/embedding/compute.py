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

# (texts encoded so far, new texts to encode): a typed count, never a log line to parse.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class EmbeddingStats:
    representations: int
    unique_texts: int
    cache_hits: int
    encoded: int
    encode_seconds: float


def compute_embeddings(
    reps: list[Representation],
    cache: EmbeddingCache,
    embedder_factory: Callable[[], Embedder],
    chunk_size: int = 256,
    progress: Progress | None = None,
) -> tuple[np.ndarray, EmbeddingStats]:
    """Vectors for ``reps`` in their order. The embedder is built only if something misses,
    so a fully cached revision never loads the model. Misses are encoded in slices of
    ``chunk_size`` and each slice is added to the cache as soon as it is done, so a killed run
    keeps the work it finished.

    ``progress(0, N)`` is called before the model loads and ``progress(k, N)`` after each slice
    (``ragpipe build`` draws its bar from these counts, which the asset records as observations).
    256 texts per slice is one update every second or two on a laptop CPU: a live bar without
    measurable overhead."""
    unique = sorted({r.digest for r in reps})
    found = cache.lookup(set(unique))
    texts = {r.digest: r.text for r in reps}
    misses = [d for d in unique if d not in found]
    encode_seconds = 0.0
    if misses:
        if progress:
            progress(0, len(misses))
        embedder = embedder_factory()
        for start in range(0, len(misses), chunk_size):
            part = misses[start : start + chunk_size]
            t0 = time.perf_counter()
            vectors = embedder.embed([texts[d] for d in part])
            encode_seconds += time.perf_counter() - t0
            cache.add(part, vectors)
            found.update(zip(part, vectors))
            if progress:
                progress(min(start + chunk_size, len(misses)), len(misses))
    matrix = np.stack([found[r.digest] for r in reps]) if reps else np.zeros((0, cache.dimensions), np.float32)
    stats = EmbeddingStats(
        representations=len(reps),
        unique_texts=len(unique),
        cache_hits=len(unique) - len(misses),
        encoded=len(misses),
        encode_seconds=encode_seconds,
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
