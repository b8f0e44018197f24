"""Resources: where runtime state lives. Operational only — nothing here enters an ID."""

from pathlib import Path

from dagster import ConfigurableResource, InitResourceContext

from ragpipe.defs.executors import celery_configured
from ragpipe.kernel.processes import worker_tag
from ragpipe.kernel.workspace import Workspace, default_home


class RagpipeHome(ConfigurableResource):
    """The runtime state folder; empty means ``RAGPIPE_HOME`` (or ``./var/ragpipe``) of the process
    that executes the run, like every other ``RAGPIPE_*`` value there (``current_settings()``).

    Not a Dagster ``EnvVar``: every ragpipe variable is optional, an unset ``EnvVar`` fails the
    run's config, and binding one only when the variable is set would make the job's snapshot
    depend on the environment of whoever loaded the location (a CLI run would no longer carry the
    snapshot the UI shows). Reading the settings where the run executes is what an ``EnvVar``
    would do, without either problem (docs/configuration.md, "Dagster")."""

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
