"""``gate_decision``: gate this revision's evaluation run against the incumbent release.

- **Challenger**: the revision's latest ``evaluation_run`` (verified and completed: ``load_arm``).
- **Incumbent**: the release active on the default target (``ragpipe/specs/targets.yaml``). Its
  evaluation run is found by the run ID its manifest binds (``evaluations/<run id>/``) and must
  match the manifest's spec ID and ledger head; it is read once, by the release's verification
  (``release.status.resolve_active_run``), and that reading is the incumbent arm. No active
  release → a *bootstrap* decision on the policy's absolute floors (``decide(policy, None,
  challenger)``). An active release that does not verify, or whose run folder is missing or
  differs, stops the step with an error (fail closed).
- **Changed coordinates**: when the incumbent's run was measured under other coordinates than
  the current evaluation spec (another suite, mode, depth, metrics …), the incumbent's bundle is
  evaluated first under the current spec, with the query plan its run bound, in a new run
  (``incumbent_run`` in the record); that run is the incumbent arm. The same happens when the
  incumbent's run records no build figures (made before runs bound them) and the policy bounds
  build cost relative to the incumbent. A judged chain judges that run with its own judge
  (``evaluation.judge``) and budget, so both arms carry one judge's labels.
- **Change kind**: the challenger's basis (its bundle's stage specs and default scope, the chain's
  query plan, answer plan and authorization policy) against the incumbent release's
  (``ragpipe.release.change_basis``): a *refresh* (only the corpus differs) is gated by
  non-inferiority, an *experiment* by improvement, and suites that grow or shrink with the
  corpus pair with new and lost coverage listed (``ragpipe.experiment.pairing``). The decision
  records the kind and the incumbent release it was made against.
- **Not pairable**: when exact pairing refuses (e.g. a case skipped by one side only), the decision
  is *ineligible* with decisive phase ``coverage`` and one failing check ``coverage pairing``
  whose reason is the pairing error; no comparison is made.

The version folder holds ``decision.json`` (and ``comparison.json`` when paired); the stage and
Dagster data version is the decision ID.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ragpipe.bundle.objects import bundle_semantic_here
from ragpipe.bundle.verify import BundleVerificationError
from ragpipe.evaluation.runner import new_run_id, run_evaluation
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.arms import ArmRun
from ragpipe.experiment.change import change_text, classify
from ragpipe.experiment.comparison import Comparison, comparison_bytes
from ragpipe.experiment.decision import Decision
from ragpipe.experiment.gate_policy import PHASES
from ragpipe.experiment.gating import gate_runs, needs_reevaluation
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.change_basis import basis_of, release_basis
from ragpipe.release.manifest import ReleaseManifest, evaluation_run_dir
from ragpipe.release.pointer import read_pointer
from ragpipe.release.replica import push_run, run_dir
from ragpipe.release.status import resolve_active_run
from ragpipe.release.store import ReleaseStore
from ragpipe.release.targets import TargetsConfig, load_targets
from ragpipe.retrieval.plan import parse_plan
from ragpipe.spec import PipelineSpec
from ragpipe.stages.chain_plan import ChainPlan, chain_plan
from ragpipe.stages.eval_steps import judge_budget_stop
from ragpipe.stages.release_chain_store import ChainResult, publish_chain, read_chain_input
from ragpipe.stages.results import Table, table
from ragpipe.stages.stage_store import StageError, holding_workspace_lock

STAGE = "gate_decision"


def _incumbent(ws: Workspace, config: TargetsConfig) -> tuple[ReleaseManifest, Path, ArmRun] | None:
    """The default target's active release — manifest, bundle path and its evaluation run, all as
    one verification read them; None when nothing is active."""
    name, _ = config.get(None)
    if read_pointer(ReleaseStore(ws), name) is None:
        return None
    return resolve_active_run(ws, name, config=config)  # refuses a release that no longer verifies


def _incumbent_arm(
    ws: Workspace, chain: ChainPlan, manifest: ReleaseManifest, bundle: Path, arm: ArmRun, challenger: ArmRun
) -> tuple[ArmRun, str | None]:
    """The incumbent arm — the release's verified run ``arm`` — re-evaluated under the current spec
    when its coordinates differ; and the new run's ID when it was."""
    # A run recorded before runs bound their bundle's build figures cannot answer a relative build
    # bound: measure the incumbent again rather than fail every challenger on a missing figure.
    if not needs_reevaluation(chain.policy, arm, challenger):
        return arm, None
    bound = evaluation_run_dir(ws, manifest) / "inputs" / "query_plan.json"  # the folder verification read
    plan = parse_plan(json.loads(bound.read_bytes()), str(bound))
    if plan.plan_id != arm.variant.plan_id:  # read again after verification: it must still be the run's plan
        raise StageError(
            f"active release {manifest.release_id}: {bound} is plan {plan.plan_id}, not its run's plan {arm.variant.plan_id}"
        )
    run_id = new_run_id()
    out = ws.evaluations / run_id
    # judged by the chain's judge, as the challenger was: labels of two judges never pair
    with judge_budget_stop(out):
        run_evaluation(
            chain.evaluation_spec(bundle, manifest.bundle_id, plan), out, run_id=run_id, judging=chain.judging(ws.home)
        )
    push_run(ws, out)  # activation makes the decision again from it, wherever it runs
    return load_arm(out), run_id


