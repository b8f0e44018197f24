"""``RAGPIPE_EXECUTOR`` picks the executor of every job the code location defines (the build job,
the UI's asset job and backfills); a value it cannot use stops loading with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInvalidConfigError, validate_run_config

from ragpipe.defs import build_definitions
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages.configuration import ConfigurationError, check_configuration
from ragpipe_tests.conftest import REPO

CELERY = {
    "RAGPIPE_EXECUTOR": "celery",
    "RAGPIPE_CELERY_BROKER": "redis://127.0.0.1:1/0",
    "RAGPIPE_CELERY_BACKEND": "redis://127.0.0.1:1/1",
    "RAGPIPE_STORE": "/srv/store",
}


def test_celery_runs_every_job_of_the_location(monkeypatch: pytest.MonkeyPatch):
    for name, value in CELERY.items():
        monkeypatch.setenv(name, value)
    defs = build_definitions(load_pipeline_spec())
    assert defs.resolve_job_def("build_revision").executor_def.name == "celery"
    assert defs.resolve_implicit_global_asset_job_def().executor_def.name == "celery"


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"RAGPIPE_EXECUTOR": "threads"}, "RAGPIPE_EXECUTOR: 'threads': must be one of in_process, celery, k8s"),
        (
            {**CELERY, "RAGPIPE_CELERY_BROKER": ""},
            'RAGPIPE_EXECUTOR: celery needs RAGPIPE_CELERY_BROKER (docs/operations.md, "Scaling out")',
        ),
        (
            {**CELERY, "RAGPIPE_STORE": ""},
            'RAGPIPE_EXECUTOR: celery needs RAGPIPE_STORE (docs/operations.md, "Scaling out")',
        ),
    ],
)
def test_an_executor_it_cannot_use_is_one_line(monkeypatch: pytest.MonkeyPatch, env: dict, line: str):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        check_configuration()
    assert str(info.value) == line


K8S = {
    "RAGPIPE_EXECUTOR": "k8s",
    "RAGPIPE_K8S_IMAGE": "registry.example/ragpipe:0.1.0",
    "RAGPIPE_K8S_NAMESPACE": "ragpipe",
    "RAGPIPE_STORE": "s3://ragpipe-prod/team-a",
}


def test_the_kubernetes_variant_validates_without_a_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """``dagster definitions validate`` accepts the location with the k8s executor, and the
    executor's configuration resolves against dagster-k8s's schema (validate does not check it)."""
    env = {**os.environ, **K8S, "DAGSTER_HOME": str(tmp_path)}
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name, value in K8S.items():
        monkeypatch.setenv(name, value)
    job = build_definitions(load_pipeline_spec()).resolve_job_def("build_revision")
    assert job.executor_def.name == "k8s"
    assert validate_run_config(job, {}) is not None
    monkeypatch.delenv("RAGPIPE_K8S_IMAGE")
    with pytest.raises(DagsterInvalidConfigError, match="RAGPIPE_K8S_IMAGE"):
        validate_run_config(job, {})
