"""What a UI backfill of the two sample revisions costs next to ``ragpipe build`` of the same work.

    python -m benchmarks.ui_backfill_bench [--out var/bench-ui] [--rev1 PATH --rev2 PATH]

Two measurements, each in fresh ``RAGPIPE_HOME``/``DAGSTER_HOME`` folders under ``--out`` (wiped
first) with ``dagster.yaml`` as the instance:

1. **CLI** — no daemon running: ``ragpipe build --json`` of revision 1, then revision 2, each a
   fresh process; wall clock per command (registration, Dagster run, publication, verification).
2. **UI** — ``dagster-daemon`` and ``dagster-webserver`` on the same ``workspace.yaml``; both
   revisions registered and added as partitions (GraphQL, as the UI's "Add partition"), then one
   asset backfill of all 7 build assets × both partitions launched through GraphQL and followed
   until it is finished. Reported:
   * ``work_span_s`` — first backfill run's start to last run's end (the runs' own timestamps):
     the figure compared with the CLI total (target ≤ 1.3×);
   * ``submit_to_end_s`` — launch to last run end, which adds the backfill daemon's loop (it
     looks for new backfills every 30 s) and the run queue's dequeue interval: latency, not work.

Both paths do the same work, the build graph only: both run under a copy of the pipeline spec
without its ``evaluation:`` section (``RAGPIPE_PIPELINE_SPEC``), so ``ragpipe build`` stops at the
bundle like the backfill of the 7 build assets, and no activation sensor changes what a later gate
sees. Revision 1 embeds every text, revision 2 only the texts revision 1
did not have (whichever of the two backfill runs reaches the embeddings pool first embeds the most).
Prints one JSON object. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

from ragpipe.corpus.registry import register_revision
from ragpipe.kernel.workspace import Workspace
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.support.services import (
    add_partition,
    launch_backfill,
    open_instance,
    start_daemon,
    start_webserver,
    wait_backfill,
    wait_daemons,
)

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "scifact-sample"
ASSETS = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]


def fresh_homes(root: Path) -> tuple[Path, Path]:
    """(ragpipe home, dagster home with dagster.yaml) under an emptied ``root``, plus
    ``root/pipeline.yaml``: the checked-in spec without its evaluation section."""
    shutil.rmtree(root, ignore_errors=True)
    dagster_home = root / "dagster"
    dagster_home.mkdir(parents=True)
    shutil.copyfile(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    spec = yaml.safe_load((REPO / "ragpipe" / "specs" / "pipeline.yaml").read_text(encoding="utf-8"))
    spec.pop("evaluation", None)
    (root / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return root / "ragpipe", dagster_home


def cli_baseline(root: Path, revisions: dict[str, Path]) -> dict:
    ragpipe_home, dagster_home = fresh_homes(root)
    env = {
        **os.environ,
        "RAGPIPE_HOME": str(ragpipe_home),
        "DAGSTER_HOME": str(dagster_home),
        "HF_HUB_OFFLINE": "1",
        "RAGPIPE_PIPELINE_SPEC": str(root / "pipeline.yaml"),
    }
    builds = {}
    for rev, path in revisions.items():
        t0 = time.perf_counter()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "ragpipe.cli",
                "build",
                str(path),
                "--revision",
                rev,
                "--default-scope",
                "public",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        seconds = time.perf_counter() - t0
        if out.returncode != 0:
            raise SystemExit(f"ragpipe build {rev} failed ({out.returncode}):\n{out.stderr}")
        summary = json.loads(out.stdout)
        builds[rev] = {
            "seconds": round(seconds, 2),
            "launched": summary.get("launched"),
            "embedded": summary["embedded"],
            "bundle_id": summary["bundle_id"],
        }
    return {"builds": builds, "total_s": round(sum(b["seconds"] for b in builds.values()), 2)}


def ui_backfill(root: Path, revisions: dict[str, Path]) -> dict:
    ragpipe_home, dagster_home = fresh_homes(root)
    env = {"RAGPIPE_HOME": str(ragpipe_home), "RAGPIPE_PIPELINE_SPEC": str(root / "pipeline.yaml")}
    ws = Workspace(ragpipe_home)
    for rev, path in revisions.items():
        register_revision(ws.registry, rev, path, "beir", "public")
    instance = open_instance(dagster_home)  # creates the tables before two services race to
    since = time.time()
    daemon = start_daemon(dagster_home, env)
    web = None
    try:
        wait_daemons(instance, timeout=120, since=since)
        web = start_webserver(dagster_home, env)
        for rev in revisions:
            add_partition(web.url, rev)
        submitted = time.time()
        backfill_id = launch_backfill(web.url, list(revisions), ASSETS)
        backfill = wait_backfill(web.url, backfill_id, timeout=1800)
    finally:
        if web is not None:
            web.stop()
        daemon.stop()
    runs = backfill["runs"]
    if backfill["status"] not in ("COMPLETED", "COMPLETED_SUCCESS") or any(r["status"] != "SUCCESS" for r in runs):
        raise SystemExit(f"backfill did not succeed: {json.dumps(backfill)}\n{daemon.log_tail(60)}")
    start, end = min(r["startTime"] for r in runs), max(r["endTime"] for r in runs)
    return {
        "backfill_id": backfill_id,
        "status": backfill["status"],
        "runs": sorted(
            (
                {
                    "job": r["jobName"],
                    "seconds": round(r["endTime"] - r["startTime"], 2),
                    "partition": {t["key"]: t["value"] for t in r["tags"]}.get("dagster/asset_partition_range_start"),
                }
                for r in runs
            ),
            key=lambda r: r["partition"] or "",
        ),
        "work_span_s": round(end - start, 2),
        "submit_to_first_start_s": round(start - submitted, 2),
        "submit_to_end_s": round(end - submitted, 2),
        "bundle_ids": {rev: read_stage_record(ws, rev, "index_bundle").data_version for rev in revisions},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=REPO / "var" / "bench-ui", help="folder for the fresh homes (wiped)"
    )
    parser.add_argument("--rev1", type=Path, default=SAMPLE / "rev-1.jsonl")
    parser.add_argument("--rev2", type=Path, default=SAMPLE / "rev-2.jsonl")
    args = parser.parse_args(argv)
    revisions = {"scifact-1": args.rev1.resolve(), "scifact-2": args.rev2.resolve()}
    out = args.out.resolve()  # DAGSTER_HOME must be absolute
    cli = cli_baseline(out / "cli", revisions)
    ui = ui_backfill(out / "ui", revisions)
    print(
        json.dumps(
            {
                "command": "python -m benchmarks.ui_backfill_bench "
                + " ".join(argv if argv is not None else sys.argv[1:]),
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "cli": cli,
                "ui": ui,
                "same_bundle_ids": ui["bundle_ids"] == {rev: b["bundle_id"] for rev, b in cli["builds"].items()},
                "work_span_over_cli": round(ui["work_span_s"] / cli["total_s"], 3),
                "submit_to_end_over_cli": round(ui["submit_to_end_s"] / cli["total_s"], 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
