"""ragpipe on a Dagster instance stored in a real PostgreSQL 15 server, operated as in production.

One module-scoped stack: a throw-away PostgreSQL server (``pg_server.py``), ``$DAGSTER_HOME`` holding
exactly ``deploy/dagster-postgres.yaml``, ``dagster-daemon`` and ``dagster-webserver`` loading
``workspace.yaml``. ``ragpipe build`` of both sample revisions goes through the queued run
coordinator, through the evaluation → gate → release chain; then a two-revision asset backfill of
the whole graph is launched through GraphQL, as from the UI. Assertions read the instance API, the
webserver's GraphQL API and the Postgres tables themselves.

Under CI (``$CI`` set) a missing PostgreSQL fails the module; elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage
from graphql import parse, validate

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.manifest import load_manifest
from ragpipe.release.store import ReleaseStore
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.paths import REPO, SAMPLE
from ragpipe_tests.support.pg_server import PostgresServer, PostgresUnavailable
from ragpipe_tests.support.services import (
    BACKFILL_DONE,
    JOB_RUNS_QUERY,
    QUERIES,
    DagsterProcess,
    graphql,
    job_selector,
    launch_backfill,
    open_instance,
    service_env,
    start_daemon,
    start_webserver,
    wait_backfill,
    wait_daemons,
)

ASSETS = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]
CHAIN = ["evaluation_run", "gate_decision", "release_manifest"]
REVISIONS = {"scifact-1": SAMPLE / "rev-1.jsonl", "scifact-2": SAMPLE / "rev-2.jsonl"}


@dataclass
class Stack:
    pg: PostgresServer
    dagster_home: Path
    ws: Workspace
    env: dict[str, str]
    instance: DagsterInstance
    daemon: DagsterProcess
    web: DagsterProcess


def start_postgres(host: str = "127.0.0.1", clients: str | None = None) -> PostgresServer:
    try:
        return PostgresServer.start(host, clients)
    except PostgresUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide PostgreSQL (.ci/run installs postgresql-15): {exc}")
        pytest.skip(f"no PostgreSQL server binaries on this machine: {exc}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("pg-instance")
    pg = start_postgres()
    home = root / "dagster"
    home.mkdir()
    shutil.copyfile(REPO / "deploy" / "dagster-postgres.yaml", home / "dagster.yaml")
    # The checked-in spec, its suite path made absolute (the copy lives elsewhere). No target's
    # activation sensor runs, so nothing is activated behind the test's back: every gate is a
    # bootstrap and the runs in the tables below are exactly the builds' and the backfill's.
    spec = yaml.safe_load((REPO / "ragpipe" / "specs" / "pipeline.yaml").read_text(encoding="utf-8"))
    spec["evaluation"]["suite"] = str(REPO / "data" / "scifact-sample" / "suite-stable.jsonl")
    (root / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    targets = yaml.safe_load((REPO / "ragpipe" / "specs" / "targets.yaml").read_text(encoding="utf-8"))
    for target in targets["targets"].values():
        target.update(auto_activate=False, waive_human_apply=False)
    (root / "targets.yaml").write_text(yaml.safe_dump(targets, sort_keys=False), encoding="utf-8")
    env = {
        "RAGPIPE_HOME": str(root / "ragpipe"),
        "RAGPIPE_PIPELINE_SPEC": str(root / "pipeline.yaml"),
        "RAGPIPE_TARGETS": str(root / "targets.yaml"),
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(pg.port),
        "DAGSTER_PG_DB": pg.database,
        "DAGSTER_PG_USERNAME": pg.user,
        "DAGSTER_PG_PASSWORD": "",  # the test server trusts local connections
    }
    started: list[DagsterProcess] = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in {**env, "DAGSTER_HOME": str(home)}.items():
                mp.setenv(key, value)
            # Create the tables once, here, before two services race to do it.
            instance = open_instance(home)
            since = time.time()
            started.append(start_daemon(home, env))
            wait_daemons(instance, timeout=120, since=since)
            started.append(start_webserver(home, env))
            yield Stack(pg, home, Workspace(root / "ragpipe"), env, instance, *started)
            instance.dispose()
    finally:
        for service in reversed(started):
            service.stop()
        pg.stop()


def ragpipe_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, env=service_env(stack.dagster_home, stack.env), inherit=False, timeout=900)


@pytest.fixture(scope="module")
def builds(stack: Stack) -> dict[str, dict]:
    """``ragpipe build --json`` of both sample revisions, in order, while the daemon is live."""
    summaries = {}
    for rev, path in REVISIONS.items():
        out = ragpipe_cli(stack, "build", str(path), "--revision", rev, "--default-scope", "public", "--json")
        assert out.returncode == 0, f"{out.stderr}\n--- daemon log ---\n{stack.daemon.log_tail(80)}"
        summaries[rev] = json.loads(out.stdout)
    return summaries


@pytest.fixture(scope="module")
def backfill(stack: Stack, builds: dict[str, dict]) -> dict:
    """A UI-style asset backfill of all 10 assets (build and chain) × both revisions, launched and
    followed through GraphQL."""
    backfill_id = launch_backfill(stack.web.url, list(REVISIONS), ASSETS + CHAIN)
    return wait_backfill(stack.web.url, backfill_id, timeout=900)


def materializations(instance: DagsterInstance, asset: str, rev: str) -> list:
    """All materializations of ``asset`` for partition ``rev``, oldest first."""
    return list(
        reversed(
            instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[rev]), limit=100
            ).records
        )
    )


def test_graphql_texts_are_valid_for_the_installed_dagster_graphql():
    from dagster_graphql.schema import create_schema

    schema = create_schema().graphql_schema
    assert {name: [e.message for e in validate(schema, parse(text))] for name, text in QUERIES.items()} == {
        name: [] for name in QUERIES
    }


def test_postgres_yaml_is_the_default_instance_plus_storage():
    pg_cfg = yaml.safe_load((REPO / "deploy" / "dagster-postgres.yaml").read_text())
    default = yaml.safe_load((REPO / "dagster.yaml").read_text())
    assert list(pg_cfg.pop("storage")) == ["postgres"]
    assert pg_cfg == default


def test_celery_yaml_is_the_postgres_instance_plus_compute_logs():
    celery_cfg = yaml.safe_load((REPO / "deploy" / "dagster-celery.yaml").read_text())
    assert celery_cfg.pop("compute_logs") == {
        "module": "dagster._core.storage.noop_compute_log_manager",
        "class": "NoOpComputeLogManager",
    }
    assert celery_cfg == yaml.safe_load((REPO / "deploy" / "dagster-postgres.yaml").read_text())


def test_instance_storage_is_postgres(stack: Stack, builds):
    inst = stack.instance
    assert type(inst.run_storage) is PostgresRunStorage
    assert type(inst.event_log_storage) is PostgresEventLogStorage
    assert type(inst.schedule_storage) is PostgresScheduleStorage
    # Nothing fell back to SQLite under $DAGSTER_HOME, even after builds.
    assert not (stack.dagster_home / "history" / "runs.db").exists()
    assert sorted(p.name for p in stack.dagster_home.rglob("*.db")) == []


def test_cli_builds_go_through_the_queue(stack: Stack, builds):
    inst = stack.instance
    assert [s["launched"] for s in builds.values()] == ["queue", "queue"]
    assert builds["scifact-1"]["embedded"] == 984 and builds["scifact-2"]["embedded"] == 146
    # Through the chain; with no active release both gates are bootstraps, and both pass.
    assert [(s["eligible"], s["decisive_phase"], s["release_id"] is not None) for s in builds.values()] == [
        (True, None, True)
    ] * 2
    for rev, summary in builds.items():
        run = inst.get_run_by_id(summary["run_id"])
        assert (run.job_name, run.status) == ("build_revision", DagsterRunStatus.SUCCESS)
        assert run.remote_job_origin.location_name == "ragpipe"
        assert run.tags["dagster/partition"] == rev
        assert (run.tags["ragpipe/launched_by"], run.tags["ragpipe/launch"]) == ("cli", "queue")
        entries = [e for e in inst.all_logs(run.run_id) if e.is_dagster_event]
        kinds = [e.dagster_event.event_type for e in entries]
        # Enqueued by the CLI, dequeued by the daemon (which reports RUN_STARTING as it launches the
        # run), executed by a run worker: a process other than the CLI that waited for it.
        run_events = [k for k in kinds if k.value.startswith("PIPELINE_")]
        assert run_events == [
            DagsterEventType.RUN_ENQUEUED,
            DagsterEventType.RUN_STARTING,
            DagsterEventType.RUN_START,
            DagsterEventType.RUN_SUCCESS,
        ]
        (started,) = [e for e in entries if e.dagster_event.event_type == DagsterEventType.RUN_START]
        assert started.dagster_event.pid != int(run.tags["ragpipe/pid"])
        # the run worker (not the CLI) recorded itself as the process the reaper watches
        assert run.tags["ragpipe/worker"].startswith(f"{run.run_id}@")
        assert run.tags["ragpipe/worker"].rsplit(":", 2)[1] == str(started.dagster_event.pid)
        assert DagsterEventType.STEP_FAILURE not in kinds
    # The job's Runs tab filters on this storage-only tag, which Dagster adds to runs with a remote origin.
    tagged = inst.get_run_records(
        RunsFilter(tags={".dagster/repository": "__repository__@ragpipe", "ragpipe/launched_by": "cli"})
    )
    assert sorted(r.dagster_run.run_id for r in tagged) == sorted(s["run_id"] for s in builds.values())


def test_job_runs_tab_lists_the_cli_runs(stack: Stack, builds):
    job = graphql(stack.web.url, JOB_RUNS_QUERY, {"selector": job_selector()})["pipelineOrError"]
    assert job["__typename"] == "Pipeline"
    runs = {r["runId"]: r for r in job["runs"]}
    assert set(runs) == {s["run_id"] for s in builds.values()}
    for run in runs.values():
        assert run["status"] == "SUCCESS"
        # Same snapshot as the job the UI shows: "Re-execute" raises no "different version" warning.
        assert run["pipelineSnapshotId"] == job["pipelineSnapshotId"]


def test_versions_in_postgres_match_the_stage_records_and_the_spec(stack: Stack, builds):
    spec = load_pipeline_spec()
    for rev, summary in builds.items():
        for asset in ASSETS:
            (rec,) = materializations(stack.instance, asset, rev)
            tags = rec.asset_materialization.tags
            assert rec.run_id == summary["run_id"]
            assert tags["dagster/code_version"] == spec.spec_ids[asset]
            assert tags["dagster/data_version"] == read_stage_record(stack.ws, rev, asset, spec).data_version
        assert read_stage_record(stack.ws, rev, "index_bundle", spec).data_version == summary["bundle_id"]


def test_asset_backfill_of_both_revisions(stack: Stack, builds, backfill):
    assert backfill["status"] in BACKFILL_DONE and backfill["status"] != "COMPLETED_FAILED", backfill
    assert (backfill["isAssetBackfill"], backfill["numPartitions"]) == (True, 2)
    runs = backfill["runs"]
    # BackfillPolicy.multi_run(1): one run per revision, each an __ASSET_JOB run tagged with the backfill.
    assert sorted((r["jobName"], r["status"]) for r in runs) == [("__ASSET_JOB", "SUCCESS")] * 2
    tags = [{t["key"]: t["value"] for t in r["tags"]} for r in runs]
    assert all(t["dagster/backfill"] == backfill["id"] for t in tags)
    # A policy-driven run names its partitions as a range, here of exactly one revision.
    ranges = [(t["dagster/asset_partition_range_start"], t["dagster/asset_partition_range_end"]) for t in tags]
    assert sorted(ranges) == [(rev, rev) for rev in sorted(REVISIONS)]
    by_partition = {start: r["runId"] for (start, _), r in zip(ranges, runs, strict=True)}
    for rev, summary in builds.items():
        for asset in ASSETS:
            first, second = materializations(stack.instance, asset, rev)
            assert (first.run_id, second.run_id) == (summary["run_id"], by_partition[rev])
            # Same inputs, same specs: every data version (bundle ID included) is unchanged.
            assert (
                second.asset_materialization.tags["dagster/data_version"]
                == first.asset_materialization.tags["dagster/data_version"]
            )
        (_, last_bundle) = materializations(stack.instance, "index_bundle", rev)
        assert last_bundle.asset_materialization.tags["dagster/data_version"] == summary["bundle_id"]
        # The chain ran in the same run: a new evaluation run (an attempt of the same spec), gated
        # (bootstrap: nothing is active) and released — a new release binding the new run.
        (_, ev), (_, gate), (_, release) = (materializations(stack.instance, a, rev) for a in CHAIN)
        assert {ev.run_id, gate.run_id, release.run_id} == {by_partition[rev]}
        run_id = ev.asset_materialization.metadata["run_id"].value
        manifest = load_manifest(ReleaseStore(stack.ws), release.asset_materialization.tags["dagster/data_version"])
        assert (manifest.revision, manifest.bundle_id, manifest.evaluation.run_id) == (
            rev,
            summary["bundle_id"],
            run_id,
        )
        assert run_id != load_manifest(ReleaseStore(stack.ws), summary["release_id"]).evaluation.run_id
        assert manifest.gate.decision_id == gate.asset_materialization.tags["dagster/data_version"]
        assert (manifest.gate.eligible, manifest.comparison_id) == (True, None)


def test_rows_in_postgres(stack: Stack, builds, backfill):
    with psycopg2.connect(stack.pg.url) as conn, conn.cursor() as cur:
        cur.execute(
            "select pipeline_name, status, count(*) from runs group by pipeline_name, status order by pipeline_name"
        )
        every_run = cur.fetchall()
        # The build's runs only: jobs of other groups (release activation, …) may run on their own sensors.
        build_runs = [row for row in every_run if row[0] in ("__ASSET_JOB", "build_revision")]
        assert build_runs == [("__ASSET_JOB", "SUCCESS", 2), ("build_revision", "SUCCESS", 2)], every_run
        cur.execute(
            "select asset_key, partition, count(*) from event_logs where dagster_event_type = 'ASSET_MATERIALIZATION' "
            "and asset_key = any(%s) group by asset_key, partition order by asset_key, partition",
            ([json.dumps([a]) for a in ASSETS + CHAIN],),
        )
        assert cur.fetchall() == [
            (json.dumps([a]), rev, 2) for a in sorted(ASSETS + CHAIN) for rev in sorted(REVISIONS)
        ]
        cur.execute("select partitions_def_name, partition from dynamic_partitions order by partition")
        assert cur.fetchall() == [("corpus_revisions", rev) for rev in sorted(REVISIONS)]
        cur.execute("select count(*) from bulk_actions")
        assert cur.fetchone() == (1,)
    conn.close()
