"""Running a candidate: build the challenger's bundle if needed, evaluate both arms, pair, compare, decide.

``run_candidate(ws, candidate, build)``:

1. The incumbent is the parent: the bundle last built for the parent revision (refused unless
   built under the parent's pipeline spec) served with the parent's query plan.
2. The challenger: a plan change (``query_plan`` / ``answer_plan``) reuses the parent's bundle
   with the candidate's plan; a build-side change registers the derived revision
   (``record.build_revision``) from the parent revision's source and calls ``build(revision,
   pipeline_path)``, which must materialize it through Dagster with the candidate's
   ``pipeline.yaml`` (``ragpipe.cli.candidate`` passes one; this package never imports Dagster).
   The embedding cache is workspace-wide, so unchanged texts are cache hits; the parent's
   ``latest`` pointers are never touched (the derived revision has its own).
3. Both arms run the candidate's locked suite with the locked evaluator settings
   (``run_evaluation``, arms labelled), then ``pair`` -> ``compare`` -> ``decide``.

Everything is written under ``<candidate>/run/``: ``incumbent/`` and ``challenger/`` run folders,
``comparison.json``, ``decision.json`` and, last, ``result.json`` (``CandidateResult.as_json``).
A candidate is run once. ``incumbent_run`` lets a tune chain reuse the incumbent's completed run
(its bundle, plan and coordinates are checked: it must be the parent's).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragpipe.candidates.asset_ids import BUILD_ASSETS
from ragpipe.candidates.folder import PIPELINE, Candidate, CandidateError
from ragpipe.corpus.registry import load_revision, register_revision
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.runner import Progress, run_evaluation
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.comparison import ALL, compare, write_comparison
from ragpipe.experiment.decision import Decision, decide
from ragpipe.experiment.pairing import pair
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.workspace import Workspace
from ragpipe.retrieval.plan import QueryPlan
from ragpipe.retrieval.retriever import Retriever
from ragpipe.spec import PipelineSpec
from ragpipe.stages.steps import StageError, read_stage_record

RUN = "run"


@dataclass(frozen=True)
class BuiltBundle:
    """What a build reports: the bundle, how many texts were embedded or cache hits, and the
    model calls of its generated representations."""

    revision: str
    bundle_id: str
    bundle_path: Path
    embedded: int
    cache_hits: int
    up_to_date: bool
    dagster_run_id: str | None
    generation: dict[str, Any] | None = None  # the build summary's model calls (None: no generated kind)


Build = Callable[[str, Path], BuiltBundle]  # (revision key, pipeline spec path) -> the built bundle


@dataclass(frozen=True)
class CandidateResult:
    candidate_id: str
    out: Path
    incumbent_run: Path
    challenger_run: Path
    decision: Decision
    comparison_id: str
    target: dict[str, Any]
    build: BuiltBundle | None
    seconds: float

    def as_json(self) -> dict[str, Any]:
        d = self.decision
        build = None if self.build is None else {**self.build.__dict__, "bundle_path": str(self.build.bundle_path)}
        return {
            "candidate_id": self.candidate_id,
            "out": str(self.out),
            "incumbent_run": str(self.incumbent_run),
            "challenger_run": str(self.challenger_run),
            "comparison_id": self.comparison_id,
            "decision_id": d.decision_id,
            "eligible": d.eligible,
            "decisive_phase": d.decisive_phase,
            "reasons": list(d.reasons),
            "target": self.target,
            "build": build,
            "seconds": round(self.seconds, 3),
        }


def bundle_of(ws: Workspace, revision: str, spec: PipelineSpec) -> tuple[Path, str]:
    """(path, ID) of the bundle last built for ``revision``, refused unless built under ``spec``."""
    try:
        facts = read_stage_record(ws, revision, "index_bundle", spec).facts
    except StageError as exc:
        raise CandidateError(f"revision {revision!r}: {exc}") from None
    return ws.located(str(facts["bundle_path"])), str(facts["bundle_id"])


def evaluate_arm(
    candidate: Candidate, bundle: Path, plan: QueryPlan, arm: str, out: Path, on_progress: Progress | None = None
) -> Path:
    """One completed evaluation run of ``plan`` on ``bundle`` under the candidate's locked settings."""
    settings = candidate.record.evaluator
    retriever = Retriever(bundle, plan=plan)
    try:
        spec = EvaluationSpec.build(
            candidate.suite,
            plan,
            bundle,
            retriever.bundle_id,
            mode=settings.mode,
            scopes=settings.scopes,
            k=settings.k,
            repeats=settings.repeats,
            arm=arm,
        )
        run_evaluation(spec, out, retriever_factory=lambda _: retriever, on_progress=on_progress)
    finally:
        retriever.close()
    return out


