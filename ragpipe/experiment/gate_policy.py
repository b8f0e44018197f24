"""The gate policy: an ordered, checked-in YAML file with a content ID (``docs/gates.md``).

Phases, in this fixed order (the file must list them so): ``hard`` (bounds on the challenger's
aggregates: safety and contract floors), ``coverage`` (failed-cell rate per arm, minimum cases),
``target`` (metric, minimum improvement, and the evidence rule: CI lower bound > 0 or p < alpha),
``regression`` (maximum allowed loss per metric, overall and per protected tag slice), ``cost``
(p95 latency and build-cost limits, read only as a tie-break after quality). ``bootstrap_floors``
are the absolute bounds that replace the relative target when there is no incumbent. ``refresh``
(optional) holds the non-inferiority ``margin`` that replaces the target's improvement checks for
a refresh (``ragpipe.experiment.change``); ``coverage`` may bound lost coverage
(``max_lost_rate``), set the floors of new coverage (``new_coverage_floors``) and bound the suite's
provisional cases, those no person has adjudicated yet (``max_provisional_cases``; 0: none).

Refused at load, with ``<file>:<line>: <key path>: <rule>``: YAML errors, duplicate keys,
nesting deeper than 64 levels, YAML aliases (``kernel/strict_load.py``),
unknown phases or keys, missing phases, phases out of order, unknown metrics, non-numbers
(booleans included), non-finite thresholds, and contradictory bounds (min above max, a bound
outside the metric's range, an unreachable improvement, no bootstrap floor for the target, a
build-cost ratio below 1), and a policy that bounds a judge label metric (``answer_label``, the
label rates, ``required_fact_recall``, ``groundedness_rate``: anywhere) without a hard ``max``
on ``judge_failure_rate`` — a judged cell recorded as a judge failure keeps no label, so without
that bound a bad label could be hidden as a provider failure. The policy ID is
``content_id("gate-policy", 1, policy)``; thresholds are stored as floats so ``0`` and ``0.0``
give one ID, and mapping order never changes it. A build-cost bound that is left out or ``null``
is not in the ID at all, nor are ``refresh``, ``max_lost_rate``, ``new_coverage_floors`` and
``max_provisional_cases`` at their defaults, so a policy written before those fields existed
keeps its ID.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_serializer

from ragpipe.evaluation.judging import JUDGE_METRICS
from ragpipe.experiment.catalog import ARM_ONLY, KNOWN_NAMES, known_metric
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.models import FrozenModel
from ragpipe.kernel.strict_load import StrictLoadError, load_yaml_lines
from ragpipe.spec import yaml_error_text

DEFAULT_POLICY_PATH = Path(__file__).resolve().parent.parent / "specs" / "gate_policy.yaml"
PHASES = ("hard", "coverage", "target", "regression", "cost")
SCHEMA = "ragpipe.gate_policy/v1"


class PolicyError(ValueError):
    """A gate policy is refused; ``str(e)`` names the file, line and key path."""


class HardBound(FrozenModel):
    min: float | None = None
    max: float | None = None
    if_measured: bool = False  # True: a run that does not measure the metric skips the check


DEFAULT_MAX_LOST_RATE = 0.1
DEFAULT_MARGIN = 0.01


class CoveragePolicy(FrozenModel):
    """``max_lost_rate``: cases only the incumbent could evaluate (their judged documents left the
    corpus) over paired cases; ``new_coverage_floors``: the absolute floors on the cases only the
    challenger can evaluate (None: the bootstrap floors); ``max_provisional_cases``: the most
    suite cases not yet adjudicated by a person (None: no bound; 0: the suite must hold none).
    Each at its default is left out of the dump (hence the ID): a policy written before they
    existed keeps its ID."""

    max_failed_rate: float
    min_cases: int
    max_lost_rate: float = DEFAULT_MAX_LOST_RATE
    new_coverage_floors: dict[str, float] | None = None
    max_provisional_cases: int | None = None

    @model_serializer(mode="wrap")
    def _without_defaults(self, handler):
        data = handler(self)
        if isinstance(data, dict):
            if data.get("max_lost_rate") == DEFAULT_MAX_LOST_RATE:
                del data["max_lost_rate"]
            for key in ("new_coverage_floors", "max_provisional_cases"):
                if data.get(key, 0) is None:
                    del data[key]
        return data


class RefreshPolicy(FrozenModel):
    """A refresh (only the corpus differs from the incumbent) passes the target phase when the
    lower bound of the paired interval of the target metric's delta is >= -``margin``."""

    margin: float = DEFAULT_MARGIN


