"""The evaluation evidence a release names, checked before it is activated, rolled back to or served.

A manifest binds an evaluation run (spec ID, run ID, ledger head). The run folder
``$RAGPIPE_HOME/evaluations/<run id>/`` is the custody record (never garbage-collected): its
ledger, bound inputs and every trace must verify, the run must be completed, and its identities
must be the manifest's — the run ID, spec ID and final ledger head, the bundle it evaluated (and,
when the run recorded it, the material digest of those bytes) and the query plan it bound. A release whose evidence is missing, damaged or belongs to another release is
refused like a bundle that does not verify.

The gate decision and comparison the manifest names are checked by ``gate_evidence`` (the release
store keeps copies, because ``ragpipe gc`` may collect the stage folder they were made in).
"""

from __future__ import annotations

from pathlib import Path

from ragpipe.experiment.arm_source import ArmSourceError, load_arm
from ragpipe.release.manifest import ReleaseManifest
from ragpipe.release.store import ReleaseError
from ragpipe.stages.workspace import Workspace


def evaluation_run_dir(ws: Workspace, manifest: ReleaseManifest) -> Path:
    """``evaluations/<run id>`` of the run ``manifest`` binds; ``ReleaseError`` for a run ID that is
    not a plain folder name (a manifest is input: it must not point outside the folder)."""
    run_id = manifest.evaluation.run_id
    if run_id in (".", "..") or "/" in run_id or "\\" in run_id or "\0" in run_id:
        raise ReleaseError(f"release {manifest.release_id}: evaluation run ID {run_id!r} is not a folder name")
    return ws.home / "evaluations" / run_id


def evaluation_problems(ws: Workspace, manifest: ReleaseManifest) -> list[str]:
    """Why the evaluation run ``manifest`` binds does not vouch for it (empty: it does)."""
    try:
        run = evaluation_run_dir(ws, manifest)
    except ReleaseError as exc:
        return [str(exc)]
    where = f"evaluation run {manifest.evaluation.run_id}"
    if not run.is_dir():
        return [f"{where}: {run} is missing"]
    try:
        arm = load_arm(run)  # verifies ledger, inputs and traces; refuses a run that is not completed
    except ArmSourceError as exc:
        return [f"{where}: {exc}"]
    bound = {
        "run ID": (arm.run_id, manifest.evaluation.run_id),
        "spec ID": (arm.spec_id, manifest.evaluation.spec_id),
        "ledger head": (arm.ledger_head, manifest.evaluation.ledger_head),
        "evaluated bundle": (arm.variant.bundle_id, manifest.bundle_id),
        "query plan": (arm.variant.plan_id, manifest.query_plan_id),
    }
    if arm.build is not None:  # runs made before runs bound build figures have no digest to compare
        bound["evaluated bundle bytes"] = (arm.build.material_digest, manifest.material_digest)
    return [f"{where}: {name} {got} is not the release's {want}" for name, (got, want) in bound.items() if got != want]