def challenger_bundle(ws: Workspace, candidate: Candidate, build: Build) -> tuple[Path, BuiltBundle | None]:
    """The parent's bundle for a plan change; for a build-side change, the derived revision's,
    registered from the parent revision's source and built by ``build``."""
    record = candidate.record
    if record.change.asset not in BUILD_ASSETS:
        return bundle_of(ws, record.parent.revision, candidate.parent_pipeline)[0], None
    source = load_revision(ws.registry, record.parent.revision)
    register_revision(
        ws.registry,
        record.build_revision,
        Path(source.source_path),
        source.format,
        source.default_scope,
        source.wxr_statuses,
    )
    built = build(record.build_revision, candidate.folder / PIPELINE)
    path = bundle_of(ws, record.build_revision, candidate.pipeline)[0]
    if path.resolve() != Path(built.bundle_path).resolve():
        raise CandidateError(
            f"the build of {record.build_revision!r} reported bundle {built.bundle_path}, but its index_bundle record names {path}"
        )
    return path, built


def _check_incumbent(run: Path, bundle_id: str, plan: QueryPlan) -> None:
    variant = load_arm(run).variant
    if (variant.bundle_id, variant.plan_id) != (bundle_id, plan.plan_id):
        raise CandidateError(
            f"{run}: the incumbent run evaluated bundle {variant.bundle_id} with plan {variant.plan_id}, "
            f"not the parent's bundle {bundle_id} with plan {plan.plan_id}"
        )


def target_stats(comparison_json: dict[str, Any], metric: str) -> dict[str, Any]:
    stats = comparison_json["slices"][ALL]["metrics"][metric]["stats"]
    return {
        "metric": metric,
        **{k: stats[k] for k in ("n", "mean", "ci_low", "ci_high", "p_value", "wins", "ties", "losses")},
    }


def run_candidate(
    ws: Workspace,
    candidate: Candidate,
    build: Build,
    *,
    incumbent_run: Path | None = None,
    labels: tuple[str, str] = ("incumbent", "challenger"),
    on_progress: Progress | None = None,
) -> CandidateResult:
    """Run ``candidate`` (module docstring); the decision says whether it is eligible."""
    start = time.monotonic()
    out = candidate.folder / RUN
    if out.exists() or out.is_symlink():
        raise CandidateError(f"{out}: already exists (a candidate is run once; its result is {out / 'result.json'})")
    parent_bundle, parent_bundle_id = bundle_of(ws, candidate.record.parent.revision, candidate.parent_pipeline)
    if incumbent_run is not None:
        _check_incumbent(incumbent_run, parent_bundle_id, candidate.parent_plan)
    bundle, built = challenger_bundle(ws, candidate, build)
    out.mkdir()
    if incumbent_run is None:
        incumbent_run = evaluate_arm(
            candidate, parent_bundle, candidate.parent_plan, labels[0], out / "incumbent", on_progress
        )
    challenger_run = evaluate_arm(candidate, bundle, candidate.plan, labels[1], out / "challenger", on_progress)
    comparison = compare(pair(load_arm(incumbent_run), load_arm(challenger_run)), candidate.record.evaluator.comparison)
    write_comparison(comparison, out / "comparison.json")
    decision = decide(candidate.policy, comparison)
    write_file_atomic(
        out / "decision.json",
        (json.dumps(decision.as_json(), indent=2, sort_keys=True) + "\n").encode("utf-8"),
        replace=False,
    )
    result = CandidateResult(
        candidate.candidate_id,
        out,
        incumbent_run,
        challenger_run,
        decision,
        comparison.comparison_id,
        target_stats(comparison.as_json(), candidate.policy.target.metric),
        built,
        time.monotonic() - start,
    )
    write_file_atomic(
        out / "result.json",
        (json.dumps(result.as_json(), indent=2, sort_keys=True) + "\n").encode("utf-8"),
        replace=False,
    )
    return result
