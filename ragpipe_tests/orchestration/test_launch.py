"""`ragpipe build` creates runs of the UI's own job (same code location, origin and snapshot),
launches them in process or through the run queue, and cleans up after killed builds."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.events import DagsterEvent
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget
from dagster._daemon.types import DaemonHeartbeat

from ragpipe.kernel import processes
from ragpipe.kernel.workspace import Workspace
from ragpipe.orchestration import launch
from ragpipe.orchestration.materialize import materialize_revision
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.paths import REPO
from ragpipe_tests.support.services import open_instance, start_daemon, wait_daemons

TEMPLATE = REPO / "dagster.yaml"


def homes(root: Path) -> dict[str, str]:
    (root / "dagster").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(TEMPLATE, root / "dagster" / "dagster.yaml")
    return {"RAGPIPE_HOME": str(root / "ragpipe"), "DAGSTER_HOME": str(root / "dagster"), "HF_HUB_OFFLINE": "1"}


def ragpipe(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env, timeout=900)


def ui_job_snapshot_id(instance: DagsterInstance) -> str:
    """The job's snapshot as the webserver sees it: workspace.yaml loaded over gRPC."""
    with WorkspaceProcessContext(instance, WorkspaceFileTarget([str(REPO / "workspace.yaml")])) as process_context:
        location = process_context.create_request_context().get_code_location("ragpipe")
        return location.get_repository("__repository__").get_full_job("build_revision").identifying_job_snapshot_id


def test_cli_run_has_workspace_origin(tmp_path: Path):
    env = homes(tmp_path)
    corpus = write_tree(tmp_path / "hb-src", HANDBOOK)
    out = ragpipe("build", str(corpus), "--revision", "hb", "--default-scope", "public", "--json", env=env)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["launched"] == "in_process"
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        (record,) = instance.get_run_records(RunsFilter(job_name="build_revision"))
        run = record.dagster_run
        assert run.run_id == summary["run_id"] and run.status == DagsterRunStatus.SUCCESS
        assert run.remote_job_origin.location_name == "ragpipe"
        assert run.remote_job_origin.repository_origin.repository_name == "__repository__"
        # the job's Runs tab in the UI lists runs by this stored tag (derived from remote_job_origin)
        tagged = instance.get_run_ids(
            RunsFilter(job_name="build_revision", tags={".dagster/repository": "__repository__@ragpipe"})
        )
        assert tagged == [run.run_id]
        assert run.tags["dagster/partition"] == "hb"
        assert {k: run.tags[k] for k in ("ragpipe/launched_by", "ragpipe/launch", "ragpipe/host")} == {
            "ragpipe/launched_by": "cli",
            "ragpipe/launch": "in_process",
            "ragpipe/host": socket.gethostname(),
        }
        assert run.tags["ragpipe/pid"].isdigit()
        pointer = run.job_code_origin.repository_origin.code_pointer
        assert Path(pointer.python_file).resolve() == REPO / "definitions.py"
        # the same snapshot the UI loads over gRPC: "Re-execute" shows no version warning
        assert run.job_snapshot_id == ui_job_snapshot_id(instance)
        # every step ran in the CLI's own process (in_process executor), none in a process of its own
        engine = [e.message for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)]
        assert [m for m in engine if m.startswith("Executing steps")] == [
            f"Executing steps in process (pid: {run.tags['ragpipe/pid']})"
        ]
        # the process that executed the run, for the reaper: the CLI itself
        pid = int(run.tags["ragpipe/pid"])
        assert processes.parse_worker_tag(run.tags["ragpipe/worker"])[:3] == (run.run_id, processes.machine_id(), pid)


def instance_with(root: Path, coordinator: str | None = None) -> DagsterInstance:
    root.mkdir(parents=True, exist_ok=True)
    text = TEMPLATE.read_text()
    if coordinator:  # replace the run_coordinator block
        head, _, rest = text.partition("run_coordinator:")
        text = (
            head
            + f"run_coordinator:\n  module: dagster._core.run_coordinator\n  class: {coordinator}\n"
            + rest[rest.index("run_monitoring:") :]
        )
    (root / "dagster.yaml").write_text(text)
    return DagsterInstance.from_config(str(root))


