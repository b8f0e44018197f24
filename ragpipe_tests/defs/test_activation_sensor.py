"""activation_sensor and the activate_release job, on a real instance and a real (handbook) bundle.

Ticks are evaluated with ``build_sensor_context(..., definitions=...)``; requested runs are
executed the way the daemon would (same job, run config and the ``dagster/run_key`` tag).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus, DefaultSensorStatus, build_sensor_context
from dagster._core.test_utils import create_run_for_test

from ragpipe.defs import build_definitions
from ragpipe.defs.activation import activation_sensor_def, load_cursor
from ragpipe.defs.resources import RagpipeHome
from ragpipe.release.history import read_history
from ragpipe.release.manifest import load_manifest
from ragpipe.release.pointer import read_pointer
from ragpipe.release.store import ReleaseStore
from ragpipe.release.targets import load_targets
from ragpipe_tests.support.release_fixtures import approve_signed, bundle_of, fixture_targets, fresh_ws, publish

TARGETS = """schema: ragpipe.targets/v1
default_target: staging
targets:
  staging: {approval_required: false, auto_activate: true, waive_human_apply: true}
  production: {approval_required: true, auto_activate: SENSOR, waive_human_apply: SENSOR}
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, built_workspace):
    ws = fresh_ws(tmp_path, bundle_of(built_workspace))
    targets = fixture_targets(tmp_path, TARGETS.replace("SENSOR", "true"))
    monkeypatch.setenv("RAGPIPE_HOME", str(ws.home))
    monkeypatch.setenv("RAGPIPE_TARGETS", str(targets))
    (tmp_path / "dagster").mkdir()
    with DagsterInstance.local_temp(str(tmp_path / "dagster")) as instance:
        yield ws, instance, build_definitions(), bundle_of(built_workspace)


def tick(env, cursor: str | None, log: logging.Handler | None = None):
    """One evaluation of the sensor; ``log``: a handler that also receives the tick's log
    (``context.log``, what the daemon keeps with the tick)."""
    ws, instance, defs, _ = env
    ctx = build_sensor_context(
        instance=instance, cursor=cursor, resources={"ragpipe": RagpipeHome(home=str(ws.home))}, definitions=defs
    )
    if log is not None:
        ctx.log.addHandler(log)  # the context keeps one logger for the tick: the sensor logs to this one
    return defs.get_sensor_def("activation_sensor").evaluate_tick(ctx)


def requests(data) -> list[tuple[str, dict]]:
    return [(r.run_key, r.run_config["ops"]["activate"]["config"]) for r in data.run_requests]


def launch(env, data) -> None:
    _, instance, defs, _ = env
    for r in data.run_requests:
        result = defs.resolve_job_def("activate_release").execute_in_process(
            run_config=r.run_config, instance=instance, tags={**r.tags, "dagster/run_key": r.run_key}
        )
        assert result.success


def test_eligible_release_is_requested_once_and_activated(env):
    ws, _, _, bundle = env
    rid = publish(ws, bundle, "r1")
    first = tick(env, None)
    assert requests(first) == [(f"activate:staging:{rid}", {"release_id": rid, "target": "staging"})]
    assert load_cursor(first.cursor) == {"staging": [rid]}
    # the cursor remembers the request: a tick before the run exists requests nothing again
    again = tick(env, first.cursor)
    assert again.run_requests == []
    launch(env, first)
    assert read_pointer(ReleaseStore(ws), "staging").release_id == rid
    # a tick that lost its cursor still never duplicates: the release is active now
    third = tick(env, None)
    assert third.run_requests == []
    assert f"staging: {rid}: release is active on target 'staging'" in third.skip_message


def test_a_sensor_activation_records_the_waiver_and_a_target_without_one_waits_for_a_person(env, tmp_path, monkeypatch):
    ws, instance, defs, bundle = env
    rid = publish(ws, bundle, "r1")
    launch(env, tick(env, None))  # the run carries the sensor's tag: automatic, waived on staging
    _, records = read_history(ReleaseStore(ws), "staging")
    intent = next(r for r in records if r.kind == "intent")
    assert (intent.payload["release_id"], intent.payload["waived"]) == (rid, "human_apply_required")
    # staging without the waiver: the sensor leaves the release to a person, who can activate it
    strict = fixture_targets(tmp_path, TARGETS.replace("SENSOR", "false").replace(", waive_human_apply: true", ""))
    monkeypatch.setenv("RAGPIPE_TARGETS", str(strict))
    other = publish(ws, bundle, "r2", against=rid)  # gated against the live release: it may replace it
    data = tick(env, None)
    assert data.run_requests == []
    assert (
        f"staging: {other}: its gate decision says human_apply_required and target 'staging' does not waive it "
        "(waive_human_apply in the targets config): a person activates it (ragpipe release activate)"
    ) in data.skip_message
    config = {"ops": {"activate": {"config": {"release_id": other, "target": "staging"}}}}
    assert defs.resolve_job_def("activate_release").execute_in_process(run_config=config, instance=instance).success
    _, records = read_history(ReleaseStore(ws), "staging")
    assert "waived" not in [r for r in records if r.kind == "intent"][-1].payload  # a person applied it


