"""ragpipe's build on Dagster's Celery executor, with workers that share no disk.

One module-scoped stack, every component real: PostgreSQL (the instance, ``deploy/dagster-celery
.yaml``), Redis (the broker and result backend), moto's S3 server (``RAGPIPE_STORE``), and two
Celery workers started with the documented ``dagster-celery worker start`` command, each in a
temporary folder of its own that is its working directory, ``$RAGPIPE_HOME`` and
``$DAGSTER_HOME``. The launcher is ``ragpipe build`` in a third folder; its corpus is deleted
once registered, so the steps can only find it in the store. The build's stage data versions and
bundle ID must equal those of an in-process build of the same corpus in a home of its own.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, EventRecordsFilter, RunsFilter

from ragpipe.kernel.workspace import Workspace
from ragpipe.stages.steps import read_stage_record
from ragpipe.storage.location import open_store
from ragpipe_tests.conftest import REPO, SAMPLE
from ragpipe_tests.orchestration.test_postgres_instance import start_postgres
from ragpipe_tests.support.celery_workers import CeleryWorker
from ragpipe_tests.support.redis_server import RedisServer, RedisUnavailable
from ragpipe_tests.support.s3_server import S3Server
from ragpipe_tests.support.services import open_instance

pytestmark = pytest.mark.slow

STAGES = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]
CHECKS = ["chunks_chunks_match_source", "index_bundle_bundle_verifies"]  # blocking asset checks: steps too


@dataclass
class Stack:
    root: Path
    env: dict[str, str]
    workers: list[CeleryWorker]
    instance: DagsterInstance


def start_redis() -> RedisServer:
    try:
        return RedisServer.start()
    except RedisUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide Redis (.ci/run installs redis-server): {exc}")
        pytest.skip(f"no redis-server on this machine: {exc}")


def small_corpus(path: Path, lines: int = 40) -> Path:
    text = (SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(text), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server):
    root = tmp_path_factory.mktemp("celery")
    pg, redis = start_postgres(), start_redis()
    spec = yaml.safe_load((REPO / "ragpipe" / "specs" / "pipeline.yaml").read_text(encoding="utf-8"))
    spec.pop("evaluation")  # the build group: the evaluation chain does not run on workers yet
    (root / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAGPIPE_", "DAGSTER_"))},
        **s3_server.env(),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "RAGPIPE_PIPELINE_SPEC": str(root / "pipeline.yaml"),
        "RAGPIPE_STORE": f"s3://{s3_server.bucket()}/ragpipe",
        "RAGPIPE_EXECUTOR": "celery",
        "RAGPIPE_CELERY_BROKER": redis.url(0),
        "RAGPIPE_CELERY_BACKEND": redis.url(1),
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(pg.port),
        "DAGSTER_PG_DB": pg.database,
        "DAGSTER_PG_USERNAME": pg.user,
        "DAGSTER_PG_PASSWORD": "",
    }
    launcher = root / "launcher"
    (launcher / "dagster").mkdir(parents=True)
    shutil.copyfile(REPO / "deploy" / "dagster-celery.yaml", launcher / "dagster" / "dagster.yaml")
    workers: list[CeleryWorker] = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            instance = open_instance(launcher / "dagster")  # creates the tables before any worker races to
            workers += [CeleryWorker.start(name, env) for name in ("w1", "w2")]
            yield Stack(root, env, workers, instance)
            instance.dispose()
    finally:
        for worker in workers:
            worker.stop()
            shutil.rmtree(worker.folder, ignore_errors=True)
        redis.stop()
        pg.stop()


def build(stack: Stack, revision: str, corpus: Path) -> dict:
    launcher = stack.root / "launcher"
    env = {**stack.env, "RAGPIPE_HOME": str(launcher / "ragpipe"), "DAGSTER_HOME": str(launcher / "dagster")}
    args = [sys.executable, "-m", "ragpipe.cli", "build", str(corpus), "--revision", revision]
    proc = subprocess.run(
        [*args, "--default-scope", "public", "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=900
    )
    assert proc.returncode == 0, proc.stderr + "\n".join("".join(w.lines[-40:]) for w in stack.workers)
    return json.loads(proc.stdout)


def in_process_reference(root: Path, revision: str, corpus: Path) -> Workspace:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAGPIPE_", "DAGSTER_"))},
        "HF_HUB_OFFLINE": "1",
        "RAGPIPE_PIPELINE_SPEC": str(root / "pipeline.yaml"),
        "RAGPIPE_HOME": str(root / "reference" / "ragpipe"),
        "DAGSTER_HOME": str(root / "reference" / "dagster"),
    }
    args = [sys.executable, "-m", "ragpipe.cli", "build", str(corpus), "--revision", revision, "--default-scope"]
    proc = subprocess.run([*args, "public", "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return Workspace(root / "reference" / "ragpipe")


def where_steps_ran(instance: DagsterInstance, run_id: str) -> dict[str, str]:
    """Step key -> the Celery worker that reported executing it (Dagster's own engine event)."""
    ran = {}
    records = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ENGINE_EVENT), limit=10_000)
    for record in records:
        entry = record.event_log_entry
        if entry.run_id != run_id or not entry.dagster_event:
            continue
        metadata = entry.dagster_event.event_specific_data.metadata
        if "Celery worker" in metadata:  # "[CeleryExecutor] Executing steps <key> in celery worker"
            ran[metadata["step_keys"].value] = metadata["Celery worker"].value
    return ran


def test_a_build_runs_its_steps_on_workers_that_share_no_disk(stack: Stack):
    corpus = small_corpus(stack.root / "corpus" / "c1.jsonl")
    reference = in_process_reference(stack.root, "c1", small_corpus(stack.root / "reference-corpus" / "c1.jsonl"))
    out = build(stack, "c1", corpus)
    assert out["launched"] == "in_process"  # the run's orchestrator; its steps went to the workers
    ran = where_steps_ran(stack.instance, out["run_id"])
    assert sorted(ran) == sorted(STAGES + CHECKS)
    assert set(ran.values()) <= {f"w1@{os.uname().nodename}", f"w2@{os.uname().nodename}"}, ran
    workers = {w.home: w for w in stack.workers}
    for stage in STAGES:
        expected = read_stage_record(reference, "c1", stage).data_version
        assert read_stage_record(Workspace(stack.root / "launcher" / "ragpipe"), "c1", stage).data_version == expected
    assert out["bundle_id"] == read_stage_record(reference, "c1", "index_bundle").data_version
    # each worker built only from what it downloaded: its home holds no registry of its own
    assert all(not Workspace(home).registry.exists() for home in workers)
    print("steps per worker:", Counter(ran.values()), ran)


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


def worker_running(stack: Stack, run_id: str, step: str, deadline_s: float = 300) -> CeleryWorker:
    """The worker that has started executing ``step`` of the run (Dagster's own engine event),
    waited for on the event log (bounded)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        run = stack.instance.get_run_by_id(run_id)
        assert run is not None and not run.is_finished, f"the run ended before {step} started"
        ran = where_steps_ran(stack.instance, run_id)
        if step in ran:
            return next(w for w in stack.workers if ran[step].startswith(f"{w.name}@"))
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
