"""End to end through Dagster: both sample revisions, lineage, incremental embedding, staleness."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetCheckKey, AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance
from dagster._core.definitions.data_version import CachingStaleStatusResolver
from dagster._core.loader import LoadingContextForTest

from ragpipe.bundle.verify import open_bundle
from ragpipe.chunking.chunkers import chunk_documents, make_chunker
from ragpipe.chunking.models import read_chunks, write_chunks
from ragpipe.corpus.connectors import read_beir
from ragpipe.corpus.registry import register_revision
from ragpipe.corpus.snapshot import build_snapshot, read_snapshot_documents
from ragpipe.defs import build_definitions
from ragpipe.kernel.workspace import Workspace
from ragpipe.orchestration.failures import failure_messages
from ragpipe.orchestration.materialize import materialize_revision
from ragpipe.representations.derive import derive_representations, read_representations
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.stages.stage_store import read_output
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.paths import REPO, SAMPLE

ASSETS = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]
# Every upstream output an asset reads, i.e. exactly the inputs its stage records.
UPSTREAM = {
    "chunks": ["source_snapshot"],
    "representations": ["chunks", "source_snapshot"],
    "embeddings": ["representations"],
    "lexical_index": ["representations", "source_snapshot"],
    "vector_index": ["embeddings", "representations", "source_snapshot"],
    "index_bundle": sorted(ASSETS[:-1]),
}


@pytest.fixture(scope="module")
def sample_build(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("e2e")
    ws = Workspace(root / "ragpipe")
    (root / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(root / "dagster"))
    spec = load_pipeline_spec()
    summaries = {}
    # the code location builds in $RAGPIPE_HOME, like the UI's
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAGPIPE_HOME", str(ws.home))
        for rev, path in (("scifact-1", SAMPLE / "rev-1.jsonl"), ("scifact-2", SAMPLE / "rev-2.jsonl")):
            register_revision(ws.registry, rev, path, "beir", "public")
            summaries[rev] = materialize_revision(rev, ws, instance=instance, spec=spec)
        yield ws, instance, spec, summaries
    instance.dispose()


def expected_representation_digests(path: Path, spec: PipelineSpec) -> set[str]:
    """Independently re-derive a revision's representation texts from the raw sample file."""
    docs, _ = build_snapshot(read_beir(path), "x", "public", spec.snapshot)
    chunks = chunk_documents(docs, make_chunker(spec.chunker, spec.own_spec_ids["chunks"]))
    return {
        r.digest
        for r in derive_representations(docs, chunks, spec.representations.kinds, spec.own_spec_ids["representations"])
    }


