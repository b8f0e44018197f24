"""A build whose embedder is remote (``provider: litellm``), end to end against a real local
embeddings server: the disclosure check before anything is sent, the stage's usage metadata, the
cache across revisions, and vector queries embedded through the same endpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragpipe.embedding.compute import read_embeddings
from ragpipe.embedding.remote import normalize_rows
from ragpipe.kernel.workspace import Workspace
from ragpipe.representations.derive import read_representations
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.stages.embedding_shards import run_embedding_shard
from ragpipe.stages.stage_store import StageError, read_output
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.embeddings_server import EmbeddingsServer, vector_for

DIMS = 16
MODEL = "openai/text-embedding-3-small"


def remote_pipeline(api_base: str | None, disclosure: dict | None = None, **embedder) -> PipelineSpec:
    data = load_pipeline_spec().model_dump(by_alias=True, exclude={"evaluation"})
    data["embedder"] = {
        "provider": "litellm",
        "model": MODEL,
        "api_base": api_base,
        "dimensions": DIMS,
        "normalize": True,
        "document_prefix": "passage: ",
        "query_prefix": "query: ",
        **embedder,
    }
    data["execution"]["embedding"] = {"batch_size": 4, "concurrency": 2, "backoff_seconds": 0.0}
    if disclosure is not None:
        data["disclosure"] = disclosure
    return PipelineSpec.model_validate(data)


def stages_before_embeddings(ws: Workspace, revision: str, corpus: Path, spec: PipelineSpec) -> None:
    from ragpipe.corpus.registry import register_revision

    register_revision(ws.registry, revision, corpus, "markdown", "public")
    for run in (steps.run_source_snapshot, steps.run_chunks, steps.run_representations):
        run(ws, revision, spec)


def test_a_remote_build_then_vector_queries_through_the_same_endpoint(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    with EmbeddingsServer(DIMS) as server:
        spec = remote_pipeline(server.api_base)
        # a loopback endpoint is this machine: every scope may be sent to it (staff included)
        ws, spec, bundle = build_all_stages(tmp_path / "home", "hb", corpus, "markdown", spec=spec)
        built = len(server.requests)
        reps = read_representations(read_output(ws, "hb", "representations", spec).path / "representations.parquet")
        assert built == -(-len({r.digest for r in reps}) // 4)  # batches of 4 distinct texts
        # the stored vectors are the server's, normalised, bit for bit
        ids, vectors = read_embeddings(read_output(ws, "hb", "embeddings", spec).path / "embeddings.parquet")
        text_of = {str(r.representation_id): r.text for r in reps}
        want = np.stack([vector_for("text-embedding-3-small", "passage: " + text_of[i], DIMS) for i in ids])
        assert np.array_equal(vectors, normalize_rows(want))
        facts = steps.read_stage_record(ws, "hb", "embeddings").facts
        assert facts["encoded"] == len({r.digest for r in reps})

        retriever = Retriever(bundle)
        assert retriever.embedder_spec.remote and retriever.embedder_spec.api_base == server.api_base
        result = retriever.query("rotate the signing keys", Subject("ops", ("public", "staff")), k=3, mode="vector")
        assert server.inputs()[-1] == ["query: rotate the signing keys"]
        top = next(r for r in reps if r.chunk_id == result.hits[0]["chunk_id"])
        assert top.document_id  # a hit, hydrated from the bundle's chunks

        def unit(text: str) -> np.ndarray:
            return normalize_rows(vector_for("text-embedding-3-small", text, DIMS)[None, :])[0]

        q = unit("query: rotate the signing keys")
        best = max(reps, key=lambda r: float(unit("passage: " + r.text) @ q))
        assert result.hits[0]["chunk_id"] == best.chunk_id  # the exact nearest representation's chunk
        retriever.query("rotate the signing keys", Subject("ops", ("public", "staff")), k=3, mode="vector")
        assert len(server.requests) == built + 1  # the repeated query: from memory
        retriever.close()

        # another revision of the same texts embeds nothing: the cache is keyed by (embedder spec, text)
        build_all_stages(tmp_path / "home", "hb2", corpus, "markdown", spec=spec)
        assert len(server.requests) == built + 1
    assert steps.read_stage_record(ws, "hb2", "embeddings").facts["encoded"] == 0


def test_the_stage_reports_calls_tokens_and_cost(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    with EmbeddingsServer(DIMS) as server:
        spec = remote_pipeline(server.api_base)
        ws = Workspace(tmp_path / "home")
        stages_before_embeddings(ws, "hb", corpus, spec)
        seen: list[tuple[int, int]] = []
        result = steps.run_embeddings(ws, "hb", spec, progress=lambda done, total: seen.append((done, total)))
        words = sum(len(t.split()) for batch in server.inputs() for t in batch)
    meta = result.metadata
    assert (meta["provider"], meta["endpoint"], meta["model"]) == ("litellm", server.api_base, MODEL)
    assert (meta["embedding_calls"], meta["embedding_input_tokens"]) == (len(server.requests), words)
    assert meta["embedding_cost_known"] is True and meta["embedding_cost_micros"] >= 1
    assert seen[0] == (0, meta["encoded"]) and seen[-1] == (meta["encoded"], meta["encoded"])  # progress in the build


def test_a_chunk_that_may_not_leave_refuses_the_build_before_anything_is_sent(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    with EmbeddingsServer(DIMS) as server:
        # the loopback server stands for a remote endpoint: its own entry allows only public text
        spec = remote_pipeline(server.api_base, {"endpoints": {server.api_base: ["public"]}})
        ws = Workspace(tmp_path / "home")
        stages_before_embeddings(ws, "hb", corpus, spec)
        reps = read_representations(read_output(ws, "hb", "representations", spec).path / "representations.parquet")
        staff_chunks = {r.chunk_id for r in reps if r.document_id == "guide/ops.md"}
        with pytest.raises(StageError) as caught:
            steps.run_embeddings(ws, "hb", spec)
        with pytest.raises(StageError):  # a shard step is checked the same way
            run_embedding_shard(ws, "hb", spec, 0, 2)
        assert (server.connections, len(server.requests)) == (0, 0)  # nothing even connected
    assert str(caught.value) == (
        f"embeddings: {len(staff_chunks)} chunk(s) of scope(s) staff may not be sent to {server.api_base} "
        f"(disclosure.endpoints[{server.api_base}]: public); embed with a local endpoint or model, or allow these "
        "scopes under disclosure.endpoints"
    )


def test_a_remote_endpoint_gets_only_public_text_by_default_and_what_its_entry_allows(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    # a non-loopback endpoint: refused before any connection is tried (the name is never resolved)
    spec = remote_pipeline("https://embeddings.example.com/v1")
    ws = Workspace(tmp_path / "home")
    stages_before_embeddings(ws, "hb", corpus, spec)
    with pytest.raises(
        StageError,
        match=r"of scope\(s\) staff may not be sent to https://embeddings\.example\.com/v1 \(disclosure\.send_scopes: public\)",
    ):
        steps.run_embeddings(ws, "hb", spec)
    default = remote_pipeline(None)  # the provider's own endpoint
    stages_before_embeddings(ws, "hb-default", corpus, default)
    with pytest.raises(StageError, match=r"may not be sent to openai:default \(disclosure\.send_scopes: public\)"):
        steps.run_embeddings(ws, "hb-default", default)
    with EmbeddingsServer(DIMS) as server:
        allowed = remote_pipeline(server.api_base, {"endpoints": {server.api_base: ["public", "staff"]}})
        stages_before_embeddings(ws, "hb-allowed", corpus, allowed)
        steps.run_embeddings(ws, "hb-allowed", allowed)
        sent = {t for batch in server.inputs() for t in batch}
    assert any("Rotate the signing keys" in t for t in sent)  # the staff runbook, allowed for this endpoint


def test_a_remote_failure_fails_the_stage_in_one_line_and_publishes_nothing(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    with EmbeddingsServer(DIMS) as server:
        spec = remote_pipeline(server.api_base)
        ws = Workspace(tmp_path / "home")
        stages_before_embeddings(ws, "hb", corpus, spec)
        server.faults.extend(["nan"] * 10)
        with pytest.raises(StageError) as caught:
            steps.run_embeddings(ws, "hb", spec)
    message = str(caught.value)
    assert message.startswith(f"embeddings: {MODEL} at {server.api_base}: ") and "\n" not in message
    assert "(invalid_output: " in message and "embedding:non_finite" in message
    with pytest.raises(StageError):  # nothing was published
        read_output(ws, "hb", "embeddings", spec)


def test_shard_steps_fill_the_cache_and_the_assembling_step_sends_nothing(tmp_path: Path):
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    with EmbeddingsServer(DIMS) as server:
        spec = remote_pipeline(server.api_base)
        ws = Workspace(tmp_path / "home")
        stages_before_embeddings(ws, "hb", corpus, spec)
        figures = [run_embedding_shard(ws, "hb", spec, shard, 2) for shard in range(2)]
        sent = len(server.requests)
        result = steps.run_embeddings(ws, "hb", spec)
        assert len(server.requests) == sent
    assert sum(f["encoded"] for f in figures) == result.metadata["unique_texts"]
    assert sum(f["embedding_calls"] for f in figures) == sent
    assert (result.metadata["encoded"], result.metadata["embedding_calls"]) == (0, 0)
