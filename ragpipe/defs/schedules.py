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
from ragpipe.defs.sensors import PARTITION_TAG, partition_run, succeeded, unfinished_run

NIGHTLY_TAG = "ragpipe/nightly_source"
# A revision whose nightly builds failed this many times is left to a person (its skip reason says so).
MAX_NIGHTLY_FAILURES = 3


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
        elif check.last is not None and (state := pending(context.instance, check.last, known))[0]:
            requests.append((check.source, check.last, f"nightly:{check.last}:{day:%Y%m%d}"))
        else:
            why = state[1] if check.last is not None else None
            reasons.append(f"{check.source}: {check.reason}" + (f"; {why}" if why else ""))
    if missing := sorted({rev for _, rev, _ in requests} - known):
        context.instance.add_dynamic_partitions(corpus_revisions.name, missing)
    if not requests:
        return SkipReason("; ".join(reasons) or "no watched sources")
    for reason in reasons:
        context.log.info(f"nightly_rebuild: {reason}")
    return [RunRequest(partition_key=rev, run_key=key, tags={NIGHTLY_TAG: source}) for source, rev, key in requests]


def pending(instance: DagsterInstance, revision: str, known: set[str]) -> tuple[bool, str | None]:
    """``(request it, why not)``: a revision is requested when it has no partition, or no run of
    its partition that succeeded (or materialized its bundle) or may still (``sensors.unfinished_run``:
    queued to canceling, by partition tag or backfill range) — unless ``MAX_NIGHTLY_FAILURES``
    nightly builds of it failed, when the reason says it is left to a person."""
    if revision not in known:
        return True, None
    if succeeded(instance, revision) or unfinished_run(instance, revision) is not None:
        return False, None
    if partition_run(instance, revision, [DagsterRunStatus.SUCCESS]) is not None:
        return False, None
    failed = instance.get_run_records(RunsFilter(tags={PARTITION_TAG: revision}, statuses=[DagsterRunStatus.FAILURE]))
    nightly = sum(1 for r in failed if NIGHTLY_TAG in r.dagster_run.tags)
    if nightly >= MAX_NIGHTLY_FAILURES:
        return (
            False,
            f"revision {revision} failed {nightly} nightly builds: build it by hand (ragpipe build, or the UI)",
        )
    return True, None
