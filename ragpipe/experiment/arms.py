"""One arm of a comparison: an evaluation run as the experiment envelope sees it.

``ArmRun`` carries what a fair comparison needs and nothing about how the run was produced:

* identities: ``run_id`` (the attempt), ``spec_id`` (the run's semantic spec) and ``ledger_head``
  (the hash of its custody ledger's last record);
* ``coordinates``: everything that must be *equal* between two arms for a paired comparison
  (suite digest, evaluator, mode, subject scopes, depth, metric declarations, repeats, answers);
* ``variant``: what is allowed to differ (bundle, query plan, arm label);
* ``expected``: the cells ``(case, repeat)`` the run declared, ``cells``: its terminal cells,
  ``skipped``: the cases it skipped with their reasons (``missing``: the judged targets the
  bundle lacks, per skipped case), ``tags``: each case's tags;
* each cell's outcome (success, abstained, failure, cancelled), failure class, metric values
  and query latency (execution data: read by the cost phase, never part of an identity);
* ``build``: the build-cost figures of the evaluated bundle (``BuildCost``), when the run
  recorded them (runs made before they were recorded have none);
* ``provisional``: the suite's cases no person has adjudicated yet (a model's drafts), which a
  gate may bound (``coverage.max_provisional_cases``);
* each completed cell's ``answer_usage`` when the run generates answers (model calls, tokens,
  micros; ``ragpipe.answer.results.AnswerUsage``), which ``summarize`` turns into per-case
  figures (``AnswerCost``) for the cost phase.

The model accepts duplicate or missing cells as data, because *detecting* them is the pairing's
job (``pairing.check_arm``), which names the arm and the cell. ``summarize`` is the per-arm view
every gate phase reads: aggregates exactly as the evaluation report computes them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

from pydantic import Field, field_validator, model_serializer

from ragpipe.answer.results import AnswerUsage
from ragpipe.experiment.catalog import Direction
from ragpipe.kernel.models import FrozenModel

Outcome = Literal["success", "abstained", "failure", "cancelled"]
COMPLETED: tuple[str, ...] = ("success", "abstained")
CellKey = tuple[str, int]  # (case ID, repeat)


class MetricDecl(FrozenModel):
    """A metric's declared semantics; ``aggregate`` says how case values combine (mean, or sum
    for counts such as ``unauthorized_disclosures``)."""

    name: str
    direction: Direction
    unit: str
    k: int | None = None
    measure: str | None = None  # how the evaluator computes it (e.g. an ir_measures measure string)
    aggregate: Literal["mean", "sum"] = "mean"


class Coordinates(FrozenModel):
    """What must be equal between incumbent and challenger (anything else is not a fair pair)."""

    suite_digest: str
    evaluator: str
    mode: str
    scopes: tuple[str, ...]
    k: int
    repeats: int = Field(ge=1)
    answers: bool
    # the judge spec ID of judged runs: labels of two judges never pair (before ``metrics``, so a
    # judged and an unjudged run are told apart by this, not by their metric lists)
    judge: str | None = None
    metrics: tuple[MetricDecl, ...]

    @model_serializer(mode="wrap")
    def _without_judge(self, handler):
        """No ``judge`` key for unjudged runs, so their comparisons keep their content and IDs."""
        data = handler(self)
        if isinstance(data, dict) and data.get("judge", 0) is None:
            data.pop("judge")
        return data

    def metric(self, name: str) -> MetricDecl | None:
        return next((m for m in self.metrics if m.name == name), None)


class Variant(FrozenModel):
    """What an arm is allowed to differ in."""

    bundle_id: str
    plan_id: str
    arm: str


class CellOutcome(FrozenModel):
    """A terminal cell. ``failure_class`` names why a failed or cancelled cell failed (the
    exception type, or ``cancelled``); completed cells carry ``metrics`` and ``latency_ms``."""

    case_id: str
    repeat: int = Field(ge=0)
    outcome: Outcome
    failure_class: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    latency_ms: float | None = Field(None, ge=0)
    answer_usage: AnswerUsage | None = None  # completed cells of a run that generates answers

    @property
    def key(self) -> CellKey:
        return (self.case_id, self.repeat)

    @property
    def completed(self) -> bool:
        return self.outcome in COMPLETED

    @field_validator("failure_class")
    @classmethod
    def _class_only_when_failed(cls, value: str | None, info) -> str | None:
        outcome = info.data.get("outcome")
        if (outcome in COMPLETED) != (value is None):
            raise ValueError("failure_class is required for failed or cancelled cells and forbidden otherwise")
        return value


class BuildCost(FrozenModel):
    """What building and serving the arm's bundle costs, as deterministic figures of the bundle
    (never wall-clock): ``vectors`` embedded (a cold build's dominant cost: one encode per
    representation) and ``payload_bytes`` of its files (serving and storage), with the
    ``material_digest`` of the bytes they describe. The run records them from the verified
    manifest when it binds the bundle."""

    material_digest: str
    vectors: int = Field(ge=0)
    payload_bytes: int = Field(ge=0)


class AnswerCost(FrozenModel):
    """What answering cost per evaluated case, over its repeats' mean, then the cases' mean (as a
    metric aggregates): ``tokens_per_case`` (input + output) and ``micros_per_case`` — None when
    any contributing cell's figure is unknown (never a smaller number) — over ``cases`` cases."""

    cases: int
    calls: int
    tokens_per_case: float | None
    micros_per_case: float | None


