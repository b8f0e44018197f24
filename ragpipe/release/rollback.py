"""Rollback: point a target back to a previously active release that still verifies (no rebuild).

The history keeps a rollback stack: an activation pushes its release; a rollback without ``to``
pops the current release and returns to the one active before it, so repeated rollbacks walk back
through the activations (A → B → C, rollback → B, rollback → A). ``to`` picks any release that was
active on this target before (the stack is cut back to it, or it is pushed if it had been popped).
The chosen release is verified completely like an activation (a rollback to a bundle that no longer
verifies is refused and recorded as ``rejected``); approvals and gate eligibility are not asked
again — the release was active here before, and a rollback is the way back from an incident.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragpipe.kernel.publish import StepHook
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import ChildCheck, SwapResult, settle_or_reject, swap, verify_release
from ragpipe.release.history import History, TargetHistory, read_history
from ragpipe.release.manifest import load_manifest
from ragpipe.release.pointer import check_generation
from ragpipe.release.recovery import recover_target
from ragpipe.release.store import ReleaseError, ReleaseStore, check_release_id
from ragpipe.release.targets import TargetsConfig, load_targets


def _noop(_: str) -> None:
    return None


def rollback_choice(state: TargetHistory, target: str, to: str | None) -> str:
    """The release a rollback of ``target`` goes to (module docstring); clear errors otherwise."""
    if state.active is None:
        raise ReleaseError(f"target {target!r} has no active release; there is nothing to roll back")
    if to is None:
        if len(state.stack) < 2:
            raise ReleaseError(
                f"target {target!r} has no earlier release to roll back to (only {state.active} was active)"
            )
        return state.stack[-2]
    check_release_id(to)
    if to == state.active:
        raise ReleaseError(f"release {to} is already active on target {target!r}")
    if to not in state.ever_active:
        raise ReleaseError(
            f"release {to} was never active on target {target!r}; rollback only returns to a previously active release"
        )
    return to


def rollback(
    ws: Workspace,
    target: str | None = None,
    *,
    to: str | None = None,
    by: str = "cli",
    config: TargetsConfig | None = None,
    child_checks: Sequence[ChildCheck] = (),
    on_step: StepHook | None = None,
) -> SwapResult:
    """Roll ``target`` back (to ``to`` or the release active before the current one); the same
    intent → CAS swap → observed sequence and crash points as ``activate``."""
    step = on_step or _noop
    store = ReleaseStore(ws)
    config = config or load_targets()
    name, _ = config.get(target)
    recover_target(ws, name)  # an interrupted swap must be settled before choosing from the history
    state, _records = read_history(store, name)
    release_id = rollback_choice(state, name, to)
    problems = verify_release(ws, load_manifest(store, release_id), child_checks)
    step("verified")
    with store.target_lock(name), History(store, name) as history:
        refused = (
            f"rollback of target {name!r} to release {release_id} refused: it no longer verifies "
            f"(pick another with --to):\n  " + "\n  ".join(problems)
        )
        settle_or_reject(store, config, history, "rollback", release_id, problems, by, refused)
        check_generation(store, name, state.generation)  # the choice was made at this generation
        return swap(store, history, release_id, "rollback", by, step)