def _check_bound(challenger: ArmRun, facts: dict) -> None:
    """The run read (perhaps fetched from the store) must be the one the evaluation step recorded:
    a self-consistent run put in its place is refused here, not gated."""
    for name, got, want in (
        ("run ID", challenger.run_id, facts["run_id"]),
        ("spec ID", challenger.spec_id, facts["spec_id"]),
        ("ledger head", challenger.ledger_head, facts["ledger_head"]),
    ):
        if got != want:
            raise StageError(f"evaluation run {facts['run_id']}: {name} {got} is not the recorded {want}")


# The unit of each check's value and threshold, by check name (none: a metric value, a rate or a count).
CHECK_UNITS = {
    "p95_latency_relative": "ms",
    "p95_latency_absolute": "ms",
    "build_vectors_relative": "vectors",
    "build_vectors_absolute": "vectors",
    "bundle_bytes_relative": "bytes",
    "bundle_bytes_absolute": "bytes",
    "answer_tokens_per_case": "tokens per case",
    "answer_micros_per_case": "micros per case",
}


def figure(value: float | None, unit: str | None) -> str:
    """A check's value or threshold for a person: 4 significant digits and its unit (bytes as
    KiB/MiB/GiB); ``—`` for no value."""
    if value is None:
        return "—"
    if unit == "bytes":
        for name, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= size:
                return f"{value / size:.4g} {name}"
        return f"{value:.4g} bytes"
    return f"{value:.4g}" + (f" {unit}" if unit else "")


def check_label(c) -> str:
    """``improvement ndcg@10``, ``max_loss recall@100 on tag:x``, ``failed_rate (challenger)``; the
    slice of every case (``all``) goes without saying, which keeps the column narrow."""
    on = f"on {c.slice}" if c.slice and c.slice != "all" else None
    return " ".join(x for x in (c.name, c.metric, on, f"({c.arm})" if c.arm else None) if x)


def checks_tables(decision: Decision) -> dict[str, Table]:
    """Every check in order, one table per phase (``checks hard``, ``checks coverage`` …, in the
    fixed phase order) of three narrow columns — the verdict, what is checked (``name metric
    slice (arm)``) and the figure against its rule with units (``38.92 ms <= 25.5 ms``) — so that
    each fits the UI's metadata panel at a 1,600 px window (checked in headless Chromium). The
    reasons are the ``reasons`` entry beside them, the raw figures the decision file."""
    cols = [("verdict", "string"), ("check", "string"), ("value and rule", "string")]
    rows: dict[str, list[list[str]]] = {}
    for c in decision.checks:
        unit = CHECK_UNITS.get(c.name)
        rule = f"{figure(c.value, unit)} {c.op} {figure(c.threshold, unit)}"
        rows.setdefault(c.phase, []).append([c.verdict, check_label(c), rule])
    return {f"checks {phase}": table(cols, rows[phase], limit=500) for phase in PHASES if phase in rows}


def deltas_table(comparison: Comparison | None) -> Table | None:
    """Per slice and metric: scored cases, mean delta, its interval, p-value, and wins / ties /
    losses in one cell — seven narrow columns that fit the metadata panel at 1,600 px."""
    if comparison is None:
        return None
    cols = [
        ("slice", "string"),
        ("metric", "string"),
        ("n", "int"),
        ("mean", "float"),
        ("interval", "string"),
        ("p", "float"),
        ("W/T/L", "string"),
    ]
    rows = [
        [
            name,
            metric,
            m.stats.n,
            m.stats.mean,
            f"{figure(m.stats.ci_low, None)} … {figure(m.stats.ci_high, None)}",
            m.stats.p_value,
            f"{m.stats.wins}/{m.stats.ties}/{m.stats.losses}",
        ]
        for name, s in comparison.slices.items()
        for metric, m in s.metrics.items()
    ]
    return table(cols, rows, limit=500)