def test_counts_and_incremental_embedding(sample_build):
    ws, _, spec, summaries = sample_build
    s1, s2 = summaries["scifact-1"], summaries["scifact-2"]
    assert (s1.documents, s1.excluded, s1.chunks, s1.representations) == (300, 0, 492, 984)
    assert (s1.embedded, s1.cache_hits) == (984, 0)
    assert (s2.documents, s2.chunks, s2.representations) == (300, 517, 1034)
    new_texts = expected_representation_digests(SAMPLE / "rev-2.jsonl", spec) - expected_representation_digests(
        SAMPLE / "rev-1.jsonl", spec
    )
    # revision 2 encodes exactly the representations whose text is new: 24 repaired, 9 edited and 9
    # added documents (data/scifact-sample/changes.json)
    assert s2.embedded == len(new_texts) == 146
    assert s2.cache_hits == 1034 - 146
    assert s1.bundle_id != s2.bundle_id
    # no daemon serves this instance's queue: both ran in this process
    assert (s1.launched, s2.launched) == ("in_process", "in_process")
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
            stage = read_stage_record(ws, rev, asset, spec)
            # the stage read exactly its declared deps, at the versions Dagster recorded for them
            assert sorted(stage.inputs) == parents
            for parent in parents:
                # each input pointer names exactly the upstream materialization of the same partition
                assert int(tags[f"dagster/input_event_pointer/{parent}"]) == records[parent].storage_id
                assert stage.inputs[parent] == records[parent].asset_materialization.tags["dagster/data_version"]
        checks = instance.all_logs(summaries[rev].run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        assert sorted(
            (e.dagster_event.event_specific_data.asset_check_key.name, e.dagster_event.event_specific_data.passed)
            for e in checks
        ) == [
            ("bundle_verifies", True),
            ("chunks_match_source", True),
            ("evaluation_ledger_verifies", True),  # the checked-in spec runs the chain after the bundle
        ]
        bundle = open_bundle(Path(summaries[rev].bundle_path))
        sem = bundle.manifest.semantic
        assert sem.corpus_digest == read_stage_record(ws, rev, "source_snapshot").data_version
        assert sem.chunk_set_digest == read_stage_record(ws, rev, "chunks").data_version
        assert sem.representation_set_digest == read_stage_record(ws, rev, "representations").data_version
        # the vectors stored in the bundle are exactly the embeddings version the run produced
        assert bundle.manifest.material.embeddings_digest == read_stage_record(ws, rev, "embeddings").data_version
        # chunk → document and representation → chunk lineage inside the bundle
        docs = {d.document_id for d in read_snapshot_documents(bundle.path / "documents.parquet")}
        chunks = read_chunks(bundle.path / "chunks.parquet")
        assert {c.document_id for c in chunks} == docs
        chunk_ids = {c.chunk_id for c in chunks}
        assert {r.chunk_id for r in read_representations(bundle.path / "representations.parquet")} == chunk_ids


def test_up_to_date_is_what_the_instance_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Build state has one source of truth, the Dagster instance: a fresh instance over a built
    workspace has built nothing, so its first build runs (and records every stage from the versions
    already published: nothing is embedded again); the next one is up to date."""
    ws = Workspace(tmp_path / "ragpipe")
    monkeypatch.setenv("RAGPIPE_HOME", str(ws.home))
    register_revision(ws.registry, "hb", write_tree(tmp_path / "hb", HANDBOOK), "markdown", "public")
    summaries = []
    for name in ("first", "fresh"):
        (tmp_path / name).mkdir()
        instance = DagsterInstance.local_temp(str(tmp_path / name))
        summaries.append(materialize_revision("hb", ws, instance=instance))
    again = materialize_revision("hb", ws, instance=instance)
    instance.dispose()
    first, fresh = summaries
    assert (first.up_to_date, first.cache_hits) == (False, 0) and first.embedded > 0
    assert (fresh.up_to_date, fresh.embedded, fresh.cache_hits) == (False, 0, first.embedded)
    assert fresh.run_id is not None and fresh.run_id != first.run_id
    assert (again.up_to_date, again.run_id, again.embedded) == (True, None, 0)
    assert fresh.bundle_id == first.bundle_id == again.bundle_id
    assert again.release_id == fresh.release_id  # the summary names the release the instance recorded last


def test_declared_deps_are_what_each_asset_reads():
    graph = build_definitions(load_pipeline_spec()).resolve_asset_graph()
    assert {a: sorted(k.to_user_string() for k in graph.get(AssetKey(a)).parent_keys) for a in UPSTREAM} == UPSTREAM
    check = graph.get(AssetCheckKey(AssetKey("chunks"), "chunks_match_source"))
    assert sorted(k.to_user_string() for k in check.parent_entity_keys) == ["chunks", "source_snapshot"]


def test_rerun_identical_revision_is_a_cheap_no_op(sample_build):
    ws, instance, spec, summaries = sample_build
    runs_before = len(instance.get_run_records())
    again = materialize_revision("scifact-2", ws, instance=instance, spec=spec)
    assert again.up_to_date and again.run_id is None and again.launched is None
    assert (again.bundle_id, again.bundle_path, again.embedded) == (
        summaries["scifact-2"].bundle_id,
        summaries["scifact-2"].bundle_path,
        0,
    )
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
    assert stale_status(instance, changed, "scifact-2") == {
        "source_snapshot": "FRESH",
        **dict.fromkeys(ASSETS[1:], "STALE"),
    }


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


# ---- failures are reported by their root cause; concurrent builds end cleanly ---------------------


def cli(*args: str, home: Path) -> subprocess.Popen:
    env = {**os.environ, "RAGPIPE_HOME": str(home / "ragpipe"), "DAGSTER_HOME": str(home / "dagster")}
    return subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "ragpipe"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def error_block(stderr: str) -> str:
    """What the CLI itself printed: from its ``error:`` line to the end (progress lines come before)."""
    return stderr[("\n" + stderr).rindex("\nerror: ") :]


def test_a_stage_failure_is_reported_by_its_root_cause(tmp_path: Path):
    """chunks fails on an upstream built under another spec: the message is the StageError's text,
    not Dagster's "Error occurred while executing op" wrapper."""
    spec = load_pipeline_spec()
    ws = Workspace(tmp_path / "ragpipe")
    register_revision(ws.registry, "hb", write_tree(tmp_path / "hb", HANDBOOK), "markdown", "public")
    other = with_changes(spec, snapshot={"min_text_chars": 5})
    steps.run_source_snapshot(ws, "hb", other)
    job = build_definitions(spec, home=str(ws.home)).resolve_job_def("build_revision")
    with DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("corpus_revisions", ["hb"])
        result = job.execute_in_process(
            partition_key="hb", instance=instance, asset_selection=[AssetKey("chunks")], raise_on_error=False
        )
    assert not result.success
    assert failure_messages(result.all_events) == [
        f"chunks: source_snapshot for revision 'hb' was built with spec {other.spec_ids['source_snapshot']}, the current "
        f"pipeline spec expects {spec.spec_ids['source_snapshot']}: re-materialize source_snapshot first"
    ]


def test_cli_build_prints_the_failed_checks_description(tmp_path: Path):
    """An existing chunks version whose file was corrupted after publication is reused by the run
    (same data version); the blocking check catches it and the CLI prints what it found."""
    spec = load_pipeline_spec()
    corpus = write_tree(tmp_path / "hb", HANDBOOK)
    ws = Workspace(tmp_path / "ragpipe")
    register_revision(ws.registry, "hb", corpus, "markdown", "public")
    steps.run_source_snapshot(ws, "hb", spec)
    steps.run_chunks(ws, "hb", spec)
    path = read_output(ws, "hb", "chunks").path / "chunks.parquet"
    chunks = read_chunks(path)
    bad = chunks[0]
    write_chunks(path, [bad.model_copy(update={"text": bad.text.upper()}), *chunks[1:]])
    proc = cli("build", str(corpus), "--revision", "hb", "--default-scope", "public", "--json", home=tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1 and out == ""
    assert err.startswith("error: ")  # --json: no progress lines, no Dagster event stream
    run_id = re.search(r"failed \(run ([0-9a-f-]{36})\)", err).group(1)
    assert error_block(err) == (
        f"error: build of revision 'hb' failed (run {run_id}):\n"
        f"check chunks_match_source on chunks failed: 2 problem(s) in {len(chunks)} chunks: chunk {bad.chunk_id} "
        f"(document {bad.document_id}, ordinal 0): text differs from document bytes [{bad.byte_start}, {bad.byte_end}) "
        "(and 1 more)\n"
    )


def test_two_cli_builds_of_one_revision_at_once(tmp_path: Path):
    """Fresh RAGPIPE_HOME and DAGSTER_HOME: one build builds, the other waits and reports the same
    bundle as up to date; no traceback."""
    procs = [
        cli(
            "build",
            str(SAMPLE / "rev-1.jsonl"),
            "--revision",
            "s1",
            "--default-scope",
            "public",
            "--json",
            home=tmp_path,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in results]
    assert not any("Traceback" in err for _, err in results)
    summaries = sorted((json.loads(out) for out, _ in results), key=lambda s: s["up_to_date"])
    built, waited = summaries
    assert (built["up_to_date"], waited["up_to_date"]) == (False, True)
    assert built["run_id"] is not None and waited["run_id"] is None
    assert (waited["bundle_id"], waited["bundle_path"]) == (built["bundle_id"], built["bundle_path"])
    assert (built["documents"], built["chunks"], built["representations"]) == (300, 492, 984)
    open_bundle(Path(built["bundle_path"]))


# A barrier after the imports (which take seconds under load), over pipes: each child says
# "ready" on stdout, then blocks reading stdin until the parent, having read both, writes "go".
OPEN_INSTANCE = """
import sys
from ragpipe.orchestration.materialize import _ensure_partition, dagster_instance
print("ready", flush=True)
assert sys.stdin.readline() == "go\\n"
_ensure_partition(dagster_instance(), "r1")
"""


def test_two_processes_open_a_fresh_instance_and_add_one_partition_at_once(tmp_path: Path):
    """Without the instance lock this failed with 'table ... already exists' or an IntegrityError
    on dynamic_partitions in most trials."""
    for trial in range(4):
        home = tmp_path / f"dagster-{trial}"
        env = {**os.environ, "DAGSTER_HOME": str(home)}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", OPEN_INSTANCE],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            for _ in range(2)
        ]
        assert [p.stdout.readline() for p in procs] == ["ready\n", "ready\n"]  # blocks; "" if one died
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        errors = [p.communicate(timeout=120)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errors]
        with DagsterInstance.from_config(str(home)) as instance:
            assert instance.get_dynamic_partitions("corpus_revisions") == ["r1"]


def test_a_sigkilled_build_is_reaped_by_the_next_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """SIGKILL a real ``ragpipe build`` (its whole process group) once its run is STARTED and tagged
    with its worker: the next build of the revision marks that run failed naming the process, frees
    what it held, and builds."""
    import signal

    from dagster import DagsterRunStatus, RunsFilter

    from ragpipe.orchestration.materialize import dagster_instance

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join((SAMPLE / "rev-1.jsonl").read_text().splitlines(keepends=True)[:30]))
    env = {**os.environ, "RAGPIPE_HOME": str(tmp_path / "ragpipe"), "DAGSTER_HOME": str(tmp_path / "dagster")}
    command = [
        str(REPO / ".venv" / "bin" / "ragpipe"),
        "build",
        str(corpus),
        "--revision",
        "k1",
        "--default-scope",
        "public",
    ]
    first = subprocess.Popen(
        command, env=env, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    run = None
    while run is None:  # each progress line the build prints is a moment to look: never a timer
        line = first.stderr.readline()
        assert line, f"the build ended before its run was recorded: {first.communicate()}"
        with dagster_instance() as instance:  # under the instance lock: never racing its creation
            records = instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.STARTED]), limit=1)
            if records and "ragpipe/worker" in records[0].dagster_run.tags:
                run = records[0].dagster_run
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    assert first.returncode == -signal.SIGKILL
    second = subprocess.run([*command, "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads(second.stdout)
    assert summary["revision"] == "k1" and summary["run_id"] != run.run_id
    with DagsterInstance.from_config(str(tmp_path / "dagster")) as instance:
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
        (failure,) = instance.all_logs(run.run_id, of_type=DagsterEventType.RUN_FAILURE)
        pid = int(run.tags["ragpipe/worker"].rsplit(":", 2)[1])
        assert failure.message.startswith(f"process {pid} on ") and failure.message.endswith(
            "which executed this run, ended without finishing it"
        )
