"""Resources: where runtime state lives. Operational only — nothing here enters an ID."""


from pathlib import Path

from dagster import ConfigurableResource

from ragpipe.stages.workspace import Workspace, default_home


class RagpipeHome(ConfigurableResource):
    """The runtime state folder; empty means ``$RAGPIPE_HOME`` or ``./var/ragpipe``."""

    home: str = ""

    @property
    def workspace(self) -> Workspace:
        return Workspace(Path(self.home).resolve() if self.home else default_home())
