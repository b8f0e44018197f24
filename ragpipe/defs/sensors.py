"""Sensors: registered corpus revisions become partitions and get built."""


from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from ragpipe.corpus.registry import list_revisions
from ragpipe.defs.jobs import build_revision_job
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome


@sensor(
    job=build_revision_job,
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
    description="Adds every corpus revision registered under $RAGPIPE_HOME/revisions as a partition and requests its build.",
)
def corpus_revision_sensor(context: SensorEvaluationContext, ragpipe: RagpipeHome) -> SensorResult | SkipReason:
    """Add every registered revision that is not yet a partition, and request its build.

    ``run_key`` is the revision key, so a revision is requested at most once per sensor.
    """
    known = set(context.instance.get_dynamic_partitions(corpus_revisions.name))
    new = [r for r in list_revisions(ragpipe.workspace.registry) if r not in known]
    if not new:
        return SkipReason("no newly registered corpus revisions")
    return SensorResult(
        run_requests=[RunRequest(partition_key=r, run_key=f"revision:{r}") for r in new],
        dynamic_partitions_requests=[corpus_revisions.build_add_request(new)],
    )
