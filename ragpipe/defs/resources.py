"""Resources: where runtime state lives. Operational only — nothing here enters an ID."""

from pathlib import Path

from dagster import ConfigurableResource, InitResourceContext

from ragpipe.defs.executors import celery_configured
from ragpipe.kernel.processes import worker_tag
from ragpipe.kernel.workspace import Workspace, default_home


class RagpipeHome(ConfigurableResource):
    """The runtime state folder; empty means ``$RAGPIPE_HOME`` or ``./var/ragpipe``."""

    home: str = ""

    def setup_for_execution(self, context: InitResourceContext) -> None:
        # Every run that uses ragpipe — CLI, daemon worker, UI, backfill — records the process that
        # executes it: a worker killed with SIGKILL cannot report its end, and Dagster frees pool
        # slots only of finished runs, so the reaper needs to know whose death ends this run.
        # Under the Celery executor this runs in a worker's step process, which ends with its step
        # while the run goes on: recording it would let the reaper fail a healthy run.
        if context.instance is not None and context.run_id is not None and not celery_configured():
            context.instance.add_run_tags(context.run_id, worker_tag(context.run_id))

    @property
    def workspace(self) -> Workspace:
        return Workspace(Path(self.home).resolve() if self.home else default_home())
