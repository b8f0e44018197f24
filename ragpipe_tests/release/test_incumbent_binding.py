"""A gate decision binds the release it was made against (``activation.incumbent_refusal``): it
activates a release only where that release is live — a bootstrap decision only where nothing is —
checked inside the target's lock; rollback is not subject to it; a decision made before decisions
recorded their incumbent activates nowhere new; a manifest cannot misstate its decision's change.
The decisions are real (``decide`` / ``gate_runs`` on real evaluation runs of the session's bundle)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.change import Change
from ragpipe.experiment.decision import decide
from ragpipe.experiment.gating import gate_runs
from ragpipe.experiment.statistics import ComparisonSpec
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate, verify_release
from ragpipe.release.history import read_history
from ragpipe.release.kept_decision import publish_gate_evidence
from ragpipe.release.live import live_release
from ragpipe.release.manifest import load_manifest, publish_manifest
from ragpipe.release.pointer import read_pointer
from ragpipe.release.rollback import rollback
from ragpipe.release.status import EligibleRelease, eligible_releases
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe_tests.support.release_fixtures import (
    evaluation_of,
    fixture_policy,
    forge_activation,
    manifest_of,
    new_evaluation_run,
    publish,
    race,
)

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")

REBUILD = "its decision says nothing about replacing that (build the revision again to gate it against what is live)"


def refused(ws: Workspace, release_id: str, target: str = "staging") -> str:
    with pytest.raises(ReleaseError) as exc:
        activate(ws, release_id, target)
    return str(exc.value)


def target_files(ws: Workspace, target: str = "staging") -> dict[str, bytes]:
    folder = ReleaseStore(ws).target_dir(target)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()} if folder.is_dir() else {}


def test_an_ineligible_refresh_re_gated_as_a_bootstrap_is_refused_where_a_release_is_live(ws, bundle: Path):
    """The forgery that used to work: r2, gated against r1, is ineligible; its own run, gated again
    on its own (a real bootstrap decision, every digest valid), is eligible. The forged release
    verifies completely, but its decision was made against nothing and r1 is live."""
    store = ReleaseStore(ws)
    r1 = publish(ws, bundle, "r1")
    r2 = publish(ws, bundle, "r2", against=r1, eligible=False, phase="coverage")
    activate(ws, r1, "staging")
    real = load_manifest(store, r2)
    assert (real.gate.change, real.gate.incumbent, real.gate.eligible) == ("refresh", r1, False)
    assert refused(ws, r2) == (
        f"release {r2} is not eligible for activation (gate decision {real.gate.decision_id}: decisive phase coverage)"
    )

    arm = load_arm(ws.home / "evaluations" / real.evaluation.run_id)
    policy = fixture_policy(None)
    bootstrap = decide(policy, None, arm, Change(kind="bootstrap", incumbent_release=None))
    assert bootstrap.eligible
    publish_gate_evidence(store, bootstrap.as_json(), None, policy)
    manifest = manifest_of(bundle, arm, policy, bootstrap, "r2")
    assert (manifest.gate.change, manifest.gate.incumbent) == ("bootstrap", None)
    forged = publish_manifest(store, manifest)[0]
    assert verify_release(ws, manifest) == []  # a real decision on a real run: nothing to catch there

    before = target_files(ws)
    assert refused(ws, forged) == (
        f"release {forged} was gated without an incumbent (bootstrap), but target 'staging' serves release {r1}: "
        + REBUILD
    )
    assert target_files(ws) == before  # pointer and history unchanged: nothing was written
    assert read_pointer(store, "staging").release_id == r1
    assert EligibleRelease(
        forged,
        "r2",
        "gated against another release",
        f"was gated without an incumbent (bootstrap), but target 'staging' serves release {r1}: {REBUILD}",
    ) in eligible_releases(ws, "staging")


def test_a_manifest_cannot_misstate_the_change_its_decision_records(ws, bundle: Path):
    """The manifest's change and incumbent must be the kept decision's: a bootstrap decision
    claimed as a refresh against the live release, and a refresh claimed as a bootstrap (to
    activate it where nothing is live), are refused at verification with a rejected record."""
    store = ReleaseStore(ws)
    r1 = publish(ws, bundle, "r1")
    r2 = publish(ws, bundle, "r2", against=r1)
    activate(ws, r1, "staging")
    refresh = load_manifest(store, r2)

    arm = load_arm(ws.home / "evaluations" / refresh.evaluation.run_id)
    policy = fixture_policy(None)
    bootstrap = decide(policy, None, arm, Change(kind="bootstrap", incumbent_release=None))
    publish_gate_evidence(store, bootstrap.as_json(), None, policy)
    base = manifest_of(bundle, arm, policy, bootstrap, "r2")
    claimed = base.model_copy(update={"gate": base.gate.model_copy(update={"change": "refresh", "incumbent": r1})})
    as_refresh = publish_manifest(store, claimed)[0]
    where = f"gate decision {bootstrap.decision_id}"
    assert refused(ws, as_refresh) == (
        f"release {as_refresh} failed verification; not activated:\n"
        f"  {where}: change bootstrap is not the release's refresh\n"
        f"  {where}: incumbent release None is not the release's {r1}"
    )
    state, records = read_history(store, "staging")
    assert (records[-1].kind, records[-1].payload["release_id"], state.active) == ("rejected", as_refresh, r1)

    unclaimed = refresh.model_copy(
        update={"gate": refresh.gate.model_copy(update={"change": "bootstrap", "incumbent": None})}
    )
    as_bootstrap = publish_manifest(store, unclaimed)[0]
    where = f"gate decision {refresh.gate.decision_id}"
    assert refused(ws, as_bootstrap, "production") == (  # production serves nothing
        f"release {as_bootstrap} failed verification; not activated:\n"
        f"  {where}: change refresh is not the release's bootstrap\n"
        f"  {where}: incumbent release {r1} is not the release's None"
    )
    assert read_pointer(store, "production") is None


def test_a_refresh_decision_whose_releases_make_it_an_experiment_is_refused(ws, bundle: Path):
    """The change is computed again from the releases the decision names: a manifest binding r2's
    refresh decision but serving another answer plan than r1 is an experiment against r1."""
    store = ReleaseStore(ws)
    r1 = publish(ws, bundle, "r1")
    r2 = load_manifest(store, publish(ws, bundle, "r2", against=r1))
    activate(ws, r1, "staging")
    other_plan = "sha256:" + "2" * 64
    rid = publish_manifest(store, r2.model_copy(update={"answer_plan_id": other_plan}))[0]
    assert refused(ws, rid) == (
        f"release {rid} failed verification; not activated:\n"
        f"  gate decision {r2.gate.decision_id}: it records the change refresh against {r1}, "
        f"but the releases it names give experiment (answer_plan_id differs) against {r1}"
    )
    assert read_pointer(store, "staging").release_id == r1


def test_a_release_activates_only_where_its_incumbent_is_live_and_rollback_is_exempt(ws, bundle: Path):
    store = ReleaseStore(ws)
    r1 = publish(ws, bundle, "r1")
    r2 = publish(ws, bundle, "r2", against=r1)
    r3 = publish(ws, bundle, "r3", against=r2)
    assert (
        refused(ws, r2)
        == f"release {r2} was gated against release {r1}, but target 'staging' serves nothing: {REBUILD}"
    )
    assert read_pointer(store, "staging") is None and read_history(store, "staging")[1] == ()  # nothing written
    activate(ws, r1, "staging")
    assert refused(ws, r3) == (
        f"release {r3} was gated against release {r2}, but target 'staging' serves release {r1}: {REBUILD}"
    )
    assert activate(ws, r2, "staging").generation == 2
    assert activate(ws, r3, "staging").generation == 3
    # rollback returns to a previously active release whatever its decision was made against
    assert rollback(ws, "staging").release_id == r2  # gated against r1; r3 was live
    assert rollback(ws, "staging").release_id == r1  # bootstrap; r2 was live
    assert rollback(ws, "staging", to=r3).release_id == r3  # gated against r2; r1 was live
    # activating anew (not a rollback) is subject to it: r1's bootstrap decision says nothing about replacing r3
    assert refused(ws, r1) == (
        f"release {r1} was gated without an incumbent (bootstrap), but target 'staging' serves release {r3}: {REBUILD}"
    )
    state, _ = read_history(store, "staging")
    assert [(g, rid, action) for g, rid, action in state.activations] == [
        (1, r1, "activate"),
        (2, r2, "activate"),
        (3, r3, "activate"),
        (4, r2, "rollback"),
        (5, r1, "rollback"),
        (6, r3, "rollback"),
    ]


def test_a_decision_that_recorded_no_incumbent_activates_nowhere_new(ws, bundle: Path):
    """A v1 decision (made before decisions recorded their change) says nothing about what it was
    made against: it activates on no target, not even one that serves nothing."""
    store = ReleaseStore(ws)
    run = next((ws.home / "evaluations").iterdir())
    arm, policy = load_arm(run), fixture_policy(None)
    v1 = decide(policy, None, arm)
    assert v1.change is None and v1.eligible
    publish_gate_evidence(store, v1.as_json(), None, policy)
    manifest = manifest_of(bundle, arm, policy, v1, "r1")
    assert "change" not in manifest.gate.model_dump()  # a v1 manifest keeps its release ID
    rid = publish_manifest(store, manifest)[0]
    assert verify_release(ws, manifest) == []
    assert refused(ws, rid) == (
        f"release {rid} was gated before decisions recorded the release they were made against, so it cannot be "
        "activated anew: build its revision again (ragpipe build) to gate it against what 'staging' serves"
    )
    assert read_pointer(store, "staging") is None and read_history(store, "staging")[1] == ()


RACER = """
import json, sys, time
from pathlib import Path
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate
from ragpipe.release.store import ReleaseError

