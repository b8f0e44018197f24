"""Query embedding through onnxruntime: same vectors as sentence-transformers, or refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ragpipe.embedding.embedder import EmbedderError, SentenceTransformerEmbedder
from ragpipe.embedding.onnx_query import PARITY_TOLERANCE, OnnxEncoder
from ragpipe.embedding.query_graph import create_entry, entry_dir, load_entry
from ragpipe.retrieval.plan import load_plan, parse_plan
from ragpipe.spec import load_pipeline_spec

TEXTS = [
    "Does aspirin prevent stroke?",
    "",
    "COVID-19 vaccines: mRNA-1273 & BNT162b2 — efficacy ≥ 90 %",
    "word " * 300,  # truncated at max_seq_length by both runtimes
]


@pytest.fixture(scope="module")
def st_embedder():
    return SentenceTransformerEmbedder(load_pipeline_spec().embedder, threads=2)


@pytest.fixture(scope="module")
def graph_root(tmp_path_factory: pytest.TempPathFactory, st_embedder) -> Path:
    """A query-graph cache holding the default embedder's entry."""
    root = tmp_path_factory.mktemp("query_graphs")
    create_entry(root, st_embedder.spec, st_embedder=st_embedder)
    return root


@pytest.fixture(scope="module")
def encoder(graph_root, st_embedder):
    return load_entry(graph_root, st_embedder.spec, threads=2)


def test_onnx_vectors_match_sentence_transformers(encoder, st_embedder):
    assert encoder.spec == st_embedder.spec and encoder.max_difference <= PARITY_TOLERANCE
    for text in TEXTS:
        got, expected = encoder.embed_query(text), st_embedder.embed_query(text)
        assert got.shape == (384,) and got.dtype == np.float32
        assert float(np.abs(got - expected).max()) <= PARITY_TOLERANCE, text[:20]


def test_query_prefix_is_applied(st_embedder, tmp_path: Path):
    spec = st_embedder.spec.model_copy(update={"query_prefix": "query: "})
    prefixed = SentenceTransformerEmbedder.__new__(SentenceTransformerEmbedder)
    prefixed.__dict__.update(st_embedder.__dict__, spec=spec)
    create_entry(tmp_path, spec, st_embedder=prefixed)
    encoder = load_entry(tmp_path, spec, threads=1)
    assert np.abs(encoder.embed_query("aspirin") - st_embedder.embed_query("query: aspirin")).max() <= PARITY_TOLERANCE
    assert np.abs(encoder.embed_query("aspirin") - st_embedder.embed_query("aspirin")).max() > 1e-3


class _Drifting(SentenceTransformerEmbedder):
    """A reference whose vectors differ from the model's (a changed model under the same spec)."""

    def embed_query(self, text: str) -> np.ndarray:
        return super().embed_query(text) + np.float32(1e-3)


def test_parity_failure_refuses_the_onnx_runtime(st_embedder, tmp_path: Path):
    drifting = _Drifting.__new__(_Drifting)
    drifting.__dict__.update(st_embedder.__dict__)
    with pytest.raises(
        EmbedderError, match=r"onnxruntime query vectors differ from sentence-transformers by 0\.001 .*probe 'aspirin'"
    ):
        create_entry(tmp_path, st_embedder.spec, st_embedder=drifting)
    assert list(tmp_path.iterdir()) == []  # nothing published, no temp left


def test_unsupported_pooling_is_refused(st_embedder, tmp_path: Path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling

    cls_pooled = SentenceTransformerEmbedder.__new__(SentenceTransformerEmbedder)
    cls_pooled.__dict__.update(st_embedder.__dict__)
    cls_pooled.model = SentenceTransformer(
        modules=[st_embedder.model[0], Pooling(384, pooling_mode="cls")], device="cpu"
    )
    with pytest.raises(EmbedderError, match="supports mean pooling only, model uses 'cls'"):
        create_entry(tmp_path, st_embedder.spec, st_embedder=cls_pooled)
    assert not entry_dir(tmp_path, st_embedder.spec).exists()


def test_runtime_is_a_plan_field_in_the_plan_id():
    plan = load_plan()
    assert plan.query_embedding.runtime == "onnxruntime"
    torch_plan = plan.model_copy(
        update={"query_embedding": plan.query_embedding.model_copy(update={"runtime": "sentence_transformers"})}
    )
    assert torch_plan.plan_id != plan.plan_id
    with pytest.raises(
        ValueError, match="query_embedding.runtime: Input should be 'onnxruntime' or 'sentence_transformers'"
    ):
        parse_plan({"channels": {"lexical": {}}, "query_embedding": {"runtime": "tensorrt"}}, "plan.yaml")


def test_retriever_embeds_queries_with_the_plan_runtime(scoped_bundles, graph_root):
    from ragpipe.retrieval.retriever import Retriever

    full, _ = scoped_bundles
    plan = load_plan()
    torch_plan = plan.model_copy(
        update={"query_embedding": plan.query_embedding.model_copy(update={"runtime": "sentence_transformers"})}
    )
    onnx_side = Retriever(full, query_graph_dir=graph_root)
    torch_side = Retriever(full, plan=torch_plan, query_graph_dir=graph_root)
    first = onnx_side.query("aspirin", trace=True).trace["timings_ms"]
    again = onnx_side.query("aspirin", trace=True).trace["timings_ms"]
    assert (set(first), set(again)) == ({"embedder_load", "lexical", "vector"}, {"lexical", "vector"})  # names only
    assert type(onnx_side.embedder()) is OnnxEncoder
    assert onnx_side.embedder().entry == entry_dir(graph_root, onnx_side.embedder_spec)
    assert type(torch_side.embedder()) is SentenceTransformerEmbedder
    for query in ("aspirin stroke", "statins cholesterol", "who may read a document"):
        a = onnx_side.query(query, mode="vector").hits
        b = torch_side.query(query, mode="vector").hits
        assert [h["chunk_id"] for h in a] == [h["chunk_id"] for h in b]
        assert max(abs(x["score"] - y["score"]) for x, y in zip(a, b)) <= 1e-5
    onnx_side.close()
    torch_side.close()


def test_concurrent_queries_get_the_sequential_vectors(encoder):
    """onnxruntime sessions take concurrent runs; the tokenizer is only read after loading."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    assert encoder.thread_safe is True
    texts = [f"{t} {i}" for i in range(4) for t in TEXTS]
    expected = [encoder.embed_query(t) for t in texts]
    barrier = threading.Barrier(8)

    def run(offset: int) -> list[tuple[int, np.ndarray]]:
        barrier.wait()
        order = [(offset + i) % len(texts) for i in range(len(texts))]
        return [(i, encoder.embed_query(texts[i])) for i in order]

    with ThreadPoolExecutor(8) as pool:
        for batch in pool.map(run, range(8)):
            for i, vector in batch:
                assert np.array_equal(vector, expected[i]), texts[i][:20]
