"""Which executor runs the steps of ragpipe's jobs (``RAGPIPE_EXECUTOR``), chosen where the code
location loads: every job, the UI's asset job and backfills use it.

* ``in_process`` (default): a run's steps in one process — one torch import and one model load
  per run (docs/operations.md, "Scaling out").
* ``celery``: Dagster's Celery executor; each step is a Celery task that any worker listening on
  the queue may take. The broker and result backend are read at launch from
  ``RAGPIPE_CELERY_BROKER`` and ``RAGPIPE_CELERY_BACKEND`` (Dagster ``env`` config, so no URL is
  part of a job's snapshot). Workers share no disk with each other or the launcher: steps meet in
  the object store (``RAGPIPE_STORE``), Postgres and Redis (docs/operations.md, "Celery workers").
"""

from __future__ import annotations

import os
import warnings

from dagster import ExecutorDefinition, in_process_executor

from ragpipe.stages.configuration import EXECUTOR_ENV


def celery_configured() -> bool:
    return os.environ.get(EXECUTOR_ENV, "in_process") == "celery"


def executor_from_env() -> ExecutorDefinition:
    """The executor ``RAGPIPE_EXECUTOR`` names (checked by ``check_configuration`` beforehand)."""
    if not celery_configured():
        return in_process_executor
    from celery.exceptions import DuplicateTaskNameWarning
    from dagster_celery import celery_executor

    # dagster-celery registers its one task, execute_plan, again for every run it launches from a
    # process; Celery warns that the second registration is ignored, which is what it intends.
    warnings.filterwarnings("ignore", category=DuplicateTaskNameWarning, message=r"Task name 'execute_plan'")
    return celery_executor.configured(
        {"broker": {"env": "RAGPIPE_CELERY_BROKER"}, "backend": {"env": "RAGPIPE_CELERY_BACKEND"}},
        name="celery",
    )