def _write(decision: Decision, comparison: Comparison | None):
    def write(tmp: Path) -> None:
        write_file_atomic(
            tmp / "decision.json", (json.dumps(decision.as_json(), indent=2, sort_keys=True) + "\n").encode()
        )
        if comparison is not None:
            write_file_atomic(tmp / "comparison.json", comparison_bytes(comparison))

    return write


@holding_workspace_lock
def run_gate_decision(
    ws: Workspace, revision: str, spec: PipelineSpec, config: TargetsConfig | None = None
) -> ChainResult:
    """Decide whether the revision's evaluation makes its release eligible (module docstring)."""
    t0 = time.perf_counter()
    chain = chain_plan(spec)
    ev = read_chain_input(ws, revision, "evaluation_run", chain.evaluation_code_version, STAGE)
    challenger = load_arm(run_dir(ws, str(ev.record.facts["run_id"])))  # fetched if run elsewhere
    _check_bound(challenger, ev.record.facts)
    incumbent = _incumbent(ws, config or load_targets())
    comparison, facts = None, {"incumbent_release": None, "incumbent_run": None, "incumbent_reevaluated": None}
    arm = None
    if incumbent is not None:
        manifest, bundle, verified = incumbent
        arm, reevaluated = _incumbent_arm(ws, chain, manifest, bundle, verified, challenger)
        facts = {
            "incumbent_release": manifest.release_id,
            "incumbent_run": arm.run_id,
            "incumbent_reevaluated": reevaluated,
        }
    hex_id = challenger.variant.bundle_id.split(":", 1)[1]
    try:
        semantic = bundle_semantic_here(ws.bundles / hex_id, challenger.variant.bundle_id)
    except BundleVerificationError as exc:
        raise StageError(f"evaluation run {challenger.run_id}: its bundle: {'; '.join(exc.problems)}") from None
    basis = basis_of(semantic, chain.query_plan_id, chain.answer_plan_id, chain.authorization_policy_id)
    change = (
        classify(basis, None, None)
        if incumbent is None
        else classify(basis, release_basis(ws, incumbent[0]), incumbent[0].release_id)
    )
    decision, comparison = gate_runs(chain.policy, challenger, arm, chain.comparison, change)
    facts |= {
        "change": change.kind,
        "changed": ", ".join(change.differs) or None,
        "decision_id": decision.decision_id,
        "eligible": decision.eligible,
        "decisive_phase": decision.decisive_phase,
        "mode": decision.mode,
        "comparison_id": comparison.comparison_id if comparison else None,
        "policy_id": decision.policy_id,
        "challenger_run": challenger.run_id,
        "new_coverage_cases": len(comparison.certificate.new_coverage) if comparison else None,
        "lost_coverage_cases": len(comparison.certificate.lost_coverage) if comparison else None,
    }
    record = publish_chain(
        ws,
        STAGE,
        revision,
        chain.gate_code_version,
        decision.decision_id,
        {"evaluation_run": ev},
        facts,
        _write(decision, comparison),
    )
    metadata: dict[str, Any] = {k: v for k, v in facts.items() if v is not None}
    metadata["change"] = change_text(change, short=True)  # the full ID: incumbent_release
    metadata["decisive_phase"] = decision.decisive_phase or "none"
    metadata["reasons"] = "; ".join(decision.reasons) or "none"
    metadata["duration_seconds"] = round(time.perf_counter() - t0, 3)
    tables = {**checks_tables(decision), "deltas": deltas_table(comparison)}
    return ChainResult(record, decision.decision_id, metadata, {k: v for k, v in tables.items() if v is not None})


def read_decision(folder: Path) -> dict[str, Any]:
    """The ``decision.json`` of a ``gate_decision`` version folder."""
    return json.loads((folder / "decision.json").read_bytes())


def read_comparison(folder: Path) -> dict[str, Any]:
    """The ``comparison.json`` of a paired ``gate_decision`` version folder."""
    return json.loads((folder / "comparison.json").read_bytes())
