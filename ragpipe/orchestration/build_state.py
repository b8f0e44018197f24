"""What is built for a revision, read from one source of truth: the Dagster instance's event log.

A revision is *built* (up to date) when the instance's latest ``index_bundle`` materialization of
its partition carries the current code version, the bundle its data version names still verifies,
and (with the evaluation → gate → release chain) the latest ``release_manifest`` materialization
carries the current chain code version and was made, through the gate decision and evaluation run
its record names, from that very bundle. Every record is read from the immutable version folder a
materialization names (``read_version``), never through the stage store's ``latest.json`` pointers:
those are how the stages inside a run find their upstream outputs, not a second record of what is
built. So ``ragpipe build``, the revision sensor and the UI's staleness all answer from the same
event log; a fresh ``$DAGSTER_HOME`` over an existing workspace has built nothing, and its first
build re-records every stage from the versions already published (no text is embedded again).

``BuildSummary`` (what ``ragpipe build --json`` prints) describes exactly that bundle's lineage:
the snapshot, chunks, representations and embeddings the bundle record names as its inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

from ragpipe.bundle.objects import open_bundle_here
from ragpipe.bundle.verify import BundleVerificationError
from ragpipe.evaluation.report import REPORT_JSON
from ragpipe.experiment.change import Change, change_text
from ragpipe.experiment.comparison import ALL
from ragpipe.experiment.decision import skipped_cases_text
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.replica import run_dir
from ragpipe.release.status import what_happens_next
from ragpipe.spec import DEFAULT_SPEC_PATH, PipelineSpec, PipelineSpecError, load_pipeline_spec
from ragpipe.stages.chain_plan import chain_plan
from ragpipe.stages.eval_steps import recorded_skip_reasons
from ragpipe.stages.gate_steps import read_comparison, read_decision
from ragpipe.stages.stage_store import StageError, StageOutput, read_version


@dataclass(frozen=True)
class BuildSummary:
    revision: str
    bundle_id: str
    bundle_path: str
    documents: int
    excluded: int
    chunks: int
    representations: int
    embedded: int
    cache_hits: int
    up_to_date: bool
    run_id: str | None
    launched: str | None  # "in_process" or "queue"; None when nothing ran
    # The release manifest of the evaluation → gate → release chain; None when the spec has no
    # evaluation: section (the chain did not run).
    release_id: str | None = None
    eligible: bool | None = None
    decisive_phase: str | None = None
    # The evaluation and gate that release binds: suite cases evaluated and skipped, the reasons of
    # the decisive phase's failing checks (empty when eligible), and, when no suite case applies to
    # the revision (every one skipped), one line saying so and what to do next.
    evaluated_cases: int | None = None
    skipped_cases: int | None = None
    gate_reasons: tuple[str, ...] | None = None
    evaluation_note: str | None = None
    # Which engine served the evaluation's vector channel, and how ({"engine", "why"}; None
    # without an evaluation or vectors; ragpipe.retrieval.vector_engine).
    vector_engine: dict[str, str] | None = None
    # The evaluation run's folder (home-relative); the gate policy's primary metrics — the target
    # metric, then the bootstrap floors' — as {value, paired, delta, ci_low, ci_high} (delta and
    # interval against the incumbent when the gate paired, else None); and one line on what becomes of the
    # release on each target (release.status.what_happens_next).
    evaluation_run: str | None = None
    # The change the gate judged (change_line: refresh / experiment / bootstrap, against which
    # release, with the suite's new and lost coverage); None without an evaluation.
    change: str | None = None
    metrics: dict[str, dict[str, object]] | None = None
    next: str | None = None
    # The model calls of this build's generated representations (``GENERATION_FIELDS``: calls,
    # cache hits, tokens, micros, the cost as text); None when the spec generates no kind.
    generation: dict[str, object] | None = None

    def as_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class BuiltRevision:
    """The outputs the instance's latest materializations name, each read from its version folder."""

    bundle: StageOutput
    release: StageOutput | None  # None without an evaluation: section
    gate: StageOutput | None
    evaluation: StageOutput | None


class NotBuilt(Exception):
    """The instance records no current build of the revision (the message says what is missing)."""


def _latest_versions(instance: DagsterInstance, revision: str, asset: str) -> tuple[str | None, str | None]:
    """(code version, data version) of the instance's latest materialization of ``asset`` for ``revision``."""
    events = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[revision]), limit=1
    ).records
    if not events:
        return None, None
    tags = events[0].asset_materialization.tags or {}
    return tags.get("dagster/code_version"), tags.get("dagster/data_version")


def _materialized(
    instance: DagsterInstance, ws: Workspace, revision: str, asset: str, code_version: str
) -> StageOutput:
    code, data = _latest_versions(instance, revision, asset)
    if data is None:
        raise NotBuilt(f"{asset} has no materialization for revision {revision!r}")
    if code != code_version:
        raise NotBuilt(f"{asset} of revision {revision!r} was materialized under {code}, not {code_version}")
    return read_version(ws, revision, asset, data, "the Dagster instance")


