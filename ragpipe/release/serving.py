"""What a query is served from when the caller names no bundle: a release.

``served_release(ws, target=…)`` resolves the active release of a target (the configured default
target when None), ``served_release(ws, release_id=…)`` one exact release; either way the bundle is
verified against the manifest (``status.resolve_active_release`` /
``activation.verified_release``; the lance table's own content checks deferred until lancedb
serves: ``ragpipe.bundle.verify.open_bundle``), once, and handed on opened, and the query plan is the
release was gated with: the evaluation run's bound copy (``evaluations/<run id>/inputs/query_plan.json``),
parsed once and accepted only if its plan ID is the manifest's ``query_plan_id``. Serving a
release with another plan would answer with something that was never evaluated, so a missing or
different plan is refused, never replaced by the default.

``active_release(ws, target)`` is what a long-running server follows: it checks what the swap
that moved the pointer checked, so a pointer nobody moved through activation or rollback is never
served — the pointer must agree with the target's verified history (the release the history
made active at that generation, under the intent the pointer's ``ledger_head`` names); a release
made active by an activation must be eligible under a gate policy the target accepts (and
approved where the target requires it); and every release is verified with its gate decision
made again from its runs, as activation and rollback verify it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragpipe.kernel.ledger import LedgerError, Record
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import VerifiedRelease, gate_refusal, verified_release
from ragpipe.release.evidence import evaluation_run_dir
from ragpipe.release.history import TargetHistory, read_history
from ragpipe.release.manifest import ReleaseManifest, load_manifest
from ragpipe.release.pointer import Pointer, read_pointer
from ragpipe.release.status import resolve_active_release
from ragpipe.release.store import ReleaseError, ReleaseStore, check_release_id
from ragpipe.release.targets import TargetsConfig, load_targets

if TYPE_CHECKING:
    from ragpipe.bundle.verify import VerifiedBundle
    from ragpipe.retrieval.plan import QueryPlan

PLAN_COPY = Path("inputs") / "query_plan.json"  # ragpipe.evaluation.run_folder.INPUTS["query_plan"]


@dataclass(frozen=True)
class ServedRelease:
    """A verified release ready to serve: its bundle opened by the verification and its gated plan
    parsed; a ``Retriever`` takes both as they are (nothing is opened or parsed twice)."""

    release_id: str
    manifest: ReleaseManifest
    bundle: VerifiedBundle
    plan: QueryPlan
    target: str | None = None  # with the three below: set by ``active_release``
    generation: int | None = None
    since: str | None = None  # when the history made it active (ISO 8601, UTC)


def served_release(ws: Workspace, target: str | None = None, release_id: str | None = None) -> ServedRelease:
    """The verified release to serve; ``ReleaseError`` naming what is missing or wrong."""
    if release_id is not None:
        store = ReleaseStore(ws)
        manifest = load_manifest(store, check_release_id(release_id))
        # served by choice, eligible or not; the lance table is checked only if lancedb serves
        verified, problems = verified_release(ws, manifest, remake_decision=False, defer_vector_table=True)
        if verified is None:
            raise ReleaseError(
                f"release {release_id} failed verification; refusing to serve it:\n  " + "\n  ".join(problems)
            )
    else:
        verified = resolve_active_release(ws, target, defer_vector_table=True)
    return _served(ws, verified)


def _served(ws: Workspace, verified: VerifiedRelease) -> ServedRelease:
    return ServedRelease(verified.release_id, verified.manifest, verified.bundle, gated_plan(ws, verified.manifest))


def gated_plan(ws: Workspace, manifest: ReleaseManifest) -> QueryPlan:
    """The plan ``manifest`` was evaluated with, parsed from the run's bound copy, after checking
    its plan ID."""
    from ragpipe.retrieval.plan import PlanError, parse_plan  # pydantic plan model: only when serving

    path = evaluation_run_dir(ws, manifest) / PLAN_COPY
    try:
        plan = parse_plan(json.loads(path.read_text(encoding="utf-8")), str(path))
    except FileNotFoundError:
        raise ReleaseError(f"release {manifest.release_id}: the plan it was gated with is missing ({path})") from None
    except (OSError, ValueError, PlanError) as exc:
        raise ReleaseError(f"release {manifest.release_id}: cannot read the plan it was gated with: {exc}") from None
    if plan.plan_id != manifest.query_plan_id:
        raise ReleaseError(
            f"release {manifest.release_id}: {path} holds plan {plan.plan_id}, not the release's {manifest.query_plan_id}"
        )
    return plan


def active_release(
    ws: Workspace, target: str | None = None, *, config: TargetsConfig | None = None, defer_vector_table: bool = False
) -> ServedRelease:
    """The active release of ``target`` checked as the swap that made it active checked it
    (module docstring), then verified and opened like ``served_release``; ``ReleaseError`` naming
    the first problem. An *activation* needed an eligible release gated under a policy the target
    accepts (and an approval where the target requires one); a *rollback* returns to a release that
    was active before, which ``rollback`` does not re-gate; both verified the release with its gate
    decision made again from its runs, and so does this (seconds, on the caller's thread: a server
    runs it beside the requests, never in one). ``defer_vector_table``: leave the lance table's
    content checks until lancedb serves (``activation.verified_release``) — its bytes are the
    ones the activation verified completely, since the release pins the bundle's material digest
    and every file's digest is checked here."""
    store = ReleaseStore(ws)
    config = config or load_targets()
    name, spec = config.get(target)
    pointer, state, records = _pointer_and_history(store, name)
    since, action = _agreement(name, pointer, state, records)
    manifest = load_manifest(store, pointer.release_id)
    if action == "activate":
        _check_activation(config, name, pointer.release_id, manifest, state, spec.approval_required)
    verified, problems = verified_release(ws, manifest, remake_decision=True, defer_vector_table=defer_vector_table)
    if verified is None:
        raise ReleaseError(f"target {name!r}: release {pointer.release_id} failed verification: " + "; ".join(problems))
    served = _served(ws, verified)
    return ServedRelease(
        served.release_id, served.manifest, served.bundle, served.plan, name, pointer.generation, since
    )


