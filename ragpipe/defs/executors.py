"""Which executor runs the steps of ragpipe's jobs (``RAGPIPE_EXECUTOR``), chosen where the code
location loads: every job, the UI's asset job and backfills use it.

* ``in_process`` (default): a run's steps in one process — one torch import and one model load
  per run (docs/operations.md, "Scaling out").
* ``celery``: Dagster's Celery executor; each step is a Celery task that any worker listening on
  the queue may take. The broker and result backend are read at launch from
  ``RAGPIPE_CELERY_BROKER`` and ``RAGPIPE_CELERY_BACKEND`` (Dagster ``env`` config, so no URL is
  part of a job's snapshot). Workers share no disk with each other or the launcher: steps meet in
  the object store (``RAGPIPE_STORE``), Postgres and Redis (docs/operations.md, "Celery workers").
  A step no worker takes within ``RAGPIPE_CELERY_WAIT_REPORT_S`` seconds (default 30) is reported
  on the run as waiting (``celery_wait``).
* ``k8s``: ``dagster_k8s.k8s_job_executor``, each step a Kubernetes Job (``k8s_executor``).
"""

from __future__ import annotations

import warnings

from dagster import Executor, ExecutorDefinition, executor, in_process_executor, multiple_process_executor_requirements

from ragpipe.defs.celery_wait import QueueWatch
from ragpipe.kernel.settings import Settings, current_settings


def celery_configured(settings: Settings | None = None) -> bool:
    """Whether ``settings`` (default: ``current_settings()``) choose the Celery executor."""
    return (settings or current_settings()).executor == "celery"


class RunInterrupted(RuntimeError):
    """The run was interrupted and nothing is left for the Celery loop to wait for."""


class WatchedExecutor(Executor):
    """Dagster's Celery executor with a ``QueueWatch`` beside its loop (``celery_wait``); every
    other attribute (``app_args``, ``retries``) is the Celery executor's own."""

    def __init__(self, inner: Executor, after_s: float):
        self.inner, self.after_s = inner, after_s

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    @property
    def retries(self):
        return self.inner.retries

    def execute(self, plan_context, execution_plan):
        with QueueWatch(plan_context.instance, plan_context.dagster_run, self.after_s) as watch:
            events, interrupted = self.inner.execute(plan_context, execution_plan), False
            for event in events:
                yield event
                if event.is_step_success or event.is_step_failure:
                    watch.finished(event.step_key)
                interrupted = interrupted or (event.is_engine_event and "termination signal" in (event.message or ""))
                if interrupted and watch.settled_after_interrupt():
                    # the loop would wait for ever on revoked tasks no worker ever received
                    events.close()
                    # the steps never taken keep the pool slots they claimed: no step end will free them
                    plan_context.instance.event_log_storage.free_concurrency_slots_for_run(plan_context.run_id)
                    raise RunInterrupted(
                        f"interrupted while {', '.join(watch.untaken()) or 'no step'} waited for a Celery worker"
                    )


# What a step pod needs from the launcher's environment (values copied at launch); credentials
# (AWS_*, RAGPIPE_BUNDLE_KEY) come from the Kubernetes Secret K8S_SECRET, never from a job's config.
K8S_ENV = ("RAGPIPE_STORE", "RAGPIPE_S3_ENDPOINT", "RAGPIPE_PIPELINE_SPEC", "RAGPIPE_EXECUTOR", "AWS_REGION")
K8S_SECRET = "ragpipe-secrets"


def k8s_executor() -> ExecutorDefinition:
    """``dagster_k8s.k8s_job_executor``: each step a Kubernetes Job, image and namespace read at
    launch from ``RAGPIPE_K8S_IMAGE`` / ``RAGPIPE_K8S_NAMESPACE``. Validated here, not run: this
    machine has no cluster (docs/operations.md, "Kubernetes")."""
    from dagster_k8s import k8s_job_executor

    return k8s_job_executor.configured(
        {
            "job_image": {"env": "RAGPIPE_K8S_IMAGE"},
            "job_namespace": {"env": "RAGPIPE_K8S_NAMESPACE"},
            "env_vars": [*K8S_ENV, "HF_HUB_OFFLINE=1"],
            "env_secrets": [K8S_SECRET],
        },
        name="k8s",
    )


def executor_from(settings: Settings) -> ExecutorDefinition:
    """The executor ``settings.executor`` (``RAGPIPE_EXECUTOR``) names; what it needs is checked
    by ``check_configuration`` beforehand."""
    if settings.executor == "k8s":
        return k8s_executor()
    if not celery_configured(settings):
        return in_process_executor
    from celery.exceptions import DuplicateTaskNameWarning
    from dagster_celery import celery_executor

    # dagster-celery registers its one task, execute_plan, again for every run it launches from a
    # process; Celery warns that the second registration is ignored, which is what it intends.
    warnings.filterwarnings("ignore", category=DuplicateTaskNameWarning, message=r"Task name 'execute_plan'")
    after_s = settings.celery_wait_report_s

    @executor(
        name="celery",
        config_schema=celery_executor.config_schema,
        requirements=multiple_process_executor_requirements(),
    )
    def watched_celery_executor(init_context):
        return WatchedExecutor(celery_executor.executor_creation_fn(init_context), after_s)

    return watched_celery_executor.configured(
        {"broker": {"env": "RAGPIPE_CELERY_BROKER"}, "backend": {"env": "RAGPIPE_CELERY_BACKEND"}},
        name="celery",
    )
