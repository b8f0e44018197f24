"""Forgeries of the gate decision a release binds (``ragpipe.release.gate_evidence``): each is
refused by activation with its exact reason, and the pointer is left as it was. Paired decisions
with a real comparison are covered by ``test_chain_dagster.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragpipe.experiment.arms import ArmRef
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.release.activation import activate
from ragpipe.release.gate_evidence import evidence_path, gate_problems, publish_gate_evidence
from ragpipe.release.manifest import GateRef, load_manifest, publish_manifest
from ragpipe.release.pointer import read_pointer
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe_tests.release_fixtures import H, bundle_of, decision_for, fresh_ws, publish


@pytest.fixture(scope="module")
def bundle(built_workspace) -> Path:
    return bundle_of(built_workspace)


@pytest.fixture
def ws(bundle: Path, tmp_path: Path):
    return fresh_ws(tmp_path, bundle)


def refusal(ws, release_id: str) -> str:
    with pytest.raises(ReleaseError) as exc:
        activate(ws, release_id, "staging")
    assert read_pointer(ReleaseStore(ws), "staging") is None
    return str(exc.value).removeprefix(f"release {release_id} failed verification; not activated:\n  ")


def test_a_published_release_keeps_a_decision_that_verifies(ws, bundle: Path):
    rid = publish(ws, bundle)
    manifest = load_manifest(ReleaseStore(ws), rid)
    assert gate_problems(ReleaseStore(ws), manifest) == []
    kept = json.loads(evidence_path(ReleaseStore(ws), manifest.gate.decision_id).read_bytes())
    assert kept == {"comparison": None, "decision": decision_for(manifest).as_json()}
    assert activate(ws, rid, "staging").generation == 1


def test_edits_of_the_kept_decision_are_refused(ws, bundle: Path):
    store = ReleaseStore(ws)
    rid = publish(ws, bundle)
    manifest = load_manifest(store, rid)
    path = evidence_path(store, manifest.gate.decision_id)
    where = f"gate decision {manifest.gate.decision_id}"
    original = path.read_bytes()

    path.unlink()
    assert refusal(ws, rid) == f"{where}: {path} is missing"

    kept = json.loads(original)
    kept["decision"]["eligible"] = False  # the ID is not recomputed
    path.write_bytes(canonical_bytes(kept) + b"\n")
    assert refusal(ws, rid).startswith(f"{where}: {path}: decision_id {manifest.gate.decision_id} is not its content ID sha256:")

    path.write_bytes(original.replace(b"\n", b" \n"))
    assert refusal(ws, rid) == f"{where}: {path}: its bytes are not the canonical rendering of its content (edited)"

    path.write_bytes(b'{"decision": {}}\n')
    assert refusal(ws, rid) == f"{where}: {path}: expected exactly the keys comparison, decision"

    path.write_bytes(b"\xff\n")
    assert refusal(ws, rid).startswith(f"{where}: {path}: 'utf-8' codec can't decode byte 0xff")

    # A different, self-consistent decision (recomputed ID) put under the release's file name.
    other = decision_for(manifest).model_copy(update={"reasons": ("forged",)})
    path.write_bytes(canonical_bytes({"comparison": None, "decision": other.as_json()}) + b"\n")
    assert refusal(ws, rid) == f"{where}: ID {other.decision_id} is not the release's {manifest.gate.decision_id}"

    path.write_bytes(original)
    assert activate(ws, rid, "staging").generation == 1


def test_a_manifest_that_misstates_its_decision_is_refused(ws, bundle: Path):
    """Manifests published with a real decision's ID but other claims (each a new release ID):
    the decision says what it says, whatever the manifest claims."""
    store = ReleaseStore(ws)
    base = load_manifest(store, publish(ws, bundle, eligible=False, phase="target"))
    decision = base.gate.decision_id
    where = f"gate decision {decision}"

    def release(**update) -> str:
        return publish_manifest(store, base.model_copy(update=update))[0]

    claims_eligible = release(gate=GateRef(decision_id=decision, eligible=True, decisive_phase=None))
    assert refusal(ws, claims_eligible) == (f"{where}: eligibility False is not the release's True\n"
                                            f"  {where}: decisive phase target is not the release's None")
    other_policy = release(gate_policy_id="sha256:" + "2" * 64, gate=GateRef(decision_id=decision, eligible=True, decisive_phase=None))
    assert refusal(ws, other_policy).endswith(f"{where}: gate policy {H} is not the release's sha256:{'2' * 64}")
    other_run = release(evaluation=base.evaluation.model_copy(update={"run_id": "another-run"}),
                        gate=GateRef(decision_id=decision, eligible=True, decisive_phase=None))
    assert f"{where}: challenger run ({base.evaluation.run_id!r}, " in refusal(ws, other_run)


def test_publication_refuses_a_decision_that_does_not_verify(ws, bundle: Path):
    store = ReleaseStore(ws)
    manifest = load_manifest(store, publish(ws, bundle))
    decision = decision_for(manifest).as_json()
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, {**decision, "eligible": False}, None)
    assert str(exc.value).startswith(f"gate decision {decision['decision_id']}: decision_id {decision['decision_id']} is not its content ID")
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, decision, {"comparison_id": H})
    assert str(exc.value).startswith(f"gate decision {decision['decision_id']}: not a comparison: ")
    # The kept file is named by the decision ID and never replaced by other bytes.
    path = evidence_path(store, decision["decision_id"])
    path.write_bytes(path.read_bytes().replace(b'"reasons":[]', b'"reasons":["x"]'))
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, decision, None)
    assert str(exc.value) == f"{path}: holds other bytes than gate decision {decision['decision_id']} (edited)"


def test_a_paired_decision_needs_its_comparison(ws, bundle: Path):
    store = ReleaseStore(ws)
    manifest = load_manifest(store, publish(ws, bundle))
    incumbent = ArmRef(run_id="incumbent-run", spec_id=H, ledger_head=H)
    paired = decision_for(manifest).model_copy(update={"mode": "paired", "comparison_id": H, "incumbent": incumbent})
    with pytest.raises(ReleaseError) as exc:
        publish_gate_evidence(store, paired.as_json(), None)
    assert str(exc.value) == f"gate decision {paired.decision_id}: decision names comparison {H}, the file holds none"
