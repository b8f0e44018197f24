"""The private Dagster APIs of ``ragpipe.orchestration.dagster_internals``, pinned by signature."""

from __future__ import annotations

import inspect
from pathlib import Path

from dagster import DagsterInstance

from ragpipe.orchestration import launch


def test_every_private_dagster_api_resolves_with_the_parameters_it_is_called_with():
    """Every private Dagster API ragpipe uses (``dagster_internals``) exists on the pinned version,
    with the parameters it is called with: an upgrade that moves or changes one fails here."""
    from ragpipe.orchestration.dagster_internals import (
        PARTITION_NAME_TAG,
        BaseWorkspaceRequestContext,
        CodeLocation,
        InProcessCodeLocationOrigin,
        InProcessWorkspaceLoadTarget,
        SerializableErrorInfo,
        WorkspaceProcessContext,
        capture_interrupts,
        core_execute_run,
        get_daemon_statuses,
        location_origins_from_yaml_paths,
        set_defs_state_storage,
    )

    assert isinstance(CodeLocation, type) and isinstance(BaseWorkspaceRequestContext, type)
    # failures and configuration errors are read from these fields of every event's error
    assert {"message", "stack", "cls_name", "cause", "context"} <= set(SerializableErrorInfo._fields)
    assert {"instance", "workspace_load_target"} <= set(inspect.signature(WorkspaceProcessContext).parameters)

    assert PARTITION_NAME_TAG == "dagster/partition"
    assert callable(capture_interrupts) and callable(InProcessWorkspaceLoadTarget)
    assert list(inspect.signature(set_defs_state_storage).parameters) == ["storage"]
    assert {"loadable_target_origin", "location_name"} <= set(inspect.signature(InProcessCodeLocationOrigin).parameters)
    assert list(inspect.signature(location_origins_from_yaml_paths).parameters) == ["yaml_paths"]
    assert {"heartbeat_interval_seconds", "heartbeat_tolerance_seconds", "ignore_errors"} <= set(
        inspect.signature(get_daemon_statuses).parameters
    )
    assert list(inspect.signature(core_execute_run).parameters)[:4] == [
        "recon_job",
        "dagster_run",
        "instance",
        "inject_env_vars",
    ]
    create_run = inspect.signature(DagsterInstance.create_run).parameters
    assert {
        "job_name",
        "run_id",
        "run_config",
        "status",
        "tags",
        "root_run_id",
        "parent_run_id",
        "step_keys_to_execute",
        "execution_plan_snapshot",
        "job_snapshot",
        "parent_job_snapshot",
        "asset_selection",
        "asset_check_selection",
        "resolved_op_selection",
        "op_selection",
        "remote_job_origin",
        "job_code_origin",
        "asset_graph",
    } <= set(create_run)
    origin = launch.location_origin()
    assert (origin.location_name, Path(origin.loadable_target_origin.python_file).name) == ("ragpipe", "definitions.py")
