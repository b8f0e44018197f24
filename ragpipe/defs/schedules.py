"""``nightly_rebuild``: snapshot changed watched sources into new revisions and build them.

At each tick (02:00 UTC; stopped by default) every watched source of ``ragpipe/specs/sources.yaml``
(``$RAGPIPE_SOURCES``) whose content digest changed since its last revision is registered as
revision ``<source>-<YYYYMMDD>-<digest8>`` (the date of the scheduled tick, UTC), its partition is
added to ``corpus_revisions`` and ``build_revision`` is requested for it — the whole chain when
the spec has an ``evaluation:`` section — with run key ``nightly:<revision>``. Unchanged sources
request nothing; the skip reason names each source and why. Schedules cannot return partition
requests, so the tick adds the partitions itself before returning the run requests.

A revision is never lost between ticks: an unchanged source whose last revision has no partition
or no ``build_revision`` run that succeeded or is still going (a tick killed after registering it,
a run that failed) is *pending*, and the tick requests it again, with run key
``nightly:<revision>:<YYYYMMDD>`` (Dagster never launches a run key twice, so a retry needs its
own). A source that cannot be read is named in the skip reason and stops no other source.
"""

from __future__ import annotations

from datetime import UTC

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from ragpipe.corpus.watched import load_sources, snapshot_changed_sources
from ragpipe.defs.jobs import BUILD_JOB
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.defs.sensors import PARTITION_TAG

NIGHTLY_TAG = "ragpipe/nightly_source"
# A build that succeeded, or may still: queued, launched or running.
ALIVE = (
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.SUCCESS,
)


@schedule(
    name="nightly_rebuild",
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    job_name=BUILD_JOB,
    default_status=DefaultScheduleStatus.STOPPED,
    description=(
        "Nightly: registers each watched source (ragpipe/specs/sources.yaml) whose content changed as revision "
        "<source>-<YYYYMMDD>-<digest8> and requests build_revision for it (run key nightly:<revision>)."
    ),
)
def nightly_rebuild(context: ScheduleEvaluationContext, ragpipe: RagpipeHome):
    """One request per changed or pending source; a skip reason naming every source otherwise."""
    day = context.scheduled_execution_time.astimezone(UTC).date()
    checks = snapshot_changed_sources(ragpipe.workspace, load_sources(), day)
    known = set(context.instance.get_dynamic_partitions(corpus_revisions.name))
    requests, reasons = [], []
    for check in checks:
        if check.revision is not None:
            requests.append((check.source, check.revision, f"nightly:{check.revision}"))
        elif check.last is not None and _pending(context.instance, check.last, known):
            requests.append((check.source, check.last, f"nightly:{check.last}:{day:%Y%m%d}"))
        else:
            reasons.append(f"{check.source}: {check.reason}")
    if missing := sorted({rev for _, rev, _ in requests} - known):
        context.instance.add_dynamic_partitions(corpus_revisions.name, missing)
    if not requests:
        return SkipReason("; ".join(reasons) or "no watched sources")
    for reason in reasons:
        context.log.info(f"nightly_rebuild: {reason}")
    return [RunRequest(partition_key=rev, run_key=key, tags={NIGHTLY_TAG: source}) for source, rev, key in requests]


def _pending(instance: DagsterInstance, revision: str, known: set[str]) -> bool:
    """Whether ``revision`` has no partition, or no build run that succeeded or may still."""
    if revision not in known:
        return True
    alive = RunsFilter(job_name=BUILD_JOB, tags={PARTITION_TAG: revision}, statuses=list(ALIVE))
    return not instance.get_run_records(alive, limit=1)
