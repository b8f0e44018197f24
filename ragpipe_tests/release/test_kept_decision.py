"""Forgeries of the gate decision a release binds (``ragpipe.release.kept_decision``): each is
refused with its exact reason, and activation leaves the pointer as it was. The decisions are real
(``decide`` / ``gate_runs`` on real evaluation runs of the session's bundle); the Dagster chain's
kept decisions are covered by ``test_chain_dagster.py``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.comparison import Comparison
from ragpipe.experiment.decision import decide
from ragpipe.experiment.gate_policy import policy_document
from ragpipe.experiment.gating import gate_runs
from ragpipe.experiment.statistics import ComparisonSpec
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import content_id
from ragpipe.release.activation import activate
from ragpipe.release.bound_run import load_run
from ragpipe.release.kept_decision import evidence_path, gate_problems, publish_gate_evidence
from ragpipe.release.manifest import GateRef, ReleaseManifest, load_manifest, publish_manifest
from ragpipe.release.pointer import read_pointer
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe_tests.support.release_fixtures import (
    H,
    evaluation_arm,
    fixture_policy,
    gate_of,
    manifest_for,
    new_evaluation_run,
    publish,
)

# Fixture releases are gated under fixture policies (release_fixtures.fixture_policy): the targets accept them.
pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


def refusal(ws, release_id: str) -> str:
    with pytest.raises(ReleaseError) as exc:
        activate(ws, release_id, "staging")
    assert read_pointer(ReleaseStore(ws), "staging") is None
    return str(exc.value).removeprefix(f"release {release_id} failed verification; not activated:\n  ")


def problems(ws, manifest: ReleaseManifest) -> list[str]:
    return gate_problems(
        ReleaseStore(ws), manifest, evaluation_arm_of(ws, manifest), lambda run_id: load_run(ws, run_id)
    )


def evaluation_arm_of(ws, manifest: ReleaseManifest):
    return load_arm(ws.home / "evaluations" / manifest.evaluation.run_id)


def keep(ws, decision: dict, policy, comparison: dict | None = None) -> str:
    """Write a kept file for ``decision`` as published (canonical), bypassing the publication checks."""
    path = evidence_path(ReleaseStore(ws), decision["decision_id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        canonical_bytes({"comparison": comparison, "decision": decision, "policy": policy_document(policy)}) + b"\n"
    )
    return decision["decision_id"]


def redo_id(obj: dict, id_key: str, domain: str) -> dict:
    """``obj`` with ``id_key`` recomputed over the rest, as a forger would."""
    body = {k: v for k, v in obj.items() if k != id_key}
    return {id_key: content_id(domain, 1, body), **body}


def test_a_published_release_keeps_a_decision_that_is_made_again(ws, bundle: Path):
    rid = publish(ws, bundle)
    manifest = load_manifest(ReleaseStore(ws), rid)
    policy, decision = gate_of(bundle, None)
    kept = json.loads(evidence_path(ReleaseStore(ws), manifest.gate.decision_id).read_bytes())
    assert kept == {"comparison": None, "decision": decision.as_json(), "policy": policy_document(policy)}
    assert problems(ws, manifest) == []
    assert activate(ws, rid, "staging").generation == 1


def test_edits_of_the_kept_file_are_refused(ws, bundle: Path):
    store = ReleaseStore(ws)
    rid = publish(ws, bundle)
    manifest = load_manifest(store, rid)
    path = evidence_path(store, manifest.gate.decision_id)
    where = f"gate decision {manifest.gate.decision_id}"
    original = path.read_bytes()

    path.unlink()
    assert refusal(ws, rid) == f"{where}: {path} is missing"
    path.mkdir()
    assert refusal(ws, rid) == f"{where}: {path}: not a regular file (a folder)"
    path.rmdir()
    path.symlink_to(ws.home / "elsewhere.json")  # never followed, whatever it names
    (ws.home / "elsewhere.json").write_bytes(original)
    assert refusal(ws, rid) == f"{where}: {path}: a symbolic link (never followed)"
    path.unlink()

    kept = json.loads(original)
    kept["decision"]["eligible"] = False  # the ID is not recomputed
    path.write_bytes(canonical_bytes(kept) + b"\n")
    assert refusal(ws, rid).startswith(
        f"{where}: {path}: decision_id {manifest.gate.decision_id} is not its content ID sha256:"
    )

    kept = json.loads(original)
    kept["decision"]["human_apply_required"] = 1  # pydantic would read it as True: same ID, other bytes
    path.write_bytes(canonical_bytes(kept) + b"\n")
    assert (
        refusal(ws, rid)
        == f"{where}: {path}: the gate decision is not in its canonical form (a value was changed in type or format)"
    )

    path.write_bytes(original.replace(b"\n", b" \n"))
    assert refusal(ws, rid) == f"{where}: {path}: its bytes are not the canonical rendering of its content (edited)"
    path.write_bytes(b'{"decision": {}}\n')
    assert refusal(ws, rid) == f"{where}: {path}: expected exactly the keys comparison, decision, policy"
    path.write_bytes(b"\xff\n")
    assert refusal(ws, rid).startswith(f"{where}: {path}: 'utf-8' codec can't decode byte 0xff")

    kept = json.loads(original)
    kept["policy"]["regression"]["overall"]["recall@100"] = 10**400  # beyond any float
    path.write_bytes(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    assert refusal(ws, rid).startswith(f"{where}: {path}: not a gate policy: ")

    kept = json.loads(original)
    kept["policy"]["coverage"]["min_cases"] = 0
    path.write_bytes(canonical_bytes(kept) + b"\n")
    assert (
        refusal(ws, rid)
        == f"{where}: {path}: not a gate policy: the kept gate policy:1: coverage.min_cases: must be an integer >= 1, got 0"
    )

    # Another real, self-consistent decision (the coverage-ineligible one) under this file name.
    _, other = gate_of(bundle, "coverage")
    path.write_bytes(canonical_bytes({**json.loads(original), "decision": other.as_json()}) + b"\n")
    assert (
        refusal(ws, rid)
        == f"{where}: {path}: the kept policy is {fixture_policy(None).policy_id}, the decision's {other.policy_id}"
    )

    path.write_bytes(original)
    assert activate(ws, rid, "staging").generation == 1


def test_an_ineligible_decision_flipped_to_eligible_is_made_again_and_refused(ws, bundle: Path):
    """The forgery the ID checks alone let through: a real ineligible decision with eligible set,
    its ID recomputed, kept under that ID, and a manifest naming it (a new release ID)."""
    store = ReleaseStore(ws)
    policy, real = gate_of(bundle, "coverage")
    forged = redo_id(
        {**real.as_json(), "eligible": True, "decisive_phase": None, "reasons": []}, "decision_id", "gate-decision"
    )
    keep(ws, forged, policy)
    base = manifest_for(bundle, eligible=False, phase="coverage")
    # the forger keeps the manifest's change and incumbent (bootstrap, none): only eligibility is forged
    gate = base.gate.model_copy(update={"decision_id": forged["decision_id"], "eligible": True, "decisive_phase": None})
    manifest = base.model_copy(update={"gate": gate})
    rid = publish_manifest(store, manifest)[0]
    assert refusal(ws, rid) == (
        f"gate decision {forged['decision_id']}: made again from its runs and policy it is {real.decision_id} "
        "(eligible False, decisive phase coverage), not the kept one"
    )


def test_a_paired_decision_is_made_again_from_both_runs(ws, bundle: Path):
    store = ReleaseStore(ws)
    incumbent_id = new_evaluation_run(ws.bundles / bundle.name, ws.home / "evaluations")  # same spec, another run
    incumbent = load_run(ws, incumbent_id)
    challenger = evaluation_arm(bundle)
    policy = fixture_policy(None)
    decision, comparison = gate_runs(policy, challenger, incumbent, ComparisonSpec())
    assert (decision.mode, decision.eligible, decision.decisive_phase) == ("paired", False, "target")  # identical runs
    publish_gate_evidence(store, decision.as_json(), comparison.as_json(), policy)
    base = manifest_for(bundle)
    manifest = base.model_copy(
        update={
            "comparison_id": comparison.comparison_id,
            "gate_policy_id": policy.policy_id,
            "gate": GateRef(decision_id=decision.decision_id, eligible=False, decisive_phase="target"),
        }
    )
    assert problems(ws, manifest) == []
    where = f"gate decision {decision.decision_id}"

    # Fabricated statistics, every ID recomputed: the comparison of the real runs differs.
    forged_c = comparison.as_json()
    forged_c["slices"]["all"]["metrics"]["ndcg@10"]["stats"].update(mean=0.9, ci_low=0.8, ci_high=1.0)
    forged_c = redo_id(forged_c, "comparison_id", "comparison")
    forged_d = redo_id(
        {**decision.as_json(), "comparison_id": forged_c["comparison_id"]}, "decision_id", "gate-decision"
    )
    keep(ws, forged_d, policy, forged_c)
    forged = manifest.model_copy(
        update={
            "comparison_id": forged_c["comparison_id"],
            "gate": GateRef(decision_id=forged_d["decision_id"], eligible=False, decisive_phase="target"),
        }
    )
    assert problems(ws, forged) == [
        f"gate decision {forged_d['decision_id']}: the comparison of its runs differs from the kept {forged_c['comparison_id']} "
        "at slices.all.metrics.ndcg@10.stats.ci_high (statistics differ)"
    ]

    def variant(edit) -> ReleaseManifest:
        """``manifest`` over a kept comparison changed by ``edit`` (IDs recomputed, as a forger would)."""
        c = comparison.as_json()
        edit(c)
        c = redo_id(c, "comparison_id", "comparison")
        d = decide(
            policy, Comparison.model_validate({k: v for k, v in c.items() if k != "comparison_id"}), challenger
        ).as_json()
        keep(ws, d, policy, c)
        return manifest.model_copy(
            update={
                "comparison_id": c["comparison_id"],
                "gate": GateRef(decision_id=d["decision_id"], eligible=False, decisive_phase="target"),
            }
        )

    def nudge(factor: float):
        def edit(c: dict) -> None:  # identical runs: every delta is 0, so a float that is not
            c["challenger"]["latency_p95_ms"] *= factor

        return edit

    # Another scipy may move a bootstrap bound in its last bits: floats equal to 1e-9 are equal.
    assert problems(ws, variant(nudge(1 + 1e-12))) == []
    assert problems(ws, variant(nudge(1 + 1e-6)))[0].endswith("at challenger.latency_p95_ms (statistics differ)")

    def reseed(c: dict) -> None:
        c["spec"]["seed"] = 12345

    (message,) = problems(ws, variant(reseed))
    assert message.endswith(
        f"its comparison uses {ComparisonSpec(seed=12345).as_json()}, not the chain's comparison spec {ComparisonSpec().as_json()}"
    )

    # The incumbent run the decision names must exist and be the one it names.
    other = ws.home / "evaluations" / incumbent_id
    shutil.move(other, other.with_name("moved"))
    shutil.copytree(ws.home / "evaluations" / challenger.run_id, other)  # another run in its folder
    assert problems(ws, manifest) == [
        f"{where}: its incumbent run {incumbent_id}: the folder holds run {challenger.run_id} "
        f"with ledger head {challenger.ledger_head}, not the decision's {incumbent.ledger_head}"
    ]
    shutil.rmtree(other)
    assert problems(ws, manifest) == [f"{where}: its incumbent run {incumbent_id}: {other} is missing"]


def test_a_manifest_that_misstates_its_decision_is_refused(ws, bundle: Path):
    """Manifests naming a real decision's ID but claiming otherwise (each a new release ID)."""
    store = ReleaseStore(ws)
    base = load_manifest(store, publish(ws, bundle, eligible=False, phase="target"))
    decision = base.gate.decision_id
    where = f"gate decision {decision}"

    def release(**update) -> str:
        return publish_manifest(store, base.model_copy(update=update))[0]

    # each claim keeps the decision's change and incumbent (bootstrap, none): only what it names differs
    eligible_claim = base.gate.model_copy(update={"eligible": True, "decisive_phase": None})
    claims_eligible = release(gate=eligible_claim)
    assert refusal(ws, claims_eligible) == (
        f"{where}: eligibility False is not the release's True\n"
        f"  {where}: decisive phase target is not the release's None"
    )
    # A policy the target does not accept is refused before anything is verified; the kept
    # decision's own link to the policy is checked as well.
    other_policy = base.model_copy(update={"gate_policy_id": H, "gate": eligible_claim})
    rid = publish_manifest(store, other_policy)[0]
    with pytest.raises(ReleaseError) as exc:
        activate(ws, rid, "staging")
    assert str(exc.value).startswith(
        f"release {rid} was gated under policy {H}, which target 'staging' does not accept (it accepts default = sha256:"
    )
    assert problems(ws, other_policy)[-1] == f"{where}: gate policy {base.gate_policy_id} is not the release's {H}"