class ArmRun(FrozenModel):
    run_id: str
    spec_id: str
    ledger_head: str
    coordinates: Coordinates
    variant: Variant
    expected: tuple[CellKey, ...]
    cells: tuple[CellOutcome, ...]
    skipped: dict[str, str] = Field(default_factory=dict)
    missing: dict[str, tuple[str, ...]] = Field(default_factory=dict)  # skipped case -> judged targets it lacks
    tags: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    build: BuildCost | None = None
    provisional: tuple[str, ...] = ()  # the suite's cases not yet adjudicated by a person, sorted

    def cases(self) -> set[str]:
        """The cases the run evaluates (those with an expected cell)."""
        return {case for case, _ in self.expected}

    def ref(self) -> ArmRef:
        return ArmRef(run_id=self.run_id, spec_id=self.spec_id, ledger_head=self.ledger_head)


class ArmRef(FrozenModel):
    """An arm's identities as a comparison or decision records them."""

    run_id: str
    spec_id: str
    ledger_head: str


class Aggregate(FrozenModel):
    """A metric over an arm: ``value`` over ``n`` evaluated cases (None when ``n`` is 0)."""

    value: float | None
    n: int


class ArmSummary(FrozenModel):
    """The per-arm view the hard, coverage and cost phases read (see ``summarize``)."""

    ref: ArmRef
    variant: Variant
    cells: int
    completed: int
    failed: dict[str, int]  # failure class -> failed or cancelled cells
    evaluated_cases: int
    aggregates: dict[str, Aggregate]
    latency_p95_ms: float | None
    latency_n: int
    build: BuildCost | None = None  # None: the run recorded no build figures
    answer_cost: AnswerCost | None = None  # None: the run generates no answers
    provisional: int = Field(0, ge=0)  # the suite's provisional cases (``ArmRun.provisional``)

    @property
    def failed_cells(self) -> int:
        return sum(self.failed.values())

    @model_serializer(mode="wrap")
    def _without_absent_figures(self, handler):
        """No ``build`` / ``answer_cost`` key when there are no such figures, and no
        ``provisional`` key when there is no provisional case, so a comparison of runs made before
        they were recorded keeps the content (and ID) it was written with."""
        data = handler(self)
        if isinstance(data, dict):
            for key in ("build", "answer_cost"):
                if data.get(key, 0) is None:
                    data.pop(key)
            if data.get("provisional") == 0:
                data.pop("provisional")
        return data


