"""Approvals: a person's record that a release may go live on a target (docs/releases.md).

An approval is an ``approval`` record ``{release_id, by, note, at}`` in the target's history
ledger, so it is hash-chained with the activations it permits. Only an eligible release can be
approved. Activation (and the sensor) require one where the target's ``approval_required`` is set;
approving for a target that does not require it is recorded and harmless.
"""

from __future__ import annotations

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import Approval, History, now_iso
from ragpipe.release.manifest import load_manifest
from ragpipe.release.recovery import settle
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import TargetsConfig, load_targets


def approve(
    ws: Workspace, release_id: str, target: str | None, *, by: str, note: str = "", config: TargetsConfig | None = None
) -> Approval:
    """Record that ``by`` approved ``release_id`` for ``target``; returns the approval."""
    if not by.strip():
        raise ReleaseError("the approver (--by) must be a non-empty name")
    store = ReleaseStore(ws)
    name, _ = (config or load_targets()).get(target)
    manifest = load_manifest(store, release_id)
    if not manifest.gate.eligible:
        raise ReleaseError(
            f"release {release_id} is not eligible for activation "
            f"(gate decision {manifest.gate.decision_id}: decisive phase {manifest.gate.decisive_phase}); it cannot be approved"
        )
    at = now_iso()
    with store.target_lock(name), History(store, name) as history:
        settle(store, history)
        record = history.append("approval", {"release_id": release_id, "by": by.strip(), "note": note, "at": at})
    return Approval(release_id, by.strip(), note, at, record.seq)