def _input(ws: Workspace, revision: str, out: StageOutput, upstream: str) -> StageOutput:
    version = out.record.inputs.get(upstream)
    if version is None:
        raise NotBuilt(f"{out.record.stage} {out.data_version} names no {upstream} input")
    return read_version(ws, revision, upstream, version, out.record.stage)


def built_revision(instance: DagsterInstance, ws: Workspace, revision: str, spec: PipelineSpec) -> BuiltRevision:
    """The current build of ``revision`` as the instance records it; ``NotBuilt`` when there is none
    (never materialized, materialized under other code versions, a version folder gone, a bundle
    that no longer verifies, or a release chain made from another bundle)."""
    try:
        bundle = _materialized(instance, ws, revision, "index_bundle", spec.spec_ids["index_bundle"])
        try:
            open_bundle_here(ws.located(str(bundle.record.facts["bundle_path"])))
        except BundleVerificationError as exc:
            raise NotBuilt(f"bundle of revision {revision!r} does not verify: {exc}") from None
        if spec.evaluation is None:
            return BuiltRevision(bundle, None, None, None)
        release = _materialized(instance, ws, revision, "release_manifest", chain_plan(spec).release_code_version)
        gate = _input(ws, revision, release, "gate_decision")
        evaluation = _input(ws, revision, gate, "evaluation_run")
        if evaluation.record.inputs.get("index_bundle") != bundle.data_version:
            raise NotBuilt(f"the latest release of revision {revision!r} was made from another bundle")
        return BuiltRevision(bundle, release, gate, evaluation)
    except StageError as exc:
        raise NotBuilt(str(exc)) from None


def no_case_note(revision: str, suite: Path, facts: dict[str, object], sample_suite: bool) -> str | None:
    """The one line a build prints when no case of ``suite`` applies to ``revision`` (its
    ``evaluation_run`` facts: every case skipped, none evaluated or failed); None otherwise.
    ``sample_suite``: ``suite`` is the checked-in spec's own, so the advice is a project of one's own."""
    evaluated, skipped, failed, cases = (facts.get(k) for k in ("evaluated", "skipped", "failed", "cases"))
    if evaluated or failed or not skipped or cases not in (None, skipped):  # cases: not recorded by older runs
        return None
    reasons = recorded_skip_reasons(facts)
    why = skipped_cases_text(reasons) if sum(reasons.values()) == skipped else f"all {skipped} suite cases were skipped"
    todo = (
        f"{suite} is the default pipeline spec's sample suite: ragpipe init DIR makes a project with a suite of "
        "this corpus' own (docs/your-corpus.md)"
        if sample_suite
        else f"add cases judged against this corpus' document IDs to {suite}, then build again"
    )
    return f'no suite case applies to revision {revision}: {why}; {todo}; meanwhile: ragpipe query --revision {revision} "..."'


def _is_sample_suite(suite: Path) -> bool:
    try:
        default = load_pipeline_spec(DEFAULT_SPEC_PATH).evaluation
    except PipelineSpecError:
        return False
    return default is not None and default.suite == suite


def primary_metrics(ws: Workspace, spec: PipelineSpec, run_path: str, gate_folder: Path) -> dict[str, dict]:
    """``{metric: {value, paired, delta, ci_low, ci_high}}`` for the gate policy's target metric and its
    bootstrap floors' metrics: the value from the run's report, the delta and interval from the
    gate's comparison (None when the gate had no incumbent)."""
    policy = chain_plan(spec).policy
    names = list(dict.fromkeys([policy.target.metric, *sorted(policy.bootstrap_floors)]))
    report = json.loads((run_dir(ws, Path(run_path).name) / REPORT_JSON).read_bytes())  # fetched if made elsewhere
    compared = (
        read_comparison(gate_folder)["slices"][ALL]["metrics"] if (gate_folder / "comparison.json").is_file() else {}
    )
    out: dict[str, dict] = {}
    for name in names:
        stats = compared.get(name, {}).get("stats", {})
        value = report["metrics"].get(name, {}).get("value")
        out[name] = {
            "value": value,
            "paired": bool(compared),
            "delta": stats.get("mean"),
            "ci_low": stats.get("ci_low"),
            "ci_high": stats.get("ci_high"),
        }
    return out


def _cases(n: int) -> str:
    return "none" if n == 0 else f"{n} case{'s' if n != 1 else ''}"


def change_line(decision: dict, gate_folder: Path) -> str:
    """``refresh against sha256:0123456789ab… (new coverage: 1 case; lost coverage: none)``,
    ``experiment (stage_specs.chunks differs) against …``, ``bootstrap (no incumbent)``, or
    ``unknown (…)`` for a decision made before kinds were recorded."""
    raw = decision.get("change")
    change = None if raw is None else Change.model_validate(raw)
    line = change_text(change, short=True)
    if change is not None and change.kind != "bootstrap" and (gate_folder / "comparison.json").is_file():
        cert = read_comparison(gate_folder)["certificate"]
        new, lost = len(cert.get("new_coverage", [])), len(cert.get("lost_coverage", []))
        line += f" (new coverage: {_cases(new)}; lost coverage: {_cases(lost)})"
    return line


