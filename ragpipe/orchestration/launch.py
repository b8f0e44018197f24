"""Runs of ``build_revision`` from the code location ``workspace.yaml`` defines, as the UI sees it.

``ragpipe build`` loads the location ``ragpipe`` *in process* (same loadable target, same
location name, same resources as the webserver's and daemon's gRPC copy), so the runs it creates
carry ``remote_job_origin`` / ``job_code_origin`` and the same job snapshot as the UI's: they show
in the job's Runs tab and can be re-executed from the UI. A run is then either executed here
(``core_execute_run`` on the location's reconstructable job, exactly what ``dagster api
execute_run`` does) or submitted to the run queue for the daemon (which resolves the location by
name, so it runs in its own ``ragpipe`` code server).

The private Dagster APIs this needs come from ``dagster_internals.py``, which says why each is needed.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from dagster import DagsterInstance, DagsterRunStatus, EventLogEntry, RunsFilter

import ragpipe
from ragpipe.kernel.processes import WORKER, machine_id, parse_worker_tag, process_start, worker_tag
from ragpipe.kernel.settings import Settings, current_settings
from ragpipe.orchestration.dagster_internals import (
    PARTITION_NAME_TAG,
    BaseWorkspaceRequestContext,
    CodeLocation,
    InProcessCodeLocationOrigin,
    InProcessWorkspaceLoadTarget,
    WorkspaceProcessContext,
    capture_interrupts,
    core_execute_run,
    get_daemon_statuses,
    location_origins_from_yaml_paths,
    set_defs_state_storage,
)
from ragpipe.stages.configuration import ConfigurationError

if TYPE_CHECKING:
    from ragpipe.orchestration.dagster_internals import SerializableErrorInfo

LOCATION = "ragpipe"
REPOSITORY = "__repository__"
JOB = "build_revision"
LAUNCHED_BY, LAUNCH, HOST, PID = "ragpipe/launched_by", "ragpipe/launch", "ragpipe/host", "ragpipe/pid"
IN_PROCESS, QUEUE = "in_process", "queue"
LAUNCHES = ("auto", IN_PROCESS, QUEUE)
# A daemon whose last heartbeat is older than interval + tolerance (60 s) counts as stopped.
# Dagster's default tolerance (1800 s) would send builds to a queue nobody serves for 30 minutes.
HEARTBEAT_INTERVAL_S, HEARTBEAT_TOLERANCE_S = 30.0, 30.0
POLL_S = 0.5
QUEUE_CHECK_S = 5.0  # how often a follower of a still-queued run asks whether a daemon serves the queue
NO_DAEMON = (
    "no dagster-daemon serves this instance's run queue (it needs the QueuedRunCoordinator and a "
    "QUEUED_RUN_COORDINATOR heartbeat in the last 60 s)"
)

OnEntry = Callable[[EventLogEntry], None]


class LaunchError(RuntimeError):
    pass


def repo_root() -> Path:
    """The folder holding the ``ragpipe`` package (and ``workspace.yaml``, ``deploy/``).

    ``ragpipe.__file__`` is None when ``ragpipe`` was imported as a namespace package: a folder
    named ``ragpipe`` without ``__init__.py`` (say ``./ragpipe`` made by hand) shadowed the real
    package. That is refused with what to do, instead of a TypeError."""
    file = getattr(ragpipe, "__file__", None)
    if file is None:
        where = ", ".join(getattr(ragpipe, "__path__", [])) or "an unknown location"
        raise LaunchError(
            f"the ragpipe package was imported as a namespace package from {where} (a 'ragpipe' folder without "
            "__init__.py shadows the installed package): run from another folder, or set RAGPIPE_DAGSTER_WORKSPACE"
        )
    return Path(file).resolve().parents[1]


def workspace_yaml(settings: Settings | None = None) -> Path:
    """``RAGPIPE_DAGSTER_WORKSPACE`` of ``settings`` (default: ``current_settings()``), else the
    ``workspace.yaml`` next to the ``ragpipe`` package."""
    path = (settings or current_settings()).dagster_workspace or repo_root() / "workspace.yaml"
    if not path.is_file():
        raise LaunchError(
            f"{path}: workspace file not found (set RAGPIPE_DAGSTER_WORKSPACE to the workspace.yaml that defines location {LOCATION!r})"
        )
    return path


def location_origin(path: Path | None = None) -> InProcessCodeLocationOrigin:
    """The in-process twin of the workspace file's ``ragpipe`` location (same loadable target)."""
    path = path or workspace_yaml()
    for origin in location_origins_from_yaml_paths([str(path)]):
        if origin.location_name == LOCATION:
            return InProcessCodeLocationOrigin(
                loadable_target_origin=origin.loadable_target_origin, location_name=LOCATION
            )  # type: ignore[attr-defined]
    raise LaunchError(f"{path}: no code location named {LOCATION!r}")


