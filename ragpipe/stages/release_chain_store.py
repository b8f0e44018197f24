"""Stage records of the chain assets (``evaluation_run``, ``gate_decision``, ``release_manifest``).

They use the build stages' store (``ragpipe.stages.stage_store``): per revision and asset an
immutable version folder plus ``latest.json``, with the upstream versions read as ``inputs``, so
``ragpipe gc`` keeps what the latest chain references and a chain asset refuses inputs that were
not built from one another. Their *stage* versions:

- ``evaluation_run``: ``content_id("evaluation-attempt", 1, {spec_id, run_id})``: one version per
  attempt (the run folder itself lives in ``evaluations/<run id>/``, outside ``work/``, and is
  never collected: it is the custody record a release names). The Dagster data version is the
  spec ID alone, so a re-run of the same spec leaves downstream assets fresh;
- ``gate_decision``: the decision ID; ``release_manifest``: the release ID (both also their
  Dagster data versions).

``ChainResult`` is what a chain step reports to its asset (Dagster-free).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ragpipe.kernel.workspace import Workspace
from ragpipe.stages.results import Scalar, Table
from ragpipe.stages.stage_store import StageError, StageOutput, StageRecord, publish_output, read_output, read_version

CHAIN_UPSTREAM = {
    "evaluation_run": "index_bundle",
    "gate_decision": "evaluation_run",
    "release_manifest": "gate_decision",
}


@dataclass
class ChainResult:
    """``data_version`` is the Dagster data version; ``record`` the published stage record."""

    record: StageRecord
    data_version: str
    metadata: dict[str, Scalar | Path] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)


def publish_chain(
    ws: Workspace,
    stage: str,
    revision: str,
    spec_id: str,
    data_version: str,
    inputs: dict[str, StageOutput],
    facts: dict,
    write=None,
) -> StageRecord:
    """Publish one chain materialization (``write(tmp)`` fills the version folder, if given)."""
    record = StageRecord(
        stage=stage,
        revision=revision,
        spec_id=spec_id,
        data_version=data_version,
        inputs={name: out.data_version for name, out in inputs.items()},
        facts=facts,
    )
    publish_output(ws, record, write or (lambda tmp: None))
    return record


def read_chain_input(ws: Workspace, revision: str, stage: str, code_version: str, downstream: str) -> StageOutput:
    """The latest ``stage`` output, refused when built under another code version than the current one."""
    out = read_output(ws, revision, stage)
    if out.record.spec_id != code_version:
        raise StageError(
            f"{stage} for revision {revision!r} was materialized under {out.record.spec_id}, the current pipeline "
            f"spec expects {code_version}: re-materialize {stage} before {downstream}"
        )
    return out


def read_chain_upstream(
    ws: Workspace, revision: str, out: StageOutput, upstream: str, code_version: str
) -> StageOutput:
    """The ``upstream`` output ``out`` was built from (by version, not the latest one), refused when
    it was built under another code version than ``code_version``.

    Two runs of one partition may interleave (run A's gate, run B's evaluation, run A's release):
    following the recorded versions keeps each chain consistent where reading every input's latest
    output would combine one run's gate with another run's evaluation.
    """
    version = out.record.inputs.get(upstream)
    if version is None:
        raise StageError(
            f"{out.record.stage} for revision {revision!r} names no {upstream} input: re-materialize {out.record.stage}"
        )
    try:
        latest = read_output(ws, revision, upstream)
    except StageError:
        latest = None
    # The folder's own stage.json is written once; re-publishing the same version under another
    # spec (same content, e.g. a bundle whose ID a spec change did not move) updates only the
    # pointer, so the pointer's record is the current one when it names this version.
    up = (
        latest
        if latest is not None and latest.data_version == version
        else read_version(ws, revision, upstream, version, out.record.stage)
    )
    if up.record.spec_id != code_version:
        raise StageError(
            f"{upstream} {version} for revision {revision!r} was materialized under {up.record.spec_id}, the current "
            f"pipeline spec expects {code_version}: re-materialize {upstream} and {out.record.stage}"
        )
    return up
