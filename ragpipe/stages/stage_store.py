"""Content-addressed stage outputs: immutable version folders plus one ``latest`` pointer per partition.

```
work/<revision>/<stage>/<data version hex>/   payload files + stage.json; published atomically
                                              (temp sibling, fsync, RENAME_NOREPLACE), never replaced
work/<revision>/<stage>/latest.json           the partition's latest materialization (a StageRecord),
                                              written after its version folder is published
                                              (temp file, fsync, os.replace, fsync dir)
```

A materialization whose output equals one already published (same data version) publishes nothing
and only moves the pointer. Readers read ``latest.json`` once and then only the immutable folder it
names, so a concurrent materialization can never hand them a half-replaced output; Dagster's
materialization history keeps pointing at folders that exist (until garbage collection, which
removes only folders no pointer references: ``ragpipe.gc``).

With an object store configured (``RAGPIPE_STORE``) the store is the record and the local folders
a cache: a published version folder is pushed as ``work/<revision>/<stage>/<hex>/listing.json``
plus its blobs (``ragpipe.storage.blobs``), then the store's ``latest.json`` is moved (compare-and-
swap, last writer wins as with ``os.replace``); readers take ``latest.json`` from the store and
download a version folder they do not have, every file checked against its listing. Steps on
machines that share no disk meet there.

A record keeps the cumulative spec ID it was built under, and the data versions of the upstream
outputs it read (``inputs``): a stage refuses an upstream recorded under another spec, and a set of
upstream outputs that were not built from one another.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar

from pydantic import ValidationError

from ragpipe.corpus.registry import RevisionError, check_revision_key
from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.publish import (
    FILE_STEPS,
    PUBLISH_STEPS,
    PublishOutcome,
    StepHook,
    publish_directory,
    write_file_atomic,
)
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import PipelineSpec
from ragpipe.stages.stage_record import POINTER, STAGE_RECORD, StageError, StageRecord, version_name
from ragpipe.stages.stage_replica import STORE_STEPS, pull_version, push_version, store_pointer
from ragpipe.storage.location import store_from_env
from ragpipe.storage.objects import StorageError

__all__ = ["POINTER", "STAGE_RECORD", "STORE_STEPS", "StageError", "StageRecord", "version_name"]

# Every point of a stage publication where a crash leaves a distinct state on disk, in order.
STAGE_PUBLISH_STEPS = PUBLISH_STEPS + FILE_STEPS
VERSION_NAME = re.compile(r"^[0-9a-f]{64}$")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class StageOutput:
    """A stage record and the immutable folder holding its output."""

    record: StageRecord
    path: Path

    @property
    def data_version(self) -> str:
        return self.record.data_version


def workspace_lock(ws: Workspace, *, exclusive: bool = False, blocking: bool = True):
    """Shared by stage materializations, exclusive for garbage collection (``ragpipe.kernel.locks``)."""
    return file_lock(ws.locks / "workspace.lock", exclusive=exclusive, blocking=blocking)


def _stage_dir(ws: Workspace, revision: str, stage: str) -> Path:
    try:
        check_revision_key(revision)  # a key is a path segment: one rule for every command
    except RevisionError as exc:
        raise StageError(str(exc)) from None
    return ws.stage_dir(revision, stage)


def version_dir(ws: Workspace, revision: str, stage: str, data_version: str) -> Path:
    return _stage_dir(ws, revision, stage) / version_name(data_version)


def pointer_path(ws: Workspace, revision: str, stage: str) -> Path:
    return _stage_dir(ws, revision, stage) / POINTER


def parse_record(path: Path | str, data: bytes) -> StageRecord:
    try:
        return StageRecord.model_validate(json.loads(data))
    except (ValueError, ValidationError) as exc:
        raise StageError(f"{path}: not a valid stage record ({str(exc).splitlines()[0]})") from None


def _record_bytes(record: StageRecord) -> bytes:
    return (record.model_dump_json(indent=2) + "\n").encode()


def _check_folder(folder: Path, record: StageRecord) -> None:
    """The folder's own stage.json must describe the same output as ``record``."""
    path = folder / STAGE_RECORD
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StageError(
            f"{record.stage} for revision {record.revision!r}: version folder {folder} is missing: re-materialize "
            f"{record.stage}"
        ) from None
    _require_identity(path, parse_record(path, data), record.stage, record.revision, record.data_version)


def _require_identity(path: Path, own: StageRecord, stage: str, revision: str, data_version: str) -> None:
    if (own.stage, own.revision, own.data_version) != (stage, revision, data_version):
        raise StageError(
            f"{path}: records {own.stage} {own.data_version} of revision {own.revision!r}, expected "
            f"{stage} {data_version} of revision {revision!r}: the folder is corrupt; move it away"
        )


def _local_pointer(ws: Workspace, revision: str, stage: str) -> tuple[Path | str, bytes | None]:
    pointer = pointer_path(ws, revision, stage)
    try:
        return pointer, pointer.read_bytes()
    except FileNotFoundError:
        return pointer, None