@contextmanager
def build_location(instance: DagsterInstance) -> Iterator[tuple[BaseWorkspaceRequestContext, CodeLocation]]:
    """The ``ragpipe`` location loaded in this process, with a request context for submissions.

    Loading and executing in process go through Dagster's ``capture_interrupts``, which on exit
    maps SIGTERM to SIGINT's handler; in a process started in the background SIGINT is ignored, so
    the caller would silently become immune to SIGTERM (and its multiprocessing pools could no
    longer stop their workers). The caller's SIGTERM disposition is restored on the way out."""
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        # Loading a location reads the *current* defs-state storage (a context variable that any
        # `with instance:` sets and an instance left open keeps pointing at a dead weakref); make it
        # the storage of the instance this location is loaded for.
        with ExitStack() as stack:
            stack.enter_context(set_defs_state_storage(instance.defs_state_storage))
            # Dagster warns about a load error with its whole stack trace; a configuration error is
            # raised instead as its one line (ConfigurationError), any other warning is shown as usual.
            with warnings.catch_warnings(record=True) as caught:
                process_context = stack.enter_context(
                    WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(location_origin()))
                )
            request_context = process_context.create_request_context()
            line = configuration_error_line(request_context.get_code_location_error(LOCATION))
            if line is not None:
                raise ConfigurationError(line)
            for w in caught:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
            yield request_context, request_context.get_code_location(LOCATION)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)


_CONFIGURATION_ERROR = f"{ConfigurationError.__module__}.{ConfigurationError.__qualname__}: "


def configuration_error_line(error: SerializableErrorInfo | None) -> str | None:
    """The one line of the ``ConfigurationError`` a location failed to load with (Dagster keeps it
    as the cause of its own load error), or None when it failed otherwise or loaded."""
    while error is not None:
        if error.message.startswith(_CONFIGURATION_ERROR):
            return error.message[len(_CONFIGURATION_ERROR) :].strip()
        error = error.cause
    return None


def cli_tags(launch: str) -> dict[str, str]:
    """Tags of a run the CLI creates: who started it, how, and from which process (for people; the
    reaper trusts only the ``ragpipe/worker`` tag, which names the run)."""
    return {LAUNCHED_BY: "cli", LAUNCH: launch, HOST: socket.gethostname(), PID: str(os.getpid())}


def run_config(verbose: bool) -> dict[str, object]:
    """Dagster's console logger at DEBUG with ``verbose``, else silent. The run-config logger is what
    the run uses instead of the DEBUG system logger; the event log (and the UI) keep every event."""
    return {"loggers": {"console": {"config": {"log_level": "DEBUG" if verbose else "CRITICAL"}}}}


