"""``RAGPIPE_EXECUTOR`` picks the executor of every job the code location defines (the build job,
the UI's asset job and backfills); a value it cannot use stops loading with one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInvalidConfigError, validate_run_config

from ragpipe.defs import build_definitions
from ragpipe.defs.executors import K8S_ENV, K8S_SECRET
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages.configuration import ConfigurationError, check_configuration
from ragpipe_tests.support.paths import REPO

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


def test_the_kubernetes_instance_is_the_celery_one_plus_a_k8s_run_launcher(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """``deploy/dagster-k8s.yaml``: Dagster's instance schema accepts it, its run launcher block
    resolves against dagster-k8s's schema with the variables set (and is refused without one), and
    it hands step pods every variable the k8s executor copies and the Secret its credentials are in."""
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster_k8s import K8sRunLauncher

    instance = yaml.safe_load((REPO / "deploy" / "dagster-k8s.yaml").read_text(encoding="utf-8"))
    launcher = instance.pop("run_launcher")
    assert instance == yaml.safe_load((REPO / "deploy" / "dagster-celery.yaml").read_text(encoding="utf-8"))
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    pg = {"DAGSTER_PG_HOST": "pg", "DAGSTER_PG_PORT": "5432", "DAGSTER_PG_DB": "dagster", "DAGSTER_PG_USERNAME": "u"}
    for name, value in {**K8S, **pg, "DAGSTER_PG_PASSWORD": ""}.items():
        monkeypatch.setenv(name, value)
    shutil.copyfile(REPO / "deploy" / "dagster-k8s.yaml", tmp_path / "dagster.yaml")
    dagster_instance_config(str(tmp_path))  # raises on a schema error
    resolved = process_config(K8sRunLauncher.config_type(), launcher["config"])
    assert resolved.success, resolved.errors
    assert (resolved.value["job_image"], resolved.value["job_namespace"]) == (
        K8S["RAGPIPE_K8S_IMAGE"],
        K8S["RAGPIPE_K8S_NAMESPACE"],
    )
    assert set(K8S_ENV) <= set(launcher["config"]["env_vars"]) and launcher["config"]["env_secrets"] == [K8S_SECRET]
    monkeypatch.delenv("RAGPIPE_K8S_IMAGE")
    assert not process_config(K8sRunLauncher.config_type(), launcher["config"]).success
