"""Shared helpers of the release tests: a real small bundle and a real completed evaluation run of
it placed in fresh workspaces, manifests binding both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.runner import new_run_id, run_evaluation
from ragpipe.evaluation.suite import Case, Suite
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.arms import ArmRun
from ragpipe.experiment.change import Change
from ragpipe.experiment.decision import Decision, decide
from ragpipe.experiment.gate_policy import GatePolicy, load_policy, parse_policy, policy_document
from ragpipe.kernel.signatures import load_key_file, new_key_file, public_key_text
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import History, now_iso
from ragpipe.release.kept_decision import publish_gate_evidence
from ragpipe.release.manifest import ReleaseManifest, publish_manifest
from ragpipe.release.pointer import Pointer, write_pointer
from ragpipe.release.store import ReleaseStore
from ragpipe_tests.support.paths import REPO

H = "sha256:" + "1" * 64
BOOTSTRAP = Change(kind="bootstrap", incumbent_release=None)


def bundle_of(built_workspace) -> Path:
    ws, _ = built_workspace
    (src,) = [p for p in ws.bundles.iterdir() if not p.name.startswith(".")]
    return src


def evaluation_of(bundle: Path, plan=None, *, second: bool = False) -> Path:
    """A completed evaluation run of ``bundle`` (two cases: ``new_evaluation_run``, under ``plan`` —
    default: the default plan — when it is made), made once beside the bundle's workspace; its
    folder name is its run ID. ``second``: another run of the same bundle and cases (a paired
    decision needs two runs)."""
    root = bundle.parents[2] / ("release-evaluation-2" if second else "release-evaluation")
    if not root.is_dir():
        new_evaluation_run(bundle, root.with_name(root.name + ".tmp"), plan)
        root.with_name(root.name + ".tmp").rename(root)
    (run,) = root.iterdir()
    return run


HANDBOOK_CASES = [
    Case(id="goals", query="honest evaluation", target_level="document", judgments={"guide/intro.md": 1}),
    Case(id="keys", query="signing keys", target_level="document", judgments={"guide/intro.md": 1}),
]


def _cases_for(documents) -> list[Case]:
    """The handbook cases for a handbook bundle; for any other bundle, its first two public
    documents' titles as queries judging those documents (a run needs evaluable cases)."""
    if any(d.document_id == "guide/intro.md" for d in documents):
        return HANDBOOK_CASES
    public = [d for d in documents if "public" in d.access_scopes][:2]
    return [
        Case(id=f"title-{i}", query=d.title, target_level="document", judgments={d.document_id: 1})
        for i, d in enumerate(public)
    ]


def new_evaluation_run(bundle: Path, folder: Path, plan=None, cases=None, **spec_options) -> str:
    """Evaluate ``bundle`` on ``cases`` (default: two, ``_cases_for``; ``plan``, default: the
    default plan; ``spec_options`` such as scopes or answers for ``EvaluationSpec.build``) into
    ``folder/<run id>``; the run ID."""
    from ragpipe.retrieval.retriever import Retriever

    retriever = Retriever(bundle, plan=plan)
    cases = cases or _cases_for(retriever.bundle.tables.documents)
    try:
        spec = EvaluationSpec.build(
            Suite.of(cases, "release-suite"), retriever.plan, bundle, retriever.bundle_id, k=10, **spec_options
        )
        run_id = new_run_id()
        run_evaluation(spec, folder / run_id, run_id=run_id, retriever_factory=lambda _: retriever)
    finally:
        retriever.close()
    return run_id


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


# Bootstrap policies that decide the fixture run (two cases, one relevant document each) with
# each outcome: eligible, or ineligible on one phase. Everything else is the default policy.
PHASE_EDITS: dict[str | None, dict] = {
    None: {},
    "hard": {"hard": {"ndcg@10": {"max": 0.001}}},
    "coverage": {"coverage": {"min_cases": 100}},
    "target": {"bootstrap_floors": {"precision@10": 0.9}},  # one relevant document: precision@10 <= 0.1
    "cost": {"cost": {"max_bundle_bytes": 1}},  # a fact of the bundle's bytes, not a timing
}


def fixture_policy(phase: str | None) -> GatePolicy:
    doc = policy_document(load_policy())
    doc["coverage"]["min_cases"] = 1
    doc["bootstrap_floors"] = {"ndcg@10": 0.01, "recall@100": 0.01}
    for section, edits in PHASE_EDITS[phase].items():
        doc[section] = {**doc[section], **edits}
    return parse_policy(doc, f"fixture policy {phase}")