def test_publication_refuses_what_does_not_verify(ws, bundle: Path):
    store = ReleaseStore(ws)
    policy, decision = gate_of(bundle, None)
    doc = decision.as_json()
    did = doc["decision_id"]
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, {**doc, "eligible": False}, None, policy)
    assert str(exc.value).startswith(f"gate decision {did}: cannot keep it: decision_id {did} is not its content ID")
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, doc, {"comparison_id": H}, policy)
    assert str(exc.value).startswith(f"gate decision {did}: cannot keep it: not a comparison: ")
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, doc, None, fixture_policy("coverage"))
    assert (
        str(exc.value)
        == f"gate decision {did}: cannot keep it: the kept policy is {fixture_policy('coverage').policy_id}, the decision's {policy.policy_id}"
    )
    # A v2 decision's mode and change kind agree: a paired decision keeping the bootstrap change is no decision.
    paired = redo_id({**doc, "mode": "paired", "comparison_id": H}, "decision_id", "gate-decision")
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, paired, None, policy)
    assert str(exc.value) == (
        f"gate decision {paired['decision_id']}: cannot keep it: not a gate decision: 1 problem, first: "
        "Value error, a paired decision cannot be a bootstrap"
    )
    # a paired decision recording a refresh (as paired v2 decisions do) names a comparison the file lacks
    refresh = {"kind": "refresh", "incumbent_release": H, "differs": []}
    paired = redo_id({**doc, "mode": "paired", "comparison_id": H, "change": refresh}, "decision_id", "gate-decision")
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, paired, None, policy)
    assert (
        str(exc.value)
        == f"gate decision {paired['decision_id']}: cannot keep it: the decision names comparison {H}, the file holds none"
    )
    # The kept file is named by the decision ID and never replaced by other bytes.
    path = publish_gate_evidence(store, doc, None, policy)
    assert publish_gate_evidence(store, doc, None, policy) == path  # same bytes: a no-op
    path.write_bytes(path.read_bytes().replace(b'"reasons":[]', b'"reasons":["x"]'))
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, doc, None, policy)
    assert str(exc.value) == f"gate decision {did}: cannot keep it: {path}: holds other bytes (edited)"