ws, rid, ready, go = Workspace(Path(sys.argv[1])), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
ready.touch()
while not go.exists():
    time.sleep(0.002)
try:
    result = activate(ws, rid, "staging", by=ready.name)
    print(json.dumps({"release_id": rid, "generation": result.generation, "refusal": None}))
except ReleaseError as exc:
    print(json.dumps({"release_id": rid, "generation": None, "refusal": str(exc)}))
"""


def test_racing_releases_gated_against_the_live_one_activate_one_the_others_are_refused(
    ws, bundle: Path, tmp_path: Path
):
    """Four processes activate four releases gated against r0, the live one, at once: the first to
    take the lock replaces r0; each other finds, inside the lock, that r0 is no longer live."""
    n = 4
    r0 = publish(ws, bundle, "r0")
    activate(ws, r0, "staging")
    releases = [publish(ws, bundle, f"r{i}", against=r0) for i in range(1, n + 1)]  # one run: revisions differ
    results = race(RACER, tmp_path, [[str(ws.home), rid] for rid in releases])
    (winner,) = [r["release_id"] for r in results if r["generation"] is not None]
    assert [r["generation"] for r in results if r["generation"] is not None] == [2]
    for r in results:
        if r["release_id"] != winner:
            assert r["refusal"] == (
                f"release {r['release_id']} was gated against release {r0}, but target 'staging' serves release "
                f"{winner}: {REBUILD}"
            )
    state, records = read_history(ReleaseStore(ws), "staging")
    assert [(rec.kind, rec.payload["release_id"]) for rec in records] == [
        ("intent", r0),
        ("observed", r0),
        ("intent", winner),
        ("observed", winner),
    ]
    assert (state.generation, state.active, read_pointer(ReleaseStore(ws), "staging").release_id) == (2, winner, winner)


def test_a_forged_history_past_the_incumbent_rule_is_not_served(ws, bundle: Path):
    """Live resolution applies activation's rule to the activation that made the release live: r2,
    gated against r1, forged live over r0 (history and pointer agreeing, every hash recomputed)."""

    r0 = publish(ws, bundle, "r0")
    r1 = publish(ws, bundle, "r1")
    r2 = publish(ws, bundle, "r2", against=r1)
    activate(ws, r0, "staging")
    assert (
        refused(ws, r2)
        == f"release {r2} was gated against release {r1}, but target 'staging' serves release {r0}: {REBUILD}"
    )
    forge_activation(ws, r2)
    with pytest.raises(ReleaseError) as caught:
        live_release(ws, "staging")
    assert str(caught.value) == (
        f"target 'staging': release {r2} was gated against release {r1}, but target 'staging' serves release {r0}: "
        f"{REBUILD}"
    )


def test_the_incumbent_arm_is_the_incumbent_release_s_own_run_where_it_pairs(ws, bundle: Path):
    """Another run of the incumbent's bundle and plan (same coordinates) cannot stand in for the
    run its release binds: a decision paired with it is refused, whatever its outcome."""

    store = ReleaseStore(ws)
    r1 = publish(ws, bundle, "r1")
    activate(ws, r1, "staging")
    bound = load_manifest(store, r1).evaluation.run_id
    # a third run of the same bundle, gated as a refresh against r1 with the second as the incumbent arm
    other = evaluation_of(bundle, second=True)

    shutil.copytree(other, ws.home / "evaluations" / other.name, dirs_exist_ok=True)

    third = new_evaluation_run(ws.bundles / bundle.name, ws.home / "evaluations")
    assert len({bound, other.name, third}) == 3
    policy = fixture_policy(None)
    challenger = load_arm(ws.home / "evaluations" / third)
    change = Change(kind="refresh", incumbent_release=r1)
    decision, comparison = gate_runs(policy, challenger, load_arm(other), ComparisonSpec(), change)
    assert decision.eligible
    publish_gate_evidence(store, decision.as_json(), comparison.as_json(), policy)
    manifest = manifest_of(bundle, challenger, policy, decision, "r2").model_copy(
        update={"comparison_id": comparison.comparison_id}
    )
    rid = publish_manifest(store, manifest)[0]
    assert verify_release(ws, manifest) == [
        f"gate decision {decision.decision_id}: it pairs run {other.name} as the incumbent, not the incumbent "
        f"release's own run {bound}, which pairs as it is: gate the revision again (ragpipe build)"
    ]
    assert refused(ws, rid).startswith(f"release {rid} failed verification; not activated:")
