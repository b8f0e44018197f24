"""A remote (litellm) embedder through the step runner and the embedding cache, against a real
local embeddings server: batches, exact vectors, the cache, retries, typed failures, the query side."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.embedding.compute import EmbeddingFailed, compute_embeddings
from ragpipe.embedding.embedder import EmbedderError
from ragpipe.embedding.remote import RemoteEmbedder, RemoteEmbeddingStep, normalize_rows
from ragpipe.kernel.ids import ChunkId, ContentDigest, DocumentId, RepresentationId, SpecId, bytes_digest, content_id
from ragpipe.representations.derive import Representation
from ragpipe.spec import EmbedderSpec, EmbeddingExecution, own_spec_id
from ragpipe.work.failures import BudgetExhausted
from ragpipe.work.leases import KeyLeases
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.runner import run_step
from ragpipe.work.usage import load_prices
from ragpipe_tests.support.embeddings_server import EmbeddingsServer, vector_for

DIMS = 8
MODEL = "openai/text-embedding-3-small"


def remote_spec(server: EmbeddingsServer, **fields) -> EmbedderSpec:
    return EmbedderSpec(
        **{
            "provider": "litellm",
            "model": MODEL,
            "api_base": server.api_base,
            "dimensions": DIMS,
            "normalize": True,
            "document_prefix": "passage: ",
            "query_prefix": "query: ",
            **fields,
        }
    )


def rep(text: str, i: int) -> Representation:
    return Representation(
        representation_id=RepresentationId(content_id("representation", 1, {"i": i})),
        chunk_id=ChunkId(content_id("chunk", 1, {"i": i})),
        document_id=DocumentId(f"d{i}"),
        kind="raw",
        text=text,
        digest=ContentDigest(bytes_digest(text.encode())),
        producer_spec_id=SpecId(content_id("s", 1, {})),
    )


TEXTS = [f"text number {i} about topic {i % 7}" for i in range(50)]
REPS = [rep(t, i) for i, t in enumerate(TEXTS)]
FAST = {"backoff_seconds": 0.0, "max_backoff_seconds": 0.0}


def cache_for(root: Path, spec: EmbedderSpec) -> EmbeddingCache:
    return EmbeddingCache(root, own_spec_id("embeddings", spec), spec.dimensions)


def build(root: Path, spec: EmbedderSpec, reps=REPS, timeout=5.0, **policy):
    execution = EmbeddingExecution(**{"batch_size": 16, "concurrency": 1, **FAST, **policy})
    embedder = RemoteEmbedder(spec, timeout_seconds=timeout, prices=load_prices())
    return compute_embeddings(reps, cache_for(root, spec), step=RemoteEmbeddingStep(embedder), policy=execution)


def expected(text: str, prefix: str = "passage: ") -> np.ndarray:
    return normalize_rows(vector_for("text-embedding-3-small", prefix + text, DIMS)[None, :])[0]


def test_fifty_texts_in_batches_of_sixteen_exact_vectors_then_all_from_the_cache(tmp_path: Path):
    with EmbeddingsServer(DIMS) as server:
        spec = remote_spec(server)
        vectors, stats = build(tmp_path, spec)
        sizes = sorted(len(batch) for batch in server.inputs())
        sent = [text for batch in server.inputs() for text in batch]
        assert sizes == [2, 16, 16, 16] and len(server.requests) == 4
        assert sorted(sent) == sorted("passage: " + t for t in TEXTS)  # the document prefix, each text once
        assert vectors.dtype == np.float32 and vectors.shape == (50, DIMS)
        for row, text in zip(vectors, TEXTS, strict=True):
            assert np.array_equal(row, expected(text))  # bit for bit
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
        words = sum(len(("passage: " + t).split()) for t in TEXTS)
        assert (stats.encoded, stats.cache_hits, stats.usage.calls, stats.usage.input_tokens) == (50, 0, 4, words)
        # each call's cost is its own words × 20,000 micros per million, rounded up
        cost = sum(-(-sum(len(t.split()) for t in batch) * 20_000 // 10**6) for batch in server.inputs())
        assert stats.usage.cost_known and stats.usage.cost_micros == cost
        # a second build, a new cache object over the same folder: nothing is sent, the same bits come back
        again, stats2 = build(tmp_path, spec)
        assert len(server.requests) == 4
    assert (stats2.encoded, stats2.cache_hits, stats2.usage.calls) == (0, 50, 0)
    assert np.array_equal(again, vectors)


def test_the_same_server_output_gives_bit_identical_vectors_in_another_batching(tmp_path: Path):
    with EmbeddingsServer(DIMS) as server:
        one, _ = build(tmp_path / "a", remote_spec(server), batch_size=16)
        other, _ = build(tmp_path / "b", remote_spec(server), batch_size=7, concurrency=3)
    assert np.array_equal(one, other)


def test_a_429_is_retried_after_the_servers_retry_after(tmp_path: Path):
    slept: list[float] = []
    with EmbeddingsServer(DIMS) as server:
        spec = remote_spec(server)
        server.faults.extend(["429:2", "ok"])
        step = RemoteEmbeddingStep(RemoteEmbedder(spec, timeout_seconds=5, prices=load_prices()))
        items = [(str(r.digest), r.text) for r in REPS[:5]]
        policy = ExecutionPolicy(batch_size=16, backoff_seconds=0.5, max_backoff_seconds=30)
        values, report = run_step(step, items, cache_for(tmp_path, spec), policy, sleep=slept.append)
    assert slept[0] == 2.0  # the server's Retry-After, not the policy's 0.5 s (then the limiter's own pause)
    # one request retried: its 5 texts counted once each
    assert (report.retries, report.computed, report.failures, len(server.requests)) == ({"rate_limited": 5}, 5, (), 2)
    assert all(np.array_equal(values[str(r.digest)], expected(r.text)) for r in REPS[:5])


def test_server_errors_past_the_attempt_budget_fail_the_build_in_one_line_keeping_finished_batches(tmp_path: Path):
    with EmbeddingsServer(DIMS) as server:
        spec = remote_spec(server)
        server.faults.extend(["ok", "500", "500", "500"])  # the first batch succeeds, the second never
        with pytest.raises(EmbeddingFailed) as caught:
            build(tmp_path, spec, reps=REPS[:32], max_attempts=3)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(
            "16 text(s) have no vector after their attempts (server_error: 16); first: http_error:500 after 3 attempt(s)"
        )
        assert "(16 embedded and cached: build again to continue)" in message
        # building again sends only the batch that failed
        _, stats = build(tmp_path, spec, reps=REPS[:32])
        assert (stats.cache_hits, stats.encoded) == (16, 16)
        assert len(server.requests) == 5


def test_a_timeout_is_retried_and_a_second_timeout_past_the_budget_fails_typed(tmp_path: Path):
    with EmbeddingsServer(DIMS) as server:
        spec = remote_spec(server)
        server.faults.extend(["timeout", "ok"])
        vectors, stats = build(tmp_path / "a", spec, reps=REPS[:3], timeout=0.5, max_attempts=2)
        assert stats.retries == 3 and np.array_equal(vectors[0], expected(TEXTS[0]))  # 3 texts retried once
        server.faults.extend(["timeout", "timeout"])
        with pytest.raises(EmbeddingFailed, match=r"\(timeout: 3\); first: timeout after 2 attempt\(s\)"):
            build(tmp_path / "b", spec, reps=REPS[:3], timeout=0.5, max_attempts=2)


@pytest.mark.parametrize(
    ("fault", "detail"),
    [
        (
            "wrong_dims",
            "embedding:wrong_dimensions after 1 attempt(s): input 0: a 7-dimensional vector, the spec declares 8",
        ),
        ("nan", "embedding:non_finite after 1 attempt(s): input 0: component 0 is nan, not a finite float32"),
        ("wrong_count", "embedding:wrong_count after 1 attempt(s): the reply holds 2 embeddings for 3 inputs"),
    ],
)
def test_a_broken_reply_is_refused_in_one_line_and_never_stored(tmp_path: Path, fault: str, detail: str):
    with EmbeddingsServer(DIMS) as server:
        spec = remote_spec(server)
        server.faults.append(fault)
        with pytest.raises(EmbeddingFailed) as caught:
            build(tmp_path, spec, reps=REPS[:3])
        assert str(caught.value) == (
            f"3 text(s) have no vector after their attempts (invalid_output: 3); first: {detail} "
            "(0 embedded and cached: build again to continue)"
        )
        assert not list((tmp_path / own_spec_id("embeddings", spec).hex).glob("shard-*"))  # nothing cached
        _, stats = build(tmp_path, spec, reps=REPS[:3])  # the server answers properly now
    assert stats.encoded == 3


def test_a_budget_stops_admission_and_names_the_embedding_setting(tmp_path: Path):
    with EmbeddingsServer(DIMS) as server:
        with pytest.raises(BudgetExhausted, match=r"raise execution\.embedding\.budget_micros"):
            build(tmp_path, remote_spec(server), budget_micros=1)
        assert len(server.requests) == 0  # a batch's worst case (its bytes as tokens) does not fit: nothing is sent


def test_another_model_endpoint_prefix_or_normalisation_is_another_spec_and_cache(tmp_path: Path):
    with EmbeddingsServer(DIMS) as server:
        spec = remote_spec(server)
        ids = {
            own_spec_id("embeddings", s)
            for s in [
                spec,
                remote_spec(server, model="openai/text-embedding-3-large"),
                remote_spec(server, api_base="http://127.0.0.1:1/v1"),
                remote_spec(server, api_base=None),
                remote_spec(server, document_prefix=""),
                remote_spec(server, query_prefix="q: "),
                remote_spec(server, normalize=False),
                remote_spec(server, dimensions=4),
                remote_spec(server, send_dimensions=True),
            ]
        }
        assert len(ids) == 9
        # the endpoint's identity, not its spelling: scheme and host case, a trailing slash
        spelled = remote_spec(server, api_base=server.api_base.replace("http://", "HTTP://") + "/")
        assert own_spec_id("embeddings", spelled) == own_spec_id("embeddings", spec)
        build(tmp_path, spec, reps=REPS[:3])
        build(tmp_path, remote_spec(server, model="openai/text-embedding-3-large"), reps=REPS[:3])
    assert len(server.requests) == 2  # another model never reads the first one's vectors
    assert server.requests[1]["model"] == "text-embedding-3-large"


def test_without_normalize_the_servers_vectors_are_stored_as_sent(tmp_path: Path):
    with EmbeddingsServer(DIMS) as server:
        vectors, _ = build(tmp_path, remote_spec(server, normalize=False, document_prefix=""), reps=REPS[:2])
    assert np.array_equal(vectors[1], vector_for("text-embedding-3-small", TEXTS[1], DIMS))


def test_the_query_side_embeds_through_the_same_endpoint_with_the_query_prefix_kept_in_memory():
    with EmbeddingsServer(DIMS) as server:
        embedder = RemoteEmbedder(remote_spec(server), prices=load_prices())
        first = embedder.embed_query("does aspirin prevent stroke")
        again = embedder.embed_query("does aspirin prevent stroke")
        other = embedder.embed_query("statins")
        # the repeat came from memory
        assert server.inputs() == [["query: does aspirin prevent stroke"], ["query: statins"]]
        assert np.array_equal(first, expected("does aspirin prevent stroke", "query: "))
        assert np.array_equal(first, again)
        assert not np.array_equal(first, other)
        assert embedder.query_usage.calls == 2
        # a transient failure is retried; one that lasts is one line naming the endpoint
        server.faults.extend(["500", "ok"])
        embedder.query_policy = ExecutionPolicy(max_attempts=2, **FAST)
        assert np.array_equal(embedder.embed_query("retry me"), expected("retry me", "query: "))
        server.faults.extend(["500", "500"])
        with pytest.raises(EmbedderError) as caught:
            embedder.embed_query("fails")
    assert str(caught.value).startswith(
        f"embedder {MODEL} at {server.api_base}: server_error (http_error:500) after 2 attempt(s): "
    )


def test_the_query_cache_is_bounded():
    with EmbeddingsServer(DIMS) as server:
        embedder = RemoteEmbedder(remote_spec(server), prices=load_prices(), query_cache_size=2)
        for text in ["a", "b", "c", "a"]:
            embedder.embed_query(text)
    assert [batch[0] for batch in server.inputs()] == ["query: a", "query: b", "query: c", "query: a"]


def test_normalize_rows_is_exact_and_refuses_a_zero_vector():
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((20, 384)).astype(np.float32)
    out = normalize_rows(matrix)
    reference = matrix.astype(np.float64) / np.linalg.norm(matrix.astype(np.float64), axis=1, keepdims=True)
    assert out.dtype == np.float32 and np.array_equal(out, reference.astype(np.float32))
    with pytest.raises(ValueError, match="input 1: a zero vector cannot be normalised"):
        normalize_rows(np.stack([matrix[0], np.zeros(384, np.float32)]))


def test_a_local_spec_is_not_a_remote_embedder():
    from ragpipe.spec import load_pipeline_spec

    with pytest.raises(EmbedderError, match="is not a remote"):
        RemoteEmbedder(load_pipeline_spec().embedder)


def test_leases_are_taken_per_text(tmp_path: Path):
    """Two builds of one cache folder at once never embed one text twice (the runner's leases)."""
    import threading

    with EmbeddingsServer(DIMS) as server:
        server.gate = threading.Event()  # the first build's request is held until the second waits
        spec = remote_spec(server)
        results = []

        def one() -> None:
            execution = EmbeddingExecution(batch_size=16, concurrency=1, **FAST)
            step = RemoteEmbeddingStep(RemoteEmbedder(spec, prices=load_prices()))
            cache = cache_for(tmp_path, spec)
            items = [(str(r.digest), r.text) for r in REPS[:16]]
            results.append(run_step(step, items, cache, execution, leases=KeyLeases(cache.directory / "leases"))[1])

        threads = [threading.Thread(target=one) for _ in range(2)]
        threads[0].start()
        with server.received:  # the first build holds the leases and its request is at the server
            assert server.received.wait_for(lambda: len(server.requests) == 1, timeout=60)
        threads[1].start()  # finds the texts leased (or, if it comes late, cached): never embeds them again
        server.gate.set()
        for t in threads:
            t.join()
    assert sorted(r.computed for r in results) == [0, 16] and len(server.requests) == 1


@pytest.mark.parametrize(
    ("name", "endpoint"),
    [("pipeline-openai.yaml", "openai:default"), ("pipeline-ollama.yaml", "http://127.0.0.1:11434")],
)
def test_the_example_specs_change_only_the_embedder(name: str, endpoint: str):
    from ragpipe.spec import DEFAULT_SPEC_PATH, load_pipeline_spec

    default = load_pipeline_spec()
    example = load_pipeline_spec(DEFAULT_SPEC_PATH.parent / "examples" / name)
    assert example.embedder.remote and example.embedder.endpoint == endpoint
    changed = {s for s in default.own_spec_ids if default.own_spec_ids[s] != example.own_spec_ids[s]}
    assert changed == {"embeddings"}