APPROVER = "alice"  # every fixture target lists her; her private key is <targets folder>/alice.pem


def fixture_targets(folder: Path, text: str | None = None) -> Path:
    """A targets file in ``folder`` (``text``, or the checked-in targets) whose every target also
    accepts the fixture policies, written beside it as policy files, and lists ``APPROVER`` with
    the key written beside it."""
    doc = yaml.safe_load(
        text if text is not None else (REPO / "ragpipe" / "specs" / "targets.yaml").read_text(encoding="utf-8")
    )
    names = []
    for phase in PHASE_EDITS:
        name = f"policy-{phase or 'eligible'}.yaml"
        (folder / name).write_text(
            yaml.safe_dump(policy_document(fixture_policy(phase)), sort_keys=False), encoding="utf-8"
        )
        names.append(name)
    key = folder / f"{APPROVER}.pem"
    public = new_key_file(key) if not key.exists() else public_key_text(load_key_file(key))
    for target in doc["targets"].values():
        target["gate_policies"] = ["default", *names]
        target["approvers"] = {APPROVER: public}
    path = folder / "targets.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def accepting_fixture_policies(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$RAGPIPE_TARGETS``: the checked-in targets, also accepting the fixture policies (the
    release tests gate a two-case run, which the default policy's 20-case minimum refuses)."""
    path = fixture_targets(tmp_path_factory.mktemp("targets"))
    monkeypatch.setenv("RAGPIPE_TARGETS", str(path))
    return path


def gate_of(bundle: Path, phase: str | None) -> tuple[GatePolicy, Decision]:
    """The real bootstrap decision on ``bundle``'s evaluation run that is eligible (``phase``
    None) or ineligible with decisive phase ``phase``, and its policy."""
    policy = fixture_policy(phase)
    decision = decide(policy, None, evaluation_arm(bundle), BOOTSTRAP)
    assert (decision.eligible, decision.decisive_phase) == (phase is None, phase), decision.reasons
    return policy, decision


def manifest_for(
    bundle: Path,
    revision: str = "r1",
    *,
    eligible: bool = True,
    phase: str | None = None,
    material_digest: str | None = None,
) -> ReleaseManifest:
    """A manifest of ``bundle`` binding its real evaluation run (``evaluation_of``) and the real
    decision ``gate_of`` makes on it (``publish`` keeps that decision in the store)."""
    assert eligible == (phase is None), "an ineligible fixture release names its decisive phase"
    policy, decision = gate_of(bundle, phase)
    return manifest_of(bundle, evaluation_arm(bundle), policy, decision, revision, material_digest)


def manifest_of(
    bundle: Path,
    arm: ArmRun,
    policy: GatePolicy,
    decision: Decision,
    revision: str = "r1",
    material_digest: str | None = None,
) -> ReleaseManifest:
    """The manifest of ``bundle`` binding the run ``arm`` and ``decision`` (made under ``policy``)."""
    bundle_id, material = bundle_ids(bundle)
    return ReleaseManifest(
        revision=revision,
        bundle_id=bundle_id,
        material_digest=material_digest or material,
        query_plan_id=arm.variant.plan_id,
        answer_plan_id=H,
        authorization_policy_id=H,
        gate_policy_id=policy.policy_id,
        evaluation={"spec_id": arm.spec_id, "run_id": arm.run_id, "ledger_head": arm.ledger_head},
        comparison_id=None,
        gate={
            "decision_id": decision.decision_id,
            "eligible": decision.eligible,
            "decisive_phase": decision.decisive_phase,
            "change": decision.change.kind if decision.change else None,
            "incumbent": decision.change.incumbent_release if decision.change else None,
        },
    )


def keep_decision(ws: Workspace, bundle: Path, phase: str | None = None) -> Path:
    """Keep ``gate_of(bundle, phase)``'s decision and policy in ``ws``'s release store."""
    policy, decision = gate_of(bundle, phase)
    return publish_gate_evidence(ReleaseStore(ws), decision.as_json(), None, policy)