def test_launch_choice(tmp_path: Path):
    with instance_with(tmp_path / "queued") as instance:
        assert launch.choose_launch(instance, "auto") == "in_process"  # no daemon has ever run
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "QUEUED_RUN_COORDINATOR", "t", []))
        assert launch.choose_launch(instance, "auto") == "queue"
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - 120, "QUEUED_RUN_COORDINATOR", "t", []))
        assert launch.choose_launch(instance, "auto") == "in_process"  # stopped more than 60 s ago
        with pytest.raises(launch.LaunchError) as refused:  # a forced queue nobody serves would hang
            launch.choose_launch(instance, "queue")
        assert str(refused.value) == (
            "launch queue: no dagster-daemon serves this instance's run queue (it needs the QueuedRunCoordinator and a "
            "QUEUED_RUN_COORDINATOR heartbeat in the last 60 s): start `dagster-daemon run -w workspace.yaml` with the "
            "same DAGSTER_HOME, or build with --launch in-process"
        )
        assert launch.choose_launch(instance, "in_process") == "in_process"
        with pytest.raises(launch.LaunchError, match=r"^launch must be one of auto, in_process, queue, not 'later'$"):
            launch.choose_launch(instance, "later")
    # an instance that does not queue runs never sends builds to a queue, whatever heartbeats say
    with instance_with(tmp_path / "default", "DefaultRunCoordinator") as instance:
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "QUEUED_RUN_COORDINATOR", "t", []))
        assert launch.choose_launch(instance, "auto") == "in_process"
        with pytest.raises(launch.LaunchError, match=r"^launch queue: no dagster-daemon serves"):
            launch.choose_launch(instance, "queue")


def test_following_a_queued_run_nobody_serves_stops_with_the_reason(tmp_path: Path):
    """The daemon stops after the CLI submitted: the follower says so instead of waiting for ever,
    and the run stays queued (nothing is lost; a daemon started later runs it)."""
    with instance_with(tmp_path / "dagster") as instance:
        instance.add_dynamic_partitions("corpus_revisions", ["hb"])
        run_id = launch.create_build_run(instance, "hb", tags=launch.cli_tags("queue"))
        instance.report_dagster_event(
            DagsterEvent(DagsterEventType.RUN_ENQUEUED.value, job_name="build_revision"), run_id=run_id
        )
        assert instance.get_run_by_id(run_id).status == DagsterRunStatus.QUEUED
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - 120, "QUEUED_RUN_COORDINATOR", "t", []))
        seen = []
        with pytest.raises(launch.LaunchError) as stopped:
            launch.follow(instance, run_id, lambda entry: seen.append(entry.dagster_event_type))
        assert str(stopped.value) == (
            f"run {run_id} is queued, but no dagster-daemon serves this instance's run queue (it needs the "
            "QueuedRunCoordinator and a QUEUED_RUN_COORDINATOR heartbeat in the last 60 s): it starts when a daemon "
            "serves the queue again (follow it in the UI), or terminate it there"
        )
        assert instance.get_run_by_id(run_id).status == DagsterRunStatus.QUEUED


def test_following_a_served_queued_run_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """While a daemon serves the queue, a queued run is waited for (not refused) until it ends."""
    import threading

    with instance_with(tmp_path / "dagster") as instance:
        instance.add_dynamic_partitions("corpus_revisions", ["hb"])
        run_id = launch.create_build_run(instance, "hb", tags=launch.cli_tags("queue"))
        instance.report_dagster_event(
            DagsterEvent(DagsterEventType.RUN_ENQUEUED.value, job_name="build_revision"), run_id=run_id
        )
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "QUEUED_RUN_COORDINATOR", "t", []))
        asked = threading.Event()
        served = launch.queue_is_served
        monkeypatch.setattr(launch, "QUEUE_CHECK_S", 0.0)

        def counting(inst):
            asked.set()
            return served(inst)

        monkeypatch.setattr(launch, "queue_is_served", counting)

        def daemon_runs_it() -> None:  # the daemon's part, once the follower has checked the queue
            asked.wait(60)
            for kind in (DagsterEventType.RUN_START, DagsterEventType.RUN_SUCCESS):
                instance.report_dagster_event(DagsterEvent(kind.value, job_name="build_revision"), run_id=run_id)

        worker = threading.Thread(target=daemon_runs_it)
        worker.start()
        status = launch.follow(instance, run_id)
        worker.join()
        assert (asked.is_set(), status) == (True, DagsterRunStatus.SUCCESS)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def started_run(instance: DagsterInstance, tags: dict[str, str], worker: str | None = None) -> str:
    """A STARTED run of ``build_revision`` whose ``ragpipe/worker`` tag is ``worker`` with
    ``{run}`` replaced by its run ID (no tag: None)."""
    run_id = launch.create_build_run(instance, "hb", tags=tags)
    instance.report_dagster_event(
        DagsterEvent(DagsterEventType.RUN_START.value, job_name="build_revision"), run_id=run_id
    )
    if worker is not None:
        instance.add_run_tags(run_id, {"ragpipe/worker": worker.replace("{run}", run_id)})
    assert instance.get_run_by_id(run_id).status == DagsterRunStatus.STARTED
    return run_id


