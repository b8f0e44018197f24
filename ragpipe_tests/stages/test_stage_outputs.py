"""Content-addressed stage outputs: immutable version folders, an atomic latest pointer, lineage checks,
SIGKILL at every publication step, and racing materializations with a concurrent reader."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragpipe.chunking.models import chunk_set_digest, read_chunks, write_chunks
from ragpipe.corpus.models import corpus_digest
from ragpipe.corpus.registry import register_revision
from ragpipe.corpus.snapshot import read_snapshot
from ragpipe.index.lexical import lexical_doc_count
from ragpipe.kernel.workspace import Workspace
from ragpipe.representations.derive import read_representations, representation_set_digest
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.stages.stage_store import (
    POINTER,
    STAGE_PUBLISH_STEPS,
    STAGE_RECORD,
    StageError,
    StageRecord,
    publish_output,
    read_output,
    version_name,
)
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import HANDBOOK, write_tree

STAGES = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]
EARLY = [steps.run_source_snapshot, steps.run_chunks, steps.run_representations]


def with_changes(spec: PipelineSpec, **sections) -> PipelineSpec:
    data = spec.model_dump(by_alias=True)
    for name, changes in sections.items():
        data[name] = {**data[name], **changes}
    return PipelineSpec.model_validate(data)


def entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def pointer(ws: Workspace, stage: str, revision: str = "hb") -> StageRecord:
    return StageRecord.model_validate_json((ws.stage_dir(revision, stage) / POINTER).read_bytes())


def early_workspace(home: Path, corpus: Path, spec: PipelineSpec) -> Workspace:
    """Revision 'hb' of the handbook through snapshot, chunks and representations (no embedder)."""
    ws = Workspace(home)
    register_revision(ws.registry, "hb", corpus, "markdown", "public")
    for run in EARLY:
        run(ws, "hb", spec)
    return ws


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("stage-outputs")
    ws, spec, _ = build_all_stages(root / "home", "hb", write_tree(root / "handbook", HANDBOOK), "markdown")
    return ws, spec


def test_each_stage_is_one_version_folder_and_a_pointer_with_lineage(full):
    ws, spec = full
    records = {stage: pointer(ws, stage) for stage in STAGES}
    for stage, record in records.items():
        folder = ws.stage_dir("hb", stage)
        assert entries(folder) == sorted([version_name(record.data_version), POINTER])
        # the version folder records the materialization that published it: the same one here
        own = StageRecord.model_validate_json((folder / version_name(record.data_version) / STAGE_RECORD).read_bytes())
        assert own == record
        assert record.spec_id == spec.spec_ids[stage]
    dv = {stage: r.data_version for stage, r in records.items()}
    assert {stage: sorted(r.inputs) for stage, r in records.items()} == {
        "source_snapshot": [],
        "chunks": ["source_snapshot"],
        "representations": ["chunks", "source_snapshot"],
        "embeddings": ["representations"],
        "lexical_index": ["representations", "source_snapshot"],
        "vector_index": ["embeddings", "representations", "source_snapshot"],
        "index_bundle": sorted(STAGES[:-1]),
    }
    for r in records.values():
        assert r.inputs == {up: dv[up] for up in r.inputs}
    out = read_output(ws, "hb", "chunks", spec)
    assert out.path == ws.stage_dir("hb", "chunks") / version_name(dv["chunks"])
    assert chunk_set_digest(read_chunks(out.path / "chunks.parquet")) == dv["chunks"]
    assert sorted(p.name for p in out.path.iterdir()) == ["chunks.parquet", STAGE_RECORD]


def test_identical_output_publishes_nothing_and_only_rewrites_the_pointer(tmp_path: Path):
    spec = load_pipeline_spec()
    ws = early_workspace(tmp_path / "home", write_tree(tmp_path / "hb", HANDBOOK), spec)
    folder = ws.stage_dir("hb", "chunks")
    before = pointer(ws, "chunks")
    inode = (folder / version_name(before.data_version)).stat().st_ino
    steps.run_chunks(ws, "hb", spec)
    assert entries(folder) == sorted([version_name(before.data_version), POINTER])
    assert (folder / version_name(before.data_version)).stat().st_ino == inode
    assert pointer(ws, "chunks") == before


def test_a_new_spec_adds_a_version_and_never_replaces_the_previous(tmp_path: Path):
    spec = load_pipeline_spec()
    ws = early_workspace(tmp_path / "home", write_tree(tmp_path / "hb", HANDBOOK), spec)
    old = read_output(ws, "hb", "chunks", spec)
    old_bytes = (old.path / "chunks.parquet").read_bytes()
    changed = with_changes(spec, chunker={"max_bytes": 800})
    steps.run_chunks(ws, "hb", changed)
    new = read_output(ws, "hb", "chunks", changed)
    assert new.data_version != old.data_version
    assert entries(ws.stage_dir("hb", "chunks")) == sorted(
        [version_name(old.data_version), version_name(new.data_version), POINTER]
    )
    assert (old.path / "chunks.parquet").read_bytes() == old_bytes  # the previous version is untouched
    with pytest.raises(StageError) as info:
        steps.run_representations(ws, "hb", spec)
    assert str(info.value) == (
        f"chunks for revision 'hb' was built with spec {changed.spec_ids['chunks']}, the current pipeline spec "
        f"expects {spec.spec_ids['chunks']}: re-materialize chunks first"
    )


def test_outputs_not_built_from_each_other_are_refused(full, tmp_path: Path):
    """``chunks`` re-published alone with other content: representations built on the previous
    chunks no longer match it, and a stage combining both refuses."""
    base, spec = full
    ws = Workspace(tmp_path / "home")
    shutil.copytree(base.home, ws.home)
    old = read_output(ws, "hb", "chunks", spec)
    fewer = read_chunks(old.path / "chunks.parquet")[:-1]
    record = old.record.model_copy(update={"data_version": chunk_set_digest(fewer), "facts": {"chunks": len(fewer)}})
    publish_output(ws, record, lambda tmp: write_chunks(tmp / "chunks.parquet", fewer))
    steps.run_lexical_index(ws, "hb", spec)  # reads snapshot + representations only: consistent
    with pytest.raises(StageError) as info:
        steps.run_index_bundle(ws, "hb", spec)
    assert str(info.value) == (
        f"representations for revision 'hb' was built from chunks {old.data_version}, but the latest chunks is "
        f"{record.data_version}: re-materialize representations first"
    )


def test_a_pointer_to_a_missing_or_foreign_version_is_refused(tmp_path: Path):
    spec = load_pipeline_spec()
    ws = early_workspace(tmp_path / "home", write_tree(tmp_path / "hb", HANDBOOK), spec)
    out = read_output(ws, "hb", "chunks")
    snap = read_output(ws, "hb", "source_snapshot")
    shutil.copy(snap.path / STAGE_RECORD, out.path / STAGE_RECORD)
    with pytest.raises(StageError) as info:
        read_output(ws, "hb", "chunks")
    assert str(info.value) == (
        f"{out.path / STAGE_RECORD}: records source_snapshot {snap.data_version} of revision 'hb', expected chunks "
        f"{out.data_version} of revision 'hb': the folder is corrupt; move it away"
    )
    shutil.rmtree(out.path)
    with pytest.raises(StageError) as info:
        read_output(ws, "hb", "chunks")
    assert str(info.value) == f"chunks for revision 'hb': version folder {out.path} is missing: re-materialize chunks"
    with pytest.raises(StageError) as info:
        read_output(ws, "../hb", "chunks")
    assert str(info.value) == (
        "invalid revision key '../hb': use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
    )


CRASH_SCRIPT = """
import os, signal, sys
from pathlib import Path
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.kernel.workspace import Workspace

