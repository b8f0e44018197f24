"""The evaluation run a release binds, checked before it is activated, rolled back to or served.

A manifest binds an evaluation run (spec ID, run ID, ledger head). The run folder
``$RAGPIPE_HOME/evaluations/<run id>/`` is the custody record (never garbage-collected): its
ledger, bound inputs and every trace must verify, the run must be completed, and its identities
must be the manifest's — the run ID, spec ID and final ledger head, the bundle it evaluated (and,
when the run recorded it, the material digest of those bytes) and the query plan it bound. A release whose evidence is missing, damaged or belongs to another release is
refused like a bundle that does not verify.

The gate decision and comparison the manifest names are checked by ``kept_decision`` (the release
store keeps copies, because ``ragpipe gc`` may collect the stage folder they were made in).
"""

from __future__ import annotations

from ragpipe.experiment.arm_source import ArmSourceError, load_arm
from ragpipe.experiment.arms import ArmRun
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.manifest import ReleaseManifest, evaluation_run_dir
from ragpipe.release.replica import run_dir
from ragpipe.release.store import ReleaseError


def load_run(ws: Workspace, run_id: str) -> ArmRun:
    """The completed run ``evaluations/<run_id>``, verified (``load_arm``); ``ValueError`` why not."""
    run = run_dir(ws, run_id)
    if not run.is_dir():
        raise ReleaseError(f"{run} is missing")
    return load_arm(run)


def evaluation_evidence(ws: Workspace, manifest: ReleaseManifest) -> tuple[ArmRun | None, list[str]]:
    """The evaluation run ``manifest`` binds, verified, and why it does not vouch for the release
    (``(arm, [])``: it does; ``(None, problems)`` when it cannot be read at all)."""
    try:
        run = evaluation_run_dir(ws, manifest)
    except ReleaseError as exc:
        return None, [str(exc)]
    where = f"evaluation run {manifest.evaluation.run_id}"
    if not run.is_dir():
        return None, [f"{where}: {run} is missing"]
    try:
        arm = load_arm(run)  # verifies ledger, inputs and traces; refuses a run that is not completed
    except ArmSourceError as exc:
        return None, [f"{where}: {exc}"]
    bound = {
        "run ID": (arm.run_id, manifest.evaluation.run_id),
        "spec ID": (arm.spec_id, manifest.evaluation.spec_id),
        "ledger head": (arm.ledger_head, manifest.evaluation.ledger_head),
        "evaluated bundle": (arm.variant.bundle_id, manifest.bundle_id),
        "query plan": (arm.variant.plan_id, manifest.query_plan_id),
    }
    if arm.build is not None:  # runs made before runs bound build figures have no digest to compare
        bound["evaluated bundle bytes"] = (arm.build.material_digest, manifest.material_digest)
    problems = [
        f"{where}: {name} {got} is not the release's {want}" for name, (got, want) in bound.items() if got != want
    ]
    return arm, problems
