"""Activation refusals (ineligible, tampered bundle, wrong material digest, missing approval),
approvals, the sensor's candidate list and serving's resolve_active."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ragpipe.experiment.gate_policy import load_policy
from ragpipe.release.activation import activate
from ragpipe.release.history import read_history
from ragpipe.release.manifest import ReleaseManifest, load_manifest, publish_manifest
from ragpipe.release.pointer import read_pointer
from ragpipe.release.rollback import rollback
from ragpipe.release.status import EligibleRelease, eligible_releases, resolve_active
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import DEFAULT_TARGETS_PATH, load_targets
from ragpipe_tests.support.release_fixtures import (
    H,
    approve_signed,
    bundle_ids,
    evaluation_arm,
    fixture_policy,
    keep_decision,
    manifest_for,
    publish,
)

# Fixture releases are gated under fixture policies (release_fixtures.fixture_policy): the targets accept them.
pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


def test_activation_records_intent_and_observed(ws, bundle: Path):
    rid = publish(ws, bundle)
    steps: list[str] = []
    result = activate(ws, rid, None, by="alice", on_step=steps.append)
    assert result.as_dict() == {
        "target": "staging",
        "release_id": rid,
        "generation": 1,
        "previous": None,
        "changed": True,
    }
    assert steps == [
        "verified",
        "intent_appended",
        "pointer_temp_written",
        "pointer_temp_fsynced",
        "pointer_renamed",
        "pointer_dir_fsynced",
        "observed_appended",
    ]
    state, records = read_history(ReleaseStore(ws), "staging")
    assert [(r.kind, r.payload["release_id"]) for r in records] == [("intent", rid), ("observed", rid)]
    assert {k: records[0].payload[k] for k in ("action", "from_generation", "generation", "previous", "by")} == {
        "action": "activate",
        "from_generation": 0,
        "generation": 1,
        "previous": None,
        "by": "alice",
    }
    assert read_pointer(ReleaseStore(ws), "staging").ledger_head == records[0].hash
    again = activate(ws, rid, "staging")
    assert (again.changed, again.generation) == (False, 1)
    assert len(read_history(ReleaseStore(ws), "staging")[1]) == 2  # nothing written


def test_ineligible_release_is_never_activated(ws, bundle: Path):
    rid = publish(ws, bundle, eligible=False, phase="target")
    decision = load_manifest(ReleaseStore(ws), rid).gate.decision_id
    with pytest.raises(ReleaseError) as exc:
        activate(ws, rid, "staging")
    assert (
        str(exc.value)
        == f"release {rid} is not eligible for activation (gate decision {decision}: decisive phase target)"
    )
    with pytest.raises(ReleaseError) as exc:
        approve_signed(ws, rid, "production")
    assert str(exc.value).endswith("decisive phase target); it cannot be approved")
    assert read_pointer(ReleaseStore(ws), "staging") is None
    assert eligible_releases(ws, "staging") == []


def test_tampered_bundle_refused_pointer_unchanged(ws, bundle: Path):
    good, bad = publish(ws, bundle, "r1"), publish(ws, bundle, "r2")
    activate(ws, good, "staging")
    before = ReleaseStore(ws).pointer_path("staging").read_bytes()
    table = ws.bundles / bundle.name / "documents.parquet"
    size = table.stat().st_size
    with open(table, "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ReleaseError) as exc:
        activate(ws, bad, "staging")
    bundle_id = bundle_ids(bundle)[0]
    assert str(exc.value) == (
        f"release {bad} failed verification; not activated:\n"
        f"  bundle {bundle_id}: documents.parquet: size {size + 1} differs from manifest size {size} (truncated or extended)"
    )
    assert ReleaseStore(ws).pointer_path("staging").read_bytes() == before
    state, records = read_history(ReleaseStore(ws), "staging")
    assert (records[-1].kind, records[-1].payload["release_id"], state.states[bad], state.active) == (
        "rejected",
        bad,
        "rejected",
        good,
    )
    with pytest.raises(ReleaseError) as exc:  # serving refuses too: the active release no longer verifies
        resolve_active(ws, "staging")
    assert str(exc.value).startswith(
        f"target 'staging': release {good} failed verification: bundle {bundle_id}: documents.parquet: size"
    )


def test_material_digest_and_child_checks_bind(ws, bundle: Path):
    rid = publish(ws, bundle, material_digest=H)
    actual = bundle_ids(bundle)[1]
    with pytest.raises(ReleaseError) as exc:
        activate(ws, rid, "staging")
    assert str(exc.value) == (
        f"release {rid} failed verification; not activated:\n"
        f"  bundle {bundle_ids(bundle)[0]}: material digest {actual} differs from the release's {H}\n"
        # the evaluation run recorded the digest of the bytes it evaluated: not the release's either
        f"  evaluation run {evaluation_arm(bundle).run_id}: evaluated bundle bytes {actual} is not the release's {H}"
    )
    other = publish(ws, bundle, "r2")
    with pytest.raises(ReleaseError) as exc:
        activate(ws, other, "staging", child_checks=[lambda ws, m: [f"answer plan {m.answer_plan_id}: not deployable"]])
    assert str(exc.value) == f"release {other} failed verification; not activated:\n  answer plan {H}: not deployable"
    assert read_pointer(ReleaseStore(ws), "staging") is None


def test_the_evaluation_run_a_release_binds_must_verify_and_be_its_own(ws, bundle: Path):
    """Activation re-verifies the evidence: the run folder exists, its ledger, inputs and traces
    verify, it is completed, and its run ID, spec ID, ledger head, bundle and plan are the manifest's."""
    arm = evaluation_arm(bundle)
    run = ws.home / "evaluations" / arm.run_id
    prefix = f"evaluation run {arm.run_id}"

    def refused(manifest: ReleaseManifest) -> str:
        keep_decision(ws, bundle)
        rid = publish_manifest(ReleaseStore(ws), manifest)[0]
        with pytest.raises(ReleaseError) as exc:
            activate(ws, rid, "staging")
        assert read_pointer(ReleaseStore(ws), "staging") is None
        # the first problem is the run's; the decision (about the real run) may add its own
        return str(exc.value).removeprefix(f"release {rid} failed verification; not activated:\n  ").split("\n  ")[0]

    base = manifest_for(bundle)
    other_head = base.model_copy(update={"evaluation": base.evaluation.model_copy(update={"ledger_head": H})})
    assert refused(other_head) == f"{prefix}: ledger head {arm.ledger_head} is not the release's {H}"
    other_spec = base.model_copy(update={"evaluation": base.evaluation.model_copy(update={"spec_id": H})})
    assert refused(other_spec) == f"{prefix}: spec ID {arm.spec_id} is not the release's {H}"
    other_plan = base.model_copy(update={"query_plan_id": H})
    assert refused(other_plan) == f"{prefix}: query plan {arm.variant.plan_id} is not the release's {H}"
    escape = base.model_copy(update={"evaluation": base.evaluation.model_copy(update={"run_id": ".."})})
    assert refused(escape).endswith("evaluation run ID '..' is not a folder name")

    ledger = run / "ledger.jsonl"
    data = ledger.read_bytes()
    ledger.write_bytes(data.replace(b'"kind":"CellCompleted"', b'"kind":"CellCompletes"', 1))
    assert refused(base).startswith(f"{prefix}: {ledger}: record ")
    ledger.write_bytes(data)
    shutil.rmtree(run)
    assert refused(base) == f"{prefix}: {run} is missing"