class TargetPolicy(FrozenModel):
    metric: str
    min_improvement: float
    evidence: Literal["ci_lower", "p_value"]
    alpha: float


class RegressionPolicy(FrozenModel):
    overall: dict[str, float]
    tags: dict[str, dict[str, float]]


BUILD_BOUNDS = ("max_build_vectors_ratio", "max_build_vectors", "max_bundle_bytes_ratio", "max_bundle_bytes")
ANSWER_BOUNDS = ("max_answer_tokens_per_case", "max_answer_micros_per_case")
OPTIONAL_BOUNDS = (*BUILD_BOUNDS, *ANSWER_BOUNDS)
COST_KEYS = ("max_p95_latency_ratio", "latency_slack_ms", "max_p95_latency_ms", *OPTIONAL_BOUNDS)


class CostPolicy(FrozenModel):
    """Latency: challenger p95 <= max(incumbent p95 x ratio, incumbent p95 + slack), and an
    absolute ceiling. Build cost (the bundle's figures, ``arms.BuildCost``): challenger vectors
    <= incumbent vectors x ratio, challenger payload bytes <= incumbent bytes x ratio, and
    absolute ceilings on each. Answer cost (``arms.AnswerCost``, runs that generate answers):
    ceilings on model tokens (input + output) and micros per evaluated case. ``None``: no such
    bound."""

    max_p95_latency_ratio: float | None = None
    latency_slack_ms: float = 0.0
    max_p95_latency_ms: float | None = None
    max_build_vectors_ratio: float | None = None
    max_build_vectors: float | None = None
    max_bundle_bytes_ratio: float | None = None
    max_bundle_bytes: float | None = None
    max_answer_tokens_per_case: float | None = None
    max_answer_micros_per_case: float | None = None

    @model_serializer(mode="wrap")
    def _without_unset_bounds(self, handler):
        """Unset build- and answer-cost bounds are left out of the dump (hence the policy ID): a
        policy that does not set them has the ID it had before these bounds existed."""
        data = handler(self)
        if isinstance(data, dict):
            for key in OPTIONAL_BOUNDS:
                if data.get(key, 0) is None:
                    del data[key]
        return data


class GatePolicy(FrozenModel):
    schema_: Literal["ragpipe.gate_policy/v1"] = Field(SCHEMA, alias="schema")
    human_apply_required: bool = True
    hard: dict[str, HardBound]
    coverage: CoveragePolicy
    target: TargetPolicy
    regression: RegressionPolicy
    refresh: RefreshPolicy = RefreshPolicy()
    cost: CostPolicy
    bootstrap_floors: dict[str, float]

    @model_serializer(mode="wrap")
    def _without_default_refresh(self, handler):
        """A ``refresh`` section equal to the defaults is left out (a policy written before
        refreshes were told apart keeps its ID; spelling the defaults out changes nothing)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("refresh") == {"margin": DEFAULT_MARGIN}:
            del data["refresh"]
        return data

    @property
    def floors_of_new_coverage(self) -> dict[str, float]:
        """The absolute floors the challenger's new-coverage cases must reach."""
        floors = self.coverage.new_coverage_floors
        return dict(self.bootstrap_floors if floors is None else floors)

    @property
    def policy_id(self) -> str:
        return content_id("gate-policy", 1, self.model_dump(mode="json", by_alias=True))

    def metrics(self) -> set[str]:
        """Every metric the policy names."""
        names = set(self.hard) | {self.target.metric} | set(self.regression.overall) | set(self.bootstrap_floors)
        names |= set(self.coverage.new_coverage_floors or {})
        return names | {m for limits in self.regression.tags.values() for m in limits}


