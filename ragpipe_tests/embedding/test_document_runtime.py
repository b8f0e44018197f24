"""Documents encoded by onnxruntime (``embedder.runtime: onnxruntime``): the spec's identity, the
fused fp32 graph within the parity tolerance of torch, the int8 graph as its own model, entries
refused when altered, and a build whose stored vectors are the graph's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from ragpipe.embedding.compute import read_embeddings
from ragpipe.embedding.embedder import SentenceTransformerEmbedder
from ragpipe.embedding.onnx_query import PARITY_PROBES, PARITY_TOLERANCE
from ragpipe.embedding.query_graph import (
    INT8_MIN_COSINE,
    MANIFEST,
    MODEL,
    QueryGraphError,
    entry_dir,
    load_entry,
    query_encoder,
)
from ragpipe.representations.derive import read_representations
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
from ragpipe.spec import EmbedderSpec, PipelineSpec, load_pipeline_spec, own_spec_id
from ragpipe.stages.stage_store import read_output
from ragpipe_tests.conftest import HANDBOOK, build_all_stages, write_tree

TEXTS = [
    "Does aspirin prevent stroke?",
    "",
    "COVID-19 vaccines: mRNA-1273 & BNT162b2 — efficacy ≥ 90 %",
    "Café crème, naïve résumé — 日本語のテキスト 🎉",
    "word " * 300,  # truncated at max_seq_length
]


def with_runtime(spec: EmbedderSpec, **fields) -> EmbedderSpec:
    return EmbedderSpec.model_validate({**spec.model_dump(), **fields})


@pytest.fixture(scope="module")
def torch_spec() -> EmbedderSpec:
    return load_pipeline_spec().embedder


@pytest.fixture(scope="module")
def fused_spec(torch_spec) -> EmbedderSpec:
    return with_runtime(torch_spec, runtime="onnxruntime", document_prefix="passage: ")


@pytest.fixture(scope="module")
def int8_spec(torch_spec) -> EmbedderSpec:
    return with_runtime(torch_spec, runtime="onnxruntime", quantization="int8")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("graphs")


@pytest.fixture(scope="module")
def fused(graphs, fused_spec):
    return query_encoder(graphs, fused_spec)


@pytest.fixture(scope="module")
def int8(graphs, int8_spec):
    return query_encoder(graphs, int8_spec)


def manifest_of(root: Path, spec: EmbedderSpec) -> dict:
    return json.loads((entry_dir(root, spec) / MANIFEST).read_text())


def operators(root: Path, spec: EmbedderSpec) -> set[str]:
    return {node.op_type for node in onnx.load(entry_dir(root, spec) / MODEL).graph.node}


def test_the_runtime_is_part_of_the_embedder_identity(torch_spec):
    assert "runtime" not in torch_spec.model_dump() and "quantization" not in torch_spec.model_dump()
    ids = {
        own_spec_id("embeddings", spec)
        for spec in (
            torch_spec,
            with_runtime(torch_spec, runtime="onnxruntime"),
            with_runtime(torch_spec, runtime="onnxruntime", quantization="int8"),
        )
    }
    assert len(ids) == 3
    # the default written out is the same spec as the default left out
    explicit = with_runtime(torch_spec, runtime="sentence_transformers", quantization="none")
    assert own_spec_id("embeddings", explicit) == own_spec_id("embeddings", torch_spec)


def test_int8_without_onnxruntime_and_a_remote_runtime_are_refused(torch_spec):
    with pytest.raises(ValueError, match="quantization: int8 weights run on runtime: onnxruntime only"):
        with_runtime(torch_spec, quantization="int8")
    remote = {"provider": "litellm", "model": "openai/text-embedding-3-small", "dimensions": 8, "normalize": True}
    with pytest.raises(ValueError, match="runtime: not used by a litellm embedder"):
        EmbedderSpec.model_validate({**remote, "runtime": "onnxruntime"})


def test_the_fused_graph_encodes_documents_within_the_tolerance_of_torch(graphs, fused, fused_spec):
    assert {"Attention", "SkipLayerNormalization"} <= operators(graphs, fused_spec)
    st = SentenceTransformerEmbedder(fused_spec, threads=2)
    vectors = fused.embed(TEXTS)
    assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32
    for text, vector in zip(TEXTS, vectors):
        assert float(np.abs(vector - st.embed([text])[0]).max()) <= PARITY_TOLERANCE
    # documents carry the document prefix, queries the query prefix ("")
    assert float(np.abs(fused.embed_query("aspirin") - st.embed_query("aspirin")).max()) <= PARITY_TOLERANCE
    assert not np.array_equal(fused.embed(["aspirin"])[0], fused.embed_query("aspirin"))
    assert fused.embed([]).shape == (0, 384)


def test_a_text_gets_the_same_bits_whatever_it_is_encoded_with(fused):
    alone = fused.embed([TEXTS[0]])[0]
    for neighbours in ([TEXTS[4], TEXTS[0]], [TEXTS[0], TEXTS[2], TEXTS[3]]):
        batch = fused.embed(neighbours)
        assert np.array_equal(batch[neighbours.index(TEXTS[0])], alone)


def test_the_fused_manifest_records_torch_document_probes(graphs, fused, fused_spec):
    manifest = manifest_of(graphs, fused_spec)
    assert manifest["graph"] == "fused" and "min_cosine_to_torch" not in manifest
    st = SentenceTransformerEmbedder(fused_spec, threads=2)
    assert [p["text"] for p in manifest["document_probes"]] == list(PARITY_PROBES)
    for probe in manifest["document_probes"]:
        torch_vector = st.embed([probe["text"]])[0]  # with the "passage: " prefix
        assert np.array_equal(np.asarray(probe["vector"], np.float32), torch_vector)
    assert 0 < manifest["max_difference"] <= PARITY_TOLERANCE


def test_the_int8_graph_is_its_own_model(graphs, int8, int8_spec, torch_spec):
    assert {"DynamicQuantizeMatMul", "MatMulInteger"} & operators(graphs, int8_spec)
    manifest = manifest_of(graphs, int8_spec)
    assert manifest["graph"] == "fused_int8"
    assert INT8_MIN_COSINE <= manifest["min_cosine_to_torch"] < 1.0
    # the recorded probes are the int8 graph's own vectors, which a load reproduces
    for probe in manifest["document_probes"]:
        assert float(np.abs(int8.embed([probe["text"]])[0] - np.asarray(probe["vector"])).max()) <= PARITY_TOLERANCE
    st = SentenceTransformerEmbedder(torch_spec, threads=2)
    difference = np.abs(int8.embed(TEXTS[:1])[0] - st.embed(TEXTS[:1])[0]).max()
    assert difference > 100 * PARITY_TOLERANCE  # not torch's vectors: the gate judges its quality


def copy_entry(root: Path, spec: EmbedderSpec, tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "root"
    shutil.copytree(entry_dir(root, spec), entry_dir(target, spec))
    return target


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        (lambda m: m.update(graph="exported"), "graph 'exported' is not the embedder's 'fused'"),
        (lambda m: m.update(document_probes=[]), "its document probes are not the parity probes a fused graph records"),
        (
            lambda m: m.update(min_cosine_to_torch=0.99),
            "min_cosine_to_torch is recorded for int8 graphs, and only for them",
        ),
        (
            lambda m: m["document_probes"][1]["vector"].__setitem__(0, m["document_probes"][1]["vector"][0] + 1e-3),
            "give document probe 'Does low-dose aspirin reduce the risk of' a vector 0.001 away from the recorded "
            "sentence-transformers vector (> 1e-05)",
        ),
    ],
)
def test_an_edited_fused_manifest_is_refused(graphs, fused, fused_spec, tmp_path: Path, edit, rule: str):
    root = copy_entry(graphs, fused_spec, tmp_path)
    path = entry_dir(root, fused_spec) / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(QueryGraphError) as info:
        load_entry(root, fused_spec)
    assert rule in str(info.value)
    assert str(info.value).endswith(f"remove {entry_dir(root, fused_spec)} to re-create it")


def test_an_int8_entry_under_an_fp32_spec_key_is_refused(graphs, int8, int8_spec, fused_spec, tmp_path: Path):
    """An int8 graph renamed into the fp32 spec's folder: the manifest's key gives it away."""
    import shutil

    root = tmp_path / "root"
    shutil.copytree(entry_dir(graphs, int8_spec), entry_dir(root, fused_spec))
    with pytest.raises(QueryGraphError, match="is not this embedder's key"):
        load_entry(root, fused_spec)


def runtime_pipeline(**embedder) -> PipelineSpec:
    data = load_pipeline_spec().model_dump(by_alias=True, exclude={"evaluation"})
    data["embedder"] = {**data["embedder"], **embedder}
    return PipelineSpec.model_validate(data)


def test_a_build_stores_the_onnxruntime_vectors_and_serves_them(tmp_path: Path):
    spec = runtime_pipeline(runtime="onnxruntime")
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    ws, spec, bundle = build_all_stages(tmp_path / "home", "hb", corpus, "markdown", spec=spec)
    graph = query_encoder(ws.query_graphs, spec.embedder)  # the entry the build created
    reps = read_representations(read_output(ws, "hb", "representations", spec).path / "representations.parquet")
    ids, vectors = read_embeddings(read_output(ws, "hb", "embeddings", spec).path / "embeddings.parquet")
    text_of = {str(r.representation_id): r.text for r in reps}
    assert np.array_equal(vectors, graph.embed([text_of[i] for i in ids]))
    retriever = Retriever(bundle, query_graph_dir=ws.query_graphs)
    assert retriever.embedder_spec.runtime == "onnxruntime"
    result = retriever.query("rotate the signing keys", Subject("ops", ("public", "staff")), k=3, mode="vector")
    assert len(result.hits) == 3


def test_an_int8_build_is_queried_through_its_own_graph_only(tmp_path: Path):
    from ragpipe.retrieval.plan import QueryEmbeddingPlan, load_plan
    from ragpipe.retrieval.results import QueryError

    spec = runtime_pipeline(runtime="onnxruntime", quantization="int8")
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    ws, spec, bundle = build_all_stages(tmp_path / "home", "hb", corpus, "markdown", spec=spec)
    graph = query_encoder(ws.query_graphs, spec.embedder)
    ids, vectors = read_embeddings(read_output(ws, "hb", "embeddings", spec).path / "embeddings.parquet")
    reps = read_representations(read_output(ws, "hb", "representations", spec).path / "representations.parquet")
    text_of = {str(r.representation_id): r.text for r in reps}
    assert np.array_equal(vectors, graph.embed([text_of[i] for i in ids]))
    subject = Subject("ops", ("public", "staff"))
    served = Retriever(bundle, query_graph_dir=ws.query_graphs)
    assert len(served.query("rotate the signing keys", subject, k=3, mode="vector").hits) == 3
    torch_plan = load_plan().model_copy(update={"query_embedding": QueryEmbeddingPlan(runtime="sentence_transformers")})
    refused = Retriever(bundle, plan=torch_plan, query_graph_dir=ws.query_graphs)
    with pytest.raises(QueryError) as info:
        refused.query("rotate the signing keys", subject, k=3, mode="vector")
    assert str(info.value) == (
        "the bundle's embedder runs int8 weights on onnxruntime: its queries are embedded by the same graph "
        "(query_embedding.runtime: onnxruntime), not by sentence_transformers"
    )
