"""What a query is served from when the caller names no bundle: a release.

``served_release(ws, target=…)`` resolves the active release of a target (the configured default
target when None), ``served_release(ws, release_id=…)`` one exact release; either way the bundle is
fully verified against the manifest (``status.resolve_active_release`` /
``activation.verified_release``), once, and handed on opened, and the query plan is the one the
release was gated with: the evaluation run's bound copy (``evaluations/<run id>/inputs/query_plan.json``),
parsed once and accepted only if its plan ID is the manifest's ``query_plan_id``. Serving a
release with another plan would answer with something that was never evaluated, so a missing or
different plan is refused, never replaced by the default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import VerifiedRelease, verified_release
from ragpipe.release.evidence import evaluation_run_dir
from ragpipe.release.manifest import ReleaseManifest, load_manifest
from ragpipe.release.status import resolve_active_release
from ragpipe.release.store import ReleaseError, ReleaseStore, check_release_id

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


def served_release(ws: Workspace, target: str | None = None, release_id: str | None = None) -> ServedRelease:
    """The verified release to serve; ``ReleaseError`` naming what is missing or wrong."""
    if release_id is not None:
        store = ReleaseStore(ws)
        manifest = load_manifest(store, check_release_id(release_id))
        verified, problems = verified_release(ws, manifest, remake_decision=False)  # served by choice: eligible or not
        if verified is None:
            raise ReleaseError(
                f"release {release_id} failed verification; refusing to serve it:\n  " + "\n  ".join(problems)
            )
    else:
        verified = resolve_active_release(ws, target)
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
