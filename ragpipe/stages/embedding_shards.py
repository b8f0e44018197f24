"""The embedding step's shared parts, and one shard of it (``RAGPIPE_EMBEDDING_SHARDS`` > 1).

``embed_revision`` is what every embedding step runs: the spec's embedder — a local model
(``spec_embedder``, loaded once per process) or a remote endpoint through litellm
(``ragpipe.embedding.remote``, under ``execution.embedding``) — through the (embedder spec, text
digest) cache (``embedding_cache``), shared through the object store when one is configured, so
steps on machines that share no disk meet in it. A remote embedder first passes the disclosure
check (``check_disclosure``): every representation's document scopes against the spec's
``disclosure`` policy for the endpoint, before anything is sent.

Shard ``i`` of ``n`` is every representation whose text digest, read as a number, is ``i`` modulo
``n``: a property of the text alone, so shards are disjoint (two shards never encode one text),
balanced for any corpus, and the same in every run. ``run_embedding_shard`` encodes its shard's
texts into the cache and publishes nothing; a shard run again (a retry, a re-execution from
failure) finds the batches it finished in the cache and encodes only the rest. The ``embeddings``
step then assembles the partition from the cache (``steps.run_embeddings``): it looks every text
up, so its output does not depend on how many shards filled the cache, or where.
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path

from ragpipe.corpus.snapshot import read_snapshot_documents
from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.embedding.compute import EmbeddingFailed, EmbeddingStats, Progress, compute_embeddings
from ragpipe.kernel.seals import configured_key
from ragpipe.kernel.settings import Settings, current_settings
from ragpipe.kernel.workspace import Workspace
from ragpipe.representations.derive import Representation, read_representations
from ragpipe.spec import PipelineSpec
from ragpipe.stages.stage_store import StageError, StageOutput, holding_workspace_lock, read_output, read_version
from ragpipe.storage.location import store_from_env
from ragpipe.work.failures import BudgetExhausted, BudgetUnenforceable
from ragpipe.work.usage import PriceError, load_prices


def shard_count(settings: Settings | None = None) -> int:
    """``RAGPIPE_EMBEDDING_SHARDS`` of ``settings`` (default: ``current_settings()``; 1: the
    one-step asset). ``Settings`` checks it is an integer from 1 to 64 (``SettingsError``)."""
    return (settings or current_settings()).embedding_shards


@lru_cache(maxsize=2)
def spec_embedder(spec: PipelineSpec, graphs: Path):
    """The spec's local model, loaded once per process: sentence-transformers (torch, imported on
    first use), or for ``runtime: onnxruntime`` the verified graph of the cache under ``graphs``
    (``ragpipe.embedding.query_graph``; created on first use, with torch)."""
    threads = spec.execution.torch_threads
    if spec.embedder.runtime == "onnxruntime":
        from ragpipe.embedding.query_graph import query_encoder

        return query_encoder(graphs, spec.embedder, threads=threads)
    from ragpipe.embedding.embedder import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(spec.embedder, spec.execution.embed_batch_size, threads)


def check_disclosure(
    ws: Workspace, revision: str, spec: PipelineSpec, representations: StageOutput, reps: list[Representation]
) -> None:
    """Refuse (``StageError``, one line) a remote embedder's build if any representation's
    document may not be sent to its endpoint under ``spec.disclosure`` — before anything is
    sent, and whatever the cache holds: a build's outcome never depends on what an earlier build
    sent. A local embedder, or an endpoint that may receive every scope (on this machine, or
    ``["*"]`` under ``disclosure.endpoints``), reads nothing."""
    embedder = spec.embedder
    if not embedder.remote:
        return
    endpoint = embedder.endpoint or ""
    policy = spec.disclosure
    allowed = policy.allowed(endpoint)
    if allowed is None:
        return
    snapshot = read_version(
        ws, revision, "source_snapshot", representations.record.inputs["source_snapshot"], "representations"
    )
    scopes = {d.document_id: d.access_scopes for d in read_snapshot_documents(snapshot.path / "documents.parquet")}
    chunks: set[str] = set()
    refused: set[str] = set()
    for rep in reps:
        document_scopes = scopes.get(rep.document_id, ())  # a document not found has no scope: refused
        if not policy.may_send(document_scopes, endpoint):
            chunks.add(rep.chunk_id)
            refused.update(document_scopes)
    if chunks:
        rule = (
            f"disclosure.endpoints[{endpoint}]: {', '.join(sorted(allowed))}"
            if endpoint in policy.endpoints
            else f"disclosure.send_scopes: {', '.join(sorted(allowed)) or '(none)'}"
        )
        raise StageError(
            f"embeddings: {len(chunks)} chunk(s) of scope(s) {', '.join(sorted(refused)) or '(none)'} may not be sent "
            f"to {endpoint} ({rule}); embed with a local endpoint or model, or allow these scopes under "
            "disclosure.endpoints"
        )


def embed_revision(
    ws: Workspace,
    revision: str,
    spec: PipelineSpec,
    representations: StageOutput,
    reps: list[Representation],
    progress: Progress | None = None,
    *,
    revision_reps: list[Representation] | None = None,
):
    """Vectors for ``reps`` (of ``representations``) and the stats, through the cache: the local
    model, or — after ``check_disclosure`` of every representation of the revision
    (``revision_reps``, default ``reps``: a shard refuses exactly when the whole build would, before
    any shard sends anything) — the remote embedder under ``execution.embedding``.
    A remote embedder's failures (texts without a vector, a budget stop, a price table that
    cannot be read) are ``StageError`` in one line; finished batches stay cached."""
    cache = embedding_cache(ws, spec)
    if not spec.embedder.remote:
        return compute_embeddings(reps, cache, lambda: spec_embedder(spec, ws.query_graphs), progress=progress)
    from ragpipe.embedding.remote import RemoteEmbedder, RemoteEmbeddingStep

    check_disclosure(ws, revision, spec, representations, reps if revision_reps is None else revision_reps)
    execution = spec.execution.embedding
    try:
        embedder = RemoteEmbedder(spec.embedder, timeout_seconds=execution.timeout_seconds, prices=load_prices())
        return compute_embeddings(reps, cache, step=RemoteEmbeddingStep(embedder), policy=execution, progress=progress)
    except (EmbeddingFailed, BudgetExhausted, BudgetUnenforceable, PriceError) as exc:
        raise StageError(f"embeddings: {spec.embedder.model} at {spec.embedder.endpoint}: {exc}") from None


def usage_metadata(stats: EmbeddingStats) -> dict[str, int | str | bool]:
    """A remote embedder's calls as Dagster metadata: requests, retries, tokens, money (the cost is
    unknown — ``embedding_cost_known`` False — when the model has no price: never read the micros
    alone as the total)."""
    usage = stats.usage
    return {
        "embedding_calls": usage.calls,
        "embedding_retries": stats.retries,
        "embedding_input_tokens": usage.input_tokens,
        "embedding_cost_micros": usage.cost_micros,
        "embedding_cost_known": usage.cost_known,
        "embedding_cost": usage.cost_text(),
    }


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
    _, stats = embed_revision(ws, revision, spec, representations, mine, revision_reps=reps)
    return {
        **figures,
        "representations": len(mine),
        "unique_texts": stats.unique_texts,
        "cache_hits": stats.cache_hits,
        "encoded": stats.encoded,
        **(usage_metadata(stats) if spec.embedder.remote else {}),
        "duration_ms": round((time.perf_counter() - t0) * 1000),
    }