def test_approval_required_by_production(ws, bundle: Path):
    rid = publish(ws, bundle)
    assert eligible_releases(ws, "production") == [
        EligibleRelease(
            rid, "r1", "approval missing", f"target 'production' requires an approval, and release {rid} has none"
        )
    ]
    with pytest.raises(ReleaseError) as exc:
        activate(ws, rid, "production")
    assert str(exc.value) == (
        f"release {rid} needs an approval for target 'production' before activation: "
        f"target 'production' requires an approval, and release {rid} has none "
        f"(ragpipe release approve {rid} --target production --by NAME --key KEYFILE)"
    )
    approval = approve_signed(ws, rid, "production", note="change 42")
    assert (approval.by, approval.note, approval.seq) == ("alice", "change 42", 1)
    assert eligible_releases(ws, "production") == [  # approved; the sensor still leaves it to a person
        EligibleRelease(
            rid,
            "r1",
            "needs a person",
            "target 'production' does not activate automatically (auto_activate: false in the targets config)",
        )
    ]
    with pytest.raises(ReleaseError, match=f"release {rid} is not activated automatically: target 'production' does"):
        activate(ws, rid, "production", automatic=True)
    assert activate(ws, rid, "production").generation == 1
    assert eligible_releases(ws, "production") == [
        EligibleRelease(rid, "r1", "active", "release is active on target 'production'")
    ]
    state, _ = read_history(ReleaseStore(ws), "production")
    assert [(a.by, a.note) for a in state.approvals[rid]] == [("alice", "change 42")]


