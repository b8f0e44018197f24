"""Documents encoded by onnxruntime (``embedder.runtime: onnxruntime``): the spec's identity, the
fused fp32 graph within the parity tolerance of torch, the int8 graph as its own model pinned by
its digest (``graph_sha256``), entries refused when altered, and builds whose stored vectors are
the graph's."""

from __future__ import annotations

import json
import logging
import shutil
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
    UntrustedManifest,
    entry_dir,
    entry_key,
    graph_digest,
    load_entry,
    pin_graph,
    query_encoder,
)
from ragpipe.kernel.workspace import Workspace
from ragpipe.representations.derive import read_representations
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
from ragpipe.spec import EmbedderSpec, PipelineSpec, load_pipeline_spec, own_spec_id
from ragpipe.stages.stage_store import read_output
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.query_graphs import copy_entry, edit_manifest

TEXTS = [
    "Does aspirin prevent stroke?",
    "",
    "COVID-19 vaccines: mRNA-1273 & BNT162b2 — efficacy ≥ 90 %",
    "Café crème, naïve résumé — 日本語のテキスト 🎉",
    "word " * 300,  # truncated at max_seq_length
]
# a well-formed pin of no graph this host makes
OTHER_PIN = "sha256:" + "1" * 64


def with_runtime(spec: EmbedderSpec, **fields) -> EmbedderSpec:
    return EmbedderSpec.model_validate({**spec.model_dump(), **fields})


@pytest.fixture(scope="module")
def torch_spec() -> EmbedderSpec:
    return load_pipeline_spec().embedder


@pytest.fixture(scope="module")
def fused_spec(torch_spec) -> EmbedderSpec:
    return with_runtime(torch_spec, runtime="onnxruntime", document_prefix="passage: ")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> Path:
    """The query-graph cache of a home (``<home>/query_graphs``)."""
    return Workspace(tmp_path_factory.mktemp("home")).query_graphs


@pytest.fixture(scope="module")
def pinned(graphs, torch_spec) -> tuple[EmbedderSpec, object]:
    """``ragpipe embedder pin-graph``'s work: this host's int8 graph, and the spec pinning it."""
    return pin_graph(graphs, torch_spec)


@pytest.fixture(scope="module")
def int8_spec(pinned) -> EmbedderSpec:
    return pinned[0]


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


def test_the_runtime_and_the_int8_graph_are_part_of_the_embedder_identity(torch_spec):
    dump = torch_spec.model_dump()
    assert "runtime" not in dump and "quantization" not in dump and "graph_sha256" not in dump
    ids = {
        own_spec_id("embeddings", spec)
        for spec in (
            torch_spec,
            with_runtime(torch_spec, runtime="onnxruntime"),
            with_runtime(torch_spec, runtime="onnxruntime", quantization="int8", graph_sha256=OTHER_PIN),
            with_runtime(torch_spec, runtime="onnxruntime", quantization="int8", graph_sha256="sha256:" + "2" * 64),
        )
    }
    assert len(ids) == 4  # two int8 graphs are two embedders: their vectors never share a cache or a bundle
    # the default written out is the same spec as the default left out
    explicit = with_runtime(torch_spec, runtime="sentence_transformers", quantization="none", graph_sha256=None)
    assert own_spec_id("embeddings", explicit) == own_spec_id("embeddings", torch_spec)


def test_the_ids_of_specs_without_int8_are_unchanged(torch_spec):
    """Golden: the IDs these specs had before graph_sha256 existed (the default spec's own is
    pinned in ragpipe_tests/test_golden.py)."""
    fp32 = with_runtime(torch_spec, runtime="onnxruntime")
    assert own_spec_id("embeddings", fp32) == "sha256:58442ef8c2412184b57106267dd5bd846aedfb7b9f0e5cae1796d386d2114223"
    prefixed = with_runtime(fp32, document_prefix="passage: ")
    assert own_spec_id("embeddings", prefixed) == (
        "sha256:489b813f300409068d2154ca1e6b893834e663fe5ff7311b18626a700635a4e2"
    )