def test_runs_of_dead_workers_are_reaped(tmp_path: Path):
    """Whoever launched it (CLI in process, the daemon for a queued build, the UI), a STARTED run
    whose worker on this machine is gone — or whose PID now belongs to another process — is marked
    failed and its pool slots freed; a run whose tag was copied from another run (re-execution), a
    live worker, a worker on another machine (even one with this host name) and a run without a
    worker or with a malformed tag are left alone."""
    machine, me = processes.machine_id(), os.getpid()
    assert machine.count("/") == 2  # host name, boot ID, PID namespace (procfs is there)
    host = socket.gethostname()
    mine = processes.process_start(me)
    with instance_with(tmp_path / "dagster") as instance:
        instance.add_dynamic_partitions("corpus_revisions", ["hb"])
        pid = dead_pid()
        killed = started_run(instance, launch.cli_tags("in_process"), f"{{run}}@{machine}:{pid}:12345")
        daemon = started_run(instance, launch.cli_tags("queue"), f"{{run}}@{machine}:{pid}:12345")
        ui = started_run(instance, {}, f"{{run}}@{machine}:{pid}:-")
        reused = started_run(instance, {}, f"{{run}}@{machine}:{me}:1")  # this PID, another process's start
        copied = started_run(instance, {}, f"{killed}@{machine}:{pid}:12345")  # inherited from its parent
        alive = started_run(instance, launch.cli_tags("in_process"), f"{{run}}@{machine}:{me}:{mine}")
        twin = started_run(instance, {}, f"{{run}}@{host}/another-boot/1:{pid}:12345")  # same host name
        malformed = started_run(instance, {}, f"{{run}}@{machine}:²:1")
        untagged = started_run(instance, launch.cli_tags("in_process"))
        storage = instance.event_log_storage
        storage.set_concurrency_slots("ragpipe_tantivy", 1)
        assert storage.claim_concurrency_slot("ragpipe_tantivy", killed, "lexical_index").is_claimed
        assert sorted(launch.reap_stale_runs(instance)) == sorted([killed, daemon, ui, reused])
        for run_id, gone in ((killed, pid), (daemon, pid), (ui, pid), (reused, me)):
            assert instance.get_run_by_id(run_id).status == DagsterRunStatus.FAILURE
            (failure,) = instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
            assert failure.message == f"process {gone} on {host}, which executed this run, ended without finishing it"
        assert storage.get_concurrency_info("ragpipe_tantivy").claimed_slots == []
        kept = (copied, alive, twin, malformed, untagged)
        assert [instance.get_run_by_id(r).status for r in kept] == [DagsterRunStatus.STARTED] * len(kept)
        assert launch.reap_stale_runs(instance) == []


def test_worker_tags_parse_strictly():
    assert processes.parse_worker_tag("r@h/b/4:12:99") == ("r", "h/b/4", 12, "99")
    assert processes.parse_worker_tag("r@h:with:colons/b/4:12:99") == ("r", "h:with:colons/b/4", 12, "99")
    for bad in (None, "", "r", "@h:1:2", "r@h:1", "r@:1:2", "r@h:x:2", "r@h:²:2", "r@h:1:", "r@h:12345678901:2"):
        assert processes.parse_worker_tag(bad) is None, bad


def test_materialize_refuses_a_workspace_other_than_ragpipe_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAGPIPE_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError) as info:
        materialize_revision("hb", Workspace(tmp_path / "elsewhere"))
    assert str(info.value) == (
        f"workspace {tmp_path / 'elsewhere'} is not $RAGPIPE_HOME ({tmp_path / 'home'}): the code location builds in "
        "$RAGPIPE_HOME, so set RAGPIPE_HOME to the workspace instead"
    )
    with pytest.raises(ValueError, match=r"^launch must be one of auto, in_process, queue, not 'soon'$"):
        materialize_revision("hb", launch="soon")


