"""Activation from Dagster: the ``activate_release`` job and the ``activation_sensor``.

``activate_release`` is an op job configured with a release ID and a target; its op calls
``ragpipe.release.activation.activate`` (manifest and full bundle verification, eligibility,
approval where the target requires it, compare-and-swap of the target's pointer). A refusal fails
the run with the refusal's message; nothing is activated. An activation that moved the pointer
records ``AssetObservation``s on ``release_manifest`` (``live_observations``): the activated
release's revision is ``live_on`` the target ``since`` now, the one it replaced
``no_longer_live_on`` it — so the asset's page says where each release is live.

``activation_sensor`` reads the release store on every tick (``eligible_releases``) for each
target whose config says ``auto_activate: true`` and requests ``activate_release`` for the newest
eligible release that is *ready* there (never activated or attempted on the target, approved
where required), with run key ``activate:<target>:<release_id>``. Everything else is skipped
with a reason. Its cursor remembers what it requested, and a run that already carries the run key
is never requested again, so repeated ticks never double-activate. Default status: running when
some target in the targets config has ``auto_activate: true`` (``staging`` in the checked-in one), else
stopped; ``production`` is off.
"""

import json

from dagster import (
    AssetObservation,
    Config,
    DagsterInstance,
    DefaultSensorStatus,
    OpExecutionContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    in_process_executor,
    job,
    op,
    sensor,
)

from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.release.activation import activate
from ragpipe.release.history import now_iso
from ragpipe.release.manifest import load_manifest
from ragpipe.release.status import EligibleRelease, eligible_releases
from ragpipe.release.store import ReleaseStore
from ragpipe.release.targets import TargetsConfig, load_targets

JOB = "activate_release"
OP = "activate"
RUN_KEY_TAG = "dagster/run_key"
SENSOR_NAME_TAG = "dagster/sensor_name"  # set by Dagster on every run a sensor requested
CURSOR_VERSION = 1


class ActivateConfig(Config):
    release_id: str
    target: str


@op(
    name=OP,
    pool="ragpipe_release_store",
    description="Activate one release on one target (verified, gated, approved where required).",
)
def activate_op(context: OpExecutionContext, config: ActivateConfig, ragpipe: RagpipeHome) -> None:
    # A run the sensor requested is automatic: no person asked for it (a run launched by hand is).
    automatic = SENSOR_NAME_TAG in context.run.tags
    ws = ragpipe.workspace
    result = activate(ws, config.release_id, config.target, by=f"dagster run {context.run_id}", automatic=automatic)
    context.log.info(
        f"target {result.target!r}: release {result.release_id} active at generation {result.generation}"
        + ("" if result.changed else " (it already was)")
    )
    if result.changed:
        for event in live_observations(context.instance, ws, result):
            context.log_event(event)


def live_observations(instance: DagsterInstance, ws, result) -> list[AssetObservation]:
    """What the ``release_manifest`` asset shows after an activation: an observation on the
    activated release's revision (``live_on``: the target, ``since``: now, the generation) and one
    on the release it replaced (``no_longer_live_on``). Only for revisions that are partitions of
    this instance (a release built elsewhere has no partition here)."""
    store = ReleaseStore(ws)
    known = set(instance.get_dynamic_partitions(corpus_revisions.name))
    since = now_iso()
    out = []
    for release_id, live in ((result.release_id, True), (result.previous, False)):
        if release_id is None:
            continue
        revision = load_manifest(store, release_id).revision
        if revision not in known:
            continue
        key = "live_on" if live else "no_longer_live_on"
        metadata = {key: result.target, "release_id": release_id, "since": since, "generation": result.generation}
        out.append(AssetObservation(asset_key="release_manifest", partition=revision, metadata=metadata))
    return out


@job(
    name=JOB,
    executor_def=in_process_executor,
    description="Activate a release on a target: `ragpipe release activate` as a Dagster run.",
)
def activate_release_job() -> None:
    activate_op()


def run_key(target: str, release_id: str) -> str:
    return f"activate:{target}:{release_id}"


def activation_request(target: str, release_id: str) -> RunRequest:
    return RunRequest(
        run_key=run_key(target, release_id),
        run_config={"ops": {OP: {"config": {"release_id": release_id, "target": target}}}},
        tags={"ragpipe/target": target, "ragpipe/release_id": release_id},
    )