class _Reader:
    """Validation helpers that raise ``PolicyError`` naming file, line and key path."""

    def __init__(self, where: str, lines: dict[str, int]):
        self.where, self.lines = where, lines

    def fail(self, path: str, rule: str) -> PolicyError:
        probe = path
        while probe not in self.lines and probe:
            probe = probe.rpartition(".")[0]
        return PolicyError(f"{self.where}:{self.lines.get(probe, 1)}: {path or 'policy'}: {rule}")

    def mapping(
        self, value: Any, path: str, keys: tuple[str, ...] | None = None, required: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, got {type(value).__name__}")
        if keys is not None:
            unknown = [k for k in value if k not in keys]
            if unknown:
                raise self.fail(f"{path}.{unknown[0]}", f"unknown key (allowed: {', '.join(keys)})")
        missing = [k for k in required if k not in value]
        if missing:
            raise self.fail(path, f"missing key {missing[0]!r}")
        return value

    def number(
        self, value: Any, path: str, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(path, f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise self.fail(path, f"threshold must be finite, got {value!r}")
        if lo is not None and (value <= lo if lo_open else value < lo):
            raise self.fail(path, f"must be {'>' if lo_open else '>='} {lo:g}, got {value!r}")
        if hi is not None and value > hi:
            raise self.fail(path, f"must be <= {hi:g}, got {value!r}")
        return float(value)

    def metric(self, name: Any, path: str):
        known = known_metric(name) if isinstance(name, str) else None
        if known is None:
            raise self.fail(path, f"unknown metric {name!r} (known: {KNOWN_NAMES})")
        return known

    def paired_metric(self, name: Any, path: str):
        """A metric compared case by case between the arms (a target or a regression limit)."""
        known = self.metric(name, path)
        if known.name in ARM_ONLY:
            raise self.fail(
                path,
                f"{known.name} describes one arm's index, not a paired measurement of the cases: "
                "bound it under hard (or bootstrap_floors)",
            )
        return known

    def in_range(self, name: str, value: Any, path: str) -> float:
        """A threshold on metric ``name``: finite and inside the metric's range."""
        known = self.metric(name, path)
        number = self.number(value, path)
        if number < known.lo or (known.hi is not None and number > known.hi):
            span = f"[{known.lo:g}, {'inf' if known.hi is None else f'{known.hi:g}'}]"
            raise self.fail(path, f"contradictory bound: {number:g} is outside the range {span} of {name}")
        return number

    def loss(self, name: str, value: Any, path: str) -> float:
        known = self.paired_metric(name, path)
        width = None if known.hi is None else known.hi - known.lo
        number = self.number(value, path, 0.0)
        if width is not None and number > width:
            raise self.fail(
                path, f"contradictory bound: a change of {number:g} exceeds the range width {width:g} of {name}"
            )
        return number


def _hard(r: _Reader, raw: Any) -> dict[str, HardBound]:
    out = {}
    for name, bound in r.mapping(raw, "hard").items():
        path = f"hard.{name}"
        r.metric(name, path)
        spec = r.mapping(bound, path, ("min", "max", "if_measured"))
        if "min" not in spec and "max" not in spec:
            raise r.fail(path, "needs min or max")
        lo = r.in_range(name, spec["min"], f"{path}.min") if "min" in spec else None
        hi = r.in_range(name, spec["max"], f"{path}.max") if "max" in spec else None
        if lo is not None and hi is not None and lo > hi:
            raise r.fail(path, f"contradictory bounds: min {lo:g} > max {hi:g}")
        flag = spec.get("if_measured", False)
        if not isinstance(flag, bool):
            raise r.fail(f"{path}.if_measured", f"must be true or false, got {flag!r}")
        out[name] = HardBound(min=lo, max=hi, if_measured=flag)
    return out


COVERAGE_KEYS = ("max_failed_rate", "min_cases", "max_lost_rate", "new_coverage_floors", "max_provisional_cases")


def _coverage(r: _Reader, raw: Any) -> CoveragePolicy:
    spec = r.mapping(raw, "coverage", COVERAGE_KEYS, ("max_failed_rate", "min_cases"))
    cases = spec["min_cases"]
    if isinstance(cases, bool) or not isinstance(cases, int) or cases < 1:
        raise r.fail("coverage.min_cases", f"must be an integer >= 1, got {cases!r}")
    floors = spec.get("new_coverage_floors")
    provisional = spec.get("max_provisional_cases")
    if provisional is not None and (
        isinstance(provisional, bool) or not isinstance(provisional, int) or provisional < 0
    ):
        raise r.fail(
            "coverage.max_provisional_cases", f"must be an integer >= 0 (a count of cases), got {provisional!r}"
        )
    return CoveragePolicy(
        max_failed_rate=r.number(spec["max_failed_rate"], "coverage.max_failed_rate", 0.0, 1.0),
        min_cases=cases,
        max_lost_rate=r.number(spec.get("max_lost_rate", DEFAULT_MAX_LOST_RATE), "coverage.max_lost_rate", 0.0, 1.0),
        new_coverage_floors=None
        if floors is None
        else {
            name: r.in_range(name, value, f"coverage.new_coverage_floors.{name}")
            for name, value in r.mapping(floors, "coverage.new_coverage_floors").items()
        },
        max_provisional_cases=provisional,
    )


def _refresh(r: _Reader, raw: Any, metric: str) -> RefreshPolicy:
    """The refresh section; its margin is a loss of the target ``metric`` (within its range)."""
    if raw is None:
        return RefreshPolicy()
    spec = r.mapping(raw, "refresh", ("margin",), ("margin",))
    return RefreshPolicy(margin=r.loss(metric, spec["margin"], "refresh.margin"))


def _target(r: _Reader, raw: Any) -> TargetPolicy:
    keys = ("metric", "min_improvement", "evidence", "alpha")
    spec = r.mapping(raw, "target", keys, keys)
    r.paired_metric(spec["metric"], "target.metric")
    if spec["evidence"] not in ("ci_lower", "p_value"):
        raise r.fail("target.evidence", f"must be ci_lower or p_value, got {spec['evidence']!r}")
    return TargetPolicy(
        metric=spec["metric"],
        min_improvement=r.loss(spec["metric"], spec["min_improvement"], "target.min_improvement"),
        evidence=spec["evidence"],
        alpha=r.number(spec["alpha"], "target.alpha", 0.0, 0.5, lo_open=True),
    )


def _losses(r: _Reader, raw: Any, path: str) -> dict[str, float]:
    return {name: r.loss(name, value, f"{path}.{name}") for name, value in r.mapping(raw, path).items()}


def _regression(r: _Reader, raw: Any) -> RegressionPolicy:
    spec = r.mapping(raw, "regression", ("overall", "tags"), ("overall", "tags"))
    tags = r.mapping(spec["tags"], "regression.tags")
    return RegressionPolicy(
        overall=_losses(r, spec["overall"], "regression.overall"),
        tags={tag: _losses(r, limits, f"regression.tags.{tag}") for tag, limits in tags.items()},
    )


def _build_ratio(r: _Reader, value: Any, path: str) -> float | None:
    """A build-cost ratio: > 0, and not below 1 — a challenger on the incumbent's own bundle (a
    query-plan change) has ratio 1, so a smaller one would refuse every such challenger."""
    if value is None:
        return None
    ratio = r.number(value, path, 0.0, lo_open=True)
    if ratio < 1.0:
        raise r.fail(
            path,
            f"contradictory bound: a ratio of {ratio:g} is below 1, so a challenger on the incumbent's own bundle could never pass",
        )
    return ratio


def _build_ceiling(r: _Reader, value: Any, path: str) -> float | None:
    """An absolute ceiling on a count (vectors, bytes, tokens or micros): a whole number > 0."""
    if value is None:
        return None
    ceiling = r.number(value, path, 0.0, lo_open=True)
    if not ceiling.is_integer():
        raise r.fail(path, f"must be a whole number (a count), got {value!r}")
    return ceiling


def _cost(r: _Reader, raw: Any) -> CostPolicy:
    spec = r.mapping(raw, "cost", COST_KEYS)
    ratio, ceiling = spec.get("max_p95_latency_ratio"), spec.get("max_p95_latency_ms")
    return CostPolicy(
        max_p95_latency_ratio=None
        if ratio is None
        else r.number(ratio, "cost.max_p95_latency_ratio", 0.0, lo_open=True),
        latency_slack_ms=r.number(spec.get("latency_slack_ms", 0.0), "cost.latency_slack_ms", 0.0),
        max_p95_latency_ms=None if ceiling is None else r.number(ceiling, "cost.max_p95_latency_ms", 0.0, lo_open=True),
        max_build_vectors_ratio=_build_ratio(r, spec.get("max_build_vectors_ratio"), "cost.max_build_vectors_ratio"),
        max_build_vectors=_build_ceiling(r, spec.get("max_build_vectors"), "cost.max_build_vectors"),
        max_bundle_bytes_ratio=_build_ratio(r, spec.get("max_bundle_bytes_ratio"), "cost.max_bundle_bytes_ratio"),
        max_bundle_bytes=_build_ceiling(r, spec.get("max_bundle_bytes"), "cost.max_bundle_bytes"),
        max_answer_tokens_per_case=_build_ceiling(
            r, spec.get("max_answer_tokens_per_case"), "cost.max_answer_tokens_per_case"
        ),
        max_answer_micros_per_case=_build_ceiling(
            r, spec.get("max_answer_micros_per_case"), "cost.max_answer_micros_per_case"
        ),
    )


def _check_phase_order(r: _Reader, doc: dict[str, Any]) -> None:
    allowed = ("schema", "human_apply_required", *PHASES, "refresh", "bootstrap_floors")
    for key in doc:
        if key not in allowed:
            raise r.fail(
                key,
                f"unknown phase (phases, in order: {', '.join(PHASES)}; other keys: schema, human_apply_required, refresh, bootstrap_floors)",
            )
    missing = [p for p in PHASES if p not in doc]
    if missing:
        raise r.fail("", f"missing phase {missing[0]!r} (every phase is declared, even when empty)")
    listed = [k for k in doc if k in PHASES]
    if listed != list(PHASES):
        wrong = next(k for k, p in zip(listed, PHASES) if k != p)
        raise r.fail(wrong, f"phase out of order (phases run, and are listed, in the order {', '.join(PHASES)})")
    if "bootstrap_floors" not in doc:
        raise r.fail("", "missing key 'bootstrap_floors' (the absolute floors of a decision without an incumbent)")


# The judge's label metrics: what a forger could hide by recording a judged cell as a judge failure.
LABEL_METRICS = tuple(m for m in JUDGE_METRICS if m != "judge_failure_rate")


def _label_bounds(policy: GatePolicy) -> list[str]:
    """Where ``policy`` bounds a judge label metric, as key paths, in file order."""
    named = [
        *((f"hard.{m}", m) for m in policy.hard),
        (f"target.metric ({policy.target.metric})", policy.target.metric),
        *((f"regression.overall.{m}", m) for m in policy.regression.overall),
        *((f"regression.tags.{t}.{m}", m) for t, limits in policy.regression.tags.items() for m in limits),
        *((f"coverage.new_coverage_floors.{m}", m) for m in policy.coverage.new_coverage_floors or {}),
        *((f"bootstrap_floors.{m}", m) for m in policy.bootstrap_floors),
    ]
    return [path for path, metric in named if metric in LABEL_METRICS]


def _check_judge_failures_bounded(r: _Reader, policy: GatePolicy) -> None:
    """A policy that bounds a judge label must bound ``judge_failure_rate`` with a hard max (module docstring)."""
    labels = _label_bounds(policy)
    bound = policy.hard.get("judge_failure_rate")
    if labels and (bound is None or bound.max is None or bound.max >= 1):
        raise r.fail(
            "hard" if bound is None else "hard.judge_failure_rate",
            f"the policy bounds a judge label ({labels[0]}), so it must bound judge_failure_rate with a max "
            "below 1 (a judged answer recorded as a judge failure keeps no label and would escape that bound)",
        )


def parse_policy(doc: Any, where: str, lines: dict[str, int] | None = None) -> GatePolicy:
    """A ``GatePolicy`` from a parsed document (module docstring for what is refused)."""
    r = _Reader(where, lines or {})
    r.mapping(doc, "")
    _check_phase_order(r, doc)
    if doc.get("schema") != SCHEMA:
        raise r.fail("schema", f"must be {SCHEMA!r}, got {doc.get('schema')!r}")
    apply_flag = doc.get("human_apply_required", True)
    if not isinstance(apply_flag, bool):
        raise r.fail("human_apply_required", f"must be true or false, got {apply_flag!r}")
    target = _target(r, doc["target"])
    floors = {
        name: r.in_range(name, value, f"bootstrap_floors.{name}")
        for name, value in r.mapping(doc.get("bootstrap_floors"), "bootstrap_floors").items()
    }
    if target.metric not in floors:
        raise r.fail(
            "bootstrap_floors",
            f"contradictory policy: no floor for the target metric {target.metric!r} (a bootstrap decision would have no target)",
        )
    policy = GatePolicy(
        human_apply_required=apply_flag,
        hard=_hard(r, doc["hard"]),
        coverage=_coverage(r, doc["coverage"]),
        target=target,
        regression=_regression(r, doc["regression"]),
        refresh=_refresh(r, doc.get("refresh"), target.metric),
        cost=_cost(r, doc["cost"]),
        bootstrap_floors=floors,
    )
    _check_judge_failures_bounded(r, policy)
    return policy


def policy_document(policy: GatePolicy) -> dict[str, Any]:
    """``policy`` as a document ``parse_policy`` reads back to the same policy (same ID): its
    JSON form without the bounds that are not set (``null`` is how a file leaves a bound out)."""

    def present(value: Any) -> Any:
        return {k: present(v) for k, v in value.items() if v is not None} if isinstance(value, dict) else value

    return present(policy.model_dump(mode="json", by_alias=True))


def _load_error_text(exc: StrictLoadError, path: Path) -> str:
    """``<file>:<line>: <rule>``: a duplicate key (``target.alpha: duplicate key (first at line
    13)``), nesting deeper than the bound, an alias or a non-string key as the strict reading words
    them; a YAML syntax error as ``invalid YAML: <problem>``; an unmarked one (a character YAML
    never accepts) as ``<file>: cannot read gate policy: <problem>``."""
    original = exc.original
    if isinstance(original, yaml.MarkedYAMLError):
        return f"{path}:{exc.line}: invalid YAML: {original.problem or original.context}"
    if isinstance(original, yaml.YAMLError):
        return f"{path}: cannot read gate policy: {yaml_error_text(original)}"
    return str(exc)


def load_policy(path: Path | None = None) -> GatePolicy:
    """Read and validate a policy file (default: ``ragpipe/specs/gate_policy.yaml``)."""
    path = Path(path or DEFAULT_POLICY_PATH)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read gate policy: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc, lines = load_yaml_lines(text, str(path), string_keys=True)
    except StrictLoadError as exc:
        raise PolicyError(_load_error_text(exc, path)) from None
    return parse_policy(doc, str(path), lines)
