"""Materialize a revision through Dagster from Python or the CLI: a run of the UI's own job.

``materialize_revision`` creates a run of ``build_revision`` from the code location
``workspace.yaml`` defines (``ragpipe.orchestration.launch``) and either executes it in this process or
submits it to the run queue when a daemon serves it; it follows the run's events (as
``ragpipe.orchestration.progress`` dataclasses for ``on_progress``) and waits for the end.

Concurrent builds: ``materialize_revision`` holds ``locks/build-<revision>.lock`` under
``$RAGPIPE_HOME`` for the whole build, so a second build of the same revision waits and then finds
the first one's bundle up to date; opening the Dagster instance holds a lock in ``$DAGSTER_HOME``,
so two processes never both create a fresh SQLite instance's tables.
"""

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DagsterRunStatus

from ragpipe.bundle.verify import BundleVerificationError, open_bundle
from ragpipe.corpus.registry import load_revision
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.experiment.decision import skipped_cases_text
from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.workspace import Workspace, default_home
from ragpipe.orchestration import launch as runs
from ragpipe.orchestration.failures import failure_messages
from ragpipe.orchestration.progress import Progress, Tracker
from ragpipe.spec import DEFAULT_SPEC_PATH, PipelineSpec, PipelineSpecError, load_pipeline_spec
from ragpipe.stages.configuration import check_configuration
from ragpipe.stages.eval_steps import recorded_skip_reasons
from ragpipe.stages.gate_steps import read_decision
from ragpipe.stages.release_chain_ids import chain_plan
from ragpipe.stages.stage_store import read_output, read_version
from ragpipe.stages.steps import StageError, read_stage_record

INSTANCE_LOCK = ".ragpipe-instance.lock"


def instance_template() -> Path:
    """The instance template (pools, run queue, run monitoring); see docs/operations.md."""
    return runs.repo_root() / "dagster.yaml"


