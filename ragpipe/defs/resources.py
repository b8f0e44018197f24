"""Resources: where runtime state lives. Operational only — nothing here enters an ID."""

import os
import socket
from pathlib import Path

from dagster import ConfigurableResource, InitResourceContext

from ragpipe.stages.workspace import Workspace, default_home

WORKER = "ragpipe/worker"


def worker_tag(run_id: str) -> dict[str, str]:
    """``{ragpipe/worker: "<run id>@<host>:<pid>"}``: the process executing ``run_id``.

    The value names the run because a re-execution inherits its parent's tags: a copied tag names
    the parent, so it never vouches for (or condemns) the new run (``launch.reap_stale_runs``).
    """
    return {WORKER: f"{run_id}@{socket.gethostname()}:{os.getpid()}"}


def parse_worker_tag(value: str | None) -> tuple[str, str, int] | None:
    """(run ID, host, pid) of a ``worker_tag`` value; None when absent or malformed."""
    run_id, _, rest = (value or "").partition("@")
    host, _, pid = rest.rpartition(":")
    return (run_id, host, int(pid)) if run_id and host and pid.isdigit() else None


class RagpipeHome(ConfigurableResource):
    """The runtime state folder; empty means ``$RAGPIPE_HOME`` or ``./var/ragpipe``."""

    home: str = ""

    def setup_for_execution(self, context: InitResourceContext) -> None:
        # Every run that uses ragpipe — CLI, daemon worker, UI, backfill — records the process that
        # executes it: a worker killed with SIGKILL cannot report its end, and Dagster frees pool
        # slots only of finished runs, so the reaper needs to know whose death ends this run.
        if context.instance is not None and context.run_id is not None:
            context.instance.add_run_tags(context.run_id, worker_tag(context.run_id))

    @property
    def workspace(self) -> Workspace:
        return Workspace(Path(self.home).resolve() if self.home else default_home())
