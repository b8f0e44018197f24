"""A sentence-transformers model folder on disk, pinned by the digest of its files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ragpipe.embedding import model_folder
from ragpipe.embedding.embedder import EmbedderError, SentenceTransformerEmbedder, model_directory
from ragpipe.spec import EmbedderSpec, PipelineSpecError, load_pipeline_spec, own_spec_id

PACKAGED = load_pipeline_spec().embedder
TEXTS = ["Aspirin reduces the risk of stroke.", "Tantivy is a search engine library.", "Café crème — 日本語"]
PINNED = {
    "1_Pooling/config.json",
    "config.json",
    "config_sentence_transformers.json",
    "data_config.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
}


def copy_model(dst: Path, link_weights: bool = True) -> Path:
    """A copy of the packaged model folder (the 90 MB weights linked, unless ``link_weights`` is False:
    a link is followed, so the digest is the same)."""
    src = model_directory(PACKAGED)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    if link_weights:
        (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    else:
        shutil.copy2(src / "model.safetensors", dst / "model.safetensors")
    return dst


def folder_spec(path: Path | None, digest: str) -> EmbedderSpec:
    fields = PACKAGED.model_dump(exclude={"package", "weights_sha256"})
    return EmbedderSpec(**fields, model_path=path, files_sha256=digest)


@pytest.fixture(scope="module")
def pinned_copy(tmp_path_factory) -> tuple[Path, str]:
    folder = copy_model(tmp_path_factory.mktemp("model") / "minilm", link_weights=False)
    digest, files, written = model_folder.pin(folder)
    assert written == folder / model_folder.MANIFEST
    assert {f.path for f in files} == PINNED  # README.md and .gitattributes are not read by any loader
    return folder, digest


def test_a_pinned_folder_embeds_exactly_as_the_packaged_model(pinned_copy):
    folder, digest = pinned_copy
    packaged = SentenceTransformerEmbedder(PACKAGED, batch_size=16, threads=2)
    on_disk = SentenceTransformerEmbedder(folder_spec(folder, digest), batch_size=16, threads=2)
    assert on_disk.model_dir == folder
    assert np.array_equal(on_disk.embed(TEXTS), packaged.embed(TEXTS))
    assert np.array_equal(
        on_disk.embed_query("does aspirin prevent stroke"), packaged.embed_query("does aspirin prevent stroke")
    )


def test_the_digest_is_the_documented_canonical_list(pinned_copy):
    folder, digest = pinned_copy
    body = json.loads((folder / model_folder.MANIFEST).read_text())
    assert body["files_sha256"] == digest and body["kind"] == "ragpipe.model_files/v1"
    # recomputed here from the manifest with the kernel's content ID: (path, bytes, sha256) sorted by path
    from ragpipe.kernel.ids import content_id

    assert content_id("model-files", 1, {"files": sorted(body["files"], key=lambda f: f["path"])}) == digest
    weights = next(f for f in body["files"] if f["path"] == "model.safetensors")
    assert weights["sha256"] == PACKAGED.weights_sha256  # the packaged pin, file for file


def test_the_path_is_operational_the_files_digest_is_identity(pinned_copy, tmp_path: Path):
    folder, digest = pinned_copy
    here, there = folder_spec(folder, digest), folder_spec(tmp_path / "elsewhere", digest)
    assert own_spec_id("embeddings", here) == own_spec_id("embeddings", there)
    assert own_spec_id("embeddings", here) != own_spec_id("embeddings", PACKAGED)
    assert own_spec_id("embeddings", here) != own_spec_id("embeddings", folder_spec(folder, "sha256:" + "0" * 64))
    assert "model_path" not in here.model_dump(mode="json", context={"semantic": True})
    assert here.model_dump(mode="json")["model_path"] == str(folder)  # a dump for people keeps it


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("flip", r"tokenizer\.json differs from the pinned file \(sha256:[0-9a-f]{64}, 466247 bytes; pinned sha256:"),
        ("delete", r"vocab\.txt is missing"),
        ("add", r"extra\.bin is not one of the pinned files"),
        ("pooling", r"1_Pooling/config\.json differs from the pinned file"),
    ],
)
def test_a_folder_whose_files_differ_is_refused_naming_the_file(pinned_copy, tmp_path: Path, change, message):
    _, digest = pinned_copy
    folder = copy_model(tmp_path / "m")
    shutil.copy2(pinned_copy[0] / model_folder.MANIFEST, folder / model_folder.MANIFEST)
    if change == "flip":
        data = bytearray((folder / "tokenizer.json").read_bytes())
        data[1000] ^= 1
        (folder / "tokenizer.json").write_bytes(bytes(data))
    elif change == "delete":
        (folder / "vocab.txt").unlink()
    elif change == "add":
        (folder / "extra.bin").write_bytes(b"x")
    else:
        (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    with pytest.raises(EmbedderError, match=rf"^model folder {folder}: {message}") as caught:
        SentenceTransformerEmbedder(folder_spec(folder, digest))  # refused before torch loads the model
    assert "\n" not in str(caught.value) and f"the spec pins files_sha256 {digest}" in str(caught.value)


def test_files_no_loader_reads_may_change(pinned_copy, tmp_path: Path):
    _, digest = pinned_copy
    folder = copy_model(tmp_path / "m")
    (folder / "README.md").write_text("a new model card")
    (folder / ".gitattributes").unlink()
    assert model_folder.verify(folder, digest) == folder


def test_without_the_manifest_the_refusal_names_both_digests(pinned_copy, tmp_path: Path):
    _, digest = pinned_copy
    folder = copy_model(tmp_path / "m")
    (folder / "vocab.txt").write_text("changed")
    with pytest.raises(
        EmbedderError,
        match=rf"its files have digest sha256:[0-9a-f]{{64}}, but the spec pins files_sha256 {digest} \(no ragpipe-files.json",
    ):
        model_directory(folder_spec(folder, digest))
    # a manifest rewritten to describe the changed folder is not the pinned list: it is not believed
    model_folder.pin(folder)
    with pytest.raises(EmbedderError, match="no ragpipe-files.json of the pinned files here"):
        model_directory(folder_spec(folder, digest))


def test_special_files_are_refused(tmp_path: Path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    os.mkfifo(folder / "weights.bin")
    with pytest.raises(model_folder.ModelFolderError, match=r"weights\.bin: is not a regular file"):
        model_folder.folder_files(folder)
    (folder / "weights.bin").unlink()
    (folder / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(model_folder.ModelFolderError, match="dangling: cannot be read"):
        model_folder.folder_files(folder)


def test_a_spec_read_from_a_bundle_finds_its_folder_by_digest(pinned_copy, tmp_path: Path, monkeypatch):
    folder, digest = pinned_copy
    recorded = EmbedderSpec.model_validate(
        folder_spec(folder, digest).model_dump(mode="json", context={"semantic": True}), context={"recorded": True}
    )
    assert recorded.model_path is None
    monkeypatch.delenv(model_folder.ENV_MODEL_FOLDERS, raising=False)
    with pytest.raises(
        EmbedderError, match=rf"no model folder with files_sha256 {digest} found: set RAGPIPE_EMBEDDER_PATH"
    ):
        model_directory(recorded)
    monkeypatch.setenv(model_folder.ENV_MODEL_FOLDERS, f"{tmp_path / 'missing'}{os.pathsep}{folder.parent}")
    assert model_directory(recorded) == folder  # a folder holding model folders is searched one level down
    monkeypatch.setenv(model_folder.ENV_MODEL_FOLDERS, str(folder))
    assert model_directory(recorded) == folder


def test_a_spec_file_resolves_a_relative_model_path_and_needs_one(pinned_copy, tmp_path: Path):
    folder, digest = pinned_copy
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    raw = (Path(__file__).resolve().parents[2] / "ragpipe" / "specs" / "pipeline.yaml").read_text()
    start, end = raw.index("embedder:"), raw.index("lexical_index:")
    relative = os.path.relpath(folder, spec_dir)
    body = (
        f"embedder:\n  model_name: all-MiniLM-L6-v2\n  model_path: {relative}\n  files_sha256: {digest}\n"
        "  dimensions: 384\n  normalize: true\n  max_seq_length: 256\n\n"
    )
    path = spec_dir / "pipeline.yaml"
    path.write_text(raw[:start] + body + raw[end:])
    spec = load_pipeline_spec(path)
    assert spec.embedder.model_path == spec_dir / relative and model_directory(spec.embedder).samefile(folder)
    path.write_text(raw[:start] + body.replace(f"  model_path: {relative}\n", "") + raw[end:])
    with pytest.raises(
        PipelineSpecError, match="embedder: model_path: a model folder pinned by files_sha256 needs its model_path$"
    ):
        load_pipeline_spec(path)
    path.write_text(raw[:start] + body.replace("  files_sha256", "  package: x\n  files_sha256") + raw[end:])
    with pytest.raises(
        PipelineSpecError, match=r"embedder: either a packaged model \(package, weights_sha256\) or a model folder"
    ):
        load_pipeline_spec(path)


def test_ragpipe_embedder_pin_prints_the_digest_and_records_the_list(tmp_path: Path):
    from ragpipe.cli.app import app

    folder = copy_model(tmp_path / "m")
    result = CliRunner().invoke(app, ["embedder", "pin", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    digest, _, _ = model_folder.pin(folder, write_manifest=False)
    assert body["files_sha256"] == digest and body["manifest"] == str(folder / model_folder.MANIFEST)
    assert {f["path"] for f in body["files"]} == PINNED
    result = CliRunner().invoke(app, ["embedder", "pin", str(tmp_path / "none")])
    assert result.exit_code == 1 and "is not a folder" in result.output


def test_a_bundle_built_from_a_folder_is_queried_through_it(pinned_copy, tmp_path: Path, monkeypatch):
    """Build with ``model_path``; the bundle names the folder by digest only, and the query side
    finds it through ``RAGPIPE_EMBEDDER_PATH`` (the onnxruntime query graph is exported from it)."""
    from ragpipe.retrieval.authz import Subject
    from ragpipe.retrieval.retriever import Retriever
    from ragpipe.spec import PipelineSpec
    from ragpipe_tests.support.builds import build_all_stages
    from ragpipe_tests.support.corpora import HANDBOOK, write_tree

    folder, digest = pinned_copy
    data = load_pipeline_spec().model_dump(by_alias=True, exclude={"evaluation"})
    data["embedder"] = folder_spec(folder, digest).model_dump()
    spec = PipelineSpec.model_validate(data)
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    _, _, bundle = build_all_stages(tmp_path / "home", "hb", corpus, "markdown", spec=spec)
    monkeypatch.setenv(model_folder.ENV_MODEL_FOLDERS, str(folder))
    retriever = Retriever(bundle, query_graph_dir=tmp_path / "graphs")
    assert retriever.embedder_spec.files_sha256 == digest and retriever.embedder_spec.model_path is None
    result = retriever.query("rotate the signing keys", Subject("ops", ("public", "staff")), k=1, mode="vector")
    assert result.hits[0]["document_id"] == "guide/ops.md"
    retriever.close()