def test_int8_without_onnxruntime_and_a_remote_runtime_are_refused(torch_spec):
    with pytest.raises(ValueError, match="quantization: int8 weights run on runtime: onnxruntime only"):
        with_runtime(torch_spec, quantization="int8", graph_sha256=OTHER_PIN)
    remote = {"provider": "litellm", "model": "openai/text-embedding-3-small", "dimensions": 8, "normalize": True}
    with pytest.raises(ValueError, match="runtime: not used by a litellm embedder"):
        EmbedderSpec.model_validate({**remote, "runtime": "onnxruntime"})
    with pytest.raises(ValueError, match="graph_sha256: not used by a litellm embedder"):
        EmbedderSpec.model_validate({**remote, "graph_sha256": OTHER_PIN})


def test_an_int8_spec_pins_its_graph_and_only_an_int8_spec_does(torch_spec):
    with pytest.raises(ValueError) as info:
        with_runtime(torch_spec, runtime="onnxruntime", quantization="int8")
    assert (
        "graph_sha256: an int8 embedder pins its int8 graph's digest "
        "(`ragpipe embedder pin-graph` makes this host's graph and prints it)"
    ) in str(info.value)
    for runtime in ("onnxruntime", "sentence_transformers"):
        with pytest.raises(ValueError, match="graph_sha256: pins an int8 graph; not used without quantization: int8"):
            with_runtime(torch_spec, runtime=runtime, graph_sha256=OTHER_PIN)


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
    # the graph is the one the spec pins
    assert manifest["files"][MODEL]["sha256"] == int8_spec.graph_sha256
    assert graph_digest((entry_dir(graphs, int8_spec) / MODEL).read_bytes()) == int8_spec.graph_sha256
    assert INT8_MIN_COSINE <= manifest["min_cosine_to_torch"] < 1.0
    # the recorded probes are the int8 graph's own vectors, which a load reproduces
    for probe in manifest["document_probes"]:
        assert float(np.abs(int8.embed([probe["text"]])[0] - np.asarray(probe["vector"])).max()) <= PARITY_TOLERANCE
    st = SentenceTransformerEmbedder(torch_spec, threads=2)
    difference = np.abs(int8.embed(TEXTS[:1])[0] - st.embed(TEXTS[:1])[0]).max()
    assert difference > 100 * PARITY_TOLERANCE  # not torch's vectors: the gate judges its quality


def test_a_spec_pinning_another_int8_graph_is_refused_when_its_graph_is_made(graphs, int8_spec, tmp_path: Path):
    """This host makes the graph ``int8_spec`` pins, not the one ``wrong`` pins: nothing is published."""
    wrong = with_runtime(int8_spec, graph_sha256=OTHER_PIN)
    root = tmp_path / "query_graphs"
    with pytest.raises(QueryGraphError) as info:
        query_encoder(root, wrong)
    assert str(info.value) == (
        f"embedder graph_sha256: the int8 graph of all-MiniLM-L6-v2 made here is {int8_spec.graph_sha256}, "
        f"the spec pins {OTHER_PIN} (onnxruntime {onnxruntime_version()} quantises it otherwise than where it was "
        f"pinned); copy query_graphs/{entry_key(wrong).removeprefix('sha256:')}/ from a home that has the pinned "
        f"graph, or pin {int8_spec.graph_sha256} (`ragpipe embedder pin-graph`: another embedder, whose documents "
        "are embedded again)"
    )
    assert not root.exists()  # refused before anything was written


