"""The embedding step's shared parts, and one shard of it (``RAGPIPE_EMBEDDING_SHARDS`` > 1).

``spec_embedder`` and ``embedding_cache`` are what every embedding step uses: the spec's model,
loaded once per process, and the (embedder spec, text digest) cache — shared through the object
store when one is configured, so steps on machines that share no disk meet in it.

Shard ``i`` of ``n`` is every representation whose text digest, read as a number, is ``i`` modulo
``n``: a property of the text alone, so shards are disjoint (two shards never encode one text),
balanced for any corpus, and the same in every run. ``run_embedding_shard`` encodes its shard's
texts into the cache and publishes nothing; a shard run again (a retry, a re-execution from
failure) finds the batches it finished in the cache and encodes only the rest. The ``embeddings``
step then assembles the partition from the cache (``steps.run_embeddings``): it looks every text
up, so its output does not depend on how many shards filled the cache, or where.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache

from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.embedding.compute import compute_embeddings
from ragpipe.kernel.seals import configured_key
from ragpipe.kernel.workspace import Workspace
from ragpipe.representations.derive import read_representations
from ragpipe.spec import PipelineSpec
from ragpipe.stages.stage_store import holding_workspace_lock, read_output
from ragpipe.storage.location import store_from_env

MAX_SHARDS = 64
ENV_SHARDS = "RAGPIPE_EMBEDDING_SHARDS"


def shard_count() -> int:
    """``RAGPIPE_EMBEDDING_SHARDS`` (default 1: the one-step asset); ``ValueError`` in one line
    unless it is an integer from 1 to ``MAX_SHARDS`` (``check_configuration`` reports it)."""
    text = os.environ.get(ENV_SHARDS, "").strip() or "1"
    if not text.isdigit() or not 1 <= int(text) <= MAX_SHARDS:
        raise ValueError(f"{ENV_SHARDS}={text!r}: must be an integer from 1 to {MAX_SHARDS}")
    return int(text)


@lru_cache(maxsize=2)
def spec_embedder(spec: PipelineSpec):
    """The spec's embedder, loaded once per process (torch is heavy: imported on first use)."""
    from ragpipe.embedding.embedder import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(spec.embedder, spec.execution.embed_batch_size, spec.execution.torch_threads)


def embedding_cache(ws: Workspace, spec: PipelineSpec) -> EmbeddingCache:
    """The home's cache for the spec's embedder, shared through ``RAGPIPE_STORE`` when it is set."""
    return EmbeddingCache(
        ws.embedding_cache,
        spec.own_spec_ids["embeddings"],
        spec.embedder.dimensions,
        store=store_from_env(),
        key=configured_key(),
    )


def shard_of(text_digest: str, shards: int) -> int:
    """The shard (``0 … shards-1``) of a text, from its ``sha256:<hex>`` digest."""
    return int(text_digest.rsplit(":", 1)[-1][:16], 16) % shards


@holding_workspace_lock
def run_embedding_shard(ws: Workspace, revision: str, spec: PipelineSpec, shard: int, shards: int) -> dict[str, int]:
    """Encode shard ``shard`` of ``shards`` of the revision's representations into the cache."""
    t0 = time.perf_counter()
    figures = {"shard": shard, "shards": shards, "representations": 0, "unique_texts": 0, "cache_hits": 0}
    if not spec.vector_index.enabled:  # a lexical-only pipeline: nothing to encode (run_embeddings)
        return {**figures, "encoded": 0, "duration_ms": round((time.perf_counter() - t0) * 1000)}
    representations = read_output(ws, revision, "representations", spec)
    reps = read_representations(representations.path / "representations.parquet")
    mine = [r for r in reps if shard_of(str(r.digest), shards) == shard]
    _, stats = compute_embeddings(mine, embedding_cache(ws, spec), lambda: spec_embedder(spec))
    return {
        **figures,
        "representations": len(mine),
        "unique_texts": stats.unique_texts,
        "cache_hits": stats.cache_hits,
        "encoded": stats.encoded,
        "duration_ms": round((time.perf_counter() - t0) * 1000),
    }