class BuildFailed(RuntimeError):
    pass


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

    def as_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def dagster_instance() -> DagsterInstance:
    """The persistent instance at ``$DAGSTER_HOME`` (default ``./var/dagster``, created if needed;
    a relative ``$DAGSTER_HOME`` raises ``LaunchError``, as Dagster needs an absolute one).

    A home without ``dagster.yaml`` gets a copy of the repository's top-level ``dagster.yaml``: without it the instance
    would have no pool limits and silently run stages of one partition concurrently."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path("var/dagster").resolve())))
    if not home.is_absolute():  # Dagster refuses it deep inside with a traceback; say it first
        raise runs.LaunchError(
            f"DAGSTER_HOME {str(home)!r} is not an absolute path: set it to one, e.g. DAGSTER_HOME={home.resolve()}"
        )
    home.mkdir(parents=True, exist_ok=True)
    # A fresh SQLite instance creates its tables when first opened and used; two processes doing
    # that at once fail with "table ... already exists". Open (and touch the event storage) one at a time.
    with file_lock(home / INSTANCE_LOCK, exclusive=True):
        template = instance_template()
        if not (home / "dagster.yaml").exists() and template.is_file():
            shutil.copyfile(template, home / "dagster.yaml")
        instance = DagsterInstance.get()
        instance.get_dynamic_partitions(corpus_revisions.name)
    return instance


def _ensure_partition(instance: DagsterInstance, revision: str) -> None:
    if instance.has_dynamic_partition(corpus_revisions.name, revision):
        return
    try:
        instance.add_dynamic_partitions(corpus_revisions.name, [revision])
    except Exception:
        # Someone else (the sensor, a launch from the UI) added it between the check and the add:
        # the storage refuses the duplicate. Only that case is fine.
        if not instance.has_dynamic_partition(corpus_revisions.name, revision):
            raise


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


def _release_fields(ws: Workspace, revision: str, spec: PipelineSpec) -> dict[str, object]:
    """The release of the revision's chain, and the evaluation and gate decision it binds (by the
    versions its record names, as ``release_manifest`` read them)."""
    if spec.evaluation is None:
        return {}
    release = read_output(ws, revision, "release_manifest").record
    gate = read_version(ws, revision, "gate_decision", release.inputs["gate_decision"], "release_manifest")
    ev = read_version(ws, revision, "evaluation_run", release.inputs["evaluation_run"], "release_manifest").record
    facts, decision = release.facts, read_decision(gate.path)
    return {
        "release_id": str(facts["release_id"]),
        "eligible": bool(facts["eligible"]),
        "decisive_phase": facts["decisive_phase"],
        "evaluated_cases": ev.facts["evaluated"],
        "skipped_cases": ev.facts["skipped"],
        "gate_reasons": tuple(
            str(c["reason"])
            for c in decision["checks"]
            if c["phase"] == decision["decisive_phase"] and c["verdict"] == "fail"
        ),
        "evaluation_note": no_case_note(
            revision, spec.evaluation.suite, ev.facts, _is_sample_suite(spec.evaluation.suite)
        ),
    }


def _summary(
    ws: Workspace, revision: str, spec: PipelineSpec, run_id: str | None, launched: str | None
) -> BuildSummary:
    up_to_date = run_id is None
    snap = read_stage_record(ws, revision, "source_snapshot")
    reps = read_stage_record(ws, revision, "representations")
    emb = read_stage_record(ws, revision, "embeddings")
    bundle = read_stage_record(ws, revision, "index_bundle")
    return BuildSummary(
        revision=revision,
        bundle_id=str(bundle.facts["bundle_id"]),
        bundle_path=str(bundle.facts["bundle_path"]),
        documents=int(snap.facts["documents"]),
        excluded=int(snap.facts["excluded"]),
        chunks=int(read_stage_record(ws, revision, "chunks").facts["chunks"]),
        representations=int(reps.facts["representations"]),
        embedded=0 if up_to_date else int(emb.facts.get("encoded") or 0),
        cache_hits=0 if up_to_date else int(emb.facts.get("cache_hits") or 0),
        up_to_date=up_to_date,
        run_id=run_id,
        launched=launched,
        **_release_fields(ws, revision, spec),  # type: ignore[arg-type]
    )


def _latest_matches(instance: DagsterInstance, revision: str, asset: str, code_version: str, data_version: str) -> bool:
    """Whether the instance's latest materialization of ``asset`` for ``revision`` has these versions."""
    events = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[revision]), limit=1
    ).records
    if not events:
        return False
    tags = events[0].asset_materialization.tags or {}
    return tags.get("dagster/code_version") == code_version and tags.get("dagster/data_version") == data_version


def _is_up_to_date(instance: DagsterInstance, ws: Workspace, revision: str, spec: PipelineSpec) -> bool:
    """True when the instance's latest ``index_bundle`` materialization for ``revision`` has the
    current code version and data version, that bundle still verifies, and (with the chain) the
    latest ``release_manifest`` has the current code version and names the published release."""
    try:
        record = read_stage_record(ws, revision, "index_bundle", spec)
        if spec.evaluation is not None:
            release = read_stage_record(ws, revision, "release_manifest")
            if not _latest_matches(
                instance, revision, "release_manifest", chain_plan(spec).release_code_version, release.data_version
            ):
                return False
    except StageError:
        return False
    if not _latest_matches(instance, revision, "index_bundle", spec.spec_ids["index_bundle"], record.data_version):
        return False
    try:
        open_bundle(Path(str(record.facts["bundle_path"])))
    except BundleVerificationError:
        return False
    return True


