"""A backfill of four revisions, evaluation → gate → release chain included, in process and on two
Celery workers that share no disk.

    python -m benchmarks.celery_backfill_bench [--out var/bench-celery] [--docs 300] [--shards 1]
        [--modes in-process,celery]

One PostgreSQL, one Redis and one moto S3 server (``ragpipe_tests/support``), then twice, each in
fresh folders under ``--out``: ``dagster-daemon`` and ``dagster-webserver`` on ``workspace.yaml``,
the four revisions registered and added as partitions, every pool's limit set (``make pools``),
and one asset backfill of all ten assets × four partitions launched through GraphQL as the UI
launches it and followed to its end.

1. **in process** — instance ``deploy/dagster-postgres.yaml``, ``RAGPIPE_EXECUTOR`` unset: each
   run executes its steps in its own process; two runs at once (the instance's run limit).
2. **celery** — instance ``deploy/dagster-celery.yaml``, ``RAGPIPE_EXECUTOR=celery``,
   ``RAGPIPE_STORE`` on the S3 server, two workers (``dagster-celery worker start``, each in a
   folder of its own); ``--shards n`` also fans the embedding step out.

The revisions are the first ``--docs`` abstracts of the sample's two revisions and the first half
of each: four partitions whose texts overlap, as successive revisions do. Reported per mode:
``work_span_s`` (first run start to last run end, the runs' own timestamps), ``steps``, the sum
of the steps' own execution (``STEP_START`` to ``STEP_SUCCESS``), and on Celery the per-step
overhead as median and maximum: queue wait (the executor submits a step's task → a worker takes
it) and start-up (a worker takes it → ``STEP_START``: a fresh process loading the code location). Prints one JSON
object. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml
from dagster import DagsterEventType, DagsterInstance

from ragpipe.corpus.registry import register_revision
from ragpipe.defs.assets import POOLS
from ragpipe.defs.release_chain import CHAIN_POOLS
from ragpipe.kernel.workspace import Workspace
from ragpipe_tests.support.celery_workers import CeleryWorker
from ragpipe_tests.support.pg_server import PostgresServer
from ragpipe_tests.support.redis_server import RedisServer
from ragpipe_tests.support.s3_server import S3Server
from ragpipe_tests.support.services import (
    launch_backfill,
    open_instance,
    start_daemon,
    start_webserver,
    wait_backfill,
    wait_daemons,
)

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "scifact-sample"
ASSETS = list(POOLS)  # the build's assets, in graph order
CHAIN = list(CHAIN_POOLS)  # evaluation → gate → release


def revisions(out: Path, docs: int) -> dict[str, Path]:
    """Four corpora: the first ``docs`` and ``docs // 2`` abstracts of each sample revision."""
    found = {}
    for sample, tag in (("rev-1.jsonl", "a"), ("rev-2.jsonl", "b")):
        lines = (SAMPLE / sample).read_text(encoding="utf-8").splitlines(keepends=True)
        for n in (docs // 2, docs):
            path = out / "corpora" / f"{tag}{n}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(lines[:n]), encoding="utf-8")
            found[f"{tag}{n}"] = path
    return found


def spec_files(out: Path) -> dict[str, str]:
    """The checked-in spec (suite path made absolute) and targets that never activate by themselves."""
    spec = yaml.safe_load((REPO / "ragpipe" / "specs" / "pipeline.yaml").read_text(encoding="utf-8"))
    spec["evaluation"]["suite"] = str(SAMPLE / "suite-stable.jsonl")
    (out / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    targets = yaml.safe_load((REPO / "ragpipe" / "specs" / "targets.yaml").read_text(encoding="utf-8"))
    for target in targets["targets"].values():
        target.update(auto_activate=False, waive_human_apply=False)
    (out / "targets.yaml").write_text(yaml.safe_dump(targets, sort_keys=False), encoding="utf-8")
    return {"RAGPIPE_PIPELINE_SPEC": str(out / "pipeline.yaml"), "RAGPIPE_TARGETS": str(out / "targets.yaml")}


def figures(instance: DagsterInstance, runs: list[dict]) -> dict[str, object]:
    """Work span, the steps' own time and, on Celery, per step: queue wait (task submitted to a
    worker taking it) and start-up (worker taking it to ``STEP_START``: a fresh process loading the
    code location)."""
    starts, ends, own, waits, startups, workers = [], [], 0.0, [], [], {}
    for run in runs:
        starts.append(run["startTime"])
        ends.append(run["endTime"])
        submitted, taken, started = {}, {}, {}
        for record in instance.get_records_for_run(run["runId"]).records:
            entry = record.event_log_entry
            kind, step = entry.dagster_event_type, entry.step_key
            if kind == DagsterEventType.STEP_START:
                started[step] = entry.timestamp
            elif kind == DagsterEventType.STEP_SUCCESS:
                own += entry.timestamp - started[step]
            elif kind == DagsterEventType.ENGINE_EVENT and "Submitting celery task" in entry.message:
                submitted.setdefault(step, entry.timestamp)
            elif kind == DagsterEventType.ENGINE_EVENT:
                # "[CeleryExecutor] Executing steps …": the worker's event is the run's, not the
                # step's; its metadata names the steps and the worker
                metadata = entry.dagster_event.event_specific_data.metadata
                if "Celery worker" in metadata:
                    taken.setdefault(metadata["step_keys"].value, entry.timestamp)
                    workers[metadata["Celery worker"].value] = workers.get(metadata["Celery worker"].value, 0) + 1
        waits += [taken[k] - t for k, t in submitted.items() if k in taken]
        startups += [started[k] - t for k, t in taken.items() if k in started]
    result: dict[str, object] = {
        "work_span_s": round(max(ends) - min(starts), 1),
        "steps_own_s": round(own, 1),
    }
    if workers:
        result["steps_per_worker"] = dict(sorted(workers.items()))
    for name, values in (("queue_wait_s", waits), ("step_startup_s", startups)):
        if values:
            result[name] = {
                "steps": len(values),
                "median": round(statistics.median(values), 2),
                "max": round(max(values), 2),
            }
    return result


def failures(instance: DagsterInstance, runs: list[dict]) -> list[str]:
    """Each failed step's error, one line each."""
    found = []
    for run in runs:
        for record in instance.get_records_for_run(run["runId"]).records:
            event = record.event_log_entry.dagster_event
            if event is not None and event.event_type == DagsterEventType.STEP_FAILURE:
                error = event.step_failure_data.error
                cause = error.cause or error
                found.append(f"{event.step_key}: {cause.cls_name}: {cause.message.strip().splitlines()[0]}")
    return found


def backfill(out: Path, env: dict[str, str], instance_yaml: str, corpora: dict[str, Path], pg: PostgresServer) -> dict:
    home = out / "dagster"
    home.mkdir(parents=True)
    shutil.copyfile(REPO / "deploy" / instance_yaml, home / "dagster.yaml")
    env = {
        **env,
        "RAGPIPE_HOME": str(out / "ragpipe"),
        "DAGSTER_PG_HOST": "127.0.0.1",
        "DAGSTER_PG_PORT": str(pg.port),
        "DAGSTER_PG_DB": pg.database,
        "DAGSTER_PG_USERNAME": pg.user,
        "DAGSTER_PG_PASSWORD": "",
    }
    saved = dict(os.environ)
    os.environ.update({**env, "DAGSTER_HOME": str(home)})
    services = []
    try:
        instance = open_instance(home)
        for pool in sorted(set(POOLS.values()) | set(CHAIN_POOLS.values())):  # make pools
            instance.event_log_storage.set_concurrency_slots(pool, 1)
        ws = Workspace(out / "ragpipe")
        for key, path in corpora.items():
            register_revision(ws.registry, key, path, "beir", "public")
        instance.add_dynamic_partitions("corpus_revisions", list(corpora))
        since = time.time()
        services.append(start_daemon(home, env))
        wait_daemons(instance, timeout=120, since=since)
        services.append(start_webserver(home, env))
        t0 = time.monotonic()
        done = wait_backfill(services[-1].url, launch_backfill(services[-1].url, list(corpora), ASSETS + CHAIN), 7200)
        submit_to_end = time.monotonic() - t0
        runs = done["runs"]
        statuses = sorted(r["status"] for r in runs)
        result = {"status": done["status"], "runs": statuses, "submit_to_end_s": round(submit_to_end, 1)}
        result.update(figures(instance, runs))
        if done["status"] != "COMPLETED_SUCCESS":  # say why, rather than report times of a failed build
            result["failures"] = failures(instance, runs)
        instance.dispose()
        return result
    finally:
        for service in reversed(services):
            service.stop()
        os.environ.clear()
        os.environ.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "var" / "bench-celery")
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--modes", default="in-process,celery", help="which of in-process,celery to run")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    corpora = revisions(args.out, args.docs)
    base = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RAGPIPE_", "DAGSTER_"))},
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        **spec_files(args.out),
    }
    pg, redis, s3 = PostgresServer.start(), RedisServer.start(), S3Server.start()
    workers: list[CeleryWorker] = []
    report: dict[str, object] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "revisions": {k: sum(1 for _ in p.open(encoding="utf-8")) for k, p in corpora.items()},
    }
    try:
        modes = args.modes.split(",")
        if "in-process" in modes:
            report["in_process"] = backfill(args.out / "in-process", base, "dagster-postgres.yaml", corpora, pg)
            pg.stop()
            pg = PostgresServer.start()  # a fresh instance: the second backfill finds nothing done
        if "celery" in modes:
            celery = {
                **base,
                **s3.env(),
                "RAGPIPE_STORE": f"s3://{s3.bucket()}/bench",
                "RAGPIPE_EXECUTOR": "celery",
                "RAGPIPE_CELERY_BROKER": redis.url(0),
                "RAGPIPE_CELERY_BACKEND": redis.url(1),
                "RAGPIPE_EMBEDDING_SHARDS": str(args.shards),
            }
            pg_env = {"DAGSTER_PG_HOST": "127.0.0.1", "DAGSTER_PG_PORT": str(pg.port), "DAGSTER_PG_DB": pg.database}
            pg_env |= {"DAGSTER_PG_USERNAME": pg.user, "DAGSTER_PG_PASSWORD": ""}
            workers += [CeleryWorker.start(name, {**celery, **pg_env}) for name in ("w1", "w2")]
            report["celery_2_workers"] = backfill(args.out / "celery", celery, "dagster-celery.yaml", corpora, pg)
    finally:
        for worker in workers:
            worker.stop()
            shutil.rmtree(worker.folder, ignore_errors=True)
        redis.stop()
        s3.stop()
        pg.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
