"""Whether a release may be activated without a person (the activation sensor's runs).

A target activates automatically only if it says so (``auto_activate``). A gate decision made
under a policy with ``human_apply_required`` (the default policy) says a person applies the
release; automatic activation goes ahead only on a target that explicitly waives that
(``waive_human_apply: true``), and the activation's intent record then carries ``waived:
human_apply_required``, so the history shows which activations no person applied. A person's
activation (``ragpipe release activate``, a run launched by hand) never needs a waiver.
"""

from __future__ import annotations

from ragpipe.release.kept_decision import EvidenceError, read_gate_evidence
from ragpipe.release.manifest import ReleaseManifest
from ragpipe.release.store import ReleaseStore
from ragpipe.release.targets import TargetSpec

WAIVED = "human_apply_required"  # the value of an intent's ``waived`` member


def automatic_refusal(
    store: ReleaseStore, target: str, spec: TargetSpec, manifest: ReleaseManifest
) -> tuple[str | None, bool]:
    """``(why not, waived)``: why ``manifest`` may not be activated on ``target`` without a person
    (None: it may), and whether doing so waives ``human_apply_required``."""
    if not spec.auto_activate:
        return f"target {target!r} does not activate automatically (auto_activate: false in the targets config)", False
    try:
        decision = read_gate_evidence(store, manifest.gate.decision_id)[0]
    except EvidenceError as exc:
        return f"its kept gate decision cannot be read: {exc}", False
    if not decision.human_apply_required:
        return None, False
    if not spec.waive_human_apply:
        return (
            f"its gate decision says human_apply_required and target {target!r} does not waive it "
            "(waive_human_apply in the targets config): a person activates it (ragpipe release activate)",
            False,
        )
    return None, True
