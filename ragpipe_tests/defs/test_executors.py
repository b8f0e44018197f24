"""``RAGPIPE_EXECUTOR`` picks the executor of every job the code location defines (the build job,
the UI's asset job and backfills); a value it cannot use stops loading with one line."""

from __future__ import annotations

import pytest

from ragpipe.defs import build_definitions
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages.configuration import ConfigurationError, check_configuration

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
        ({"RAGPIPE_EXECUTOR": "threads"}, "RAGPIPE_EXECUTOR: 'threads': must be one of in_process, celery"),
        (
            {**CELERY, "RAGPIPE_CELERY_BROKER": ""},
            'RAGPIPE_EXECUTOR: celery needs RAGPIPE_CELERY_BROKER (docs/operations.md, "Celery workers")',
        ),
        (
            {**CELERY, "RAGPIPE_STORE": ""},
            'RAGPIPE_EXECUTOR: celery needs RAGPIPE_STORE (docs/operations.md, "Celery workers")',
        ),
    ],
)
def test_an_executor_it_cannot_use_is_one_line(monkeypatch: pytest.MonkeyPatch, env: dict, line: str):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        check_configuration()
    assert str(info.value) == line
