"""The chain's gate as one function of its inputs, so a decision can be made and re-made alike.

``gate_runs(policy, challenger, incumbent, spec, change)`` is what ``gate_decision`` computes — a
bootstrap decision without an incumbent; otherwise pairing (accepting new and lost coverage when
the decision records its ``change``), the comparison under ``spec`` and the policy's decision on
it, or the ineligible ``not_pairable`` decision when pairing refuses.
Everything it reads is content-bound (verified runs, a policy and a comparison spec with content
IDs) and everything it computes is seeded, so activation can recompute a release's decision from
the runs it names and compare IDs (``ragpipe.release.kept_decision``).
"""

from __future__ import annotations

from ragpipe.experiment.arms import ArmRun
from ragpipe.experiment.change import Change
from ragpipe.experiment.comparison import Comparison, compare
from ragpipe.experiment.decision import SCHEMA, Decision, check, decide
from ragpipe.experiment.gate_policy import GatePolicy
from ragpipe.experiment.pairing import PairingError, pair
from ragpipe.experiment.statistics import ComparisonSpec


def needs_reevaluation(policy: GatePolicy, bound: ArmRun, challenger: ArmRun) -> bool:
    """Whether the incumbent's own run (``bound``, the one its release binds) cannot be paired with
    ``challenger`` as it is, so the incumbent's bundle is evaluated again under the challenger's
    coordinates: they differ (another suite, mode, depth, metrics …), or the policy bounds build
    cost relative to the incumbent and ``bound`` recorded no build figures (made before runs did).
    Otherwise the bound run *is* the incumbent arm — the gate and its verification use this one
    rule, so no other run of the incumbent's bundle can stand in for it."""
    cost = policy.cost
    needs_build = cost.max_build_vectors_ratio is not None or cost.max_bundle_bytes_ratio is not None
    return bound.coordinates != challenger.coordinates or (bound.build is None and needs_build)


def not_pairable(
    policy: GatePolicy, incumbent: ArmRun, challenger: ArmRun, error: PairingError, change: Change | None = None
) -> Decision:
    """The ineligible decision recorded when the runs cannot be paired exactly: decisive phase
    ``coverage``, one failing check ``coverage pairing`` whose reason is the pairing error."""
    failed = check("coverage", "pairing", None, "==", 1.0, missing=str(error))
    return Decision(
        mode="paired",
        eligible=False,
        decisive_phase="coverage",
        checks=(failed,),
        reasons=(str(failed.reason),),
        comparison_id=None,
        policy_id=policy.policy_id,
        incumbent=incumbent.ref(),
        challenger=challenger.ref(),
        human_apply_required=policy.human_apply_required,
        change=change,
        **({"schema": SCHEMA} if change is not None else {}),
    )


def gate_runs(
    policy: GatePolicy,
    challenger: ArmRun,
    incumbent: ArmRun | None,
    spec: ComparisonSpec | None,
    change: Change | None = None,
) -> tuple[Decision, Comparison | None]:
    """The decision (and, when the runs pair, the comparison) of ``policy`` on these runs;
    ``change`` None makes a v1 decision (exact pairing, improvement), as kept releases made
    before change kinds existed are made again."""
    if incumbent is None:
        return decide(policy, None, challenger, change), None
    try:
        comparison = compare(pair(incumbent, challenger, coverage_change=change is not None), spec)
    except PairingError as exc:
        return not_pairable(policy, incumbent, challenger, exc, change), None
    return decide(policy, comparison, challenger, change), comparison