def _check_activation(
    config: TargetsConfig,
    name: str,
    release_id: str,
    manifest: ReleaseManifest,
    state: TargetHistory,
    approval_required: bool,
) -> None:
    """What ``activate`` requires of a release before it swaps the pointer (its verification aside)."""
    refused = gate_refusal(config, name, manifest)
    if refused:
        raise ReleaseError(f"target {name!r}: release {release_id} {refused}")
    if approval_required and not state.approved(release_id):
        raise ReleaseError(f"target {name!r} requires an approval, and release {release_id} has none")


def _pointer_and_history(store: ReleaseStore, name: str) -> tuple[Pointer, TargetHistory, tuple[Record, ...]]:
    """The pointer and the history as of one moment: read under the target's writer lock, which
    every activation and rollback holds from its intent to its observed record, so no swap moves
    the pointer or appends to the history between the two reads (held for the reads only)."""
    with store.target_lock(name):
        pointer = read_pointer(store, name)
        if pointer is None:
            raise ReleaseError(f"target {name!r} has no active release: activate one (ragpipe release activate)")
        try:
            state, records = read_history(store, name)
        except (LedgerError, ValueError) as exc:
            raise ReleaseError(f"target {name!r}: its history does not verify: {exc}") from None
    return pointer, state, records


def _agreement(target: str, pointer: Pointer, state: TargetHistory, records: tuple[Record, ...]) -> tuple[str, str]:
    """(when, by which action) the history made ``pointer``'s release active; ``ReleaseError``
    unless the history agrees with the pointer. Between the pointer swap and its *observed* record
    the history's open intent is the one the pointer names (an activation in flight, or one whose
    writer died after the swap): that intent vouches for the pointer."""
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
