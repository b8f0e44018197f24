"""Candidate folders: a parent snapshot plus exactly one changed asset, and their validation.

A candidate folder holds ``candidate.json`` (the record below) and six regular files::

    pipeline.yaml  query_plan.yaml                 the candidate's specs (one of them edited)
    parent/pipeline.yaml  parent/query_plan.yaml   the parent's specs (the incumbent runs these)
    suite.jsonl  gate_policy.yaml                  the locked suite (canonical) and gate policy

``validate_candidate(dir)`` refuses, each with a ``CandidateError`` naming the file and rule, in
this order: an unreadable or malformed record; a record naming an unknown asset; a candidate
file that is missing, resolves outside the folder (symlinks resolved), is not a regular file,
or whose bytes differ from the recorded digest; files that do not load; parent copies that are
not the parent snapshot's assets; a changed locked asset; zero or several changed assets; a
change other than the recorded one; a wrong candidate ID or build revision. The candidate ID is
``content_id("candidate", 1, {parent snapshot ID, changed asset, new asset ID})``.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from ragpipe.candidates.asset_ids import (
    ASSETS,
    BUILD_ASSETS,
    LOCKED,
    EvaluatorSettings,
    Snapshot,
    SnapshotError,
    asset_ids,
    changed_assets,
    check_assets,
)
from ragpipe.corpus.registry import check_revision_key
from ragpipe.evaluation.suite import Suite, SuiteError, parse_suite_bytes
from ragpipe.experiment.gate_policy import GatePolicy, PolicyError, load_policy
from ragpipe.kernel.ids import bytes_digest, content_id
from ragpipe.kernel.models import FrozenModel
from ragpipe.kernel.strict_load import StrictLoadError, load_json
from ragpipe.retrieval.plan import PlanError, QueryPlan, load_plan
from ragpipe.spec import PipelineSpec, PipelineSpecError, load_pipeline_spec

RECORD = "candidate.json"
PIPELINE, PLAN = "pipeline.yaml", "query_plan.yaml"
PARENT_PIPELINE, PARENT_PLAN = "parent/pipeline.yaml", "parent/query_plan.yaml"
SUITE, POLICY = "suite.jsonl", "gate_policy.yaml"
FILES = (PIPELINE, PLAN, PARENT_PIPELINE, PARENT_PLAN, SUITE, POLICY)


class CandidateError(ValueError):
    """A candidate is refused; the message names the file (or ``--set``) and the rule broken."""


class Change(FrozenModel):
    """The one changed asset: the ``--set`` edits as given, and the asset's old and new IDs."""

    asset: str
    edits: tuple[str, ...]
    old_id: str
    new_id: str