def _release_fields(ws: Workspace, built: BuiltRevision, revision: str, spec: PipelineSpec) -> dict[str, object]:
    """The release of the revision's chain, and the evaluation and gate decision it binds."""
    if built.release is None or built.gate is None or built.evaluation is None or spec.evaluation is None:
        return {}
    facts, decision, ev = built.release.record.facts, read_decision(built.gate.path), built.evaluation.record
    reasons = tuple(
        str(c["reason"])
        for c in decision["checks"]
        if c["phase"] == decision["decisive_phase"] and c["verdict"] == "fail"
    )
    try:  # reports, not the build: a run folder or manifest that cannot be read says so here
        metrics = primary_metrics(ws, spec, str(ev.facts["run_path"]), built.gate.path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        metrics = {"unreadable": {"reason": f"{type(exc).__name__}: {exc}"}}
    try:
        upcoming = what_happens_next(ws, str(facts["release_id"]), reasons)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        upcoming = f"unknown: {exc}"
    return {
        "evaluation_run": str(ev.facts["run_path"]),
        "change": change_line(decision, built.gate.path),
        "metrics": metrics,
        "next": upcoming,
        "release_id": str(facts["release_id"]),
        "eligible": bool(facts["eligible"]),
        "decisive_phase": facts["decisive_phase"],
        "evaluated_cases": ev.facts["evaluated"],
        "skipped_cases": ev.facts["skipped"],
        "gate_reasons": reasons,
        "evaluation_note": no_case_note(
            revision, spec.evaluation.suite, ev.facts, _is_sample_suite(spec.evaluation.suite)
        ),
        "vector_engine": (
            {"engine": str(ev.facts["vector_engine"]), "why": str(ev.facts["vector_engine_why"])}
            if "vector_engine" in ev.facts
            else None
        ),
    }


def _run_metadata(instance: DagsterInstance, run_id: str | None, asset: str) -> dict[str, object]:
    """The metadata values of ``asset``'s materialization in run ``run_id`` ({} if none): what
    *this* build did (a version folder keeps the counts of the run that first published it)."""
    if run_id is None:
        return {}
    for record in instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records:
        materialization = record.event_log_entry.asset_materialization
        if materialization is not None and materialization.asset_key == AssetKey(asset):
            return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    return {}


# The summary's ``generation`` fields, read from the representations materialization's
# ``generation_<field>`` metadata (ragpipe.stages.generation_metadata).
GENERATION_FIELDS = (
    "calls",
    "cache_hits",
    "computed",
    "invalid_output",
    "withheld",
    "missing",
    "retries",
    "input_tokens",
    "output_tokens",
    "cost_micros",
    "cost_known",
    "cost",
)


def _generation(instance: DagsterInstance, run_id: str | None, spec: PipelineSpec) -> dict[str, object] | None:
    """This build's generation sums; zeros (cost ``0 micros``) when nothing ran or nothing was asked."""
    if not spec.representations.generated_kinds:
        return None
    metadata = _run_metadata(instance, run_id, "representations")
    zero: dict[str, object] = {f: 0 for f in GENERATION_FIELDS} | {"cost_known": True, "cost": "0 micros"}
    return {f: metadata.get(f"generation_{f}", zero[f]) for f in GENERATION_FIELDS}


def build_summary(
    instance: DagsterInstance,
    ws: Workspace,
    revision: str,
    spec: PipelineSpec,
    built: BuiltRevision,
    run_id: str | None,
    launched: str | None,
) -> BuildSummary:
    """The summary of ``built``; ``run_id`` None: nothing ran (up to date, so nothing was embedded)."""
    up_to_date = run_id is None
    bundle = built.bundle.record
    snap, chunks, reps = (
        _input(ws, revision, built.bundle, s).record for s in ("source_snapshot", "chunks", "representations")
    )
    embedding = _run_metadata(instance, run_id, "embeddings")
    embedded, cache_hits = (int(embedding.get(k, 0) or 0) for k in ("encoded", "cache_hits"))  # type: ignore[call-overload]
    return BuildSummary(
        revision=revision,
        bundle_id=str(bundle.facts["bundle_id"]),
        bundle_path=str(ws.located(str(bundle.facts["bundle_path"]))),
        documents=int(snap.facts["documents"]),
        excluded=int(snap.facts["excluded"]),
        chunks=int(chunks.facts["chunks"]),
        representations=int(reps.facts["representations"]),
        embedded=embedded,
        cache_hits=cache_hits,
        up_to_date=up_to_date,
        run_id=run_id,
        launched=launched,
        **_release_fields(ws, built, revision, spec),  # type: ignore[arg-type]
        generation=_generation(instance, run_id, spec),
    )
