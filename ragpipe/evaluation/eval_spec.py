"""The evaluation spec: what an evaluation run computes, and its semantic ID.

``SpecBody`` holds exactly what can change a result: the suite digest, the bundle ID, the query
plan ID (its answer plan included), the mode, the subject's scopes (the run's default; a case's
own subject overrides it), the retrieval depth ``k``, the metric specs with their cutoffs, the
repeats, the arm label, whether answers are generated, and the evaluator version. The spec ID is
``content_id("evaluation-spec", 1, body)``; a plan that searches vectors approximately adds the
metric ``ann_recall@10`` (``ragpipe.evaluation.ann``), an exact one adds nothing. Never in it: the run folder, the run ID, time, host,
thread counts, the bundle's path (a bundle is named by its ID) or the subject's principal (policy
scope-intersection/v1 decides on scopes only).

``EvaluationSpec`` is the body plus the inputs it names (suite, plan, bundle path), so one object
is all ``run_evaluation`` needs; only ``body`` is hashed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.evaluation.ann import ann_metric_specs
from ragpipe.evaluation.judge_spec import JudgeSpec
from ragpipe.evaluation.judging import judge_metric_specs
from ragpipe.evaluation.metrics import MetricSpec, default_metric_specs
from ragpipe.evaluation.safety import answer_metric_specs, safety_metric_specs
from ragpipe.evaluation.suite import Suite
from ragpipe.kernel.ids import content_id
from ragpipe.retrieval.plan import QueryPlan

SPEC_KIND = "evaluation-spec"
SPEC_VERSION = 1
# Bumped whenever the runner's way of turning a case into metrics changes (docs/architecture.md, identities).
EVALUATOR = "ragpipe.evaluation.runner/v1"
DEFAULT_DEPTH = 1000  # trec_eval's customary run depth: every cutoff up to 1000 sees a full list
MODES = ("hybrid", "lexical", "vector")


class SpecBody(BaseModel):
    """The hashed part of an evaluation spec (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    spec_schema: Literal["ragpipe.evaluation_spec/v1"] = Field("ragpipe.evaluation_spec/v1", alias="schema")
    evaluator: str = EVALUATOR
    suite_digest: str
    bundle_id: str
    plan_id: str
    mode: Literal["hybrid", "lexical", "vector"]
    scopes: tuple[str, ...]
    k: int = Field(ge=1, le=10_000)
    metrics: tuple[MetricSpec, ...]
    repeats: int = Field(1, ge=1, le=100)
    arm: str = Field("a", pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")
    answers: bool = False
    # The judge spec ID (``ragpipe.evaluation.judge_spec``) when answers are judged; left out of the
    # body when None, so every unjudged spec keeps its ID.
    judge: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _judge_needs_answers(self) -> SpecBody:
        if self.judge is not None and not self.answers:
            raise ValueError("a judge judges answers: a run with a judge generates answers")
        return self

    @field_validator("scopes")
    @classmethod
    def _sorted_scopes(cls, scopes: tuple[str, ...]) -> tuple[str, ...]:
        if not scopes:
            raise ValueError("at least one scope")
        bad = [s for s in scopes if not SCOPE_PATTERN.match(s)]
        if bad:
            raise ValueError(f"invalid scope name {bad[0]!r}")
        return tuple(sorted(set(scopes)))

    @property
    def spec_id(self) -> str:
        return content_id(SPEC_KIND, SPEC_VERSION, self.as_json())

    def as_json(self) -> dict[str, object]:
        data = self.model_dump(mode="json", by_alias=True)
        if data["judge"] is None:
            del data["judge"]
        return data

    def ranking_metrics(self) -> tuple[MetricSpec, ...]:
        return tuple(m for m in self.metrics if m.is_ranking)


def metric_specs(
    cutoffs: Mapping[str, int] | None = None, answers: bool = False, ann: bool = False, judged: bool = False
) -> tuple[MetricSpec, ...]:
    """Ranking metrics (``cutoffs`` per family), the safety metric, the answer metrics when the
    run generates answers, ``ann_recall@10`` when its plan searches vectors approximately
    (``ragpipe.evaluation.ann``) and the judge's metrics when its answers are judged
    (``ragpipe.evaluation.judging``) — in that fixed order."""
    return (
        default_metric_specs(cutoffs)
        + safety_metric_specs()
        + (answer_metric_specs() if answers else ())
        + (ann_metric_specs() if ann else ())
        + (judge_metric_specs() if judged else ())
    )


def searches_approximately(plan: QueryPlan, mode: str) -> bool:
    """Whether queries of ``mode`` under ``plan`` search vectors approximately (and so a run
    measures ``ann_recall@10``)."""
    return plan.approximate and mode in ("hybrid", "vector")


@dataclass(frozen=True)
class EvaluationSpec:
    """The spec body plus the inputs it names; ``bundle_path`` is operational (never hashed)."""

    body: SpecBody
    suite: Suite
    plan: QueryPlan
    bundle_path: Path
    judge: JudgeSpec | None = None  # the spec ``body.judge`` names (its ID), when answers are judged

    @property
    def spec_id(self) -> str:
        return self.body.spec_id

    @classmethod
    def build(
        cls,
        suite: Suite,
        plan: QueryPlan,
        bundle_path: Path,
        bundle_id: str,
        *,
        mode: str = "hybrid",
        scopes: tuple[str, ...] = ("public",),
        k: int = DEFAULT_DEPTH,
        cutoffs: Mapping[str, int] | None = None,
        repeats: int = 1,
        arm: str = "a",
        answers: bool = False,
        judge: JudgeSpec | None = None,
    ) -> EvaluationSpec:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r} (hybrid, lexical, vector)")
        if judge is not None and not answers:
            raise ValueError("a judge judges answers: evaluate with answers to judge them")
        body = SpecBody(
            suite_digest=suite.digest,
            bundle_id=bundle_id,
            plan_id=plan.plan_id,
            mode=mode,
            scopes=tuple(scopes),
            k=k,
            metrics=metric_specs(cutoffs, answers, searches_approximately(plan, mode), judge is not None),
            repeats=repeats,
            arm=arm,
            answers=answers,
            judge=None if judge is None else judge.spec_id,
        )
        return cls(body, suite, plan, Path(bundle_path), judge)
