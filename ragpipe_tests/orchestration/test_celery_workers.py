"""ragpipe's build on Dagster's Celery executor, with workers that share no disk.

One module-scoped stack, every component real: PostgreSQL (the instance, ``deploy/dagster-celery
.yaml``), Redis (the broker and result backend), moto's S3 server (``RAGPIPE_STORE``), two Celery
workers started with the documented ``dagster-celery worker start`` command, each in a temporary
folder of its own that is its working directory, ``$RAGPIPE_HOME`` and ``$DAGSTER_HOME``, and the
launcher's ``dagster-daemon`` and ``dagster-webserver`` in a third folder. Worker ``w2`` runs in a
network namespace of its own, joined to this machine by a veth pair (``PrivateLink``): the services
listen on the link's host end, so everything ``w2`` exchanges crosses that link and nothing else. A UI-style asset
backfill of four revisions, through the evaluation → gate → release chain, must give the data
versions, bundle IDs, material digests, evaluation metrics and release manifests of in-process
builds of the same revisions in a home of their own.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter

from ragpipe.corpus.registry import register_revision
from ragpipe.defs.assets import POOLS
from ragpipe.defs.embedding_shards import SHARD_POOL
from ragpipe.defs.release_chain import CHAIN_POOLS
from ragpipe.kernel.workspace import Workspace
from ragpipe.orchestration.failures import failure_messages
from ragpipe.release.kept_decision import read_gate_evidence
from ragpipe.release.manifest import load_manifest
from ragpipe.release.replica import run_dir
from ragpipe.release.store import ReleaseStore
from ragpipe.stages.steps import read_stage_record
from ragpipe.storage.location import open_store
from ragpipe_tests.orchestration.test_postgres_instance import start_postgres
from ragpipe_tests.support.celery_workers import CeleryWorker
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.paths import REPO, SAMPLE
from ragpipe_tests.support.private_link import PrivateLink, private_link_here
from ragpipe_tests.support.redis_server import RedisServer, RedisUnavailable
from ragpipe_tests.support.s3_server import S3Server
from ragpipe_tests.support.services import (
    BACKFILL_DONE,
    DagsterProcess,
    launch_backfill,
    open_instance,
    start_daemon,
    start_webserver,
    wait_backfill,
    wait_daemons,
)

pytestmark = pytest.mark.slow

STAGES = list(POOLS)  # the build's assets, in graph order
CHAIN = list(CHAIN_POOLS)  # evaluation → gate → release
# blocking asset checks: steps too
CHECKS = ["chunks_chunks_match_source", "index_bundle_bundle_verifies", "evaluation_run_evaluation_ledger_verifies"]
# four revisions of 40 to 55 abstracts (each has 17 to 22 suite cases whose judged documents it holds)
BACKFILL = {"b1": ("rev-1.jsonl", 40), "b2": ("rev-1.jsonl", 55), "b3": ("rev-2.jsonl", 40), "b4": ("rev-2.jsonl", 55)}


@dataclass
class Stack:
    root: Path
    env: dict[str, str]
    workers: list[CeleryWorker]
    instance: DagsterInstance
    web: DagsterProcess
    link: PrivateLink | None  # w2's own network; None only outside CI, where it cannot be made
    no_link: str = ""  # why not


def pools_of_the_makefile() -> list[str]:
    """The pools ``make pools`` sets, which must be every pool the definitions name."""
    lines = (REPO / "Makefile").read_text().splitlines()
    (line,) = [x for x in lines if x.startswith("POOLS = ")]
    pools = line.removeprefix("POOLS = ").split()
    assert f"SHARD_POOL = {SHARD_POOL}" in lines
    assert sorted(pools) == sorted(set(POOLS.values()) | set(CHAIN_POOLS.values()))
    return [*pools, SHARD_POOL]


def start_redis(host: str) -> RedisServer:
    try:
        return RedisServer.start(host)
    except RedisUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide Redis (.ci/run installs redis-server): {exc}")
        pytest.skip(f"no redis-server on this machine: {exc}")


def small_corpus(path: Path, lines: int = 40, sample: str = "rev-1.jsonl") -> Path:
    text = (SAMPLE / sample).read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(text), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("celery")
    # The checked-in spec, its suite path made absolute; no target activates automatically, so
    # every gate is a bootstrap in both builds and nothing changes behind the test's back.
    spec = yaml.safe_load((REPO / "ragpipe" / "specs" / "pipeline.yaml").read_text(encoding="utf-8"))
    spec["evaluation"]["suite"] = str(REPO / "data" / "scifact-sample" / "suite-stable.jsonl")
    (root / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    targets = yaml.safe_load((REPO / "ragpipe" / "specs" / "targets.yaml").read_text(encoding="utf-8"))
    for target in targets["targets"].values():
        target.update(auto_activate=False, waive_human_apply=False)
    (root / "targets.yaml").write_text(yaml.safe_dump(targets, sort_keys=False), encoding="utf-8")
    launcher = root / "launcher"
    (launcher / "dagster").mkdir(parents=True)
    shutil.copyfile(REPO / "deploy" / "dagster-celery.yaml", launcher / "dagster" / "dagster.yaml")
    home = {"RAGPIPE_HOME": str(launcher / "ragpipe")}
    with ExitStack() as running, pytest.MonkeyPatch.context() as mp:  # stopped in reverse order
        link, no_link = private_link_here()
        if link is not None:
            running.callback(link.close)
        host = link.host_ip if link else "127.0.0.1"  # every service on the link's host end
        pg = start_postgres(host, link.network if link else None)
        running.callback(pg.stop)
        redis = start_redis(host)
        running.callback(redis.stop)
        s3_server = S3Server.start(host)
        running.callback(s3_server.stop)
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RAGPIPE_", "DAGSTER_"))},
            **s3_server.env(),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "RAGPIPE_PIPELINE_SPEC": str(root / "pipeline.yaml"),
            "RAGPIPE_TARGETS": str(root / "targets.yaml"),
            "RAGPIPE_STORE": f"s3://{s3_server.bucket()}/ragpipe",
            "RAGPIPE_EXECUTOR": "celery",
            "RAGPIPE_CELERY_BROKER": redis.url(0),
            "RAGPIPE_CELERY_BACKEND": redis.url(1),
            "DAGSTER_PG_HOST": host,
            "DAGSTER_PG_PORT": str(pg.port),
            "DAGSTER_PG_DB": pg.database,
            "DAGSTER_PG_USERNAME": pg.user,
            "DAGSTER_PG_PASSWORD": "",
        }
        for key, value in {**env, **home, "DAGSTER_HOME": str(launcher / "dagster")}.items():
            mp.setenv(key, value)
        instance = open_instance(launcher / "dagster")  # creates the tables before any worker races to
        running.callback(instance.dispose)
        for pool in pools_of_the_makefile():  # as `make pools` sets them: no run initialises a default
            instance.event_log_storage.set_concurrency_slots(pool, 1)
        workers = []
        for name, prefix in (("w1", None), ("w2", link.exec_prefix() if link else None)):
            workers.append(CeleryWorker.start(name, env, prefix))
            running.callback(shutil.rmtree, workers[-1].folder, ignore_errors=True)
            running.callback(workers[-1].stop)
        since = time.time()
        daemon = start_daemon(launcher / "dagster", {**env, **home})
        running.callback(daemon.stop)
        wait_daemons(instance, timeout=120, since=since)
        web = start_webserver(launcher / "dagster", {**env, **home})
        running.callback(web.stop)
        yield Stack(root, env, workers, instance, web, link, no_link)


def in_process_reference(root: Path, revision: str, corpus: Path) -> Workspace:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAGPIPE_", "DAGSTER_"))},
        "HF_HUB_OFFLINE": "1",
        "RAGPIPE_PIPELINE_SPEC": str(root / "pipeline.yaml"),
        "RAGPIPE_TARGETS": str(root / "targets.yaml"),
        "RAGPIPE_HOME": str(root / "reference" / "ragpipe"),
        "DAGSTER_HOME": str(root / "reference" / "dagster"),
    }
    args = ["build", str(corpus), "--revision", revision, "--default-scope", "public", "--json"]
    proc = run_cli(*args, env=env, inherit=False, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return Workspace(root / "reference" / "ragpipe")


def where_steps_ran(instance: DagsterInstance, run_id: str) -> dict[str, str]:
    """Step key -> the Celery worker that reported executing it (Dagster's own engine event)."""
    ran = {}
    # the run's own events only: a test polls this while the step runs, on an instance that holds
    # every earlier test's runs
    for record in instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records:
        entry = record.event_log_entry
        if not entry.dagster_event:
            continue
        metadata = entry.dagster_event.event_specific_data.metadata
        if "Celery worker" in metadata:  # "[CeleryExecutor] Executing steps <key> in celery worker"
            ran[metadata["step_keys"].value] = metadata["Celery worker"].value
    return ran


@contextmanager
def launcher_env(stack: Stack, home: Path | None = None) -> Iterator[Workspace]:
    """This process as the launcher's machine (its store, its home): for reading what runs made."""
    home = home or stack.root / "launcher" / "ragpipe"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {**stack.env, "RAGPIPE_HOME": str(home)}.items():
            mp.setenv(key, value)
        yield Workspace(home)


def release_outcome(ws: Workspace, revision: str) -> dict:
    """What a revision's chain produced, less what names one evaluation attempt: the release manifest
    without its run ID, ledger head and decision ID (each run of an evaluation is a new attempt with
    its own UUIDv7 and timestamped ledger, so no two builds — in-process ones neither — share those,
    nor the release ID that binds them), the gate's checks, and the run's metrics and case counts."""
    release_id = read_stage_record(ws, revision, "release_manifest").data_version
    manifest = load_manifest(ReleaseStore(ws), release_id).body()
    evaluation, gate = manifest.pop("evaluation"), manifest.pop("gate")
    report = json.loads((run_dir(ws, evaluation["run_id"]) / "report.json").read_bytes())
    decision = read_gate_evidence(ReleaseStore(ws), gate.pop("decision_id"))[0]
    return {
        "manifest": {**manifest, "evaluation_spec": evaluation["spec_id"], "gate": gate},
        "checks": [c.model_dump(mode="json") for c in decision.checks],
        "metrics": report["metrics"],
        "cases": (report["cases"], report["evaluated"], len(report["skipped"]), report["cells"]["failed"]),
    }


def why_failed(stack: Stack, backfill: dict) -> str:
    """The failure messages of the backfill's runs and the tails of the worker and daemon logs."""
    messages = []
    for run in backfill["runs"]:
        entries = [r.event_log_entry for r in stack.instance.get_records_for_run(run["runId"]).records]
        messages += failure_messages(e.dagster_event for e in entries if e.dagster_event is not None)
        messages += [  # the run's own engine and failure events, which name what ended a run without a step error
            f"{run['runId']}: {e.dagster_event_type}: {e.message}"
            for e in entries
            if e.dagster_event_type in (DagsterEventType.ENGINE_EVENT, DagsterEventType.RUN_FAILURE) and not e.step_key
        ][-6:]
    logs = ["".join(w.lines[-30:]) for w in stack.workers]
    return "\n".join([str(backfill["status"]), *messages, *logs])


def test_a_backfill_of_four_revisions_runs_on_both_workers_and_equals_in_process_builds(stack: Stack):
    """Four revisions registered as the watched-folder sensor registers them (source and record on
    the store; the corpus files then deleted), then an asset backfill of the whole graph launched
    as from the UI: one run per revision, each step on a Celery worker (which one is recorded by
    Dagster), and every output equal to an in-process build's."""
    with launcher_env(stack) as ws:
        for rev, (sample, lines) in BACKFILL.items():
            corpus = small_corpus(stack.root / "corpus" / f"{rev}.jsonl", lines, sample)
            register_revision(ws.registry, rev, corpus, "beir", "public")
            corpus.unlink()  # the steps can only find it in the store
    stack.instance.add_dynamic_partitions("corpus_revisions", list(BACKFILL))
    carried = stack.link.bytes_carried() if stack.link else 0
    t0 = time.monotonic()
    backfill = wait_backfill(stack.web.url, launch_backfill(stack.web.url, list(BACKFILL), STAGES + CHAIN), 2400)
    wall = time.monotonic() - t0
    assert backfill["status"] in BACKFILL_DONE and backfill["status"] != "COMPLETED_FAILED", why_failed(stack, backfill)
    assert sorted((r["jobName"], r["status"]) for r in backfill["runs"]) == [("__ASSET_JOB", "SUCCESS")] * 4
    ran = {r["runId"]: where_steps_ran(stack.instance, r["runId"]) for r in backfill["runs"]}
    for steps in ran.values():
        assert sorted(steps) == sorted(STAGES + CHAIN + CHECKS)
    per_worker = Counter(worker for steps in ran.values() for worker in steps.values())
    assert set(per_worker) == {f"w1@{os.uname().nodename}", f"w2@{os.uname().nodename}"}, per_worker
    carried = stack.link.bytes_carried() - carried if stack.link else 0
    print(f"backfill of {len(BACKFILL)} revisions on Celery: {wall:.1f} s; steps per worker: {dict(per_worker)}")
    print(f"w2's private link carried {carried:,} bytes during the backfill")

    references = {}
    for rev, (sample, lines) in BACKFILL.items():
        corpus = small_corpus(stack.root / "reference-corpus" / f"{rev}.jsonl", lines, sample)
        references[rev] = in_process_reference(stack.root, rev, corpus)
    for rev in BACKFILL:
        reference = references[rev]
        expected = {stage: read_stage_record(reference, rev, stage).data_version for stage in STAGES}
        want = release_outcome(reference, rev)
        assert want["cases"][1] > 0  # the suite has cases each revision can answer
        with launcher_env(stack) as ws:
            assert {stage: read_stage_record(ws, rev, stage).data_version for stage in STAGES} == expected
            assert release_outcome(ws, rev) == want, rev
        # ... and so does a machine that took part in nothing
        with launcher_env(stack, stack.root / "empty-home") as empty:
            assert release_outcome(empty, rev) == want
    # each worker built only from what it downloaded: its home holds no registry of its own
    assert all(not Workspace(w.home).registry.exists() for w in stack.workers)


def test_w2_reaches_the_services_only_over_its_private_link(stack: Stack):
    """w2's network namespace holds its loopback and one end of a veth pair, routed to nothing but
    the link's /30; every TCP connection open in it (the worker's broker and Postgres connections)
    goes to the link's host end, where the services listen: whatever w2 runs (its steps in the
    backfill above) reaches Postgres, Redis and the store over that link and nothing else."""
    if stack.link is None:
        pytest.skip(f"no network namespace on this machine (CI makes one): {stack.no_link}")
    link = stack.link
    assert link.interfaces() == sorted(["lo", link.peer_if])
    routes = link.routes()
    assert [r for r in routes if ":" not in r] == [link.network]
    assert {r for r in routes if ":" in r} <= {"::1", "fe80::/64"}  # loopback and the link's own
    peers = link.peers()
    assert peers and set(peers) == {link.host_ip}, peers
    # the worker is alive and Dagster's runs recorded it by name (it did take steps in the backfill)
    assert stack.workers[1].process.poll() is None


def test_a_step_no_worker_takes_is_reported_as_waiting(stack: Stack):
    """The broker's database 2 has no worker: the build says the run waits (one line, and one
    engine event in the run's log) instead of hanging silently; interrupted, it publishes nothing."""
    launcher = stack.root / "launcher"
    env = {
        **stack.env,
        "RAGPIPE_HOME": str(stack.root / "launcher-2" / "ragpipe"),
        "DAGSTER_HOME": str(launcher / "dagster"),
        "RAGPIPE_CELERY_BROKER": stack.env["RAGPIPE_CELERY_BROKER"].rsplit("/", 1)[0] + "/2",
        "RAGPIPE_CELERY_BACKEND": stack.env["RAGPIPE_CELERY_BACKEND"].rsplit("/", 1)[0] + "/3",
        "RAGPIPE_CELERY_WAIT_REPORT_S": "2",
    }
    corpus = small_corpus(stack.root / "corpus" / "w1.jsonl", 10)
    args = [sys.executable, "-m", "ragpipe.cli", "build", str(corpus), "--revision", "w1", "--default-scope", "public"]
    args += ["--launch", "in-process"]  # this environment's broker, not the daemon's
    proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()], daemon=True).start()
    seen, deadline = [], time.monotonic() + 180
    while not any("no Celery worker has taken step source_snapshot" in line for line in seen):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(seen)
        try:
            seen.append(lines.get(timeout=5))
        except queue.Empty:
            continue
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) != 0
    while not lines.empty():
        seen.append(lines.get())
    assert "interrupted while source_snapshot waited for a Celery worker\n" in seen and "Traceback" not in "".join(seen)
    # the step never taken frees the pool slot it claimed: later runs are not blocked by it
    assert stack.instance.event_log_storage.get_concurrency_info("ragpipe_stage_files").claimed_slots == []
    (run,) = stack.instance.get_runs(RunsFilter(tags={"dagster/partition": "w1"}))
    assert run.status == DagsterRunStatus.FAILURE
    waits = [
        r.event_log_entry
        for r in stack.instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ENGINE_EVENT).records
        if r.event_log_entry.message.startswith("no Celery worker has taken step")
    ]
    assert [(e.step_key, e.message.split(" in ")[0]) for e in waits] == [
        ("source_snapshot", "no Celery worker has taken step source_snapshot from queue 'dagster'")
    ]
    store = open_store(stack.env["RAGPIPE_STORE"])
    assert store.list("work/w1/") == []