def load_cursor(cursor: str | None) -> dict[str, list[str]]:
    """Release IDs requested per target (``{"v": 1, "requested": {...}}``); empty when unset."""
    if not cursor:
        return {}
    state = json.loads(cursor)
    if state.get("v") != CURSOR_VERSION:
        raise ValueError(f"activation_sensor: unknown cursor version in {cursor!r}")
    return {str(t): [str(r) for r in ids] for t, ids in state["requested"].items()}


def dump_cursor(requested: dict[str, list[str]]) -> str:
    return json.dumps({"v": CURSOR_VERSION, "requested": requested}, sort_keys=True)


def _requested_before(instance: DagsterInstance, requested: list[str], target: str, release_id: str) -> bool:
    if release_id in requested:
        return True
    return bool(instance.get_run_records(RunsFilter(tags={RUN_KEY_TAG: run_key(target, release_id)}), limit=1))


def plan_target(
    instance: DagsterInstance, target: str, candidates: list[EligibleRelease], requested: list[str]
) -> tuple[str | None, list[str]]:
    """(release to request or None, skip reasons) for one target: the newest ready candidate."""
    reasons = [f"{target}: {c.release_id}: {c.reason}" for c in candidates if not c.ready]
    ready = [c for c in candidates if c.ready]
    if not candidates:
        reasons.append(f"{target}: no eligible release")
    if not ready:
        return None, reasons
    newest, older = ready[-1], ready[:-1]
    reasons += [f"{target}: {c.release_id}: a newer eligible release ({newest.release_id}) is ready" for c in older]
    after = candidates[candidates.index(newest) + 1 :]
    if damaged := [c.release_id for c in after if c.status == "invalid manifest"]:
        # The damaged file may be the release that should go live: never activate an older one past it.
        return None, [
            *reasons,
            f"{target}: {newest.release_id}: not activated: a newer manifest file ({damaged[-1]}) does not verify; "
            "repair or remove it",
        ]
    if _requested_before(instance, requested, target, newest.release_id):
        return None, [
            *reasons,
            f"{target}: {newest.release_id}: activation already requested (run key {run_key(target, newest.release_id)})",
        ]
    return newest.release_id, reasons


def evaluate(context: SensorEvaluationContext, ragpipe: RagpipeHome) -> SensorResult:
    config = load_targets()
    requested = load_cursor(context.cursor)
    requests, reasons = [], []
    for target, spec in sorted(config.targets.items()):
        if not spec.auto_activate:
            reasons.append(f"{target}: auto_activate is off for this target (targets config)")
            continue
        candidates = eligible_releases(ragpipe.workspace, target, config=config)
        for bad in (c for c in candidates if c.status == "invalid manifest"):
            context.log.warning(f"activation_sensor: skipping {bad.release_id}: {bad.reason}")
        chosen, why = plan_target(context.instance, target, candidates, requested.get(target, []))
        reasons += why
        if chosen is not None:
            requests.append(activation_request(target, chosen))
            requested.setdefault(target, []).append(chosen)
    if requests:  # Dagster refuses a skip reason beside run requests: the tick's own log shows them
        for reason in reasons:
            context.log.info(f"activation_sensor: not requested: {reason}")
    skip = None if requests else SkipReason("; ".join(reasons))
    return SensorResult(run_requests=requests, cursor=dump_cursor(requested), skip_reason=skip)


def activation_sensor_def(config: TargetsConfig | None = None) -> SensorDefinition:
    """The sensor, its default status from the targets config (``config`` or the loaded one)."""
    config = config or load_targets()
    running = any(t.auto_activate for t in config.targets.values())

    @sensor(
        name="activation_sensor",
        job=activate_release_job,
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING if running else DefaultSensorStatus.STOPPED,
        description=(
            "Requests activate_release for the newest eligible release of each target with `auto_activate: true` in the "
            "targets config (after approval where the target requires it); run key activate:<target>:<release_id>."
        ),
    )
    def activation_sensor(context: SensorEvaluationContext, ragpipe: RagpipeHome) -> SensorResult:
        """Request the activation of eligible, ready releases (module docstring)."""
        return evaluate(context, ragpipe)

    return activation_sensor
