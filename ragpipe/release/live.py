"""What is live on a target: the one resolution every reader of "the active release" uses.

``live_release(ws, target)`` is what ``ragpipe query``/``answer`` (``ragpipe.api``), ``release
current``, the gate's incumbent (``status.resolve_active_run``) and the server's follower
(``serving.active_release``) serve or report. It checks what the swap that moved the pointer
checked, so a pointer nobody moved through activation or rollback is never live:

1. the pointer and the target's verified history are read as of one moment (under the target's
   writer lock) and must agree — the release the pointer names at its generation is the one the
   history's last activation or rollback made active, under the intent the pointer's
   ``ledger_head`` names (an intent whose swap happened but whose observed record is not yet
   written vouches for the pointer, as ``recovery.settle`` would record it);
2. a release made active by an *activation* must be eligible under a gate policy the target
   accepts, and approved where the target requires it, by a signed approval that was valid when
   the activation took effect (``approvals.approval_refusal``) (a *rollback* returns to a release that was
   active before, which ``rollback`` does not re-gate);
3. the release is verified as activation verifies it — bundle and evaluation evidence, with its
   gate decision made again from its runs (``activation.verified_release``). A reader that only
   serves (``remember=True``) does the evidence and decision part once per target generation:
   a sealed record remembers it (``ragpipe.release.verified_record``), and while the record holds
   only the bundle is verified again.

Anything else raises ``ReleaseError`` naming the target, the release and the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ragpipe.kernel.ledger import LedgerError, Record
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import VerifiedRelease, gate_refusal, incumbent_refusal, verified_release
from ragpipe.release.approvals import approval_refusal, parse_time
from ragpipe.release.history import TargetHistory, read_history
from ragpipe.release.manifest import load_manifest
from ragpipe.release.pointer import Pointer, read_pointer
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import TargetsConfig, load_targets
from ragpipe.release.time_order import time_refusal
from ragpipe.release.verified_record import VerifiedKey, remembered
from ragpipe.release.verified_record import remember as remember_verified


@dataclass(frozen=True)
class LiveRelease:
    """The verified live release of ``target`` and when, by which action, the history made it so."""

    verified: VerifiedRelease
    target: str
    generation: int
    since: str  # ISO 8601, UTC
    action: str  # "activate" or "rollback"
    previous: str | None  # the release the swap replaced

    @property
    def release_id(self) -> str:
        return self.verified.release_id


def live_release(
    ws: Workspace,
    target: str | None = None,
    *,
    config: TargetsConfig | None = None,
    defer_vector_table: bool = False,
    remember: bool = False,
) -> LiveRelease:
    """The live release of ``target`` (the configured default when None), checked and verified as
    the module docstring says; ``ReleaseError`` naming the first problem. ``defer_vector_table``:
    leave the lance table's content checks until its vectors are read (``activation.verified_release``)
    — its bytes are the ones the activation verified completely, since the release pins the
    bundle's material digest and every file's digest is checked here. ``remember``: use and keep
    the verification record (module docstring, 3); the result's ``verified.arm`` is then None."""
    store = ReleaseStore(ws)
    config = config or load_targets()
    name, spec = config.get(target)
    pointer, state, records = _pointer_and_history(store, name)
    since, action = _agreement(name, pointer, state, records)
    # the writers' rule: no record dated before its predecessor unless a (signed) correction accepts it
    untimely = time_refusal(config, name, state)
    if untimely:
        raise ReleaseError(untimely)
    manifest = load_manifest(store, pointer.release_id)
    # A rollback returns to a release an earlier activation made live: that activation must have
    # been one activation allows, or a forged activation could be laundered through a rollback.
    first = pointer.generation if action == "activate" else _first_activation(state, pointer.release_id)
    refused = gate_refusal(config, name, manifest) if action == "activate" else _ineligible(manifest)
    if refused:
        raise ReleaseError(f"target {name!r}: release {pointer.release_id} {refused}")
    if spec.approval_required:
        at, intent_seq = _activation_record(records, first)
        moment = _moment(
            state.judged_time(intent_seq, at)
        )  # an accepted back-dated time: judged at the latest before it
        unapproved = approval_refusal(config, name, state, pointer.release_id, moment, before_seq=intent_seq)
        if unapproved:
            raise ReleaseError(unapproved)
    key = VerifiedKey(
        target=name,
        generation=pointer.generation,
        history_head=records[-1].hash,
        release_id=manifest.release_id,
        material_digest=manifest.material_digest,
        evaluation_ledger_head=manifest.evaluation.ledger_head,
        decision_id=manifest.gate.decision_id,
    )
    known = remembered(ws, key) if remember else None
    if known is not None:
        from ragpipe.bundle.verify import trust_payload  # pyarrow: only when verifying

        trust_payload(known)  # the payload of exactly that bundle manifest verified in full
    verified, problems = verified_release(
        ws, manifest, remake_decision=True, defer_vector_table=defer_vector_table, evidence=known is None
    )
    if verified is None:
        raise ReleaseError(f"target {name!r}: release {pointer.release_id} failed verification: " + "; ".join(problems))
    # The activation that first made it live replaced what its intent names: the release the
    # decision was made against (or nothing, for a bootstrap), as activation checked — so a history
    # forged past that check is refused here too. A decision made before decisions recorded their
    # incumbent (v1) was activated under the old rule and keeps serving.
    if manifest.gate.change is not None:
        stale = incumbent_refusal(name, manifest, _intent(records, first).payload.get("previous"), config.get(None)[0])
        if stale:
            raise ReleaseError(f"target {name!r}: release {pointer.release_id} {stale}")
    if remember and known is None:  # every check above passed in full: remember it for this generation
        from ragpipe.bundle.verify import manifest_digest_of

        remember_verified(ws, key, manifest_digest_of(verified.bundle))
    return LiveRelease(verified, name, pointer.generation, since, action, pointer.previous)