def _check_matches_location(ws: Workspace, spec: PipelineSpec | None) -> PipelineSpec:
    """The code location reads ``$RAGPIPE_HOME`` and ``$RAGPIPE_PIPELINE_SPEC``; a different
    workspace or spec passed here would build something else than the caller asked for."""
    if ws.home.resolve() != default_home():
        raise ValueError(
            f"workspace {ws.home} is not $RAGPIPE_HOME ({default_home()}): the code location builds in "
            "$RAGPIPE_HOME, so set RAGPIPE_HOME to the workspace instead"
        )
    current = check_configuration().spec  # the location's whole configuration: ConfigurationError, one line
    if spec is not None and spec.model_dump() != current.model_dump():
        raise ValueError(
            "the pipeline spec passed differs from the one the code location loads "
            "($RAGPIPE_PIPELINE_SPEC or ragpipe/specs/pipeline.yaml): set RAGPIPE_PIPELINE_SPEC instead"
        )
    return current


def _run(
    instance: DagsterInstance, revision: str, launch: str, verbose: bool, on_progress: Callable[[Progress], None] | None
) -> tuple[str, str, DagsterRunStatus]:
    """Create, launch and follow one run; (run ID, how it was launched, final status)."""
    runs.reap_stale_runs(instance)
    chosen = runs.choose_launch(instance, launch)
    tracker = Tracker(log_lines=verbose and chosen == runs.QUEUE)  # in process, Dagster's logger prints

    def on_entry(entry) -> None:
        for item in tracker.feed(entry):
            on_progress(item)  # type: ignore[misc]

    listener = on_entry if on_progress else None
    with runs.build_location(instance) as (context, location):
        run_id = runs.create_run_in(instance, location, revision, runs.cli_tags(chosen), verbose)
        if chosen == runs.QUEUE:
            status = runs.submit_and_follow(instance, context, run_id, listener)
        else:
            status = runs.execute_in(instance, location, run_id, listener)
    return run_id, chosen, status


def materialize_revision(
    revision: str,
    ws: Workspace | None = None,
    instance: DagsterInstance | None = None,
    spec: PipelineSpec | None = None,
    on_wait: Callable[[str], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    launch: str = "auto",
    verbose: bool = False,
) -> BuildSummary:
    """Add ``revision`` as a partition and run ``build_revision`` for it; wait for the run.

    ``ws`` and ``spec`` (defaults: ``$RAGPIPE_HOME``, ``$RAGPIPE_PIPELINE_SPEC``) must be what the
    code location loads, else ``ValueError``. ``launch``: ``auto`` (queue when a daemon serves it,
    else in process), ``in_process`` or ``queue``. ``on_progress`` receives each step, check,
    pool wait and embedding progress as it happens; ``verbose`` turns on Dagster's event stream.

    A revision whose bundle is already materialized under the current specs is not rebuilt. While
    another build of the same revision runs, this one waits for it (``on_wait`` is told why) and
    then usually finds that build's bundle up to date. A failed run raises ``BuildFailed`` naming
    the root cause of each failed step and the description of each failed check.
    """
    ws = ws or Workspace(default_home())
    spec = _check_matches_location(ws, spec)
    if launch not in runs.LAUNCHES:
        raise ValueError(f"launch must be one of {', '.join(runs.LAUNCHES)}, not {launch!r}")
    load_revision(ws.registry, revision)  # an unregistered or malformed key fails here, clearly
    message = f"another build of revision {revision!r} is running; waiting for it to finish"
    with file_lock(
        ws.locks / f"build-{revision}.lock", exclusive=True, on_wait=(lambda: on_wait(message)) if on_wait else None
    ):
        instance = instance or dagster_instance()
        _ensure_partition(instance, revision)
        if _is_up_to_date(instance, ws, revision, spec):
            return _summary(ws, revision, spec, None, None)
        run_id, launched, status = _run(instance, revision, launch, verbose, on_progress)
        if status != DagsterRunStatus.SUCCESS:
            records = instance.get_records_for_run(run_id).records
            events = [r.event_log_entry.dagster_event for r in records if r.event_log_entry.dagster_event is not None]
            raise BuildFailed(
                f"build of revision {revision!r} failed (run {run_id}):\n" + "\n".join(failure_messages(events))
            )
        return _summary(ws, revision, spec, run_id, launched)