class CandidateRecord(FrozenModel):
    record_schema: Literal["ragpipe.candidate/v1"] = Field("ragpipe.candidate/v1", alias="schema")
    candidate_id: str
    parent: Snapshot
    change: Change
    evaluator: EvaluatorSettings
    build_revision: str  # where the challenger's bundle lives: the parent's revision, or a derived key
    files: dict[str, str]  # candidate file -> sha256 of its bytes

    def as_json(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


def candidate_id(parent_snapshot_id: str, asset: str, new_id: str) -> str:
    return content_id("candidate", 1, {"parent": parent_snapshot_id, "asset": asset, "new_id": new_id})


def build_revision_for(parent_revision: str, asset: str, cand_id: str) -> str:
    """A build-side change is built under ``<parent revision>.c<12 hex of the candidate ID>``
    (same source, so the embedding cache serves it); a plan change reuses the parent's bundle."""
    if asset not in BUILD_ASSETS:
        return parent_revision
    key = f"{parent_revision}.c{cand_id.split(':', 1)[1][:12]}"
    try:
        return check_revision_key(key)
    except ValueError:
        raise CandidateError(
            f"derived revision key {key!r} is longer than 128 characters: use a shorter parent revision key"
        ) from None


@dataclass(frozen=True)
class Candidate:
    """A validated candidate: its record, loaded specs and snapshot (``snapshot.revision`` is the
    revision whose bundle the challenger runs on)."""

    folder: Path
    record: CandidateRecord
    pipeline: PipelineSpec
    plan: QueryPlan
    parent_pipeline: PipelineSpec
    parent_plan: QueryPlan
    suite: Suite
    policy: GatePolicy
    snapshot: Snapshot

    @property
    def candidate_id(self) -> str:
        return self.record.candidate_id

    @property
    def asset(self) -> str:
        return self.record.change.asset


def _read_record(folder: Path) -> CandidateRecord:
    path = folder / RECORD
    data = _read_inside(folder, RECORD)
    try:
        return CandidateRecord.model_validate(load_json(data.decode("utf-8"), str(path)))
    except UnicodeDecodeError as exc:
        raise CandidateError(f"{path}: not valid UTF-8 (byte {exc.start + 1})") from None
    except (
        StrictLoadError
    ) as exc:  # a syntax error keeps its wording; a duplicate key, deep nesting, NaN: <file>:<line>: <rule>
        if isinstance(exc.original, json.JSONDecodeError):
            raise CandidateError(f"{path}: not JSON: {exc.original.msg} at line {exc.original.lineno}") from None
        raise CandidateError(str(exc)) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CandidateError(
            f"{path}: invalid candidate record: {'.'.join(map(str, first['loc']))}: {first['msg']}"
        ) from None


def _read_inside(folder: Path, name: str) -> bytes:
    """The bytes of ``folder/name``, refused unless it resolves inside the folder to a regular file."""
    path = folder / name
    if not path.exists() and not path.is_symlink():
        raise CandidateError(f"{path}: missing (a candidate holds {RECORD} and {', '.join(FILES)})")
    root, resolved = folder.resolve(), path.resolve()
    if not resolved.is_relative_to(root):
        raise CandidateError(f"{path}: resolves to {resolved}, outside the candidate folder {root}")
    try:
        mode = resolved.stat().st_mode  # stat before open: opening a FIFO would block
    except OSError as exc:
        raise CandidateError(f"{path}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise CandidateError(f"{path}: not a regular file (a candidate holds only regular files)")
    return resolved.read_bytes()


def _checked_bytes(folder: Path, record: CandidateRecord) -> dict[str, bytes]:
    listed = sorted(set(record.files) - set(FILES))
    if listed:
        raise CandidateError(
            f"{folder / RECORD}: files names {listed[0]!r}, which is not a candidate file ({', '.join(FILES)})"
        )
    data = {}
    for name in FILES:
        if name not in record.files:
            raise CandidateError(f"{folder / RECORD}: files lacks {name!r}")
        data[name] = _read_inside(folder, name)
        digest = bytes_digest(data[name])
        if digest != record.files[name]:
            raise CandidateError(f"{folder / name}: digest {digest} differs from the recorded {record.files[name]}")
    return data


def _load(
    folder: Path, data: dict[str, bytes]
) -> tuple[PipelineSpec, QueryPlan, PipelineSpec, QueryPlan, Suite, GatePolicy]:
    try:
        loaded = (
            load_pipeline_spec(folder / PIPELINE),
            load_plan(folder / PLAN),
            load_pipeline_spec(folder / PARENT_PIPELINE),
            load_plan(folder / PARENT_PLAN),
            parse_suite_bytes(data[SUITE], str(folder / SUITE)),
            load_policy(folder / POLICY),
        )
    except (PipelineSpecError, PlanError, SuiteError, PolicyError) as exc:
        raise CandidateError(str(exc)) from None
    return loaded


def check_change(where: str, parent: dict[str, str], child: dict[str, str]) -> str:
    """The one changed asset between two asset maps, or ``CandidateError``."""
    changed = changed_assets(parent, child)
    if not changed:
        raise CandidateError(f"{where}: no asset changed: a candidate changes exactly one asset of its parent snapshot")
    locked = [a for a in changed if a in LOCKED]
    if locked:
        raise CandidateError(
            f"{where}: locked asset {locked[0]!r} changed ({parent[locked[0]]} -> {child[locked[0]]}): "
            f"{', '.join(LOCKED)} are locked"
        )
    if len(changed) > 1:
        raise CandidateError(
            f"{where}: {len(changed)} assets changed ({', '.join(changed)}): a candidate changes exactly one asset; "
            "make a chain of one-change candidates"
        )
    return changed[0]


def validate_candidate(folder: Path) -> Candidate:
    """The candidate in ``folder``, fully checked (module docstring), or ``CandidateError``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CandidateError(f"{folder}: not a candidate folder (no such directory)")
    record = _read_record(folder)
    where = str(folder / RECORD)
    if record.change.asset not in ASSETS:
        raise CandidateError(
            f"{where}: change names unknown asset {record.change.asset!r} (assets: {', '.join(ASSETS)})"
        )
    try:
        check_assets(record.parent.assets, f"{where}: parent")
    except SnapshotError as exc:
        raise CandidateError(str(exc)) from None
    data = _checked_bytes(folder, record)
    pipeline, plan, parent_pipeline, parent_plan, suite, policy = _load(folder, data)
    parent = record.parent.assets
    as_parent = asset_ids(
        parent["corpus_revision"], parent_pipeline, parent_plan, suite.digest, policy.policy_id, record.evaluator
    )
    for asset in (*BUILD_ASSETS, "query_plan", "answer_plan"):
        if as_parent[asset] != parent[asset]:
            name = PARENT_PLAN if asset in ("query_plan", "answer_plan") else PARENT_PIPELINE
            raise CandidateError(
                f"{folder / name}: asset {asset} is {as_parent[asset]}, the parent snapshot's is {parent[asset]}"
            )
    child = asset_ids(parent["corpus_revision"], pipeline, plan, suite.digest, policy.policy_id, record.evaluator)
    asset = check_change(where, parent, child)
    if asset != record.change.asset:
        raise CandidateError(f"{where}: the changed asset is {asset!r}, but the record names {record.change.asset!r}")
    if (record.change.old_id, record.change.new_id) != (parent[asset], child[asset]):
        raise CandidateError(f"{where}: change IDs differ from the files' ({parent[asset]} -> {child[asset]})")
    expected_id = candidate_id(record.parent.snapshot_id, asset, child[asset])
    if record.candidate_id != expected_id:
        raise CandidateError(f"{where}: candidate ID {record.candidate_id} differs from its content ID {expected_id}")
    if record.build_revision != build_revision_for(record.parent.revision, asset, expected_id):
        raise CandidateError(
            f"{where}: build revision {record.build_revision!r} is not {build_revision_for(record.parent.revision, asset, expected_id)!r}"
        )
    snapshot = Snapshot(revision=record.build_revision, assets=child)
    return Candidate(folder, record, pipeline, plan, parent_pipeline, parent_plan, suite, policy, snapshot)