def test_a_release_gated_against_another_release_than_the_live_one_is_never_requested(env):
    """A decision holds only where the release it was made against is live (a bootstrap's: where
    nothing is): any other release is not ready on that target, with the activation's refusal."""
    ws, _, _, bundle = env
    first = publish(ws, bundle, "r1")
    launch(env, started := tick(env, None))  # staging serves first
    stale = publish(ws, bundle, "r2")  # a bootstrap, published while staging serves first
    data = tick(env, started.cursor)
    assert data.run_requests == []
    assert (
        f"staging: {stale}: was gated without an incumbent (bootstrap), but target 'staging' serves release {first}: "
        "its decision says nothing about replacing that (build the revision again to gate it against what is live)"
    ) in data.skip_message
    refresh = publish(ws, bundle, "r3", against=first)
    data = tick(env, data.cursor)
    assert requests(data) == [(f"activate:staging:{refresh}", {"release_id": refresh, "target": "staging"})]
    launch(env, data)  # staging serves refresh; production still serves nothing
    later = publish(ws, bundle, "r4", against=first)
    data = tick(env, data.cursor)
    assert data.run_requests == []
    assert (
        f"staging: {later}: was gated against release {first}, but target 'staging' serves release {refresh}: "
        "its decision says nothing about replacing that"
    ) in data.skip_message
    assert f"production: {later}: was gated against release {first}, but target 'production' serves nothing: " in (
        data.skip_message
    )


def test_beside_a_run_request_the_reasons_for_the_other_targets_are_in_the_ticks_log(env, caplog):
    """Dagster refuses a skip reason beside run requests: the tick's log says why the other target
    requested nothing."""
    ws, _, _, bundle = env
    rid = publish(ws, bundle, "r1")
    data = tick(env, None, log=caplog.handler)
    assert requests(data) == [(f"activate:staging:{rid}", {"release_id": rid, "target": "staging"})]
    assert data.skip_message is None
    assert [m for m in caplog.messages if m.startswith("activation_sensor:")] == [
        f"activation_sensor: not requested: production: {rid}: target 'production' requires an approval, "
        f"and release {rid} has none"
    ]


def test_ineligible_release_is_never_requested(env):
    ws, _, _, bundle = env
    rid = publish(ws, bundle, "r1", eligible=False, phase="target")
    data = tick(env, None)
    assert data.run_requests == []
    assert data.skip_message == "production: no eligible release; staging: no eligible release"
    assert rid not in data.skip_message


def test_approval_missing_then_one_request_after_approval(env):
    ws, instance, _, bundle = env
    rid = publish(ws, bundle, "r1")
    launch(env, first := tick(env, None))  # staging activates at once
    assert requests(first) == [(f"activate:staging:{rid}", {"release_id": rid, "target": "staging"})]
    waiting = tick(env, first.cursor)
    assert waiting.run_requests == []
    assert f"production: {rid}: target 'production' requires an approval" in waiting.skip_message
    approve_signed(ws, rid, "production", config=load_targets())
    approved = tick(env, waiting.cursor)
    assert requests(approved) == [(f"activate:production:{rid}", {"release_id": rid, "target": "production"})]
    launch(env, approved)
    assert read_pointer(ReleaseStore(ws), "production").release_id == rid
    assert tick(env, approved.cursor).run_requests == []


def test_newest_ready_release_wins_and_older_are_skipped(env):
    ws, _, _, bundle = env
    old = publish(ws, bundle, "r1")
    new = publish(ws, bundle, "r2")
    data = tick(env, None)
    assert [k for k, _ in requests(data)] == [f"activate:staging:{new}"]
    assert load_cursor(data.cursor) == {"staging": [new]}
    assert data.skip_message is None
    # the older release is skipped with a reason on the next tick
    assert f"staging: {old}: a newer eligible release ({new}) is ready" in tick(env, data.cursor).skip_message