def worker_running(
    stack: Stack, run_id: str, step: str, deadline_s: float = 300, among: list[CeleryWorker] | None = None
) -> CeleryWorker:
    """The worker (of ``among``, default the stack's) that has started executing ``step`` of the
    run (Dagster's own engine event), waited for on the event log (bounded)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        run = stack.instance.get_run_by_id(run_id)
        assert run is not None and not run.is_finished, f"the run ended before {step} started"
        ran = where_steps_ran(stack.instance, run_id)
        if step in ran:
            found = [w for w in among or stack.workers if ran[step].startswith(f"{w.name}@")]
            assert found, f"{step} ran on {ran[step]}, none of the workers expected"
            return found[0]
        time.sleep(0.2)  # polling the event log, as ragpipe build's follower does
    raise AssertionError(f"no worker started {step} within {deadline_s} s")


def test_a_worker_process_killed_mid_step_hands_the_step_back_and_the_build_is_unchanged(stack: Stack):
    """SIGKILL of the process executing the embedding step: Celery hands the step back to the
    queue (late acknowledgement, reject on worker lost), a worker runs it again, and the build's
    data versions and bundle ID still equal an in-process build's; every output the store names
    can be read by an empty home (nothing half-written is visible)."""
    import psutil

    corpus = small_corpus(stack.root / "corpus" / "k1.jsonl", 60)
    reference = in_process_reference(stack.root, "k1", small_corpus(stack.root / "reference-corpus" / "k1.jsonl", 60))
    launcher = stack.root / "launcher"
    env = {**stack.env, "RAGPIPE_HOME": str(launcher / "ragpipe"), "DAGSTER_HOME": str(launcher / "dagster")}
    args = [sys.executable, "-m", "ragpipe.cli", "build", str(corpus), "--revision", "k1", "--default-scope", "public"]
    args += ["--launch", "in-process"]
    proc = subprocess.Popen(
        [*args, "--json"], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while not stack.instance.get_runs(RunsFilter(tags={"dagster/partition": "k1"})):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    (run,) = stack.instance.get_runs(RunsFilter(tags={"dagster/partition": "k1"}))
    victim = worker_running(stack, run.run_id, "embeddings")
    # the step runs in the worker's pool process: the leaf of its process tree
    leaves = [p for p in psutil.Process(victim.process.pid).children(recursive=True) if not p.children()]
    for leaf in leaves:
        leaf.kill()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    result = json.loads(out)
    executions = [
        r.event_log_entry
        for r in stack.instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ENGINE_EVENT).records
        if "Celery worker" in r.event_log_entry.dagster_event.event_specific_data.metadata
        and r.event_log_entry.step_key == "embeddings"
    ]
    assert len(executions) == 2  # the killed attempt and the one that finished
    for stage in STAGES:
        got = read_stage_record(Workspace(launcher / "ragpipe"), "k1", stage).data_version
        assert got == read_stage_record(reference, "k1", stage).data_version, stage
    assert result["bundle_id"] == read_stage_record(reference, "k1", "index_bundle").data_version
    with pytest.MonkeyPatch.context() as mp:
        for key, value in stack.env.items():
            mp.setenv(key, value)
        empty = Workspace(stack.root / "empty-home")
        assert [read_stage_record(empty, "k1", s).data_version for s in STAGES] == [
            read_stage_record(reference, "k1", s).data_version for s in STAGES
        ]


# a test-sized visibility timeout, swept every 2 s (kombu's default sweep is every 100 s); it
# must exceed every step these workers run, or a running step is handed out a second time
VISIBILITY_S = 90
SWEEP_S = 2


def worker_config(root: Path, **transport: int) -> Path:
    """``deploy/celery-worker.yaml`` with its broker transport options replaced."""
    config = yaml.safe_load((REPO / "deploy" / "celery-worker.yaml").read_text(encoding="utf-8"))
    config["execution"]["config"]["config_source"]["broker_transport_options"] = transport
    path = root / "celery-worker-visibility.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def executions(stack: Stack, run_id: str, step: str) -> list[tuple[str, float]]:
    """The workers that began ``step`` of the run and when, in order (Dagster's engine events)."""
    records = stack.instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records
    return [
        (entry.dagster_event.event_specific_data.metadata["Celery worker"].value, entry.timestamp)
        for entry in (r.event_log_entry for r in records)
        if entry.step_key == step and "Celery worker" in entry.dagster_event.event_specific_data.metadata
    ]


def received_at(broker_url: str, step: str) -> float:
    """When a worker received the task of ``step`` it has not acknowledged: kombu's Redis transport
    keeps each unacknowledged delivery in the ``unacked`` hash (the message, its body base64) and
    scores it by its time in the ``unacked_index`` sorted set."""
    import redis

    named = re.compile(rf"\b{re.escape(step)}\b(?![._])")  # the step's key, not a longer one
    client = redis.Redis.from_url(broker_url)
    try:
        found = []
        for tag, score in client.zrange("unacked_index", 0, -1, withscores=True):
            message = json.loads(client.hget("unacked", tag) or b"[{}]")[0]
            if named.search(base64.b64decode(message.get("body", "")).decode("utf-8", "replace")):
                found.append(score)
    finally:
        client.close()
    assert len(found) == 1, found
    return found[0]


SHARDS = {"RAGPIPE_EMBEDDING_SHARDS": "2"}  # the embedding step as two shard steps and an assembly
DEAD_WORKER_LINES = 150  # abstracts: each shard encodes for seconds, long enough to be killed mid-way


def test_a_worker_machine_that_dies_mid_shard_has_the_shard_run_elsewhere_after_the_visibility_timeout(stack: Stack):
    """The embedding step in two shards, one on each worker; every process of the worker running
    shard 0 — the CLI, Celery's main process and the pool process — killed at once, as when its
    machine dies: nothing rejects or acknowledges the shard, so it stays with the dead worker until
    the visibility timeout passes; then the surviving worker's broker sweep hands it back to the
    queue and it runs there. Shard 1 is not run again (the build resumes per shard), the assembly
    encodes nothing, and the bundle ID equals an in-process one-step build's. Two workers of their
    own on broker databases 4 and 5, with the deployed configuration but a visibility timeout of
    ``VISIBILITY_S``; the shards' pool has two slots, as ``make pools`` gives it by default."""
    broker = stack.env["RAGPIPE_CELERY_BROKER"].rsplit("/", 1)[0]
    env = {**stack.env, **SHARDS, "RAGPIPE_CELERY_BROKER": f"{broker}/4", "RAGPIPE_CELERY_BACKEND": f"{broker}/5"}
    config = worker_config(
        stack.root, visibility_timeout=VISIBILITY_S, unacked_restore_interval=SWEEP_S, unacked_restore_throttle=1
    )
    machines = [CeleryWorker.start(name, env, config=config) for name in ("m1", "m2")]
    stack.instance.event_log_storage.set_concurrency_slots(SHARD_POOL, 2)
    proc = None
    try:
        reference = in_process_reference(
            stack.root, "d1", small_corpus(stack.root / "reference-corpus" / "d1.jsonl", DEAD_WORKER_LINES)
        )
        launcher = stack.root / "launcher"
        args = [
            sys.executable,
            "-m",
            "ragpipe.cli",
            "build",
            str(small_corpus(stack.root / "corpus" / "d1.jsonl", DEAD_WORKER_LINES)),
        ]
        args += ["--revision", "d1", "--default-scope", "public", "--launch", "in-process", "--json"]
        proc = subprocess.Popen(
            args,
            env={**env, "RAGPIPE_HOME": str(launcher / "ragpipe"), "DAGSTER_HOME": str(launcher / "dagster")},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        while not stack.instance.get_runs(RunsFilter(tags={"dagster/partition": "d1"})):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        (run,) = stack.instance.get_runs(RunsFilter(tags={"dagster/partition": "d1"}))
        shard, other = "embeddings.embed_shard_00", "embeddings.embed_shard_01"
        victim = worker_running(stack, run.run_id, shard, among=machines)
        victim.kill()  # SIGKILL to its whole process group: the machine is gone
        received = received_at(f"{broker}/4", shard)
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err
        (survivor,) = [m for m in machines if m is not victim]
        host = os.uname().nodename
        (first, began), (second, again) = executions(stack, run.run_id, shard)
        assert (first, second) == (f"{victim.name}@{host}", f"{survivor.name}@{host}")
        # handed back by the timeout, not by anything the dead machine did: the survivor began no
        # sooner than the timeout after the victim received the shard, and soon after it (a sweep,
        # then a fresh pool process loading the code location)
        assert received < began and received + VISIBILITY_S <= again <= received + VISIBILITY_S + SWEEP_S + 40, (
            received,
            began,
            again,
        )
        print(
            f"dead worker's shard: began {began - received:.1f} s after it was received, again after {again - received:.1f} s"
        )
        assert [w for w, _ in executions(stack, run.run_id, other)] == [f"{survivor.name}@{host}"]
        assert len(executions(stack, run.run_id, "embeddings.assemble")) == 1
        (materialization,) = stack.instance.fetch_materializations(AssetKey("embeddings"), limit=100).records[:1]
        assert materialization.run_id == run.run_id
        meta = materialization.asset_materialization.metadata
        assert (meta["encoded"].value, meta["cache_hits"].value) == (0, meta["unique_texts"].value)
        result = json.loads(out)
        assert result["bundle_id"] == read_stage_record(reference, "d1", "index_bundle").data_version
        # the vectors of texts encoded in other batches are equal to float32 rounding, not to the bit
        # (docs/operations.md, "The embedding step in shards"): the other stages are equal exactly
        ws = Workspace(launcher / "ragpipe")
        for stage in ("source_snapshot", "chunks", "representations", "lexical_index"):
            assert (
                read_stage_record(ws, "d1", stage).data_version
                == read_stage_record(reference, "d1", stage).data_version
            )
    finally:
        stack.instance.event_log_storage.set_concurrency_slots(SHARD_POOL, 1)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        for machine in machines:
            machine.stop()
            shutil.rmtree(machine.folder, ignore_errors=True)