data = load_pipeline_spec().model_dump(by_alias=True)
data["chunker"] = {**data["chunker"], "max_bytes": 800}
target = sys.argv[2]
def hook(step):
    if step == target:
        os.kill(os.getpid(), signal.SIGKILL)
steps.run_chunks(Workspace(Path(sys.argv[1])), "hb", PipelineSpec.model_validate(data), on_step=hook)
"""


@pytest.fixture(scope="module")
def early(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("early")
    spec = load_pipeline_spec()
    return early_workspace(root / "home", write_tree(root / "hb", HANDBOOK), spec), spec


@pytest.mark.parametrize("step", STAGE_PUBLISH_STEPS)
def test_sigkill_at_every_stage_publication_step(early, tmp_path: Path, step: str):
    base, spec = early
    ws = Workspace(tmp_path / "home")
    shutil.copytree(base.home, ws.home)
    changed = with_changes(spec, chunker={"max_bytes": 800})
    v1 = version_name(pointer(ws, "chunks").data_version)
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(ws.home), step], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    folder = ws.stage_dir("hb", "chunks")
    names = entries(folder)
    temps = [n for n in names if n.startswith(".tmp-")]
    visible = [n for n in names if not n.startswith(".")]
    order = STAGE_PUBLISH_STEPS.index
    # the rerun below computes V2; before the rename only the dead publisher's temp folder exists
    if order(step) < order("renamed"):
        assert visible == sorted([v1, POINTER]) and len(temps) == 1 and (folder / temps[0]).is_dir()
    elif step == "file_temp_written":
        assert len(visible) == 3 and len(temps) == 1 and temps[0].startswith(f".tmp-{POINTER}-")
    else:
        assert len(visible) == 3 and temps == []
    # the pointer names a complete version: the previous one until the pointer's rename, then the new one
    moved = order(step) >= order("file_renamed")
    current = read_output(ws, "hb", "chunks", changed if moved else spec)
    assert chunk_set_digest(read_chunks(current.path / "chunks.parquet")) == current.data_version
    assert (version_name(current.data_version) == v1) is not moved
    # a rerun succeeds, removes the dead publisher's temp and leaves exactly both versions
    steps.run_chunks(ws, "hb", changed)
    v2 = version_name(pointer(ws, "chunks").data_version)
    assert v2 != v1
    assert entries(folder) == sorted([v1, v2, POINTER])
    assert chunk_set_digest(read_chunks(folder / v2 / "chunks.parquet")) == pointer(ws, "chunks").data_version


# ---- racing materializations of one partition, with a reader ------------------------------------


def _check_output(ws: Workspace, stage: str) -> None:
    """Read the latest output of ``stage`` completely and check it against its data version."""
    out = read_output(ws, "hb", stage)
    if stage == "source_snapshot":
        documents, summary = read_snapshot(out.path)
        assert corpus_digest(documents, summary.default_scope) == out.data_version
    elif stage == "chunks":
        assert chunk_set_digest(read_chunks(out.path / "chunks.parquet")) == out.data_version
    elif stage == "representations":
        assert representation_set_digest(read_representations(out.path / "representations.parquet")) == out.data_version
    elif stage == "lexical_index":
        assert lexical_doc_count(out.path / "index") == out.record.facts["documents"]
    else:
        assert json.loads((out.path / STAGE_RECORD).read_bytes())["data_version"] == out.data_version


def reader(home: str, stages: list[str], writers_done, writers: int) -> tuple[int, list[str]]:
    """Loop over the stages' pointers until every writer is done; (complete reads, errors).

    A stage that has never been materialized may say so; once it has been read, any error counts.
    """
    ws = Workspace(Path(home))
    seen: set[str] = set()
    reads, errors = 0, []
    while True:
        finished = writers_done.value >= writers  # read once more after the last writer finished
        for stage in stages:
            try:
                _check_output(ws, stage)
                seen.add(stage)
                reads += 1
            except StageError as exc:
                if stage in seen or "has not been materialized" not in str(exc):
                    errors.append(f"{stage}: {exc}")
            except Exception as exc:  # a torn read shows up as any error at all
                errors.append(f"{stage}: {type(exc).__name__}: {exc}")
        if finished:
            return reads, errors


def _call(results, key: str, fn, *args) -> None:
    """Process target: store ``fn(*args)`` (or the error it raised) under ``key``."""
    try:
        results[key] = ("ok", fn(*args))
    except BaseException as exc:  # reported to the test, which fails on it
        results[key] = ("error", f"{type(exc).__name__}: {exc}")
        raise


def run_concurrently(manager, ctx, tasks: dict[str, tuple]) -> dict[str, object]:
    """Run each ``key: (fn, *args)`` in its own spawned process; every one must exit cleanly."""
    results = manager.dict()
    procs = {key: ctx.Process(target=_call, args=(results, key, *task)) for key, task in tasks.items()}
    for proc in procs.values():
        proc.start()
    for proc in procs.values():
        proc.join(timeout=600)
    assert {key: proc.exitcode for key, proc in procs.items()} == dict.fromkeys(tasks, 0), dict(results)
    assert {key: results[key][0] for key in tasks} == dict.fromkeys(tasks, "ok"), dict(results)
    return {key: results[key][1] for key in tasks}


def stage_writer(home: str, barrier, writers_done, lock, iterations: int) -> list[tuple[str, str]]:
    """Materialize snapshot → chunks → representations → lexical index ``iterations`` times."""
    spec = load_pipeline_spec()
    ws = Workspace(Path(home))
    seen: list[tuple[str, str]] = []
    barrier.wait()
    try:
        for _ in range(iterations):
            for stage, run in (*zip(STAGES[:3], EARLY), ("lexical_index", steps.run_lexical_index)):
                run(ws, "hb", spec, on_step=lambda step, stage=stage: seen.append((stage, step)))
    finally:
        with lock:
            writers_done.value += 1
    return seen


def test_racing_stage_materializations_and_a_reader(tmp_path: Path):
    """Rounds on fresh workspaces: two writers race to publish every version, a third process
    reads continuously. No error, no torn read, exactly one publication per stage."""
    corpus = write_tree(tmp_path / "hb", HANDBOOK)
    stages = ["source_snapshot", "chunks", "representations", "lexical_index"]
    ctx = multiprocessing.get_context("spawn")
    iterations = 6
    with ctx.Manager() as manager:
        for round_ in range(3):
            ws = Workspace(tmp_path / f"home-{round_}")
            register_revision(ws.registry, "hb", corpus, "markdown", "public")
            barrier, done, lock = manager.Barrier(2), manager.Value("i", 0), manager.Lock()
            home = str(ws.home)
            out = run_concurrently(
                manager,
                ctx,
                {
                    "reader": (reader, home, stages, done, 2),
                    "writer-1": (stage_writer, home, barrier, done, lock, iterations),
                    "writer-2": (stage_writer, home, barrier, done, lock, iterations),
                },
            )
            reads, errors = out["reader"]
            assert errors == []
            assert reads > 0
            events = out["writer-1"] + out["writer-2"]
            for stage in stages:
                # one version folder won the race; every materialization moved the pointer
                assert events.count((stage, "renamed")) == 1, stage
                assert events.count((stage, "file_renamed")) == 2 * iterations, stage
                record = pointer(ws, stage)
                assert entries(ws.stage_dir("hb", stage)) == sorted([version_name(record.data_version), POINTER])
                _check_output(ws, stage)


def dagster_writer(home: str, barrier, writers_done, lock) -> tuple[bool, dict[str, str], list[str]]:
    """One real Dagster run of ``build_revision`` for 'hb' (own ephemeral instance, shared home):
    (success, data version per asset, step failure messages)."""
    from dagster import DagsterInstance

    from ragpipe.defs import build_definitions

    job = build_definitions(load_pipeline_spec(), home=home).resolve_job_def("build_revision")
    try:
        with DagsterInstance.ephemeral() as instance:
            instance.add_dynamic_partitions("corpus_revisions", ["hb"])
            barrier.wait()
            result = job.execute_in_process(partition_key="hb", instance=instance, raise_on_error=False)
            versions = {
                e.asset_key.to_user_string(): e.materialization.tags["dagster/data_version"]
                for e in result.get_asset_materialization_events()
            }
            failures = [
                f"{e.step_key}: {e.event_specific_data.error.message.strip()}"
                for e in result.all_events
                if e.is_step_failure
            ]
            return result.success, versions, failures
    finally:
        with lock:
            writers_done.value += 1


def test_racing_dagster_runs_of_one_partition_and_a_reader(tmp_path: Path):
    """Two real Dagster runs of the whole graph for one partition at once, a reader looping over
    every stage pointer: both runs succeed, no read fails, and each stage holds exactly one version
    folder per distinct output the runs reported."""
    ws = Workspace(tmp_path / "home")
    register_revision(ws.registry, "hb", write_tree(tmp_path / "hb", HANDBOOK), "markdown", "public")
    ctx = multiprocessing.get_context("spawn")
    home = str(ws.home)
    with ctx.Manager() as manager:
        barrier, done, lock = manager.Barrier(2), manager.Value("i", 0), manager.Lock()
        out = run_concurrently(
            manager,
            ctx,
            {
                "reader": (reader, home, STAGES, done, 2),
                "run-1": (dagster_writer, home, barrier, done, lock),
                "run-2": (dagster_writer, home, barrier, done, lock),
            },
        )
    reads, errors = out["reader"]
    runs = [out["run-1"], out["run-2"]]
    assert errors == []
    assert reads > 0
    assert [ok for ok, _, _ in runs] == [True, True], [f for _, _, f in runs]
    # the checked-in spec carries each run on through evaluation, gate and release manifest
    assert [sorted(v) for _, v, _ in runs] == [
        sorted([*STAGES, "evaluation_run", "gate_decision", "release_manifest"])
    ] * 2
    for stage in STAGES:
        reported = {version_name(v[stage]) for _, v, _ in runs}
        assert [n for n in entries(ws.stage_dir("hb", stage)) if n != POINTER] == sorted(reported), stage
        assert version_name(pointer(ws, stage).data_version) in reported
        _check_output(ws, stage)
    assert entries(ws.bundles) == sorted({version_name(v["index_bundle"]) for _, v, _ in runs})
