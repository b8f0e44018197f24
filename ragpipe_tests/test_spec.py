"""The pipeline spec file read strictly: a key given twice or nesting beyond the bound is one line
naming the file and line (``kernel/strict_load.py``); a YAML syntax error keeps its wording."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.spec import DEFAULT_SPEC_PATH, PipelineSpecError, load_pipeline_spec

DEFAULT = DEFAULT_SPEC_PATH.read_text(encoding="utf-8")
MAX_BYTES = "  max_bytes: 1200\n"


def refusal(tmp_path: Path, text: str) -> str:
    path = tmp_path / "pipeline.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PipelineSpecError) as err:
        load_pipeline_spec(path)
    assert "\n" not in str(err.value)
    return str(err.value).removeprefix(str(path))


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(keepends=True), start=1) if line == needle)


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path):
    assert DEFAULT.count(MAX_BYTES) == 1
    first = line_of(DEFAULT, MAX_BYTES)
    text = DEFAULT.replace(MAX_BYTES, MAX_BYTES + "  max_bytes: 900\n")
    assert refusal(tmp_path, text) == f":{first + 1}: chunker.max_bytes: duplicate key (first at line {first})"


def test_deep_nesting_is_one_line_without_a_recursion_error(tmp_path: Path):
    text = DEFAULT.replace(MAX_BYTES, "  max_bytes: " + "[" * 100_000 + "]" * 100_000 + "\n")
    # the document and chunker are levels 1-2: the 63rd '[' crosses the bound of 64
    assert refusal(tmp_path, text) == (
        f":{line_of(DEFAULT, MAX_BYTES)}: nesting deeper than 64 levels (column {len('  max_bytes: ') + 63})"
    )


def test_an_alias_is_refused(tmp_path: Path):
    text = DEFAULT.replace(MAX_BYTES, "  max_bytes: &size 1200\n  min_bytes: *size\n")
    assert refusal(tmp_path, text) == (
        f":{line_of(DEFAULT, MAX_BYTES) + 1}: YAML alias *size is not allowed "
        "(anchors and aliases are refused in configuration: write the value out)"
    )


def test_a_syntax_error_keeps_its_wording(tmp_path: Path):
    line = line_of(DEFAULT, MAX_BYTES)
    text = DEFAULT.replace(MAX_BYTES, "  max_bytes: 1200: 3\n")
    assert refusal(tmp_path, text) == (
        f": cannot read pipeline spec: invalid YAML at line {line}, column 18: mapping values are not allowed here"
    )


# --- the ANN index of the vector-index spec (docs/retrieval.md, "Approximate vector search") ----

VECTOR_INDEX = "vector_index:\n  metric: cosine\n"
DEFAULT_VECTOR_INDEX_ID = "sha256:60487fa7d0498c116f40bd0549820291af02783d5962bfd138805a634dfac0bd"  # test_golden


def with_ann(tmp_path: Path, ann: str, name: str = "pipeline.yaml"):
    assert DEFAULT.count(VECTOR_INDEX) == 1
    path = tmp_path / name
    path.write_text(DEFAULT.replace(VECTOR_INDEX, VECTOR_INDEX + f"  ann: {ann}\n"), encoding="utf-8")
    return load_pipeline_spec(path)


def test_without_ann_every_spec_id_is_unchanged(tmp_path: Path):
    from ragpipe.spec import VectorIndexSpec

    default = load_pipeline_spec()
    assert "ann" not in VectorIndexSpec().model_dump(mode="json")
    assert default.own_spec_ids["vector_index"] == DEFAULT_VECTOR_INDEX_ID
    explicit = with_ann(tmp_path, "null")
    assert explicit.vector_index.ann is None
    assert explicit.own_spec_ids == default.own_spec_ids and explicit.spec_ids == default.spec_ids


def test_the_ann_index_is_in_the_vector_index_spec_id(tmp_path: Path):
    default = load_pipeline_spec()
    hnsw = with_ann(tmp_path, "{kind: ivf_hnsw_sq}", "a.yaml")
    wider = with_ann(tmp_path, "{kind: ivf_hnsw_sq, m: 32}", "b.yaml")
    pq = with_ann(tmp_path, "{kind: ivf_pq, num_partitions: 4, num_sub_vectors: 48}", "c.yaml")
    assert hnsw.vector_index.ann.model_dump() == {
        "kind": "ivf_hnsw_sq",
        "num_partitions": 1,
        "m": 20,
        "ef_construction": 300,
    }
    ids = [s.own_spec_ids["vector_index"] for s in (default, hnsw, wider, pq)]
    assert len(set(ids)) == 4
    # downstream of it: the bundle; upstream and beside it: unchanged
    assert hnsw.spec_ids["index_bundle"] != default.spec_ids["index_bundle"]
    for stage in ("embeddings", "lexical_index"):
        assert hnsw.spec_ids[stage] == default.spec_ids[stage]
    # the dump the ID is computed from holds every parameter, defaults included
    assert pq.vector_index.model_dump(mode="json")["ann"] == {
        "kind": "ivf_pq",
        "num_partitions": 4,
        "num_sub_vectors": 48,
        "num_bits": 8,
    }


def test_pq_sub_vectors_must_divide_the_embedder_dimensions(tmp_path: Path):
    text = DEFAULT.replace(
        VECTOR_INDEX, VECTOR_INDEX + "  ann: {kind: ivf_pq, num_partitions: 4, num_sub_vectors: 7}\n"
    )
    assert refusal(tmp_path, text) == (
        ": invalid pipeline spec: vector_index.ann.num_sub_vectors: "
        "7 does not divide the embedder's 384 dimensions (embedder.dimensions)"
    )


def test_an_ann_field_is_named_as_the_file_spells_it(tmp_path: Path):
    text = DEFAULT.replace(
        VECTOR_INDEX, VECTOR_INDEX + "  ann: {kind: ivf_pq, num_partitions: 4, num_sub_vectors: 8, num_bits: 5}\n"
    )
    assert refusal(tmp_path, text) == ": invalid pipeline spec: vector_index.ann.num_bits: Input should be 4 or 8"
    text = DEFAULT.replace(VECTOR_INDEX, VECTOR_INDEX + "  ann: {kind: flat}\n")
    assert refusal(tmp_path, text).startswith(
        ": invalid pipeline spec: vector_index.ann: Input tag 'flat' found using 'kind' does not match any of the expected tags"
    )


def test_a_manifest_whose_pq_index_cannot_fit_its_embedder_is_refused():
    from ragpipe.bundle.manifest import BundleCounts, BundleSemantic, StageSpecRecord, make_manifest
    from ragpipe.bundle.payload_checks import check_specs
    from ragpipe.spec import SEMANTIC, VectorIndexSpec, own_spec_id

    default = load_pipeline_spec()
    vector = VectorIndexSpec.model_validate({"ann": {"kind": "ivf_pq", "num_partitions": 2, "num_sub_vectors": 5}})
    specs = {
        "embeddings": StageSpecRecord(
            spec_id=default.own_spec_ids["embeddings"], spec=default.embedder.model_dump(mode="json", context=SEMANTIC)
        ),
        "vector_index": StageSpecRecord(
            spec_id=own_spec_id("vector_index", vector), spec=vector.model_dump(mode="json", context=SEMANTIC)
        ),
    }
    sem = BundleSemantic(
        corpus_digest="sha256:" + "1" * 64,
        default_scope="public",
        specs=specs,
        chunk_set_digest="sha256:" + "3" * 64,
        representation_set_digest="sha256:" + "4" * 64,
        has_vector_index=True,
        counts=BundleCounts(documents=1, chunks=1, representations=1, lexical_documents=1, vectors=1),
    )
    assert check_specs(make_manifest(sem, None, [], None)) == [
        "manifest.json: specs.vector_index: ann.num_sub_vectors: 5 does not divide the embedder's 384 dimensions "
        "(embedder.dimensions)"
    ]
