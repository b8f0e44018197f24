"""Shared helpers of the release tests: a real small bundle and a real completed evaluation run of
it placed in fresh workspaces, manifests binding both."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.runner import new_run_id, run_evaluation
from ragpipe.evaluation.suite import Case, Suite
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.arms import ArmRef, ArmRun
from ragpipe.experiment.decision import Decision
from ragpipe.release.gate_evidence import publish_gate_evidence
from ragpipe.release.manifest import GateRef, ReleaseManifest, publish_manifest
from ragpipe.release.store import ReleaseStore
from ragpipe.stages.workspace import Workspace
from ragpipe_tests.conftest import REPO

H = "sha256:" + "1" * 64


def bundle_of(built_workspace) -> Path:
    ws, _ = built_workspace
    (src,) = [p for p in ws.bundles.iterdir() if not p.name.startswith(".")]
    return src


def evaluation_of(bundle: Path) -> Path:
    """A completed evaluation run of ``bundle`` (two handbook cases, default plan), made once beside
    the session's built workspace; its folder name is its run ID."""
    root = bundle.parents[2] / "release-evaluation"
    if not root.is_dir():
        from ragpipe.retrieval.service import Retriever

        cases = [
            Case(id="goals", query="honest evaluation", target_level="document", judgments={"guide/intro.md": 1}),
            Case(id="keys", query="signing keys", target_level="document", judgments={"guide/intro.md": 1}),
        ]
        retriever = Retriever(bundle)
        try:
            spec = EvaluationSpec.build(Suite.of(cases, "release-suite"), retriever.plan, bundle, retriever.bundle_id, k=10)
            run_id = new_run_id()
            run_evaluation(spec, root.with_name("release-evaluation.tmp") / run_id, run_id=run_id, retriever_factory=lambda _: retriever)
        finally:
            retriever.close()
        root.with_name("release-evaluation.tmp").rename(root)
    (run,) = root.iterdir()
    return run


def evaluation_arm(bundle: Path) -> ArmRun:
    return load_arm(evaluation_of(bundle))


def fresh_ws(root: Path, bundle: Path) -> Workspace:
    """A new workspace under ``root`` holding a copy of ``bundle`` (same directory name) and of its
    evaluation run (``evaluations/<run id>``)."""
    ws = Workspace(root / "home")
    ws.bundles.mkdir(parents=True)
    shutil.copytree(bundle, ws.bundles / bundle.name, symlinks=True)
    run = evaluation_of(bundle)
    shutil.copytree(run, ws.home / "evaluations" / run.name)
    return ws


def bundle_ids(bundle: Path) -> tuple[str, str]:
    m = json.loads((bundle / "manifest.json").read_text())
    return m["bundle_id"], m["material_digest"]


def decision_for(manifest: ReleaseManifest) -> Decision:
    """A bootstrap gate decision saying what ``manifest`` says (eligibility, phase, policy, run).
    Its checks are not those of a real gate: the release tests exercise what activation does with
    a decision, the gate tests how one is made."""
    ev = manifest.evaluation
    return Decision(
        mode="bootstrap", eligible=manifest.gate.eligible, decisive_phase=manifest.gate.decisive_phase, checks=(),
        reasons=() if manifest.gate.eligible else (f"{manifest.gate.decisive_phase}: fixture",),
        comparison_id=None, policy_id=manifest.gate_policy_id, incumbent=None,
        challenger=ArmRef(run_id=ev.run_id, spec_id=ev.spec_id, ledger_head=ev.ledger_head), human_apply_required=True,
    )


def with_decision(manifest: ReleaseManifest) -> ReleaseManifest:
    """``manifest`` naming the ID of ``decision_for(manifest)``."""
    gate = GateRef(decision_id=decision_for(manifest).decision_id, eligible=manifest.gate.eligible,
                   decisive_phase=manifest.gate.decisive_phase)
    return manifest.model_copy(update={"gate": gate})


def manifest_for(bundle: Path, revision: str = "r1", *, eligible: bool = True, phase: str | None = None,
                 material_digest: str | None = None) -> ReleaseManifest:
    """A manifest of ``bundle`` binding its real evaluation run (``evaluation_of``) and the decision
    of ``decision_for`` (``publish_release`` keeps that decision in the store)."""
    bundle_id, material = bundle_ids(bundle)
    arm = evaluation_arm(bundle)
    return with_decision(ReleaseManifest(
        revision=revision, bundle_id=bundle_id, material_digest=material_digest or material,
        query_plan_id=arm.variant.plan_id, answer_plan_id=H, authorization_policy_id=H, gate_policy_id=H,
        evaluation={"spec_id": arm.spec_id, "run_id": arm.run_id, "ledger_head": arm.ledger_head},
        comparison_id=None, gate={"decision_id": H, "eligible": eligible, "decisive_phase": phase},
    ))


def publish_release(ws: Workspace, manifest: ReleaseManifest) -> str:
    """Publish ``manifest`` as ``release_manifest`` does: its decision first, then the manifest."""
    publish_gate_evidence(ReleaseStore(ws), decision_for(manifest).as_json(), None)
    return publish_manifest(ReleaseStore(ws), manifest)[0]


def publish(ws: Workspace, bundle: Path, revision: str = "r1", **kw) -> str:
    return publish_release(ws, manifest_for(bundle, revision, **kw))


def run_script(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)