def test_ragpipe_embedder_pin_graph_prints_the_pin(pinned, tmp_path: Path, monkeypatch):
    """The command quantises the pipeline spec's model whatever its runtime says, and finds the
    entry pin_graph made; the spec lines it prints load as a pinned int8 embedder."""
    from typer.testing import CliRunner

    from ragpipe.cli.app import app
    from ragpipe.spec import load_model_embedder

    spec, encoder = pinned
    monkeypatch.setenv("RAGPIPE_HOME", str(encoder.entry.parent.parent))
    result = CliRunner().invoke(app, ["embedder", "pin-graph", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert (body["graph_sha256"], body["entry"]) == (spec.graph_sha256, str(encoder.entry))
    assert body["embedder_spec_id"] == own_spec_id("embeddings", spec)
    assert INT8_MIN_COSINE <= body["min_cosine_to_torch"] < 1
    edits = dict(e.removeprefix("embeddings.").split("=", 1) for e in body["set"][1::2])
    assert with_runtime(load_model_embedder(), **edits) == spec
    # a spec file whose int8 embedder is not pinned yet: refused by a build, read by pin-graph
    raw = load_pipeline_spec().model_dump(mode="json", by_alias=True, exclude={"evaluation"})
    raw["embedder"] |= {"runtime": "onnxruntime", "quantization": "int8"}
    path = tmp_path / "pipeline.yaml"
    path.write_text(json.dumps(raw))
    from ragpipe.spec import PipelineSpecError

    with pytest.raises(PipelineSpecError, match=r"embedder: graph_sha256: an int8 embedder pins"):
        load_pipeline_spec(path)
    assert load_model_embedder(path) == load_model_embedder()


def onnxruntime_version() -> str:
    from importlib import metadata

    return metadata.version("onnxruntime")


def another_home(tmp_path: Path) -> Path:
    return Workspace(tmp_path / "home").query_graphs


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        (lambda m: m.update(graph="exported"), "graph 'exported' is not the embedder's 'fused'"),
        (lambda m: m.update(document_probes=[]), "its document probes are not the parity probes a fused graph records"),
        (
            lambda m: m.update(min_cosine_to_torch=0.99),
            "min_cosine_to_torch is recorded for int8 graphs, and only for them",
        ),
    ],
)
def test_a_fused_manifest_not_describing_its_entry_is_not_trusted(
    graphs, fused, fused_spec, tmp_path: Path, edit, rule: str
):
    """Edits sealed again with the key (only a key holder could): still not this entry's manifest."""
    entry = copy_entry(graphs, fused_spec, another_home(tmp_path))
    edit_manifest(entry, edit, reseal=True)
    with pytest.raises(UntrustedManifest) as info:
        load_entry(entry.parent, fused_spec)
    assert str(info.value) == f"query graph {entry}/{MANIFEST}: {rule}"


def test_a_fused_manifest_with_other_probe_vectors_is_refused_by_the_probes(graphs, fused, fused_spec, tmp_path: Path):
    """Where the probes did not pass yet (another onnxruntime, here) a load runs them."""
    entry = copy_entry(graphs, fused_spec, another_home(tmp_path))

    def edit(m: dict) -> None:
        m["document_probes"][1]["vector"][0] += 1e-3
        m["probes_passed_on"]["onnxruntime"] = "0.0.1"

    edit_manifest(entry, edit, reseal=True)
    with pytest.raises(QueryGraphError) as info:
        load_entry(entry.parent, fused_spec)
    assert str(info.value) == (
        f"query graph {entry}: {MODEL} and tokenizer.json give document probe 'Does low-dose aspirin reduce the risk of' "
        f"a vector 0.001 away from the recorded sentence-transformers vector (> 1e-05); remove {entry} to re-create it"
    )


def test_an_int8_entry_under_an_fp32_spec_key_is_not_trusted(graphs, int8, int8_spec, fused_spec, tmp_path: Path):
    """An int8 graph renamed into the fp32 spec's folder: the manifest's key gives it away."""
    entry = copy_entry(graphs, int8_spec, another_home(tmp_path), dst_spec=fused_spec)
    with pytest.raises(UntrustedManifest, match="is not this embedder's key"):
        load_entry(entry.parent, fused_spec)