def nearest_rank(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least ``q`` of the sample at or below."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def case_means(cells: Iterable[CellOutcome]) -> dict[str, dict[str, float]]:
    """Case ID -> metric -> mean over the case's completed cells (its repeats)."""
    sums: dict[str, dict[str, list[float]]] = {}
    for cell in cells:
        if cell.completed:
            for name, value in cell.metrics.items():
                sums.setdefault(cell.case_id, {}).setdefault(name, []).append(value)
    return {case: {m: math.fsum(v) / len(v) for m, v in metrics.items()} for case, metrics in sums.items()}


def _per_case(values: dict[str, list[float | None]]) -> float | None:
    """The mean over cases of each case's mean over its cells; None if any value is unknown."""
    if not values or any(v is None for vs in values.values() for v in vs):
        return None
    return math.fsum(math.fsum(vs) / len(vs) for vs in values.values()) / len(values)  # type: ignore[arg-type]


def answer_cost(arm: ArmRun, evaluated: list[str]) -> AnswerCost | None:
    """Per-case answer usage over the evaluated cases (``AnswerCost``); None when the run
    generates no answers or recorded no usage (runs made before it was recorded keep the
    comparison content they were written with)."""
    if not arm.coordinates.answers or all(c.answer_usage is None for c in arm.cells):
        return None
    tokens: dict[str, list[float | None]] = {}
    micros: dict[str, list[float | None]] = {}
    calls, wanted = 0, set(evaluated)
    for cell in arm.cells:
        if cell.case_id not in wanted:
            continue
        u = cell.answer_usage
        known = u is not None and u.input_tokens is not None and u.output_tokens is not None
        tokens.setdefault(cell.case_id, []).append(float(u.input_tokens + u.output_tokens) if known else None)  # type: ignore[union-attr,operator]
        cost = None if u is None or u.cost_micros is None else float(u.cost_micros)
        micros.setdefault(cell.case_id, []).append(cost)
        calls += 0 if u is None else u.calls
    return AnswerCost(
        cases=len(tokens), calls=calls, tokens_per_case=_per_case(tokens), micros_per_case=_per_case(micros)
    )


def summarize(arm: ArmRun) -> ArmSummary:
    """Counts, failures by class, aggregates, p95 latency, build figures and answer cost of one
    (integrity-checked) arm.

    As the evaluation report: a case is *evaluated* when all its cells completed; a metric's value is
    the mean (or sum) over evaluated cases carrying it of each case's mean over its repeats;
    latency is the nearest-rank p95 over completed cells."""
    per_case_cells: dict[str, list[CellOutcome]] = {}
    for cell in arm.cells:
        per_case_cells.setdefault(cell.case_id, []).append(cell)
    evaluated = sorted(c for c, cells in per_case_cells.items() if all(x.completed for x in cells))
    means = case_means(arm.cells)
    aggregates = {}
    for decl in sorted(arm.coordinates.metrics, key=lambda m: m.name):
        values = [means[c][decl.name] for c in evaluated if decl.name in means.get(c, {})]
        total = math.fsum(values)
        value = None if not values else (total if decl.aggregate == "sum" else total / len(values))
        aggregates[decl.name] = Aggregate(value=value, n=len(values))
    failed: dict[str, int] = {}
    for cell in arm.cells:
        if not cell.completed:
            failed[str(cell.failure_class)] = failed.get(str(cell.failure_class), 0) + 1
    latencies = [c.latency_ms for c in arm.cells if c.completed and c.latency_ms is not None]
    return ArmSummary(
        ref=arm.ref(),
        variant=arm.variant,
        cells=len(arm.cells),
        completed=sum(1 for c in arm.cells if c.completed),
        failed=dict(sorted(failed.items())),
        evaluated_cases=len(evaluated),
        aggregates=aggregates,
        latency_p95_ms=nearest_rank(latencies, 0.95),
        latency_n=len(latencies),
        build=arm.build,
        answer_cost=answer_cost(arm, evaluated),
        provisional=len(arm.provisional),
    )
