"""Start and stop Dagster's long-running services (webserver, daemon) and talk to the webserver's GraphQL API.

Used by the tests that operate ragpipe the way a Dagster user does (UI checks, Postgres instance,
backfills) and by the UI backfill benchmark. Both services load the same code location as the UI
and ``ragpipe build``: the repository's ``workspace.yaml`` (location ``ragpipe``), or
``$RAGPIPE_DAGSTER_WORKSPACE`` (``ragpipe.orchestration.launch.workspace_yaml``).

Each service runs in its own session (process group), which also holds the gRPC code server and
the run workers it starts, so ``DagsterProcess.stop`` ends all of them and nothing else.
Output goes to ``<home>/<name>.log`` so a failing start can say why.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from dagster import DagsterInstance
from dagster._daemon.controller import get_daemon_statuses

from ragpipe.orchestration.launch import LOCATION, REPOSITORY, workspace_yaml
from ragpipe_tests.support.graphql_texts import (
    ADD_PARTITION_MUTATION,
    ASSET_GRAPH_QUERY,
    BACKFILL_MUTATION,
    BACKFILL_STATUS_QUERY,
    INSTANCE_QUERY,
    JOB_RUNS_QUERY,
    LOCATION_QUERY,
    QUERIES,
    REPOSITORY_QUERY,
)

__all__ = [  # the GraphQL texts are re-exported: callers import everything from here
    "ADD_PARTITION_MUTATION",
    "ASSET_GRAPH_QUERY",
    "BACKFILL_DONE",
    "BACKFILL_MUTATION",
    "BACKFILL_STATUS_QUERY",
    "DEFAULT_DAEMONS",
    "INSTANCE_QUERY",
    "JOB_RUNS_QUERY",
    "LOCATION",
    "LOCATION_QUERY",
    "QUERIES",
    "REPOSITORY",
    "REPOSITORY_QUERY",
    "DagsterProcess",
    "ServiceError",
    "add_partition",
    "free_port",
    "graphql",
    "job_selector",
    "launch_backfill",
    "open_instance",
    "repository_selector",
    "service_env",
    "start_daemon",
    "start_webserver",
    "wait_backfill",
    "wait_daemons",
    "wait_location_loaded",
]

# Statuses after which a backfill starts no more runs (BulkActionStatus).
BACKFILL_DONE = frozenset({"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"})
DEFAULT_DAEMONS = ("QUEUED_RUN_COORDINATOR", "SENSOR", "BACKFILL")


class ServiceError(RuntimeError):
    """A service did not start, stopped early, or a GraphQL call returned errors."""


def open_instance(home: Path) -> DagsterInstance:
    """The instance ``home/dagster.yaml`` configures (``env:`` sources in it are read from this process's environment).

    Opening it creates the run, event-log and schedule tables of a fresh home. Call it *before*
    starting services there: two processes creating a fresh SQLite instance's tables at once leave
    it broken ("more than one head present").
    """
    instance = DagsterInstance.from_config(str(home))
    instance.get_runs(limit=1)
    instance.get_dynamic_partitions("corpus_revisions")
    instance.all_instigator_state()
    return instance


def _executable(name: str) -> str:
    # The console scripts installed next to this interpreter: the same venv, whatever PATH says.
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    raise ServiceError(
        f"{name} not found next to {sys.executable}; install dagster-webserver/dagster into this environment"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class DagsterProcess:
    """One service process (and its process group). ``url`` is set for the webserver."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    url: str | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the process group, wait up to ``timeout`` s, then SIGKILL it. Returns the exit code."""
        try:
            if self.alive():
                _signal_group(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    _signal_group(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
            # Children (run workers, the code server) may outlive a cleanly exiting leader.
            _signal_group(self.proc.pid, signal.SIGKILL)
        finally:
            if self._log is not None:
                self._log.close()
        return self.proc.returncode

    def __enter__(self) -> DagsterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def service_env(home: Path, env: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus ``env``, with ``DAGSTER_HOME=home`` and offline Hugging Face."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", **env, "DAGSTER_HOME": str(home)}


def _spawn(name: str, argv: list[str], home: Path, env: Mapping[str, str]) -> DagsterProcess:
    if not (home / "dagster.yaml").is_file():
        raise ServiceError(f"{home / 'dagster.yaml'} is missing: copy dagster.yaml there (make dagster-home)")
    log_path = home / f"{name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - closed by DagsterProcess.stop
    proc = subprocess.Popen(
        argv,
        cwd=home,
        env=service_env(home, env),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return DagsterProcess(name=name, proc=proc, log_path=log_path, _log=log)


def start_webserver(
    home: Path, env: Mapping[str, str], port: int | None = None, timeout: float = 120
) -> DagsterProcess:
    """Start ``dagster-webserver`` on 127.0.0.1 for instance ``home`` and wait until location ``ragpipe`` is loaded.

    ``env`` is added to this process's environment (e.g. ``RAGPIPE_HOME``, ``DAGSTER_PG_URL``).
    Raises ``ServiceError`` with the log's tail if it exits or is not ready within ``timeout`` s.
    """
    port = port or free_port()
    argv = [_executable("dagster-webserver"), "-h", "127.0.0.1", "-p", str(port), "-w", str(workspace_yaml())]
    service = _spawn("webserver", argv, home, env)
    service.url = f"http://127.0.0.1:{port}"
    try:
        _wait_http_ok(service, f"{service.url}/server_info", timeout)
        wait_location_loaded(service.url, LOCATION, timeout)
    except BaseException:
        service.stop()
        raise
    return service


def start_daemon(home: Path, env: Mapping[str, str]) -> DagsterProcess:
    """Start ``dagster-daemon run`` for instance ``home``; use ``wait_daemons`` to know when it is working."""
    return _spawn("daemon", [_executable("dagster-daemon"), "run", "-w", str(workspace_yaml())], home, env)


def _wait_http_ok(service: DagsterProcess, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise ServiceError(f"{service.name} exited with {service.proc.returncode}:\n{service.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise ServiceError(f"{service.name} not answering {url} after {timeout:.0f} s:\n{service.log_tail()}")


def graphql(url: str, query: str, variables: Mapping[str, object] | None = None, timeout: float = 120) -> dict:
    """POST ``query`` to ``<url>/graphql`` and return ``data``; raise ``ServiceError`` if the response has ``errors``."""
    body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
    req = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        raise ServiceError(f"GraphQL HTTP {err.code}: {err.read().decode(errors='replace')[:2000]}") from err
    if payload.get("errors"):
        raise ServiceError(f"GraphQL errors: {json.dumps(payload['errors'])[:2000]}")
    return payload["data"]


def wait_location_loaded(url: str, name: str = LOCATION, timeout: float = 120) -> None:
    """Wait until the webserver reports location ``name`` LOADED as a repository location.

    A location that loads with an error fails at once with its Python error message.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        entry = graphql(url, LOCATION_QUERY, {"name": name})["workspaceLocationEntryOrError"]
        last = entry
        if entry and entry["__typename"] == "WorkspaceLocationEntry" and entry["loadStatus"] == "LOADED":
            loaded = entry["locationOrLoadError"]
            if loaded["__typename"] == "RepositoryLocation":
                return
            raise ServiceError(f"location {name} failed to load: {loaded.get('message', loaded)}")
        time.sleep(0.5)
    raise ServiceError(f"location {name} not loaded after {timeout:.0f} s: {last}")


def wait_daemons(
    instance: DagsterInstance, types: Iterable[str] = DEFAULT_DAEMONS, timeout: float = 60, since: float | None = None
) -> None:
    """Wait until each daemon in ``types`` has a heartbeat younger than 60 s (and newer than ``since``, a Unix time).

    A type the instance does not require (e.g. QUEUED_RUN_COORDINATOR without the queued run
    coordinator) is an error, since it would never beat.
    """
    types = tuple(types)
    deadline = time.monotonic() + timeout
    while True:
        # Interval + tolerance of 30 s each: the default tolerance (1800 s) would call a stopped daemon alive.
        statuses = get_daemon_statuses(
            instance, types, heartbeat_interval_seconds=30, heartbeat_tolerance_seconds=30, ignore_errors=True
        )
        unrequired = [t for t in types if not statuses[t].required]
        if unrequired:
            raise ServiceError(f"daemons not required by this instance: {unrequired} (check dagster.yaml)")
        waiting = [
            t
            for t in types
            if not statuses[t].healthy or (since is not None and statuses[t].last_heartbeat.timestamp < since)
        ]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise ServiceError(f"no recent heartbeat after {timeout:.0f} s from daemons: {waiting}")
        time.sleep(0.5)


def launch_backfill(url: str, partitions: list[str], asset_keys: list[str]) -> str:
    """Launch an asset backfill of ``asset_keys`` × ``partitions``; return its id (``ServiceError`` otherwise)."""
    params = {"partitionNames": partitions, "assetSelection": [{"path": [k]} for k in asset_keys]}
    result = graphql(url, BACKFILL_MUTATION, {"params": params})["launchPartitionBackfill"]
    if result["__typename"] != "LaunchBackfillSuccess":
        raise ServiceError(f"backfill not launched: {result['__typename']}: {result.get('message')}")
    return result["backfillId"]


def wait_backfill(url: str, backfill_id: str, timeout: float = 600) -> dict:
    """Poll until the backfill's status is final and none of its runs is unfinished; return the ``PartitionBackfill``."""
    deadline = time.monotonic() + timeout
    unfinished_runs = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "MANAGED", "CANCELING"}
    while True:
        found = graphql(url, BACKFILL_STATUS_QUERY, {"id": backfill_id})["partitionBackfillOrError"]
        if found["__typename"] != "PartitionBackfill":
            raise ServiceError(f"backfill {backfill_id}: {found['__typename']}: {found.get('message')}")
        if found["status"] in BACKFILL_DONE and not any(r["status"] in unfinished_runs for r in found["runs"]):
            return found
        if time.monotonic() > deadline:
            raise ServiceError(f"backfill {backfill_id} not finished after {timeout:.0f} s: {found['status']}")
        time.sleep(1)


def add_partition(url: str, key: str, partitions_def: str = "corpus_revisions") -> None:
    """Add ``key`` to the dynamic partitions ``partitions_def`` as the UI's "Add partition" does (idempotent)."""
    variables = {"selector": repository_selector(), "name": partitions_def, "key": key}
    result = graphql(url, ADD_PARTITION_MUTATION, variables)["addDynamicPartition"]
    if result["__typename"] not in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"):
        raise ServiceError(f"partition {key} not added: {result['__typename']}: {result.get('message')}")


def job_selector(job: str = "build_revision") -> dict[str, str]:
    """``PipelineSelector`` variables for ``JOB_RUNS_QUERY``."""
    return {"pipelineName": job, "repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}


def repository_selector() -> dict[str, str]:
    """``RepositorySelector`` variables for ``REPOSITORY_QUERY``."""
    return {"repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}