def test_an_entry_holding_another_int8_graph_is_refused_and_not_rebuilt_from_it(
    graphs, int8, int8_spec, tmp_path: Path, caplog
):
    """The int8 entry relabelled as the entry of a spec pinning another graph. Sealed with the key
    (a key holder's mistake), the load compares the graph with the pin and refuses; unsealed, the
    entry is rebuilt — and this host makes the graph ``int8_spec`` pins, not the one pinned."""
    wrong = with_runtime(int8_spec, graph_sha256=OTHER_PIN)
    entry = copy_entry(graphs, int8_spec, another_home(tmp_path), dst_spec=wrong)
    relabel = {"key": entry_key(wrong), "embedder_spec_id": own_spec_id("embeddings", wrong)}
    edit_manifest(entry, lambda m: m.update(relabel), reseal=True)
    with pytest.raises(QueryGraphError) as info:
        load_entry(entry.parent, wrong)
    assert str(info.value) == (
        f"query graph {entry}/{MODEL}: sha256 {int8_spec.graph_sha256} is not the graph the embedder pins "
        f"(graph_sha256 {OTHER_PIN}); remove {entry} to re-create it"
    )
    edit_manifest(entry, lambda m: None, reseal=False)
    with (
        caplog.at_level(logging.WARNING, logger="ragpipe.embedding.query_graph"),
        pytest.raises(QueryGraphError) as info,
    ):
        query_encoder(entry.parent, wrong)
    assert str(info.value).startswith(
        f"embedder graph_sha256: the int8 graph of all-MiniLM-L6-v2 made here is {int8_spec.graph_sha256}, the spec pins {OTHER_PIN}"
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"query graph {entry}/{MANIFEST}: is not sealed (written before manifests were sealed, or by someone without "
        "the key); the entry is rebuilt"
    ]
    assert not entry.exists()


def test_a_copied_entry_of_the_pinned_int8_graph_is_adopted(graphs, int8, int8_spec, tmp_path: Path, caplog):
    """A graph this host does not make (one weight moved) pinned by a spec and published in one
    home; its entry copied to another home, whose key did not seal it: rebuilt there around the
    copied graph — the bytes the spec pins — with this host's own probes, not refused for the
    graph this host would make."""
    import onnx
    from onnx import numpy_helper

    from ragpipe.embedding.query_graph import export_graph, publish_graph

    model = onnx.load_from_string((entry_dir(graphs, int8_spec) / MODEL).read_bytes())
    bias = next(i for i in model.graph.initializer if i.name.endswith("dense.bias"))
    values = numpy_helper.to_array(bias).copy()
    values[0] += 1e-3
    bias.CopyFrom(numpy_helper.from_array(values, bias.name))
    other = model.SerializeToString()
    spec = with_runtime(int8_spec, graph_sha256=graph_digest(other))
    first = Workspace(tmp_path / "first").query_graphs
    publish_graph(first, export_graph(SentenceTransformerEmbedder(spec, threads=2), graph=other))
    copied = entry_dir(another_home(tmp_path), spec)
    shutil.copytree(entry_dir(first, spec), copied)
    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.query_graph"):
        encoder = query_encoder(copied.parent, spec)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        f"query graph {copied}/{MANIFEST}: no verification key exists in this home: it cannot have been sealed here; "
        "the entry is rebuilt"
    )
    assert (copied / MODEL).read_bytes() == other and encoder.entry == copied
    assert INT8_MIN_COSINE <= encoder.min_cosine_to_torch < 1
    load_entry(copied.parent, spec)


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

    # as a user would: pin this host's graph (ragpipe embedder pin-graph), then build with the pin
    pinned, _ = pin_graph(Workspace(tmp_path / "home").query_graphs, load_pipeline_spec().embedder)
    spec = runtime_pipeline(runtime="onnxruntime", quantization="int8", graph_sha256=pinned.graph_sha256)
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    ws, spec, bundle = build_all_stages(tmp_path / "home", "hb", corpus, "markdown", spec=spec)
    assert spec.embedder == pinned
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
