"""Every private Dagster API ragpipe uses, in one place, each with the reason no public one serves.

Dagster (pinned 1.13.27 in ``pyproject.toml``) offers no public API to load a code location from
``workspace.yaml`` *in process* and execute a run of it the way ``dagster api execute_run`` does,
nor to read the daemon's heartbeats. ``ragpipe build`` needs both so that its runs are runs of the
very job the UI shows (same location name, origins and job snapshot) and so that it can tell a
queue no daemon serves from a busy one. Nothing else in ragpipe imports ``dagster._*`` or
``dagster_shared``:
``ragpipe_tests/orchestration/test_dagster_internals.py`` resolves every name below with the
parameters it is called with, so an upgrade that moves one fails there, loudly, by name.
"""

from __future__ import annotations

# Loading the code location of workspace.yaml in this process, as the webserver and daemon load it.
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.remote_representation.code_location import CodeLocation

# A code location with state-backed definitions needs the instance's state storage set while it loads.
from dagster._core.storage.defs_state.base import set_defs_state_storage

# The run tag Dagster stores a run's partition key under ("dagster/partition"): runs are looked up
# by it; the constant is not re-exported publicly.
from dagster._core.storage.tags import PARTITION_NAME_TAG
from dagster._core.workspace.context import BaseWorkspaceRequestContext, WorkspaceProcessContext
from dagster._core.workspace.load import location_origins_from_yaml_paths
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

# Whether a daemon serves the run queue: its heartbeats.
from dagster._daemon.controller import get_daemon_statuses

# Executing a created run in this process exactly as `dagster api execute_run` does.
from dagster._grpc.impl import core_execute_run
from dagster._utils.interrupts import capture_interrupts

# The type of every event's error (failures are read from it); defined outside dagster's public API.
from dagster_shared.error import SerializableErrorInfo

__all__ = [
    "PARTITION_NAME_TAG",
    "SerializableErrorInfo",
    "BaseWorkspaceRequestContext",
    "CodeLocation",
    "InProcessCodeLocationOrigin",
    "InProcessWorkspaceLoadTarget",
    "WorkspaceProcessContext",
    "capture_interrupts",
    "core_execute_run",
    "get_daemon_statuses",
    "location_origins_from_yaml_paths",
    "set_defs_state_storage",
]
