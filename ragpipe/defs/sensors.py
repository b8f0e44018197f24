"""Sensors: registered corpus revisions become partitions and get built, with bounded retries.

The Dagster instance is the only source of truth for "built": a revision is built when its latest
``index_bundle`` materialization came from a run that succeeded (the run, not just the event: the
blocking ``bundle_verifies`` check can fail the run after the materialization). The registry only
says which revisions exist. The cursor counts this sensor's attempts per revision and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dagster import (
    AssetKey,
    AssetRecordsFilter,
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from ragpipe.corpus.registry import list_revisions
from ragpipe.defs.assets import ATTEMPT_TAG
from ragpipe.defs.jobs import BUILD_JOB
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome

MAX_ATTEMPTS = 3
MAX_ATTEMPTS_TAG = "ragpipe/max_attempts"
# Dagster's own tag names (dagster._core.storage.tags): the daemon adds the run key to the runs it
# creates from sensor requests, and every partitioned run carries its partition.
RUN_KEY_TAG = "dagster/run_key"
PARTITION_TAG = "dagster/partition"
RANGE_START_TAG, RANGE_END_TAG = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
UNFINISHED = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]
RETRY_STATUSES = (DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
CURSOR_VERSION = 1


@dataclass(frozen=True)
class Decision:
    """What to do for one revision this tick: request ``attempt`` (``None``: nothing), and why."""

    attempt: int | None
    reason: str


def run_key(revision: str, attempt: int) -> str:
    return f"{revision}#{attempt}"


def succeeded(instance: DagsterInstance, revision: str) -> bool:
    """Whether the latest ``index_bundle`` materialization of ``revision`` came from a run that succeeded."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("index_bundle"), asset_partitions=[revision]), limit=1
    ).records
    if not records:
        return False
    run = instance.get_run_by_id(records[0].run_id)
    return run is not None and run.status == DagsterRunStatus.SUCCESS


def partition_run(
    instance: DagsterInstance, revision: str, statuses: list[DagsterRunStatus], extra_tags: dict[str, str] | None = None
) -> str | None:
    """A run of the partition in one of ``statuses`` (CLI, UI, sensors, schedules: ``dagster/partition``;
    an asset backfill, whose runs carry a partition *range* instead — one partition per run under
    the build assets' ``BackfillPolicy.multi_run(1)``), or None."""
    for tags in ({PARTITION_TAG: revision}, {RANGE_START_TAG: revision, RANGE_END_TAG: revision}):
        records = instance.get_run_records(RunsFilter(tags={**tags, **(extra_tags or {})}, statuses=statuses), limit=1)
        if records:
            return records[0].dagster_run.run_id
    return None


def unfinished_run(instance: DagsterInstance, revision: str) -> str | None:
    """An unfinished run of the partition (``partition_run``), or None."""
    return partition_run(instance, revision, UNFINISHED)


def decide(instance: DagsterInstance, revision: str, attempts: int) -> Decision:
    """The decision for ``revision`` after ``attempts`` requests by this sensor."""
    if succeeded(instance, revision):
        return Decision(None, "built")
    if (running := unfinished_run(instance, revision)) is not None:
        return Decision(None, f"run {running} has not finished")
    if attempts == 0:
        return Decision(1, "not built")
    records = instance.get_run_records(RunsFilter(tags={RUN_KEY_TAG: run_key(revision, attempts)}), limit=1)
    if not records:
        # Requested on an earlier tick, not launched yet: requesting again would duplicate it.
        return Decision(None, f"attempt {attempts} requested, not launched yet")
    status = records[0].dagster_run.status
    if status in RETRY_STATUSES and attempts < MAX_ATTEMPTS:
        return Decision(attempts + 1, f"attempt {attempts} ended {status.value}")
    if status in RETRY_STATUSES:
        return Decision(None, f"gave up after {MAX_ATTEMPTS} attempts (last: {status.value})")
    return Decision(None, f"attempt {attempts} ended {status.value} without a built bundle")


def load_cursor(cursor: str | None) -> dict[str, int]:
    """Attempts per revision from the cursor (``{"v": 1, "attempts": {...}}``); empty when unset."""
    if not cursor:
        return {}
    state = json.loads(cursor)
    if state.get("v") != CURSOR_VERSION:
        raise ValueError(f"corpus_revision_sensor: unknown cursor version in {cursor!r}")
    return {str(k): int(v) for k, v in state["attempts"].items()}


def dump_cursor(attempts: dict[str, int]) -> str:
    return json.dumps({"v": CURSOR_VERSION, "attempts": attempts}, sort_keys=True)


def build_request(revision: str, attempt: int) -> RunRequest:
    return RunRequest(
        partition_key=revision,
        run_key=run_key(revision, attempt),
        tags={ATTEMPT_TAG: str(attempt), MAX_ATTEMPTS_TAG: str(MAX_ATTEMPTS)},
    )


@sensor(
    job_name=BUILD_JOB,  # the job is built per spec inside build_definitions
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
    description=(
        "Adds every corpus revision registered under $RAGPIPE_HOME/revisions as a partition and requests "
        f"its build until one succeeds (at most {MAX_ATTEMPTS} attempts per revision; run key <revision>#<attempt>)."
    ),
)
def corpus_revision_sensor(context: SensorEvaluationContext, ragpipe: RagpipeHome) -> SensorResult:
    """Add new registered revisions as partitions; request a build of each one not built yet.

    A revision is skipped while any run of its partition is unfinished, and when it is built. The
    attempt number goes into the run key and the run's ``ragpipe/attempt`` tag (``index_bundle``
    records it as ``run_attempt``). After ``MAX_ATTEMPTS`` failed or canceled attempts the sensor
    gives up on that revision; a build from the CLI or the UI can still succeed later.
    """
    instance = context.instance
    attempts = load_cursor(context.cursor)
    registered = list_revisions(ragpipe.workspace.registry)
    known = set(instance.get_dynamic_partitions(corpus_revisions.name))
    new = [r for r in registered if r not in known]
    requests: list[RunRequest] = []
    reasons: list[str] = []
    for revision in registered:
        decision = decide(instance, revision, attempts.get(revision, 0))
        if decision.attempt is None:
            reasons.append(f"{revision}: {decision.reason}")
            if decision.reason.startswith("gave up"):
                context.log.warning(f"corpus revision {revision!r}: {decision.reason}")
            continue
        attempts[revision] = decision.attempt
        requests.append(build_request(revision, decision.attempt))
    skip = None if requests else SkipReason("; ".join(reasons) or "no registered corpus revisions")
    return SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=[corpus_revisions.build_add_request(new)] if new else None,
        cursor=dump_cursor(attempts),
        skip_reason=skip,
    )
