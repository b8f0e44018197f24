"""What a query is served from when the caller names no bundle: a release.

``served_release(ws, target=…)`` serves the live release of a target (the configured default
target when None) — ``active_release``, which is ``ragpipe.release.live.live_release``, the one
resolution of "what is live" the server, the CLI and the gate share; ``served_release(ws,
release_id=…)`` serves one exact release chosen by the caller, eligible or not, verified all the
same. Either way the bundle is verified against the manifest (``activation.verified_release``;
the lance table's own content checks deferred until lancedb serves:
``ragpipe.bundle.verify.open_bundle``), once, and handed on opened, and the query plan is the one
the release was gated with: the evaluation run's bound copy
(``evaluations/<run id>/inputs/query_plan.json``), parsed once and accepted only if its plan ID is
the manifest's ``query_plan_id``. Serving a release with another plan would answer with something
that was never evaluated, so a missing or different plan is refused, never replaced by the default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import VerifiedRelease, verified_release
from ragpipe.release.live import LiveRelease, live_release
from ragpipe.release.manifest import ReleaseManifest, evaluation_run_dir, load_manifest
from ragpipe.release.store import ReleaseError, ReleaseStore, check_release_id
from ragpipe.release.targets import TargetsConfig

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
    live: LiveRelease | None = None  # how it is live (``active_release``); None when served by choice

    @property
    def target(self) -> str | None:
        return None if self.live is None else self.live.target

    @property
    def generation(self) -> int | None:
        return None if self.live is None else self.live.generation

    @property
    def since(self) -> str | None:
        """When the history made it active (ISO 8601, UTC)."""
        return None if self.live is None else self.live.since


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
        return _served(ws, verified)
    return active_release(ws, target, defer_vector_table=True)


def _served(ws: Workspace, verified: VerifiedRelease, live: LiveRelease | None = None) -> ServedRelease:
    return ServedRelease(
        verified.release_id, verified.manifest, verified.bundle, gated_plan(ws, verified.manifest), live
    )


def gated_plan(ws: Workspace, manifest: ReleaseManifest) -> QueryPlan:
    """The plan ``manifest`` was evaluated with, parsed from the run's bound copy, after checking
    its plan ID."""
    from ragpipe.retrieval.plan import PlanError, parse_plan  # pydantic plan model: only when serving

    path = evaluation_run_dir(ws, manifest) / PLAN_COPY
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(raw, dict) and "vector_search" not in raw and "vector" in raw.get("channels", {}):
            raise ReleaseError(
                f"release {manifest.release_id}: it was gated with vector scores from lance's float32 kernels, "
                "which this version replaced by exact scores that are the same on every CPU (docs/retrieval.md, "
                "Exact vector scores); build the revision again to gate and release it with them"
            )
        plan = parse_plan(raw, str(path))
    except FileNotFoundError:
        raise ReleaseError(f"release {manifest.release_id}: the plan it was gated with is missing ({path})") from None
    except ReleaseError:
        raise
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
    """The live release of ``target`` (``ragpipe.release.live.live_release``: pointer and history
    agreeing, eligible under an accepted policy and approved where required, verified with its gate
    decision made again — seconds on a large run, on the caller's thread: a server runs it beside
    the requests, never in one — once per target generation, then remembered:
    ``ragpipe.release.verified_record``), opened and with its gated plan parsed; ``ReleaseError``
    naming the first problem."""
    live = live_release(ws, target, config=config, defer_vector_table=defer_vector_table, remember=True)
    return _served(ws, live.verified, live)