def create_run_in(
    instance: DagsterInstance, location: CodeLocation, revision: str, tags: dict[str, str], verbose: bool
) -> str:
    """Create a NOT_STARTED run of ``build_revision`` for partition ``revision`` the way
    ``dagster job launch`` does (``dagster/_cli/job.py::_create_run``), with the location's origin."""
    repo = location.get_repository(REPOSITORY)
    job = repo.get_full_job(JOB)
    config = run_config(verbose)
    plan = location.get_execution_plan(job, config, step_keys_to_execute=None, known_state=None, instance=instance)
    run = instance.create_run(
        job_name=JOB,
        run_id=None,
        run_config=config,
        status=None,
        tags={**job.run_tags, PARTITION_NAME_TAG: revision, **tags},
        root_run_id=None,
        parent_run_id=None,
        step_keys_to_execute=plan.execution_plan_snapshot.step_keys_to_execute,
        execution_plan_snapshot=plan.execution_plan_snapshot,
        job_snapshot=job.job_snapshot,
        parent_job_snapshot=job.parent_job_snapshot,
        asset_selection=None,
        asset_check_selection=None,
        resolved_op_selection=None,
        op_selection=None,
        remote_job_origin=job.get_remote_origin(),
        job_code_origin=job.get_python_origin(),
        asset_graph=repo.asset_graph,
    )
    return run.run_id


