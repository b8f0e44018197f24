"""The gate decision: ordered phases, every check recorded, the first failing phase decisive.

``decide(policy, comparison, challenger)`` runs every check of every phase in the fixed order
hard -> coverage -> target -> regression -> cost and records each with its value, operator,
threshold and verdict (``pass``, ``fail``, or ``skipped`` for an ``if_measured`` hard bound on a
metric the run does not measure). The decisive phase is the first phase with a failing check;
the release is eligible only when there is none. Later phases are still evaluated and shown, but
they never change the outcome: nothing compensates a failure (an ordered gate, not a sum).

With a comparison the decision is *paired*; with ``comparison=None`` it is a *bootstrap*
decision on the challenger alone (no incumbent): hard and coverage as usual, the target phase
checks ``bootstrap_floors`` (direction-aware: a floor for higher-is-better metrics, a ceiling
otherwise), regression has nothing to compare and cost checks only the absolute ceilings.

A challenger run that evaluated no case because it skipped every suite case (each judges
documents the revision lacks, or has no relevant judgment) has nothing measured: its checks
without a value fail as always, and their reasons say why there is no value (``no evaluable
case: all 12 suite cases judge documents this revision lacks``, see ``no_evaluable_case``)
instead of only that there is none. The outcome is the same; only the reasons are more precise.

The coverage phase ends with ``provisional_cases`` when the policy sets
``coverage.max_provisional_cases``: the suite's cases no person has adjudicated yet (a model's
drafts, ``ArmSummary.provisional``) must not exceed the bound; its reason names the count and the
bound. Both arms of a comparison ran one suite, so the challenger's count is the suite's.

The cost phase checks, in this order: p95 latency (relative, absolute), then the build cost of
the arm's bundle (``arms.BuildCost``, recorded by the run when it bound the bundle): vectors
(relative, absolute), then payload bytes (relative, absolute), then — for runs that generate
answers — model tokens and micros per evaluated case against their ceilings (``arms.AnswerCost``;
a cost the run does not know, such as a model without a price, fails the bound). A run without a
build figure fails the check (``no value``, fail closed). The latency checks are *advisory*: a latency bound
that does not hold (or has no sample) gets verdict ``advisory`` with its reason, is shown, and
never decides — each arm's latencies are wall-clock times of its own run, taken at another
moment under another load, so a busy machine would flip the outcome (``ADVISORY_LATENCY``).
Only recorded figures (build cost, answer usage — a cached answer keeps the usage of the call
that produced it) make the cost phase decisive.

Refused with ``GateError`` (no decision is made): a policy naming a metric the run does not
declare (other than ``if_measured`` bounds), a run declaring a known metric with another
direction, a ``ci_lower`` policy over a comparison whose interval is not at ``1 - alpha``, and a
challenger that is not the comparison's. Checks are built in sorted metric / slice order, so the
order of any mapping never changes a decision; the decision ID is a content ID of all of it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_serializer, model_validator

from ragpipe.evaluation.suite import MISSING_TARGETS, NO_POSITIVE_JUDGMENT
from ragpipe.experiment.arms import ArmRef, ArmRun, ArmSummary, Coordinates, summarize
from ragpipe.experiment.catalog import known_metric
from ragpipe.experiment.change import Change
from ragpipe.experiment.comparison import ALL, Comparison
from ragpipe.experiment.gate_policy import PHASES, GatePolicy
from ragpipe.experiment.pairing import check_arm
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.models import FrozenModel

Op = Literal[">=", "<=", ">", "<", "=="]
Verdict = Literal["pass", "fail", "skipped", "advisory"]
_HOLDS = {
    ">=": lambda v, t: v >= t,
    "<=": lambda v, t: v <= t,
    ">": lambda v, t: v > t,
    "<": lambda v, t: v < t,
    "==": lambda v, t: v == t,
}


# Why latency never decides: each arm's latencies are wall-clock times of its own run, measured at
# another moment and under another load than the other arm's (a busy machine flips the outcome).
ADVISORY_LATENCY = "the arms' latencies were measured at different times, so they decide nothing"


class GateError(ValueError):
    """A decision cannot be made: the policy does not fit the runs (the message says why)."""


class Check(FrozenModel):
    phase: Literal["hard", "coverage", "target", "regression", "cost"]
    name: str
    metric: str | None = None
    slice: str | None = None
    arm: Literal["incumbent", "challenger"] | None = None
    value: float | None
    op: Op
    threshold: float
    verdict: Verdict
    reason: str | None = None


SCHEMA_V1, SCHEMA = "ragpipe.gate_decision/v1", "ragpipe.gate_decision/v2"


class Decision(FrozenModel):
    """A gate decision. Schema v2 records the ``change`` (kind and the incumbent release it was made
    against); v1 decisions (made before) have none and are read as they were written."""

    schema_: Literal["ragpipe.gate_decision/v1", "ragpipe.gate_decision/v2"] = Field(SCHEMA_V1, alias="schema")
    mode: Literal["paired", "bootstrap"]
    eligible: bool
    decisive_phase: Literal["hard", "coverage", "target", "regression", "cost"] | None
    checks: tuple[Check, ...]
    reasons: tuple[str, ...]
    comparison_id: str | None
    policy_id: str
    incumbent: ArmRef | None
    challenger: ArmRef
    human_apply_required: bool
    change: Change | None = None

    @model_validator(mode="after")
    def _schema_matches_change(self) -> Decision:
        if (self.schema_ == SCHEMA) != (self.change is not None):
            raise ValueError(f"a {SCHEMA} decision records its change, a {SCHEMA_V1} one does not")
        if self.change is not None and (self.change.kind == "bootstrap") != (self.mode == "bootstrap"):
            raise ValueError(f"a {self.mode} decision cannot be a {self.change.kind}")
        return self

    @model_serializer(mode="wrap")
    def _v1_without_change(self, handler):
        """A v1 decision dumps as it always did (no ``change`` member): its ID is unchanged."""
        data = handler(self)
        if isinstance(data, dict) and data.get("change", 0) is None:
            del data["change"]
        return data

    @property
    def decision_id(self) -> str:
        return content_id("gate-decision", 1, self.model_dump(mode="json", by_alias=True))

    def as_json(self) -> dict[str, object]:
        return {"decision_id": self.decision_id, **self.model_dump(mode="json", by_alias=True)}


def check(
    phase: str,
    name: str,
    value: float | None,
    op: Op,
    threshold: float,
    *,
    metric: str | None = None,
    slice: str | None = None,
    arm: str | None = None,
    missing: str = "no value",
    advisory: bool = False,
) -> Check:
    """One check; a missing value fails (fail closed) with ``missing`` as the reason. An
    ``advisory`` check that does not hold has verdict ``advisory``, not ``fail``: recorded and
    shown with its reason, never decisive."""
    label = " ".join(
        x for x in (phase, name, metric, f"on {slice}" if slice else None, f"({arm})" if arm else None) if x
    )
    if value is None:
        verdict, reason = "fail", f"{label}: {missing}"
    elif _HOLDS[op](value, threshold):
        verdict, reason = "pass", None
    else:
        verdict, reason = "fail", f"{label}: {value:.6g} is not {op} {threshold:.6g}"
    if advisory and verdict == "fail":
        verdict, reason = "advisory", f"{reason} (advisory: {ADVISORY_LATENCY})"
    return Check(
        phase=phase,
        name=name,
        metric=metric,
        slice=slice,
        arm=arm,
        value=value,
        op=op,
        threshold=threshold,
        verdict=verdict,
        reason=reason,
    )


# How a skip reason code (``ragpipe.evaluation.suite``) reads in a sentence: (one case, several).
SKIP_PHRASES = {
    MISSING_TARGETS: ("judges documents this revision lacks", "judge documents this revision lacks"),
    NO_POSITIVE_JUDGMENT: ("has no relevant judgment (grade >= 1)", "have no relevant judgment (grade >= 1)"),
}


def skipped_cases_text(skipped: Mapping[str, int]) -> str:
    """Why every case of a suite was skipped, from ``{reason code: cases}``: ``all 12 suite cases
    judge documents this revision lacks``, ``the suite's only case has no relevant judgment (grade
    >= 1)``, or ``all 3 suite cases were skipped: 2 judge documents this revision lacks, 1 has no
    relevant judgment (grade >= 1)``."""

    def phrase(code: str, n: int) -> str:
        one, many = SKIP_PHRASES.get(code, (f"was skipped ({code})", f"were skipped ({code})"))
        return one if n == 1 else many

    counts = {code: n for code, n in sorted(skipped.items()) if n > 0}
    total = sum(counts.values())
    if len(counts) == 1:
        ((code, n),) = counts.items()
        return f"the suite's only case {phrase(code, 1)}" if n == 1 else f"all {n} suite cases {phrase(code, n)}"
    return f"all {total} suite cases were skipped: " + ", ".join(f"{n} {phrase(c, n)}" for c, n in counts.items())


def no_evaluable_case(arm: ArmRun) -> str | None:
    """``no evaluable case: <why>`` when ``arm`` expected no cell because it skipped every suite
    case; None when it had a case to evaluate (or skipped none)."""
    if arm.expected or not arm.skipped:
        return None
    return f"no evaluable case: {skipped_cases_text(Counter(arm.skipped.values()))}"


def outcome(checks: tuple[Check, ...]) -> tuple[bool, str | None]:
    """``(eligible, decisive phase)``: the first phase, in the fixed order, with a failing check."""
    failing = {c.phase for c in checks if c.verdict == "fail"}
    decisive = next((p for p in PHASES if p in failing), None)
    return decisive is None, decisive


def _hard(policy: GatePolicy, arm: ArmSummary, gap: str | None = None) -> list[Check]:
    """The hard bounds on the challenger's aggregates (``arm``: its summary, whose metrics are
    the ones it declares)."""
    out = []
    for name, bound in sorted(policy.hard.items()):
        for op, threshold in ((">=", bound.min), ("<=", bound.max)):
            if threshold is None:
                continue
            key = "min" if op == ">=" else "max"
            # the challenger's own declarations: an arm-only metric (ANN recall) need not be shared
            if bound.if_measured and name not in arm.aggregates:
                label = f"hard {key} {name}"
                out.append(
                    Check(
                        phase="hard",
                        name=key,
                        metric=name,
                        value=None,
                        op=op,
                        threshold=threshold,
                        verdict="skipped",
                        reason=f"{label}: not measured by this run",
                    )
                )
                continue
            out.append(
                check(
                    "hard",
                    key,
                    arm.aggregates[name].value,
                    op,
                    threshold,
                    metric=name,
                    missing=gap or "no evaluated case carries it",
                )
            )
    return out


def _failed_rates(policy: GatePolicy, arms: dict[str, ArmSummary], gap: str | None = None) -> list[Check]:
    """``gap`` (the challenger's ``no_evaluable_case``) names why the challenger has no cell."""
    return [
        check(
            "coverage",
            "failed_rate",
            summary.failed_cells / summary.cells if summary.cells else None,
            "<=",
            policy.coverage.max_failed_rate,
            arm=side,
            missing=(gap if side == "challenger" else None) or "the arm has no cell",
        )
        for side, summary in arms.items()
    ]


def _provisional(policy: GatePolicy, summary: ArmSummary) -> list[Check]:
    """The suite's provisional cases (not yet adjudicated by a person) <= ``max_provisional_cases``,
    when the policy bounds them; the reason names the count and the bound."""
    bound = policy.coverage.max_provisional_cases
    if bound is None:
        return []
    got = check("coverage", "provisional_cases", float(summary.provisional), "<=", float(bound))
    if got.verdict != "fail":
        return [got]
    cases = "case" if summary.provisional == 1 else "cases"
    why = (
        f"the suite holds {summary.provisional} provisional {cases}, not yet adjudicated by a person; "
        f"max_provisional_cases is {bound}"
    )
    return [got.model_copy(update={"reason": f"{got.reason} ({why})"})]


def _floor_op(metric: str) -> Op:
    return ">=" if known_metric(metric).direction == "higher" else "<="  # type: ignore[union-attr]


def _lost_coverage(policy: GatePolicy, c: Comparison) -> Check:
    """Cases only the incumbent could evaluate over paired cases <= ``max_lost_rate``; the reason
    names the cases and the judged documents the challenger lacks."""
    lost = c.certificate.lost_coverage
    paired = len({case for case, _ in c.certificate.cells})
    rate = len(lost) / paired if paired else (0.0 if not lost else None)
    got = check("coverage", "lost_coverage", rate, "<=", policy.coverage.max_lost_rate, missing="no paired case")
    if got.verdict != "fail" or not lost:
        return got
    removed = sorted({doc for _, docs in lost for doc in docs})
    shown = ", ".join(removed[:10]) + (f" and {len(removed) - 10} more" if len(removed) > 10 else "")
    documents = f"their judged documents {shown}" if removed else "their judged documents"
    why = f"{len(lost)} of {paired} paired cases lost: {documents} are not in the challenger"
    return got.model_copy(update={"reason": f"{got.reason} ({why})"})


def _target(policy: GatePolicy, c: Comparison, change: Change | None, gap: str | None) -> list[Check]:
    """An experiment (or a v1 decision) must improve; a refresh must not be worse; new coverage
    must reach its absolute floors."""
    t = policy.target
    stats = c.slices[ALL].metrics[t.metric].stats
    few = gap or "fewer than 2 scored cases"
    if change is not None and change.kind == "refresh":
        checks = [
            check(
                "target",
                "non_inferiority",
                stats.ci_low,
                ">=",
                -policy.refresh.margin,
                metric=t.metric,
                missing=few,
            )
        ]
    else:
        checks = [
            check(
                "target",
                "improvement",
                stats.mean,
                ">=",
                t.min_improvement,
                metric=t.metric,
                missing=gap or "no scored case",
            )
        ]
        if t.evidence == "ci_lower":
            checks.append(check("target", "ci_lower", stats.ci_low, ">", 0.0, metric=t.metric, missing=few))
        else:
            checks.append(check("target", "p_value", stats.p_value, "<", t.alpha, metric=t.metric, missing=few))
    if c.new_coverage is not None:
        checks += _floors(
            "new_coverage_floor", c.new_coverage, policy.floors_of_new_coverage, "no new-coverage case carries it"
        )
    return checks


def _floors(name: str, summary: ArmSummary, floors: dict[str, float], missing: str) -> list[Check]:
    """One target check per floor (direction-aware: a ceiling for lower-is-better metrics)."""
    return [
        check("target", name, summary.aggregates[m].value, _floor_op(m), floor, metric=m, missing=missing)
        for m, floor in sorted(floors.items())
    ]


def _paired(policy: GatePolicy, c: Comparison, gap: str | None = None, change: Change | None = None) -> list[Check]:
    checks = _hard(policy, c.challenger, gap)
    new_cells = c.new_coverage.cells if c.new_coverage is not None else 0
    checks.append(
        check("coverage", "paired_cells", float(len(c.certificate.cells)), "==", float(c.challenger.cells - new_cells))
    )
    if change is not None:
        checks.append(_lost_coverage(policy, c))
    checks += _failed_rates(policy, {"incumbent": c.incumbent, "challenger": c.challenger}, gap)
    target = c.slices[ALL].metrics[policy.target.metric].stats
    checks.append(
        check(
            "coverage",
            "scored_cases",
            float(target.n),
            ">=",
            float(policy.coverage.min_cases),
            metric=policy.target.metric,
        )
    )
    checks += _provisional(policy, c.challenger)  # both arms ran one suite (equal coordinates)
    checks += _target(policy, c, change, gap)
    limits = [(ALL, policy.regression.overall)] + [
        (f"tag:{tag}", lim) for tag, lim in sorted(policy.regression.tags.items())
    ]
    for slice_name, lim in limits:
        for metric, loss in sorted(lim.items()):
            got = c.slices.get(slice_name)
            mean = got.metrics[metric].stats.mean if got is not None else None
            checks.append(
                check(
                    "regression",
                    "max_loss",
                    mean,
                    ">=",
                    -loss,
                    metric=metric,
                    slice=slice_name,
                    missing=gap or "no scored case in this slice",
                )
            )
    checks += _cost(policy, c.challenger, c.incumbent, gap)
    return checks


def _cost(
    policy: GatePolicy, challenger: ArmSummary, incumbent: ArmSummary | None, gap: str | None = None
) -> list[Check]:
    cost, out = policy.cost, []
    p95 = challenger.latency_p95_ms
    no_sample = gap or "no latency sample"
    if incumbent is not None and cost.max_p95_latency_ratio is not None:
        base = incumbent.latency_p95_ms
        if base is None:
            out.append(
                check(
                    "cost",
                    "p95_latency_relative",
                    None,
                    "<=",
                    0.0,
                    missing="the incumbent has no latency sample",
                    advisory=True,
                )
            )
        else:
            allowance = max(base * cost.max_p95_latency_ratio, base + cost.latency_slack_ms)
            out.append(check("cost", "p95_latency_relative", p95, "<=", allowance, missing=no_sample, advisory=True))
    if cost.max_p95_latency_ms is not None:
        out.append(
            check("cost", "p95_latency_absolute", p95, "<=", cost.max_p95_latency_ms, missing=no_sample, advisory=True)
        )
    return out + _build_cost(policy, challenger, incumbent) + _answer_cost(policy, challenger)


ANSWER_FIGURES = (  # (check name, AnswerCost field, policy ceiling, why a value is missing)
    (
        "answer_tokens_per_case",
        "tokens_per_case",
        "max_answer_tokens_per_case",
        "some answer's token counts are unknown",
    ),
    (
        "answer_micros_per_case",
        "micros_per_case",
        "max_answer_micros_per_case",
        "some answer's cost is unknown (a model without a price, or a call that reported no usage)",
    ),
)


def _answer_cost(policy: GatePolicy, challenger: ArmSummary) -> list[Check]:
    """Challenger tokens and micros per evaluated case <= their ceilings (fail closed)."""
    out = []
    for name, figure, ceiling_key, unknown in ANSWER_FIGURES:
        ceiling = getattr(policy.cost, ceiling_key)
        if ceiling is None:
            continue
        cost = challenger.answer_cost
        value = None if cost is None else getattr(cost, figure)
        missing = (
            "the run recorded no answer usage (it generates no answers, or predates usage)" if cost is None else unknown
        )
        if cost is not None and cost.cases == 0:
            missing = "no evaluated case"
        out.append(check("cost", name, value, "<=", ceiling, missing=missing))
    return out


BUILD_FIGURES = (  # (check name prefix, BuildCost field, policy ratio, policy ceiling), in check order
    ("build_vectors", "vectors", "max_build_vectors_ratio", "max_build_vectors"),
    ("bundle_bytes", "payload_bytes", "max_bundle_bytes_ratio", "max_bundle_bytes"),
)


def _build_cost(policy: GatePolicy, challenger: ArmSummary, incumbent: ArmSummary | None) -> list[Check]:
    """Challenger figure <= incumbent figure x ratio (paired only), and <= the absolute ceiling."""
    out = []
    for name, figure, ratio_key, ceiling_key in BUILD_FIGURES:
        ratio, ceiling = getattr(policy.cost, ratio_key), getattr(policy.cost, ceiling_key)
        value = None if challenger.build is None else float(getattr(challenger.build, figure))
        if incumbent is not None and ratio is not None:
            if incumbent.build is None:
                out.append(
                    check(
                        "cost",
                        f"{name}_relative",
                        None,
                        "<=",
                        0.0,
                        missing="the incumbent run records no build figures",
                    )
                )
            else:
                allowance = getattr(incumbent.build, figure) * ratio
                out.append(
                    check(
                        "cost",
                        f"{name}_relative",
                        value,
                        "<=",
                        allowance,
                        missing="the challenger run records no build figures",
                    )
                )
        if ceiling is not None:
            out.append(
                check(
                    "cost",
                    f"{name}_absolute",
                    value,
                    "<=",
                    ceiling,
                    missing="the challenger run records no build figures",
                )
            )
    return out


def _bootstrap(policy: GatePolicy, arm: ArmRun) -> list[Check]:
    summary, gap = summarize(arm), no_evaluable_case(arm)
    checks = _hard(policy, summary, gap)
    checks.append(check("coverage", "terminal_cells", float(summary.cells), "==", float(len(arm.expected))))
    checks += _failed_rates(policy, {"challenger": summary}, gap)
    checks.append(
        check("coverage", "evaluated_cases", float(summary.evaluated_cases), ">=", float(policy.coverage.min_cases))
    )
    checks += _provisional(policy, summary)
    checks += _floors("floor", summary, policy.bootstrap_floors, gap or "no evaluated case carries it")
    return checks + _cost(policy, summary, None, gap)


def _check_fit(policy: GatePolicy, coords: Coordinates, comparison: Comparison | None) -> None:
    for decl in coords.metrics:
        known = known_metric(decl.name)
        if known is not None and known.direction != decl.direction:
            raise GateError(
                f"metric {decl.name!r} is declared {decl.direction!r}-is-better by the run, but ragpipe defines it {known.direction!r}-is-better"
            )
    optional = {name for name, bound in policy.hard.items() if bound.if_measured}
    declared = {m.name for m in coords.metrics}
    if comparison is not None:  # an arm-only metric (ANN recall) the challenger alone measures
        declared |= set(comparison.challenger.aggregates)
    unknown = sorted(policy.metrics() - optional - declared)
    if unknown:
        raise GateError(
            f"the policy names metric {unknown[0]!r}, which the run does not measure (measured: {', '.join(sorted(declared))})"
        )
    if comparison is not None and policy.target.evidence == "ci_lower":
        level = comparison.spec.confidence_level
        if not math.isclose(level, 1 - policy.target.alpha, abs_tol=1e-12):
            raise GateError(
                f"the comparison's interval is at {level:g}, the policy needs 1 - alpha = {1 - policy.target.alpha:g} (recompute it with that confidence level)"
            )


def _check_change(change: Change | None, comparison: Comparison | None) -> None:
    if change is None:
        return
    if comparison is None and change.kind != "bootstrap":
        raise GateError(f"a {change.kind} needs a comparison with its incumbent")
    if comparison is not None and change.kind == "bootstrap":
        raise GateError("a bootstrap decision has no comparison")


def decide(
    policy: GatePolicy,
    comparison: Comparison | None,
    challenger: ArmRun | None = None,
    change: Change | None = None,
) -> Decision:
    """The decision of ``policy`` on a comparison (paired) or on ``challenger`` alone (bootstrap).
    ``change``: the challenger's change kind (``ragpipe.experiment.change``), recorded in a v2
    decision; a refresh is judged by non-inferiority, an experiment by improvement. None makes a
    v1 decision (as decisions were made before kinds existed): improvement, no coverage change."""
    _check_change(change, comparison)
    if comparison is None:
        if challenger is None:
            raise GateError("a bootstrap decision (no comparison) needs the challenger run")
        check_arm(challenger, "challenger")
        _check_fit(policy, challenger.coordinates, None)
        checks, incumbent, challenger_ref, comparison_id = _bootstrap(policy, challenger), None, challenger.ref(), None
    else:
        if challenger is not None and challenger.ref() != comparison.certificate.challenger:
            raise GateError(
                f"run {challenger.run_id} is not the comparison's challenger {comparison.certificate.challenger.run_id}"
            )
        _check_fit(policy, comparison.coordinates, comparison)
        checks, incumbent, challenger_ref = (
            _paired(policy, comparison, None if challenger is None else no_evaluable_case(challenger), change),
            comparison.certificate.incumbent,
            comparison.certificate.challenger,
        )
        comparison_id = comparison.comparison_id
    checks_t = tuple(checks)
    eligible, decisive = outcome(checks_t)
    return Decision(
        mode="bootstrap" if comparison is None else "paired",
        eligible=eligible,
        decisive_phase=decisive,
        checks=checks_t,
        reasons=tuple(c.reason for c in checks_t if c.verdict == "fail" and c.reason),
        comparison_id=comparison_id,
        policy_id=policy.policy_id,
        incumbent=incumbent,
        challenger=challenger_ref,
        human_apply_required=policy.human_apply_required,
        change=change,
        **({"schema": SCHEMA} if change is not None else {}),
    )
