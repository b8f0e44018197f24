"""``nightly_rebuild``: snapshot changed watched sources into new revisions and build them.

At each tick (02:00 UTC; stopped by default) every watched source of ``ragpipe/specs/sources.yaml``
(``$RAGPIPE_SOURCES``) whose content digest changed since its last revision is registered as
revision ``<source>-<YYYYMMDD>-<digest8>`` (the date of the scheduled tick, UTC), its partition is
added to ``corpus_revisions`` and ``build_revision`` is requested for it — the whole chain when
the spec has an ``evaluation:`` section — with run key ``nightly:<revision>``. Unchanged sources
request nothing; the skip reason names each source and why. Schedules cannot return partition
requests, so the tick adds the partitions itself before returning the run requests.
"""

from __future__ import annotations

from datetime import UTC

from dagster import DefaultScheduleStatus, RunRequest, ScheduleEvaluationContext, SkipReason, schedule

from ragpipe.corpus.watched import load_sources, snapshot_changed_sources
from ragpipe.defs.jobs import BUILD_JOB
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome

NIGHTLY_TAG = "ragpipe/nightly_source"


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
    """One request per changed source; a skip reason naming every source otherwise."""
    day = context.scheduled_execution_time.astimezone(UTC).date()
    checks = snapshot_changed_sources(ragpipe.workspace, load_sources(), day)
    new = [c.revision for c in checks if c.revision is not None]
    known = set(context.instance.get_dynamic_partitions(corpus_revisions.name))
    if missing := [r for r in new if r not in known]:
        context.instance.add_dynamic_partitions(corpus_revisions.name, missing)
    if not new:
        return SkipReason("; ".join(f"{c.source}: {c.reason}" for c in checks) or "no watched sources")
    return [
        RunRequest(partition_key=c.revision, run_key=f"nightly:{c.revision}", tags={NIGHTLY_TAG: c.source})
        for c in checks
        if c.revision is not None
    ]