def execute_in(
    instance: DagsterInstance, location: CodeLocation, run_id: str, on_entry: OnEntry | None = None
) -> DagsterRunStatus:
    """Execute a created run in this process; ``on_entry`` sees every event the moment it is stored.
    A load error or an interrupt is reported as the run's failure (by ``core_execute_run``)."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise LaunchError(f"run {run_id} not found")
    # this process owns the run from now on, also if it dies before the resource tags it
    instance.add_run_tags(run_id, worker_tag(run_id))
    run = instance.get_run_by_id(run_id)
    if on_entry is not None:
        instance.add_event_listener(run_id, on_entry)
    recon = location.get_reconstructable_job(REPOSITORY, JOB)  # type: ignore[attr-defined]
    try:  # the caller's SIGTERM is restored by build_location (see there)
        with capture_interrupts():
            for _ in core_execute_run(recon, run, instance, inject_env_vars=False):
                pass
    except Exception:
        pass  # core_execute_run stored the failure (with its error) before raising; the status says it
    return final_status(instance, run_id)


def submit_and_follow(
    instance: DagsterInstance, context: BaseWorkspaceRequestContext, run_id: str, on_entry: OnEntry | None = None
) -> DagsterRunStatus:
    """Hand a created run to the run queue and follow its event log until it finishes."""
    instance.submit_run(run_id, context)
    return follow(instance, run_id, on_entry)


def follow(instance: DagsterInstance, run_id: str, on_entry: OnEntry | None = None) -> DagsterRunStatus:
    """Poll a run's event log (every 0.5 s) until the run is finished, then drain it once more.

    A run still ``QUEUED`` while no daemon serves the queue (checked every 5 s) raises
    ``LaunchError`` instead of waiting for ever; the run stays queued for a daemon to start later.
    """
    cursor, next_queue_check = None, 0.0
    while True:
        run = instance.get_run_by_id(run_id)
        finished = run is None or run.is_finished
        if run is not None and run.status == DagsterRunStatus.QUEUED and time.monotonic() >= next_queue_check:
            if not queue_is_served(instance):
                raise LaunchError(
                    f"run {run_id} is queued, but {NO_DAEMON}: it starts when a daemon serves the queue again "
                    "(follow it in the UI), or terminate it there"
                )
            next_queue_check = time.monotonic() + QUEUE_CHECK_S
        connection = instance.get_records_for_run(run_id, cursor=cursor)
        cursor = connection.cursor
        for record in connection.records:
            if on_entry is not None:
                on_entry(record.event_log_entry)
        if finished and not connection.has_more:
            return final_status(instance, run_id)
        if not connection.records:
            time.sleep(POLL_S)


def final_status(instance: DagsterInstance, run_id: str) -> DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise LaunchError(f"run {run_id} disappeared from the instance")
    return run.status


def queue_is_served(instance: DagsterInstance) -> bool:
    """True when runs submitted now would be dequeued: the instance queues runs and a
    ``QUEUED_RUN_COORDINATOR`` daemon sent a heartbeat in the last 60 s."""
    status = get_daemon_statuses(
        instance,
        ["QUEUED_RUN_COORDINATOR"],
        heartbeat_interval_seconds=HEARTBEAT_INTERVAL_S,
        heartbeat_tolerance_seconds=HEARTBEAT_TOLERANCE_S,
        ignore_errors=True,
    )["QUEUED_RUN_COORDINATOR"]
    return bool(status.required and status.healthy)


def choose_launch(instance: DagsterInstance, launch: str) -> str:
    """``auto`` → ``queue`` when a daemon serves the queue, else ``in_process``; ``in_process`` is
    forced; ``queue`` is refused (``LaunchError``, before any run exists) when no daemon serves it."""
    if launch not in LAUNCHES:
        raise LaunchError(f"launch must be one of {', '.join(LAUNCHES)}, not {launch!r}")
    if launch == IN_PROCESS:
        return IN_PROCESS
    if queue_is_served(instance):
        return QUEUE
    if launch == QUEUE:
        raise LaunchError(
            f"launch queue: {NO_DAEMON}: start `dagster-daemon run -w workspace.yaml` with the same DAGSTER_HOME, "
            "or build with --launch in-process"
        )
    return IN_PROCESS


def _worker_gone(pid: int, start: str) -> bool:
    """True when the process ``pid`` that started at ``start`` no longer exists (a reused PID is
    another process). Without a recorded start time only the PID can be checked."""
    now = process_start(pid)
    if now is None:
        return not _pid_exists(pid)
    return start != "-" and now != start


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except (OverflowError, ValueError):  # no process can have this PID
        return False
    return True


def reap_stale_runs(instance: DagsterInstance) -> list[str]:
    """Mark failed the unfinished runs executed on this machine by a process that is gone, and
    free their pool slots; their run IDs.

    A run worker killed with SIGKILL (a ``ragpipe build``, a daemon-launched worker of a queued
    build, a UI materialization or a backfill) leaves its run STARTED with its slots claimed, and
    Dagster frees slots only of finished runs, so every later run of those pools would wait for
    ever. The executing process is the run's ``ragpipe/worker`` tag (``kernel.processes.worker_tag``:
    machine = host name, boot ID and PID namespace; PID and its start time), trusted only when it
    names this run and this machine; queued runs have no worker yet and are left alone. A run is
    re-read just before it is failed, so one that finished meanwhile keeps its status.
    """
    machine = machine_id()
    unfinished = instance.get_runs(
        RunsFilter(
            statuses=[
                DagsterRunStatus.NOT_STARTED,
                DagsterRunStatus.STARTING,
                DagsterRunStatus.STARTED,
                DagsterRunStatus.CANCELING,
            ]
        )
    )
    reaped = []
    for run in unfinished:
        worker = parse_worker_tag(run.tags.get(WORKER))
        if worker is None or worker[:2] != (run.run_id, machine) or not _worker_gone(worker[2], worker[3]):
            continue
        current = instance.get_run_by_id(run.run_id)
        if current is None or current.is_finished:
            continue
        host = machine.split("/", 1)[0]
        instance.report_run_failed(
            current, f"process {worker[2]} on {host}, which executed this run, ended without finishing it"
        )
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        reaped.append(run.run_id)
    return reaped


def create_build_run(
    instance: DagsterInstance, revision: str, *, tags: dict[str, str] | None = None, verbose: bool = False
) -> str:
    """A NOT_STARTED run of ``build_revision`` for ``revision`` from the workspace's location;
    its run ID. The partition must exist."""
    with build_location(instance) as (_, location):
        return create_run_in(instance, location, revision, dict(tags or {}), verbose)


def execute_build_run(instance: DagsterInstance, run_id: str, on_progress: OnEntry | None = None) -> DagsterRunStatus:
    """Execute a run made by ``create_build_run`` in this process; its final status."""
    with build_location(instance) as (_, location):
        return execute_in(instance, location, run_id, on_progress)
