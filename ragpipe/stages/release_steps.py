"""``release_manifest``: publish the release manifest of a revision's gated evaluation.

Reads the revision's latest ``gate_decision``, then the ``evaluation_run`` version it decided on
and the ``index_bundle`` version that run evaluated (each by the version its downstream recorded,
so a racing run of the same partition cannot pair this gate with another run's evaluation; each
refused when built under other code versions than the current spec's), verifies the
bundle completely (``open_bundle``, for its material digest), and publishes
``ReleaseManifest`` into the release store (``ragpipe.release.manifest.publish_manifest``:
atomic, a no-op when the same manifest exists), after keeping the gate decision and its comparison
beside it (``ragpipe.release.kept_decision``). Ineligible decisions are published too: the
manifest says so, and nothing activates it. Stage and Dagster data version: the release ID.
"""

from __future__ import annotations

import time

from ragpipe.bundle.objects import open_bundle_here
from ragpipe.experiment.decision import Decision
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.kept_decision import publish_gate_evidence
from ragpipe.release.manifest import EvaluationRef, GateRef, ReleaseManifest, publish_manifest
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.spec import PipelineSpec
from ragpipe.stages.chain_plan import chain_plan
from ragpipe.stages.gate_steps import read_comparison, read_decision
from ragpipe.stages.release_chain_store import ChainResult, publish_chain, read_chain_input, read_chain_upstream
from ragpipe.stages.stage_store import StageError, holding_workspace_lock

STAGE = "release_manifest"


def _check_links(
    revision: str, gate_version: str, decision: dict, ev_facts: dict, bundle_version: str, opened_id: str
) -> None:
    """Refuse a chain whose links do not hold: the decision file must hash to the gate's version,
    decide on exactly the evaluation run read, and that run's bundle must be the bundle opened."""
    body = {k: v for k, v in decision.items() if k != "decision_id"}
    try:
        recomputed = Decision.model_validate(body).decision_id
    except ValueError as exc:
        raise StageError(
            f"gate_decision {gate_version} of revision {revision!r}: decision.json is not a decision ({exc})"
        ) from None
    if not recomputed == decision.get("decision_id") == gate_version:
        raise StageError(f"gate_decision {gate_version} of revision {revision!r}: decision.json hashes to {recomputed}")
    run = {"run_id": ev_facts["run_id"], "spec_id": ev_facts["spec_id"], "ledger_head": ev_facts["ledger_head"]}
    if decision["challenger"] != run:
        raise StageError(
            f"gate_decision {gate_version} of revision {revision!r} decided on evaluation run {decision['challenger']['run_id']}, "
            f"not on {run['run_id']}: re-materialize gate_decision"
        )
    if opened_id != bundle_version:
        raise StageError(f"index_bundle {bundle_version} of revision {revision!r}: its folder holds bundle {opened_id}")


@holding_workspace_lock
def run_release_manifest(ws: Workspace, revision: str, spec: PipelineSpec) -> ChainResult:
    t0 = time.perf_counter()
    chain = chain_plan(spec)
    gate = read_chain_input(ws, revision, "gate_decision", chain.gate_code_version, STAGE)
    ev = read_chain_upstream(ws, revision, gate, "evaluation_run", chain.evaluation_code_version)
    bundle = read_chain_upstream(ws, revision, ev, "index_bundle", spec.spec_ids["index_bundle"])
    decision = read_decision(gate.path)
    opened = open_bundle_here(ws.located(str(bundle.record.facts["bundle_path"])))
    f = ev.record.facts
    _check_links(revision, gate.data_version, decision, f, bundle.data_version, opened.manifest.bundle_id)
    manifest = ReleaseManifest(
        revision=revision,
        bundle_id=opened.manifest.bundle_id,
        material_digest=opened.manifest.material_digest,
        query_plan_id=chain.query_plan_id,
        answer_plan_id=chain.answer_plan_id,
        authorization_policy_id=chain.authorization_policy_id,
        gate_policy_id=decision["policy_id"],
        evaluation=EvaluationRef(spec_id=str(f["spec_id"]), run_id=str(f["run_id"]), ledger_head=str(f["ledger_head"])),
        comparison_id=decision["comparison_id"],
        gate=GateRef(
            decision_id=decision["decision_id"],
            eligible=decision["eligible"],
            decisive_phase=decision["decisive_phase"],
            change=(decision.get("change") or {}).get("kind"),
            incumbent=(decision.get("change") or {}).get("incumbent_release"),
        ),
    )
    store = ReleaseStore(ws)
    # The decision, comparison and policy go into the release store first: gc may collect the stage
    # folder, and activation makes the decision again from them (``kept_decision.gate_problems``).
    comparison = read_comparison(gate.path) if decision["comparison_id"] is not None else None
    try:
        publish_gate_evidence(store, decision, comparison, chain.policy)
    except ReleaseError as exc:
        raise StageError(f"gate_decision {gate.data_version} of revision {revision!r}: {exc}") from None
    release_id, published = publish_manifest(store, manifest)
    facts = {
        "release_id": release_id,
        "eligible": manifest.gate.eligible,
        "decisive_phase": manifest.gate.decisive_phase,
        "bundle_id": manifest.bundle_id,
        "change": manifest.gate.change,
        "incumbent_release": manifest.gate.incumbent,
    }
    record = publish_chain(
        ws,
        STAGE,
        revision,
        chain.release_code_version,
        release_id,
        {"gate_decision": gate, "evaluation_run": ev, "index_bundle": bundle},
        facts,
    )
    metadata = {
        "release_id": release_id,
        "eligible": manifest.gate.eligible,
        "decisive_phase": manifest.gate.decisive_phase or "none",
        "change": manifest.gate.change or "unknown",
        "incumbent_release": manifest.gate.incumbent or "none",
        "bundle_id": manifest.bundle_id,
        "material_digest": manifest.material_digest,
        "decision_id": manifest.gate.decision_id,
        "comparison_id": manifest.comparison_id or "none (bootstrap)",
        "evaluation_run_id": manifest.evaluation.run_id,
        "publication": "published" if published else "existing",
        "manifest_path": ReleaseStore(ws).manifest_path(release_id),
        "duration_seconds": round(time.perf_counter() - t0, 3),
    }
    return ChainResult(record, release_id, metadata)
