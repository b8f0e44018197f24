"""Materialize a revision through Dagster from Python or the CLI (the same job the UI runs).

Concurrent builds: ``materialize_revision`` holds ``locks/build-<revision>.lock`` under
``$RAGPIPE_HOME`` for the whole build, so a second build of the same revision waits and then finds
the first one's bundle up to date; opening the Dagster instance holds a lock in ``$DAGSTER_HOME``,
so two processes never both create a fresh SQLite instance's tables.
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from ragpipe.bundle.verify import BundleVerificationError, open_bundle
from ragpipe.corpus.registry import load_revision
from ragpipe.defs import build_definitions
from ragpipe.defs.failures import failure_messages
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.pipeline_spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages.locks import file_lock
from ragpipe.stages.steps import StageError, read_stage_record
from ragpipe.stages.workspace import Workspace

INSTANCE_LOCK = ".ragpipe-instance.lock"


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

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def dagster_instance() -> DagsterInstance:
    """The persistent instance at ``$DAGSTER_HOME`` (default ``./var/dagster``, created if needed)."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path("var/dagster").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    # A fresh SQLite instance creates its tables when first opened and used; two processes doing
    # that at once fail with "table ... already exists". Open (and touch the event storage) one at a time.
    with file_lock(home / INSTANCE_LOCK, exclusive=True):
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


def _summary(ws: Workspace, revision: str, run_id: str | None, up_to_date: bool) -> BuildSummary:
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
    )


def _is_up_to_date(instance: DagsterInstance, ws: Workspace, revision: str, spec: PipelineSpec) -> bool:
    """True when the instance's latest ``index_bundle`` materialization for ``revision`` has the
    current code version and data version, and that bundle still verifies."""
    try:
        record = read_stage_record(ws, revision, "index_bundle", spec)
    except StageError:
        return False
    events = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("index_bundle"), asset_partitions=[revision]), limit=1
    ).records
    if not events:
        return False
    tags = events[0].asset_materialization.tags or {}
    if tags.get("dagster/code_version") != spec.spec_ids["index_bundle"] or tags.get("dagster/data_version") != record.data_version:
        return False
    try:
        open_bundle(Path(str(record.facts["bundle_path"])))
    except BundleVerificationError:
        return False
    return True


def materialize_revision(
    revision: str,
    ws: Workspace,
    instance: DagsterInstance | None = None,
    spec: PipelineSpec | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> BuildSummary:
    """Add ``revision`` as a partition and run ``build_revision`` for it in-process.

    A revision whose bundle is already materialized under the current specs is not rebuilt. While
    another build of the same revision runs, this one waits for it (``on_wait`` is told why) and
    then usually finds that build's bundle up to date. A failed run raises ``BuildFailed`` naming
    the root cause of each failed step and the description of each failed check.
    """
    spec = spec or load_pipeline_spec()
    load_revision(ws.registry, revision)  # an unregistered or malformed key fails here, clearly
    message = f"another build of revision {revision!r} is running; waiting for it to finish"
    with file_lock(
        ws.locks / f"build-{revision}.lock", exclusive=True, on_wait=(lambda: on_wait(message)) if on_wait else None
    ):
        instance = instance or dagster_instance()
        _ensure_partition(instance, revision)
        if _is_up_to_date(instance, ws, revision, spec):
            return _summary(ws, revision, None, up_to_date=True)
        defs = build_definitions(spec, home=str(ws.home))
        job = defs.resolve_job_def("build_revision")
        result = job.execute_in_process(partition_key=revision, instance=instance, raise_on_error=False)
        if not result.success:
            raise BuildFailed(
                f"build of revision {revision!r} failed (run {result.run_id}):\n" + "\n".join(failure_messages(result.all_events))
            )
        return _summary(ws, revision, result.run_id, up_to_date=False)
