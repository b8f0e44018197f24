"""Activation: make an eligible, verified (and, where required, approved) release active on a target.

Order (docs/releases.md): resolve the exact release ID → load and verify its manifest → refuse an
ineligible release → verify the bundle completely (``open_bundle``: files, digests, seal, payload,
material digest) and every child ID (the bundle's ID and material digest must be the manifest's,
and the evaluation run it binds must verify and be the manifest's: ``evidence``; ``child_checks``
add more) → under the target's lock: settle an interrupted activation, record a
``rejected`` record and refuse if verification failed, refuse without a required approval, compare
the pointer's generation with the one the caller read (``ConflictError`` if it moved) → append the
intent → swap the pointer → append the observed record. ``on_step`` is called at every point where
a crash leaves a distinct state: ``verified``, ``intent_appended``, the pointer's
``POINTER_STEPS``, ``observed_appended``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragpipe.kernel.publish import StepHook
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.approvals import approval_refusal
from ragpipe.release.history import History, now_iso
from ragpipe.release.manifest import ReleaseManifest, load_manifest
from ragpipe.release.pointer import Pointer, check_generation, current_generation, read_pointer, write_pointer
from ragpipe.release.recovery import settle
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import TargetsConfig, load_targets
from ragpipe.release.time_order import refuse_untimely

if TYPE_CHECKING:
    from ragpipe.bundle.verify import VerifiedBundle
    from ragpipe.experiment.arms import ArmRun

ChildCheck = Callable[[Workspace, ReleaseManifest], list[str]]
ACTIVATION_STEPS = (
    "verified",
    "intent_appended",
    "pointer_temp_written",
    "pointer_temp_fsynced",
    "pointer_renamed",
    "pointer_dir_fsynced",
    "observed_appended",
)


@dataclass(frozen=True)
class SwapResult:
    target: str
    release_id: str
    generation: int
    previous: str | None
    changed: bool  # False: the release was already active; nothing was written

    def as_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "release_id": self.release_id,
            "generation": self.generation,
            "previous": self.previous,
            "changed": self.changed,
        }


def _waived_text() -> str:
    from ragpipe.release.automatic import WAIVED

    return WAIVED


def _noop(_: str) -> None:
    return None


def bundle_path(ws: Workspace, manifest: ReleaseManifest) -> Path:
    return ws.bundles / manifest.bundle_hex


def verify_release(
    ws: Workspace, manifest: ReleaseManifest, child_checks: Sequence[ChildCheck] = (), *, remake_decision: bool = True
) -> list[str]:
    """Problems that forbid serving ``manifest`` (empty: it verifies); ``verified_release``."""
    return verified_release(ws, manifest, child_checks, remake_decision=remake_decision)[1]


@dataclass(frozen=True)
class VerifiedRelease:
    """A release that verified, with the objects its verification read and checked: the opened
    bundle and the evaluation run. Whoever serves or gates it uses these, never a second reading.
    ``arm`` is None when the evidence checks were remembered, not repeated
    (``verified_release(…, evidence=False)``: serving only)."""

    manifest: ReleaseManifest
    bundle: VerifiedBundle
    arm: ArmRun | None

    @property
    def release_id(self) -> str:
        return self.manifest.release_id


def verified_release(
    ws: Workspace,
    manifest: ReleaseManifest,
    child_checks: Sequence[ChildCheck] = (),
    *,
    remake_decision: bool = True,
    defer_vector_table: bool = False,
    evidence: bool = True,
) -> tuple[VerifiedRelease | None, list[str]]:
    """The release as verified here — None unless it verifies — and the problems that forbid
    serving ``manifest`` (empty: it verifies). Full bundle verification,
    then the bundle's IDs against the manifest's, then its evaluation evidence
    (``bound_run.evaluation_evidence``) and gate decision (``kept_decision.gate_problems``: made
    again from its runs unless ``remake_decision`` is False), then each of ``child_checks``.

    Activation, rollback and every reader of the live release (``ragpipe.release.live``) make the
    decision again (a paired comparison is recomputed, with its bootstrap); serving a release the
    caller names by ID checks the kept documents and their links only.
    ``defer_vector_table``: leave the lance table's content checks to the moment its vectors are
    read (``ragpipe.bundle.verify.open_bundle``), so a query process never imports lancedb.
    ``evidence=False``: skip the evaluation evidence and the gate decision (and ``child_checks``) —
    only for a live release whose full verification is remembered
    (``ragpipe.release.verified_record``); the bundle is verified all the same."""
    from ragpipe.bundle.objects import open_bundle_here  # pyarrow: only when verifying
    from ragpipe.bundle.verify import BundleVerificationError

    try:
        # built on another machine, the store holds it: downloaded only as the release bound it
        bundle = open_bundle_here(
            bundle_path(ws, manifest), manifest.material_digest, defer_vector_table=defer_vector_table
        )
    except BundleVerificationError as exc:
        return None, [f"bundle {manifest.bundle_id}: {p}" for p in exc.problems]
    problems = []
    if bundle.manifest.bundle_id != manifest.bundle_id:
        problems.append(f"bundle ID {bundle.manifest.bundle_id} differs from the release's {manifest.bundle_id}")
    if bundle.manifest.material_digest != manifest.material_digest:
        problems.append(
            f"bundle {manifest.bundle_id}: material digest {bundle.manifest.material_digest} differs from the release's {manifest.material_digest}"
        )
    if not evidence:
        return (None, problems) if problems else (VerifiedRelease(manifest, bundle, None), problems)
    # Imported here: the evaluation and gate machinery (~0.3 s of imports) is needed to verify a
    # release in full, not to serve one whose verification is remembered (``verified_record``).
    from ragpipe.release.bound_run import evaluation_evidence, load_run
    from ragpipe.release.kept_decision import gate_problems

    arm, found = evaluation_evidence(ws, manifest)
    problems += found
    # The decision is made again from a run that verifies but is not the release's too: the
    # decision's own links then name the mismatch.
    problems += gate_problems(
        ReleaseStore(ws), manifest, arm if remake_decision else None, lambda run_id: load_run(ws, run_id)
    )
    for check in child_checks:
        problems += check(ws, manifest)
    if problems or arm is None:  # a run that loaded but vouches for nothing is no arm
        return None, problems
    return VerifiedRelease(manifest, bundle, arm), problems


def unaccepted_policy(accepted: dict[str, str], target: str, manifest: ReleaseManifest) -> str | None:
    """Why ``target``, accepting ``accepted`` (``TargetsConfig.accepted_policies``), does not accept
    the gate policy ``manifest`` was gated under (None: it does)."""
    if manifest.gate_policy_id in accepted:
        return None
    return (
        f"was gated under policy {manifest.gate_policy_id}, which target {target!r} does not accept "
        f"(it accepts {', '.join(f'{v} = {k}' for k, v in accepted.items())}: gate_policies in the targets config)"
    )


def gate_refusal(config: TargetsConfig, target: str, manifest: ReleaseManifest) -> str | None:
    """Why the gate forbids activating ``manifest`` on ``target`` (None: it allows it): an
    ineligible decision, or a gate policy the target does not accept. Shared by activation and by
    a server checking what activation checked (``ragpipe.release.serving``)."""
    if not manifest.gate.eligible:
        return (
            f"is not eligible for activation "
            f"(gate decision {manifest.gate.decision_id}: decisive phase {manifest.gate.decisive_phase})"
        )
    return unaccepted_policy(config.accepted_policies(target), target, manifest)


def incumbent_refusal(
    target: str, manifest: ReleaseManifest, live: str | None, default_target: str | None = None
) -> str | None:
    """Why ``manifest``'s gate decision does not vouch for it against ``live``, the release
    ``target`` serves (None: it does). A decision answers "is it good enough compared with the
    release it was made against" (or, bootstrap, "on its own"), so it holds only where that
    release is the one live — a bootstrap decision only where nothing is. A decision made before
    decisions bound their incumbent activates nowhere new (rollback to it still works). The remedy
    named depends on whether ``target`` is ``default_target``, the one the chain's gate compares
    against."""
    gate = manifest.gate
    if gate.change is None:
        return (
            "was gated before decisions recorded the release they were made against, so it cannot be "
            f"activated anew: build its revision again (ragpipe build) to gate it against what {target!r} serves"
        )
    if gate.incumbent == live:
        return None
    against = "without an incumbent (bootstrap)" if gate.incumbent is None else f"against release {gate.incumbent}"
    serves = "serves nothing" if live is None else f"serves release {live}"
    if default_target is None or target == default_target:
        remedy = "build the revision again to gate it against what is live"
    else:  # the chain gates against the default target's release, not this one's
        first = f"activate release {gate.incumbent} on {target!r} first, or " if gate.incumbent else ""
        remedy = f"{first}build the revision again while {default_target!r} serves what {target!r} serves"
    return f"was gated {against}, but target {target!r} {serves}: its decision says nothing about replacing that ({remedy})"


def refusal(release_id: str, problems: list[str]) -> str:
    return f"release {release_id} failed verification; not activated:\n  " + "\n  ".join(problems)


def settle_or_reject(
    store: ReleaseStore,
    config: TargetsConfig,
    history: History,
    action: str,
    release_id: str,
    problems: list[str],
    by: str,
    refused: str,
) -> None:
    """What activation and rollback do first under the target's lock: refuse a change out of time
    order, settle an interrupted swap, and record ``release_id`` as rejected — then raise
    ``ReleaseError(refused)`` — when it no longer verifies (``problems``)."""
    refuse_untimely(config, history.target, history.state)
    settle(store, history)
    if problems:
        history.append(
            "rejected",
            {"action": action, "release_id": release_id, "reason": "; ".join(problems), "by": by, "at": now_iso()},
        )
        raise ReleaseError(refused)


def swap(
    store: ReleaseStore, history: History, release_id: str, action: str, by: str, step: StepHook, waived: bool = False
) -> SwapResult:
    """Intent → pointer swap → observed, under the lock, the generation already checked. An
    exception after the intent settles it from the pointer (cancelled if the pointer did not move).
    ``waived``: the intent records that it waives ``human_apply_required`` (``automatic``)."""
    state = history.state
    target, gen, previous = history.target, state.generation, state.active
    intent = history.append(
        "intent",
        {
            "action": action,
            "release_id": release_id,
            "from_generation": gen,
            "generation": gen + 1,
            "previous": previous,
            "by": by,
            "at": now_iso(),
            **({"waived": _waived_text()} if waived else {}),
        },
    )
    step("intent_appended")
    try:
        write_pointer(store, Pointer(target, release_id, gen + 1, previous, intent.hash), on_step=step)
    except BaseException as exc:
        settle(store, history, ("cancelled", f"the writer failed before the pointer swap: {type(exc).__name__}: {exc}"))
        raise
    history.append(
        "observed",
        {
            "intent": intent.seq,
            "outcome": "active",
            "release_id": release_id,
            "generation": gen + 1,
            "reason": None,
            "at": now_iso(),
        },
    )
    step("observed_appended")
    return SwapResult(target, release_id, gen + 1, previous, True)


def activate(
    ws: Workspace,
    release_id: str,
    target: str | None = None,
    *,
    expected_generation: int | None = None,
    by: str = "cli",
    config: TargetsConfig | None = None,
    child_checks: Sequence[ChildCheck] = (),
    on_step: StepHook | None = None,
    automatic: bool = False,
) -> SwapResult:
    """Activate ``release_id`` on ``target`` (default target when None); see the module docstring.
    ``automatic``: no person asked for it (the activation sensor's runs) — refused unless the
    target activates automatically and, for a decision saying ``human_apply_required``, waives
    that (``ragpipe.release.automatic``).

    ``expected_generation`` is the pointer generation the caller based its decision on (read now
    when None); if another writer moved the pointer since, ``ConflictError`` and nothing changes.
    Raises ``ReleaseError`` (never activating) when the release is unknown, ineligible, fails
    verification, or lacks a required approval. Already active → ``changed=False``, nothing written.
    """
    step = on_step or _noop
    store = ReleaseStore(ws)
    config = config or load_targets()
    name, spec = config.get(target)
    manifest = load_manifest(store, release_id)
    refused = gate_refusal(config, name, manifest)
    if refused:
        raise ReleaseError(f"release {release_id} {refused}")
    waived = False
    if automatic:
        from ragpipe.release.automatic import automatic_refusal  # gate evidence: only when automatic

        not_automatic, waived = automatic_refusal(store, name, spec, manifest)
        if not_automatic:
            raise ReleaseError(f"release {release_id} is not activated automatically: {not_automatic}")
    if expected_generation is None:
        expected_generation = current_generation(store, name)
    problems = verify_release(ws, manifest, child_checks)  # slow: outside the lock
    step("verified")
    with store.target_lock(name), History(store, name) as history:
        settle_or_reject(store, config, history, "activate", release_id, problems, by, refusal(release_id, problems))
        if history.state.active == release_id:
            pointer = read_pointer(store, name)
            return SwapResult(name, release_id, history.state.generation, pointer.previous if pointer else None, False)
        stale = incumbent_refusal(name, manifest, history.state.active, config.get(None)[0])
        if stale:
            raise ReleaseError(f"release {release_id} {stale}")
        unapproved = spec.approval_required and approval_refusal(config, name, history.state, release_id)
        if unapproved:
            raise ReleaseError(
                f"release {release_id} needs an approval for target {name!r} before activation: {unapproved} "
                f"(ragpipe release approve {release_id} --target {name} --by NAME --key KEYFILE)"
            )
        check_generation(store, name, expected_generation)
        return swap(store, history, release_id, "activate", by, step, waived)