def test_a_refused_activation_fails_the_run_and_changes_nothing(env):
    ws, instance, defs, bundle = env
    rid = publish(ws, bundle, "r1", eligible=False, phase="hard")
    config = {"ops": {"activate": {"config": {"release_id": rid, "target": "staging"}}}}
    result = defs.resolve_job_def("activate_release").execute_in_process(
        run_config=config, instance=instance, raise_on_error=False
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_failure_data.error.cause.message.startswith(
        f"ragpipe.release.store.ReleaseError: release {rid} is not eligible for activation"
    )
    assert read_pointer(ReleaseStore(ws), "staging") is None


def test_default_status_follows_the_targets_config(tmp_path: Path):
    path = tmp_path / "targets.yaml"
    path.write_text(
        TARGETS.replace("SENSOR", "false").replace(
            "staging: {approval_required: false, auto_activate: true, waive_human_apply: true}",
            "staging: {approval_required: false, auto_activate: false}",
        )
    )
    assert activation_sensor_def(load_targets(path)).default_status == DefaultSensorStatus.STOPPED
    assert activation_sensor_def(load_targets()).default_status == DefaultSensorStatus.RUNNING  # checked-in: staging on


def test_an_invalid_manifest_is_skipped_with_its_reason_and_stops_nothing(env):
    ws, _, _, bundle = env
    stray = ReleaseStore(ws).manifests
    stray.mkdir(parents=True, exist_ok=True)
    (stray / "notes.json").write_text("{}", encoding="utf-8")
    rid = publish(ws, bundle, "r1")
    reason = f"{stray / 'notes.json'}: not a valid release manifest: expected exactly the keys manifest, release_id"
    first = tick(env, None)
    assert requests(first) == [(f"activate:staging:{rid}", {"release_id": rid, "target": "staging"})]
    launch(env, first)
    later = tick(env, first.cursor)
    assert later.run_requests == []
    assert f"staging: notes.json: {reason}" in later.skip_message
    assert f"production: notes.json: {reason}" in later.skip_message


def test_the_remaining_skip_reasons_are_what_the_docs_say(env, tmp_path, monkeypatch):
    """auto_activate off; a policy the target does not accept; a request whose run already exists
    although the cursor was lost (a failed activation is never retried automatically)."""
    ws, instance, _, bundle = env
    rid = publish(ws, bundle, "r1")
    doc = yaml.safe_load(Path(os.environ["RAGPIPE_TARGETS"]).read_text())
    doc["targets"]["staging"]["gate_policies"] = ["default"]
    doc["targets"]["production"].update(auto_activate=False, waive_human_apply=False)
    strict = tmp_path / "strict-targets.yaml"
    strict.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("RAGPIPE_TARGETS", str(strict))
    data = tick(env, None)
    policy = load_manifest(ReleaseStore(ws), rid).gate_policy_id
    assert data.run_requests == []
    assert data.skip_message.startswith(
        f"production: auto_activate is off for this target (targets config); staging: {rid}: was gated under "
        f"policy {policy}, which target 'staging' does not accept (it accepts default = "
    )
    monkeypatch.setenv("RAGPIPE_TARGETS", str(fixture_targets(tmp_path, TARGETS.replace("SENSOR", "false"))))
    create_run_for_test(
        instance,
        job_name="activate_release",
        status=DagsterRunStatus.FAILURE,
        tags={"dagster/run_key": f"activate:staging:{rid}"},
    )
    again = tick(env, None)  # no cursor: the run key alone says it was requested
    assert again.run_requests == []
    assert f"staging: {rid}: activation already requested (run key activate:staging:{rid})" in again.skip_message


def test_a_damaged_newer_manifest_stops_the_sensor_from_activating_an_older_release(env):
    """The damaged file may be the release that should go live: the sensor never activates an older
    one past it (an older stray file stops nothing: the test above)."""
    ws, _, _, bundle = env
    rid = publish(ws, bundle, "r1")
    store = ReleaseStore(ws)
    good = store.manifest_path(rid)
    damaged = store.manifests / ("f" * 64 + ".json")
    damaged.write_bytes(good.read_bytes()[:-10])
    published = good.stat().st_mtime_ns
    os.utime(damaged, ns=(published + 10**9, published + 10**9))
    data = tick(env, None)
    assert data.run_requests == []
    assert (
        f"staging: {rid}: not activated: a newer manifest file ({damaged.name}) does not verify; repair or remove it"
        in data.skip_message
    )
    damaged.unlink()
    assert requests(tick(env, None)) == [(f"activate:staging:{rid}", {"release_id": rid, "target": "staging"})]