def test_queue_launch_follows_the_daemons_run(tmp_path: Path):
    """With a daemon serving the queue, `ragpipe build` submits the run, the daemon runs it in its
    own code server, and the CLI still prints every step line and the summary."""
    env = homes(tmp_path)
    corpus = write_tree(tmp_path / "hb-src", HANDBOOK)
    # the tables of the fresh SQLite home exist before the daemon and the CLI open it at once
    open_instance(tmp_path / "dagster").dispose()
    daemon = start_daemon(tmp_path / "dagster", env)
    try:
        with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            wait_daemons(instance, ("QUEUED_RUN_COORDINATOR",), timeout=120)
        out = ragpipe("build", str(corpus), "--revision", "hb", "--default-scope", "public", env=env)
    finally:
        daemon.stop()
    assert out.returncode == 0, out.stderr + daemon.log_tail()
    lines = out.stderr.splitlines()
    assert lines[0] == f"registered: revision hb from {corpus}"
    run_id = lines[1].split()[1]
    assert lines[1] == f"run {run_id} queued; waiting for the daemon to start it"
    # the checked-in spec has an evaluation section: the run carries the revision through the chain
    assert [line.split()[1] for line in lines if line.startswith("✓ ") and "check" not in line] == [
        "source_snapshot",
        "chunks",
        "representations",
        "embeddings",
        "lexical_index",
        "vector_index",
        "index_bundle",
        "evaluation_run",
        "gate_decision",
        "release_manifest",
    ]
    assert "│ launched        │ queue" in out.stdout and f"│ run_id          │ {run_id}" in out.stdout
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        run = instance.get_run_by_id(run_id)
        assert run.status == DagsterRunStatus.SUCCESS and run.tags["ragpipe/launch"] == "queue"
        types = [e.dagster_event.event_type for e in instance.all_logs(run_id) if e.dagster_event]
        # queued by the CLI, then launched by the daemon (1.13 writes no RUN_DEQUEUED event)
        assert (
            types.index(DagsterEventType.RUN_ENQUEUED)
            < types.index(DagsterEventType.RUN_STARTING)
            < types.index(DagsterEventType.RUN_START)
        )


def test_executing_a_run_in_process_keeps_the_callers_sigterm(tmp_path: Path):
    """Dagster's capture_interrupts maps SIGTERM to SIGINT's handler on exit; in a background process
    (SIGINT ignored) that made the caller immune to SIGTERM. A child started with SIGINT ignored runs
    a (failing: the revision is not registered) build run in process and must still die of SIGTERM."""
    script = (
        "import os, signal, sys\n"
        "from dagster import DagsterInstance\n"
        "from ragpipe.orchestration.launch import create_build_run, execute_build_run\n"
        "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"  # whatever the parent passed down
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "instance = DagsterInstance.local_temp(sys.argv[1])\n"
        "instance.add_dynamic_partitions('corpus_revisions', ['nope'])\n"
        "execute_build_run(instance, create_build_run(instance, 'nope'))\n"
        "print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('survived', flush=True)\n"
    )
    env = {**os.environ, "RAGPIPE_HOME": str(tmp_path / "ragpipe")}
    (tmp_path / "dagster").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "dagster")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )
    assert (done.returncode, done.stdout) == (-signal.SIGTERM, "True\n"), done.stderr[-2000:]


def test_a_stale_defs_state_storage_left_by_another_instance_does_not_break_loading(tmp_path: Path, monkeypatch):
    """`with instance:` sets Dagster's current defs-state storage; an instance entered and never
    exited (then collected) leaves it pointing at a dead weakref, and loading the location failed
    with "Attempted to resolve undefined DagsterInstance weakref" for every later run in the process."""
    import gc

    monkeypatch.setenv("RAGPIPE_HOME", str(tmp_path / "ragpipe"))
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    stale = DagsterInstance.local_temp(str(tmp_path / "old"))
    stale.__enter__()  # never exited: the context variable keeps its storage
    del stale
    gc.collect()
    instance = DagsterInstance.local_temp(str(tmp_path / "new"))
    instance.add_dynamic_partitions("corpus_revisions", ["nope"])
    run_id = launch.create_build_run(instance, "nope")
    assert instance.get_run_by_id(run_id).job_name == "build_revision"
