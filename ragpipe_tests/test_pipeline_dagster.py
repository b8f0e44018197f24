"""End to end through Dagster: both sample revisions, lineage, incremental embedding, staleness."""

from __future__ import annotations

from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance
from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContextForTest

from ragpipe.bundle.verify import open_bundle
from ragpipe.chunking.chunkers import chunk_documents, make_chunker
from ragpipe.chunking.models import read_chunks
from ragpipe.corpus.connectors import read_beir
from ragpipe.corpus.registry import register_revision
from ragpipe.corpus.snapshot import build_snapshot, read_snapshot_documents
from ragpipe.defs import build_definitions
from ragpipe.defs.runner import materialize_revision
from ragpipe.pipeline_spec import PipelineSpec, load_pipeline_spec
from ragpipe.representations.derive import derive_representations, read_representations
from ragpipe.stages.steps import read_stage_record
from ragpipe.stages.workspace import Workspace
from ragpipe_tests.conftest import SAMPLE

ASSETS = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]
UPSTREAM = {
    "chunks": ["source_snapshot"],
    "representations": ["chunks"],
    "embeddings": ["representations"],
    "lexical_index": ["representations"],
    "vector_index": ["embeddings"],
    "index_bundle": ["lexical_index", "vector_index"],
}


@pytest.fixture(scope="module")
def sample_build(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("e2e")
    ws = Workspace(root / "ragpipe")
    (root / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(root / "dagster"))
    spec = load_pipeline_spec()
    summaries = {}
    for rev, path in (("scifact-1", SAMPLE / "rev-1.jsonl"), ("scifact-2", SAMPLE / "rev-2.jsonl")):
        register_revision(ws.registry, rev, path, "beir")
        summaries[rev] = materialize_revision(rev, ws, instance=instance, spec=spec)
    yield ws, instance, spec, summaries
    instance.dispose()


def expected_representation_digests(path: Path, spec: PipelineSpec) -> set[str]:
    """Independently re-derive a revision's representation texts from the raw sample file."""
    docs, _ = build_snapshot(read_beir(path), "x", "public", spec.snapshot)
    chunks = chunk_documents(docs, make_chunker(spec.chunker, spec.own_spec_ids["chunks"]))
    return {r.digest for r in derive_representations(docs, chunks, spec.representations.kinds, spec.own_spec_ids["representations"])}


def test_counts_and_incremental_embedding(sample_build):
    ws, _, spec, summaries = sample_build
    s1, s2 = summaries["scifact-1"], summaries["scifact-2"]
    assert (s1.documents, s1.excluded, s1.chunks, s1.representations) == (300, 0, 517, 1034)
    assert (s1.embedded, s1.cache_hits) == (1034, 0)
    assert (s2.documents, s2.chunks, s2.representations) == (300, 517, 1034)
    new_texts = expected_representation_digests(SAMPLE / "rev-2.jsonl", spec) - expected_representation_digests(
        SAMPLE / "rev-1.jsonl", spec
    )
    # revision 2 encodes exactly the representations whose text is new: 9 edited + 9 added documents
    assert s2.embedded == len(new_texts) == 48
    assert s2.cache_hits == 1034 - 48
    assert s1.bundle_id != s2.bundle_id
    for s in (s1, s2):
        assert open_bundle(Path(s.bundle_path)).bundle_id == s.bundle_id


def test_lineage_in_dagster_matches_artifacts(sample_build):
    ws, instance, spec, summaries = sample_build
    for rev in summaries:
        records = {}
        for asset in ASSETS:
            (rec,) = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[rev]), limit=1
            ).records
            records[asset] = rec
            tags = rec.asset_materialization.tags
            stage = read_stage_record(ws, rev, asset, spec)
            assert tags["dagster/code_version"] == spec.spec_ids[asset] == stage.spec_id
            assert tags["dagster/data_version"] == stage.data_version
            assert rec.run_id == summaries[rev].run_id
        for asset, parents in UPSTREAM.items():
            tags = records[asset].asset_materialization.tags
            for parent in parents:
                # each input pointer names exactly the upstream materialization of the same partition
                assert int(tags[f"dagster/input_event_pointer/{parent}"]) == records[parent].storage_id
        checks = instance.all_logs(summaries[rev].run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        assert sorted((e.dagster_event.event_specific_data.asset_check_key.name, e.dagster_event.event_specific_data.passed) for e in checks) == [
            ("bundle_verifies", True),
            ("chunks_match_source", True),
        ]
        bundle = open_bundle(Path(summaries[rev].bundle_path))
        sem = bundle.manifest.semantic
        assert sem.corpus_digest == read_stage_record(ws, rev, "source_snapshot").data_version
        assert sem.chunk_set_digest == read_stage_record(ws, rev, "chunks").data_version
        assert sem.representation_set_digest == read_stage_record(ws, rev, "representations").data_version
        assert sem.embeddings_digest == read_stage_record(ws, rev, "embeddings").data_version
        # chunk → document and representation → chunk lineage inside the bundle
        docs = {d.document_id for d in read_snapshot_documents(bundle.path / "documents.parquet")}
        chunks = read_chunks(bundle.path / "chunks.parquet")
        assert {c.document_id for c in chunks} == docs
        chunk_ids = {c.chunk_id for c in chunks}
        assert {r.chunk_id for r in read_representations(bundle.path / "representations.parquet")} == chunk_ids


def test_rerun_identical_revision_is_a_cheap_no_op(sample_build):
    ws, instance, spec, summaries = sample_build
    runs_before = len(instance.get_run_records())
    again = materialize_revision("scifact-2", ws, instance=instance, spec=spec)
    assert again.up_to_date and again.run_id is None
    assert (again.bundle_id, again.bundle_path, again.embedded) == (summaries["scifact-2"].bundle_id, summaries["scifact-2"].bundle_path, 0)
    assert len(instance.get_run_records()) == runs_before


def with_changes(spec: PipelineSpec, **sections) -> PipelineSpec:
    data = spec.model_dump(by_alias=True)
    for name, changes in sections.items():
        data[name] = {**data[name], **changes}
    return PipelineSpec.model_validate(data)


def stale_status(instance: DagsterInstance, spec: PipelineSpec, partition: str) -> dict[str, str]:
    graph = build_definitions(spec).resolve_asset_graph()
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    return {a: resolver.get_status(AssetKey(a), partition).value for a in ASSETS}


def code_versions(spec: PipelineSpec) -> dict[str, str]:
    defs = build_definitions(spec)
    return {a: defs.resolve_assets_def(a).code_versions_by_key[AssetKey(a)] for a in ASSETS}


def test_chunk_size_change_makes_chunks_and_downstream_stale_only(sample_build):
    _, instance, spec, _ = sample_build
    changed = with_changes(spec, chunker={"max_bytes": 800})
    before, after = code_versions(spec), code_versions(changed)
    assert [a for a in ASSETS if before[a] != after[a]] == ASSETS[1:]
    assert stale_status(instance, spec, "scifact-2") == dict.fromkeys(ASSETS, "FRESH")
    assert stale_status(instance, changed, "scifact-2") == {"source_snapshot": "FRESH", **dict.fromkeys(ASSETS[1:], "STALE")}


def test_embedder_change_leaves_lexical_side_fresh(sample_build):
    _, instance, spec, _ = sample_build
    changed = with_changes(spec, embedder={"max_seq_length": 128})
    status = stale_status(instance, changed, "scifact-1")
    assert [a for a, s in status.items() if s == "STALE"] == ["embeddings", "vector_index", "index_bundle"]


def test_execution_settings_change_no_identity(sample_build):
    _, instance, spec, _ = sample_build
    changed = with_changes(spec, execution={"embed_batch_size": 8, "torch_threads": 1, "index_writer_heap_mb": 64})
    assert code_versions(changed) == code_versions(spec)
    assert stale_status(instance, changed, "scifact-1") == dict.fromkeys(ASSETS, "FRESH")