def _ineligible(manifest) -> str | None:
    if manifest.gate.eligible:
        return None
    return f"is not eligible for activation (gate decision {manifest.gate.decision_id}: decisive phase {manifest.gate.decisive_phase})"


def _first_activation(state: TargetHistory, release_id: str) -> int:
    """The generation at which an *activation* first made ``release_id`` live on the target."""
    for generation, release, action in state.activations:
        if release == release_id and action == "activate":
            return generation
    raise ReleaseError(f"release {release_id} was never activated on the target; a rollback cannot return to it")


def _intent(records: tuple[Record, ...], generation: int) -> Record:
    """The intent record that moved the target to ``generation``."""
    for record in records:
        if record.kind == "intent" and record.payload["generation"] == generation:
            return record
    raise ReleaseError(f"the history has no intent for generation {generation}")


def _activation_record(records: tuple[Record, ...], generation: int) -> tuple[str, int]:
    """(time, record number) of the intent that moved the target to ``generation``."""
    record = _intent(records, generation)
    return str(record.payload["at"]), record.seq


def _moment(since: str) -> datetime:
    """When the activation took effect; a history time that does not parse is no moment at all."""
    try:
        return parse_time(since)
    except (TypeError, ValueError):
        raise ReleaseError(f"the history records the activation at {since!r}, which is not a time") from None


def _pointer_and_history(store: ReleaseStore, name: str) -> tuple[Pointer, TargetHistory, tuple[Record, ...]]:
    """The pointer and the history as of one moment: read under the target's writer lock, which
    every activation and rollback holds from its intent to its observed record, so no swap moves
    the pointer or appends to the history between the two reads (held for the reads only)."""
    with store.target_lock(name):
        pointer = read_pointer(store, name)
        if pointer is None and read_history(store, name)[0].active is not None:
            raise ReleaseError(
                f"target {name!r}: the pointer is missing, but the history has a release active: refusing to guess"
            )
        if pointer is None:
            raise ReleaseError(
                f"target {name!r} has no active release: query a built revision with ragpipe query --revision KEY "
                f'"...", or activate an eligible release (ragpipe release list) with '
                f"ragpipe release activate RELEASE_ID --target {name}"
            )
        try:
            state, records = read_history(store, name)
        except (LedgerError, ValueError) as exc:
            raise ReleaseError(f"target {name!r}: its history does not verify: {exc}") from None
    return pointer, state, records


def _agreement(target: str, pointer: Pointer, state: TargetHistory, records: tuple[Record, ...]) -> tuple[str, str]:
    """(when, by which action) the history made ``pointer``'s release active; ``ReleaseError``
    unless the history agrees with the pointer (module docstring, 1)."""
    agreed = _release_agreement(target, pointer, state, records)
    announced = next(r for r in records if r.kind == "intent" and r.hash == pointer.ledger_head)
    if announced.payload["previous"] != pointer.previous:
        raise ReleaseError(
            f"target {target!r}: the pointer says it replaced {pointer.previous}, but its intent (history record "
            f"{announced.seq}) replaced {announced.payload['previous']}: the pointer was not written by that swap"
        )
    return agreed


def _release_agreement(
    target: str, pointer: Pointer, state: TargetHistory, records: tuple[Record, ...]
) -> tuple[str, str]:
    """``_agreement`` on release, generation and intent (everything but ``previous``)."""
    intent = state.open_intent
    if intent is not None and intent.hash == pointer.ledger_head:
        if (intent.payload["release_id"], intent.payload["generation"]) == (pointer.release_id, pointer.generation):
            return str(intent.payload["at"]), str(intent.payload["action"])
    if (state.active, state.generation, state.active_intent) != (
        pointer.release_id,
        pointer.generation,
        pointer.ledger_head,
    ):
        raise ReleaseError(
            f"target {target!r}: the pointer names release {pointer.release_id} at generation {pointer.generation}, "
            f"but the history has {state.active} at generation {state.generation}: the pointer was not moved "
            "by activation or rollback; refusing to serve it"
        )
    action = next(a for generation, _, a in reversed(state.activations) if generation == pointer.generation)
    for record in reversed(records):
        if record.kind == "observed" and record.payload["generation"] == pointer.generation:
            return str(record.payload["at"]), action
    raise ReleaseError(f"target {target!r}: the history has no record of generation {pointer.generation}")