def test_sensor_candidates_never_re_offer_a_previous_release(ws, bundle: Path):
    first = publish(ws, bundle, "r1")
    second = publish(ws, bundle, "r2", against=first)
    publish(ws, bundle, "r3", eligible=False, phase="coverage")
    # changed ("ready" for both before): second is gated against first, which is not live yet
    assert [c.status for c in eligible_releases(ws, "staging")] == ["ready", "gated against another release"]
    activate(ws, first, "staging")
    assert [c.status for c in eligible_releases(ws, "staging")] == ["active", "ready"]
    activate(ws, second, "staging")
    assert eligible_releases(ws, "staging") == [
        EligibleRelease(first, "r1", "superseded", "release is superseded on target 'staging'"),
        EligibleRelease(second, "r2", "active", "release is active on target 'staging'"),
    ]


def test_resolve_active(ws, bundle: Path):
    with pytest.raises(ReleaseError) as exc:
        resolve_active(ws)
    assert (
        str(exc.value)
        == "target 'staging' has no active release: query a built revision with ragpipe query --revision KEY \"...\", or activate an eligible release (ragpipe release list) with ragpipe release activate RELEASE_ID --target staging"
    )
    rid = publish(ws, bundle)
    activate(ws, rid)
    manifest, path = resolve_active(ws)
    assert (manifest.release_id, path) == (rid, ws.bundles / bundle.name)


def test_a_target_activates_only_releases_gated_under_a_policy_it_accepts(ws, bundle: Path, tmp_path: Path):
    """The lenient-policy forgery: a real eligible decision, made under a policy the target does not
    list, is refused before anything is verified; the sensor skips it with the same reason;
    rollback to a release that was active under an earlier configuration still works."""
    store = ReleaseStore(ws)
    a = publish(ws, bundle, "r1")
    b = publish(ws, bundle, "r2", against=a)
    lenient = fixture_policy(None).policy_id
    default = load_policy().policy_id
    checked_in = load_targets(DEFAULT_TARGETS_PATH)
    refusal = (
        f"was gated under policy {lenient}, which target 'staging' does not accept "
        f"(it accepts default = {default}: gate_policies in the targets config)"
    )
    with pytest.raises(ReleaseError) as exc:
        activate(ws, a, "staging", config=checked_in)
    assert str(exc.value) == f"release {a} {refusal}"
    assert read_pointer(store, "staging") is None and read_history(store, "staging")[1] == ()  # nothing written
    assert eligible_releases(ws, "staging", config=checked_in) == [
        EligibleRelease(a, "r1", "policy not accepted", refusal),
        EligibleRelease(b, "r2", "policy not accepted", refusal),
    ]
    activate(ws, a, "staging")  # $RAGPIPE_TARGETS accepts the fixture policies
    activate(ws, b, "staging")
    assert rollback(ws, "staging", config=checked_in).release_id == a  # it was accepted when it was active

    bad = tmp_path / "targets.yaml"
    bad.write_text(
        "schema: ragpipe.targets/v1\ndefault_target: staging\n"
        "targets:\n  staging: {approval_required: false, auto_activate: false, gate_policies: [missing.yaml]}\n"
    )
    with pytest.raises(ReleaseError) as exc:
        activate(ws, a, "staging", config=load_targets(bad))
    assert str(exc.value).startswith(
        f"{bad}: target 'staging': gate policy 'missing.yaml': {tmp_path / 'missing.yaml'}: cannot read gate policy"
    )