def read_output(ws: Workspace, revision: str, stage: str, spec: PipelineSpec | None = None) -> StageOutput:
    """The latest output of ``stage`` for ``revision``; with ``spec``, refuse one built under another spec.

    The pointer is read once; everything after that reads only the immutable folder it names.
    """
    store = store_from_env()
    pointer, data = _local_pointer(ws, revision, stage) if store is None else store_pointer(store, revision, stage)
    if data is None:
        raise StageError(f"{stage} has not been materialized for revision {revision!r}: materialize it first")
    record = parse_record(pointer, data)
    if (record.stage, record.revision) != (stage, revision):
        raise StageError(f"{pointer}: names {record.stage} of revision {record.revision!r}")
    if spec is not None and record.spec_id != spec.spec_ids[stage]:
        raise StageError(
            f"{stage} for revision {revision!r} was built with spec {record.spec_id}, the current pipeline "
            f"spec expects {spec.spec_ids[stage]}: re-materialize {stage} first"
        )
    folder = version_dir(ws, revision, stage, record.data_version)
    pull_version(store, revision, stage, record.data_version, folder)
    _check_folder(folder, record)
    return StageOutput(record, folder)


def read_version(ws: Workspace, revision: str, stage: str, data_version: str, named_by: str) -> StageOutput:
    """The output ``data_version`` of ``stage`` (latest or not), as ``named_by`` recorded it as an input.

    Version folders are immutable, so an input named by version is the exact output a downstream
    was built from, even after a later materialization moved ``latest.json`` on.
    """
    folder = version_dir(ws, revision, stage, data_version)
    pull_version(store_from_env(), revision, stage, data_version, folder)
    path = folder / STAGE_RECORD
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StageError(
            f"{stage} {data_version} of revision {revision!r}, which {named_by} was built from, is not in {folder.parent}: "
            f"re-materialize {named_by}"
        ) from None
    record = parse_record(path, data)
    _require_identity(path, record, stage, revision, data_version)
    return StageOutput(record, folder)


def read_outputs(ws: Workspace, revision: str, stages: list[str], spec: PipelineSpec) -> dict[str, StageOutput]:
    """The latest outputs of ``stages``, refused unless each was built from the others' versions.

    A stage re-materialized alone (say ``chunks`` with new content) makes the outputs built on its
    previous version inconsistent with it; combining them would produce an artifact no single
    input state explains.
    """
    outs = {stage: read_output(ws, revision, stage, spec) for stage in stages}
    for stage, out in outs.items():
        for upstream, version in out.record.inputs.items():
            if upstream in outs and outs[upstream].data_version != version:
                raise StageError(
                    f"{stage} for revision {revision!r} was built from {upstream} {version}, but the latest "
                    f"{upstream} is {outs[upstream].data_version}: re-materialize {stage} first"
                )
    return outs


def publish_output(
    ws: Workspace,
    record: StageRecord,
    write: Callable[[Path], None],
    on_step: StepHook | None = None,
) -> tuple[StageOutput, PublishOutcome]:
    """Publish ``record``'s version folder (``write(tmp)`` fills it) unless that version exists, then
    point ``latest.json`` at it. ``write`` is not called when the version is already published."""
    folder = version_dir(ws, record.revision, record.stage, record.data_version)
    outcome = publish_directory(
        folder, write, lambda tmp: (tmp / STAGE_RECORD).write_bytes(_record_bytes(record)), on_step
    )
    if outcome is PublishOutcome.existing:
        _check_folder(folder, record)
    write_file_atomic(pointer_path(ws, record.revision, record.stage), _record_bytes(record), on_step=on_step)
    store = store_from_env()
    if store is not None:
        try:
            push_version(store, record, folder, on_step or (lambda _: None))
        except StorageError as exc:
            raise StageError(str(exc)) from None
    return StageOutput(record, folder), outcome


def holding_workspace_lock(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn(ws, ...)`` with the workspace lock held shared (no garbage collection meanwhile)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with workspace_lock(args[0]):  # type: ignore[arg-type]
            return fn(*args, **kwargs)

    return run


def publish_stage(
    ws: Workspace,
    revision: str,
    stage: str,
    spec: PipelineSpec,
    data_version: str,
    write: Callable[[Path], None],
    facts: dict | None = None,
    inputs: dict[str, StageOutput] | None = None,
    on_step: StepHook | None = None,
) -> StageRecord:
    """Publish one materialization of ``stage``: its record names the spec it was built under and
    the upstream ``inputs`` it read; returns the record (see ``publish_output``)."""
    record = StageRecord(
        stage=stage,
        revision=revision,
        spec_id=spec.spec_ids[stage],
        data_version=data_version,
        inputs={name: out.data_version for name, out in (inputs or {}).items()},
        facts=facts or {},
    )
    publish_output(ws, record, write, on_step)
    return record
