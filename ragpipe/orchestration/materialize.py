"""Materialize a revision through Dagster from Python or the CLI: a run of the UI's own job.

``materialize_revision`` creates a run of ``build_revision`` from the code location
``workspace.yaml`` defines (``ragpipe.orchestration.launch``) and either executes it in this process or
submits it to the run queue when a daemon serves it; it follows the run's events (as
``ragpipe.orchestration.progress`` dataclasses for ``on_progress``) and waits for the end.

Concurrent builds: ``materialize_revision`` holds ``locks/build-<revision>.lock`` under
``$RAGPIPE_HOME`` for the whole build, so a second build of the same revision waits and then finds
the first one's bundle up to date (``ragpipe.orchestration.build_state``: what the instance
records as built, the one source of truth for "up to date"); opening the Dagster instance holds a lock in ``$DAGSTER_HOME``,
so two processes never both create a fresh SQLite instance's tables.
"""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus

from ragpipe.corpus.registry import load_revision
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.workspace import Workspace, default_home
from ragpipe.orchestration import launch as runs
from ragpipe.orchestration.build_state import BuildSummary, NotBuilt, build_summary, built_revision
from ragpipe.orchestration.failures import failure_messages
from ragpipe.orchestration.progress import Progress, Tracker
from ragpipe.spec import PipelineSpec
from ragpipe.stages.configuration import Configuration, check_configuration

INSTANCE_LOCK = ".ragpipe-instance.lock"


def instance_template() -> Path:
    """The instance template (pools, run queue, run monitoring); see docs/operations.md."""
    return runs.repo_root() / "dagster.yaml"


class BuildFailed(RuntimeError):
    pass


def dagster_instance() -> DagsterInstance:
    """The persistent instance at ``$DAGSTER_HOME`` (default ``./var/dagster``, created if needed;
    a relative ``$DAGSTER_HOME`` raises ``LaunchError``, as Dagster needs an absolute one).

    A home without ``dagster.yaml`` gets a copy of the repository's top-level ``dagster.yaml``: without it the instance
    would have no pool limits and silently run stages of one partition concurrently."""
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path("var/dagster").resolve())))
    if not dagster_home.is_absolute():  # Dagster refuses it deep inside with a traceback; say it first
        raise runs.LaunchError(
            f"DAGSTER_HOME {str(dagster_home)!r} is not an absolute path: set it to one, e.g. DAGSTER_HOME={dagster_home.resolve()}"
        )
    dagster_home.mkdir(parents=True, exist_ok=True)
    # A fresh SQLite instance creates its tables when first opened and used; two processes doing
    # that at once fail with "table ... already exists". Open (and touch the event storage) one at a time.
    with file_lock(dagster_home / INSTANCE_LOCK, exclusive=True):
        template = instance_template()
        if not (dagster_home / "dagster.yaml").exists() and template.is_file():
            shutil.copyfile(template, dagster_home / "dagster.yaml")
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


def _check_matches_location(
    ws: Workspace, spec: PipelineSpec | None, configuration: Configuration | None
) -> PipelineSpec:
    """The code location reads ``$RAGPIPE_HOME`` and ``$RAGPIPE_PIPELINE_SPEC``; a different
    workspace or spec passed here would build something else than the caller asked for.
    ``configuration``: what the caller's ``check_configuration`` returned (not read again)."""
    # the location's whole configuration: ConfigurationError, one line
    configuration = configuration or check_configuration()
    home = default_home(configuration.settings)
    if ws.home.resolve() != home:
        raise ValueError(
            f"workspace {ws.home} is not $RAGPIPE_HOME ({home}): the code location builds in "
            "$RAGPIPE_HOME, so set RAGPIPE_HOME to the workspace instead"
        )
    current = configuration.spec
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
    configuration: Configuration | None = None,
) -> BuildSummary:
    """Add ``revision`` as a partition and run ``build_revision`` for it; wait for the run.

    ``ws`` and ``spec`` (defaults: ``$RAGPIPE_HOME``, ``$RAGPIPE_PIPELINE_SPEC``) must be what the
    code location loads, else ``ValueError``. ``launch``: ``auto`` (queue when a daemon serves it,
    else in process), ``in_process`` or ``queue``. ``on_progress`` receives each step, check,
    pool wait and embedding progress as it happens; ``verbose`` turns on Dagster's event stream.
    ``configuration``: the caller's checked configuration (``check_configuration``), so it is not
    read again; without it, it is read here.

    A revision whose bundle is already materialized under the current specs is not rebuilt. While
    another build of the same revision runs, this one waits for it (``on_wait`` is told why) and
    then usually finds that build's bundle up to date. A failed run raises ``BuildFailed`` naming
    the root cause of each failed step and the description of each failed check.
    """
    ws = ws or Workspace(default_home(configuration.settings if configuration else None))
    spec = _check_matches_location(ws, spec, configuration)
    if launch not in runs.LAUNCHES:
        raise ValueError(f"launch must be one of {', '.join(runs.LAUNCHES)}, not {launch!r}")
    load_revision(ws.registry, revision)  # an unregistered or malformed key fails here, clearly
    message = f"another build of revision {revision!r} is running; waiting for it to finish"
    with file_lock(
        ws.locks / f"build-{revision}.lock", exclusive=True, on_wait=(lambda: on_wait(message)) if on_wait else None
    ):
        instance = instance or dagster_instance()
        _ensure_partition(instance, revision)
        try:
            return build_summary(instance, ws, revision, spec, built_revision(instance, ws, revision, spec), None, None)
        except NotBuilt:
            pass
        run_id, launched, status = _run(instance, revision, launch, verbose, on_progress)
        if status != DagsterRunStatus.SUCCESS:
            records = instance.get_records_for_run(run_id).records
            events = [r.event_log_entry.dagster_event for r in records if r.event_log_entry.dagster_event is not None]
            raise BuildFailed(
                f"build of revision {revision!r} failed (run {run_id}):\n" + "\n".join(failure_messages(events))
            )
        try:
            built = built_revision(instance, ws, revision, spec)
        except NotBuilt as exc:  # the run succeeded, so its materializations must be there
            raise BuildFailed(f"build of revision {revision!r} succeeded (run {run_id}) but {exc}") from None
        return build_summary(instance, ws, revision, spec, built, run_id, launched)
