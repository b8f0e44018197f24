"""Resources: where runtime state lives. Operational only — nothing here enters an ID."""

from pathlib import Path

from dagster import ConfigurableResource, EnvVar, InitResourceContext

from ragpipe.defs.executors import celery_configured
from ragpipe.kernel.processes import worker_tag
from ragpipe.kernel.settings import Settings
from ragpipe.kernel.workspace import Workspace, default_home


class RagpipeHome(ConfigurableResource):
    """The settings Dagster-run code takes from the resource rather than from ``current_settings()``:
    the runtime state folder (``RAGPIPE_HOME``) and the executor (``RAGPIPE_EXECUTOR``). Empty
    means the variable's default (``./var/ragpipe``, ``in_process``); ``bound`` fills them with
    Dagster ``EnvVar``s, resolved where a run executes."""

    home: str = ""
    executor: str = ""

    @classmethod
    def bound(cls, settings: Settings, home: str = "") -> "RagpipeHome":
        """The resource for a code location loaded with ``settings``: each field a Dagster
        ``EnvVar`` of its variable when that variable is set, else empty (the default). An unset
        ``EnvVar`` fails Dagster's config check at launch, so a variable left at its default is
        never bound: it means the same default wherever the run executes. ``home`` given: that
        folder, not ``RAGPIPE_HOME``."""
        given = settings.as_environ()
        fields = {"home": "RAGPIPE_HOME", "executor": "RAGPIPE_EXECUTOR"}
        bound = {field: EnvVar(name) if name in given else "" for field, name in fields.items()}
        return cls(**{**bound, **({"home": home} if home else {})})

    def setup_for_execution(self, context: InitResourceContext) -> None:
        # Every run that uses ragpipe — CLI, daemon worker, UI, backfill — records the process that
        # executes it: a worker killed with SIGKILL cannot report its end, and Dagster frees pool
        # slots only of finished runs, so the reaper needs to know whose death ends this run.
        # Under the Celery executor this runs in a worker's step process, which ends with its step
        # while the run goes on: recording it would let the reaper fail a healthy run.
        celery = self.executor == "celery" if self.executor else celery_configured()
        if context.instance is not None and context.run_id is not None and not celery:
            context.instance.add_run_tags(context.run_id, worker_tag(context.run_id))

    @property
    def workspace(self) -> Workspace:
        return Workspace(Path(self.home).resolve() if self.home else default_home())