def publish(ws: Workspace, bundle: Path, revision: str = "r1", *, against: str | None = None, **kw) -> str:
    """Publish a manifest as ``release_manifest`` does: its decision first, then the manifest.
    ``against``: a release published in ``ws`` the decision is made against (a refresh on the
    same bundle, paired with the other of ``bundle``'s two runs) instead of a bootstrap."""
    if against is not None:
        return publish_against(ws, bundle, against, revision, **kw)
    manifest = manifest_for(bundle, revision, **kw)
    keep_decision(ws, bundle, manifest.gate.decisive_phase)
    return publish_manifest(ReleaseStore(ws), manifest)[0]


def publish_against(
    ws: Workspace,
    bundle: Path,
    incumbent: str,
    revision: str = "r2",
    *,
    eligible: bool = True,
    phase: str | None = None,
    policy: GatePolicy | None = None,
) -> str:
    """A release of ``bundle`` gated as a refresh against the published release ``incumbent`` —
    the real paired decision on the incumbent's run and the other run of the bundle (copied into
    ``ws``), kept with its comparison — eligible, or ineligible on ``phase`` (not ``target``:
    two runs of one bundle never differ enough). ``policy``: the gate policy (default:
    ``fixture_policy(phase)``), for a bundle other than the incumbent's whose run is worse."""
    from ragpipe.experiment.gating import gate_runs
    from ragpipe.experiment.statistics import ComparisonSpec
    from ragpipe.release.manifest import load_manifest

    assert eligible == (phase is None) and phase != "target"
    store = ReleaseStore(ws)
    inc_run = load_manifest(store, incumbent).evaluation.run_id
    runs = [evaluation_of(bundle), evaluation_of(bundle, second=True)]
    run = next(r for r in runs if r.name != inc_run)
    if not (ws.home / "evaluations" / run.name).exists():
        shutil.copytree(run, ws.home / "evaluations" / run.name)
    policy, arm = policy or fixture_policy(phase), load_arm(run)
    change = Change(kind="refresh", incumbent_release=incumbent)
    decision, comparison = gate_runs(policy, arm, load_arm(ws.home / "evaluations" / inc_run), ComparisonSpec(), change)
    assert (decision.eligible, decision.decisive_phase) == (phase is None, phase), decision.reasons
    manifest = manifest_of(bundle, arm, policy, decision, revision).model_copy(
        update={"comparison_id": comparison.comparison_id}
    )
    publish_gate_evidence(store, decision.as_json(), comparison.as_json(), policy)
    return publish_manifest(store, manifest)[0]


def approve_signed(ws: Workspace, release_id: str, target: str, **kw):
    """``approve`` as ``APPROVER`` with her key beside ``$RAGPIPE_TARGETS`` (``fixture_targets``)."""
    from ragpipe.release.approvals import approve

    key = Path(os.environ["RAGPIPE_TARGETS"]).parent / f"{APPROVER}.pem"
    return approve(ws, release_id, target, by=APPROVER, key_file=key, **kw)


def run_script(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout
    )


def forge_activation(ws: Workspace, release_id: str, target: str = "staging", action: str = "activate") -> None:
    """Move ``target``'s pointer to ``release_id`` with a history that agrees with it — an intent
    (of ``action``) and an observed record, every hash recomputed — without any of the checks."""
    store = ReleaseStore(ws)
    with store.target_lock(target), History(store, target) as history:
        gen, previous = history.state.generation, history.state.active
        intent = history.append(
            "intent",
            {
                "action": action,
                "release_id": release_id,
                "from_generation": gen,
                "generation": gen + 1,
                "previous": previous,
                "by": "forger",
                "at": now_iso(),
            },
        )
        write_pointer(store, Pointer(target, release_id, gen + 1, previous, intent.hash))
        history.append(
            "observed",
            {
                "intent": intent.seq,
                "outcome": "active",
                "release_id": release_id,
                "generation": gen + 1,
                "reason": None,
                "at": now_iso(),
            },
        )


def race(script: str, tmp_path: Path, args: list[list[str]]) -> list[dict]:
    """Start one ``python -c script`` per argument list (each gets ``… READY GO`` appended), let
    them all go at once when every one is ready, and return each one's stdout as JSON, in order
    (each must exit 0)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *a, str(tmp_path / f"ready-{i}"), str(tmp_path / "go")],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, a in enumerate(args)
    ]
    while not all((tmp_path / f"ready-{i}").exists() for i in range(len(args))):
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs if p.poll() is not None]
        time.sleep(0.005)
    (tmp_path / "go").touch()
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        results.append(json.loads(stdout))
    return results
