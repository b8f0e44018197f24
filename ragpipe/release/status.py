"""Read-side functions for serving, the sensor and the CLI (no writes, no locks).

Contracts the Dagster layer and ``query``/``answer`` build on:

- ``resolve_active(ws, target)`` → ``(manifest, bundle path)`` of the target's live release
  (``ragpipe.release.live.live_release``: pointer and history agreeing, eligible and approved as
  activation required, verified); a target with nothing active is a clear error.
  ``resolve_active_run`` adds the evaluation run as that verification read it, for the gate.
- ``eligible_releases(ws, target)`` → one ``EligibleRelease`` per published release whose gate decision
  is eligible, and one per manifest file that does not verify (status ``invalid manifest``), all in
  publication order, with ``status``: ``ready`` (request activation), ``gated against another
  release`` (its decision was made against a release the target does not serve —
  ``activation.incumbent_refusal``), ``approval missing``, ``needs a person`` (``ragpipe.release.automatic``: the target does not activate
  automatically, or its decision says human_apply_required and the target does not waive it), or
  its state in the target's history (``active``, ``superseded``, ``rolled_back``,
  ``failed``, ``cancelled``, ``rejected``, ``activating``). The sensor requests
  ``activate:<target>:<release_id>`` for each ``ready`` one and skips the rest with ``reason``; a
  release that ever had an activation attempt on the target is never ``ready`` again, so an old
  release is never re-activated automatically (rollback is a person's decision), and the sensor
  never activates a release older than a manifest file that does not verify.
- ``what_happens_next(ws, release_id)`` → the line ``ragpipe build`` prints about a new release:
  on each target, activated by the sensor, awaiting approval, waiting for a person, live, or why not.
- ``release_summaries(ws)`` → the ``release list`` rows, then one ``{"file", "invalid"}`` row per
  manifest file that does not verify (the sensor's list has it as status ``invalid manifest``, a
  skip with its reason): one bad file never hides the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ragpipe.experiment.arms import ArmRun
from ragpipe.kernel.ledger import LedgerError
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import bundle_path, incumbent_refusal, unaccepted_policy
from ragpipe.release.approvals import approval_refusal
from ragpipe.release.automatic import automatic_refusal
from ragpipe.release.history import TargetHistory, read_history
from ragpipe.release.kept_decision import EvidenceError, read_gate_evidence
from ragpipe.release.live import live_release
from ragpipe.release.manifest import ReleaseManifest, list_manifests, load_manifest
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import TargetsConfig, load_targets


@dataclass(frozen=True)
class EligibleRelease:
    release_id: str
    revision: str
    status: str
    reason: str | None

    @property
    def ready(self) -> bool:
        return self.status == "ready"


def resolve_active(
    ws: Workspace, target: str | None = None, *, config: TargetsConfig | None = None
) -> tuple[ReleaseManifest, Path]:
    """The active release of ``target`` (default target when None) and its bundle directory, fully
    verified; ``ReleaseError`` when nothing is active or the release no longer verifies."""
    manifest, bundle, _ = resolve_active_run(ws, target, config=config)
    return manifest, bundle


def resolve_active_run(
    ws: Workspace, target: str | None = None, *, config: TargetsConfig | None = None
) -> tuple[ReleaseManifest, Path, ArmRun]:
    """``resolve_active`` and the release's evaluation run, as its verification read it (what a
    gate compares a challenger with: no second read of the run)."""
    verified = live_release(ws, target, config=config).verified
    return verified.manifest, bundle_path(ws, verified.manifest), verified.arm


def _candidate(
    ws: Workspace,
    release_id: str,
    manifest: ReleaseManifest,
    target: str,
    config: TargetsConfig,
    accepted: dict[str, str],
    state: TargetHistory,
) -> EligibleRelease:
    known = state.states.get(release_id)
    if known is not None:
        return EligibleRelease(
            release_id, manifest.revision, known, f"release is {known.replace('_', ' ')} on target {target!r}"
        )
    policy_refusal = unaccepted_policy(accepted, target, manifest)
    if policy_refusal:
        return EligibleRelease(release_id, manifest.revision, "policy not accepted", policy_refusal)
    stale = incumbent_refusal(target, manifest, state.active, config.get(None)[0])
    if stale:
        return EligibleRelease(release_id, manifest.revision, "gated against another release", stale)
    unapproved = config.targets[target].approval_required and approval_refusal(config, target, state, release_id)
    if unapproved:
        return EligibleRelease(release_id, manifest.revision, "approval missing", unapproved)
    needs_person, _ = automatic_refusal(ReleaseStore(ws), target, config.targets[target], manifest)
    if needs_person:
        return EligibleRelease(release_id, manifest.revision, "needs a person", needs_person)
    return EligibleRelease(release_id, manifest.revision, "ready", None)


def eligible_releases(
    ws: Workspace, target: str | None = None, *, config: TargetsConfig | None = None
) -> list[EligibleRelease]:
    """Eligible releases and what the sensor should do with each (module docstring)."""
    store = ReleaseStore(ws)
    config = config or load_targets()
    name, _ = config.get(target)
    state, _ = read_history(store, name)
    accepted = config.accepted_policies(name)  # read the policy files once, not per release
    listing = list_manifests(store)
    invalid = [EligibleRelease(path.name, "", "invalid manifest", reason) for path, reason in listing.invalid]
    valid = [_candidate(ws, rid, m, name, config, accepted, state) for rid, m in listing.valid if m.gate.eligible]
    # One order for both, by publication: the sensor must see an unreadable manifest newer than
    # every ready release (it may be the release it should activate), never skip past it.
    return sorted(invalid + valid, key=lambda c: (listing.published.get(c.release_id, 0), c.release_id))


def target_states(ws: Workspace, config: TargetsConfig | None = None) -> dict[str, TargetHistory]:
    """The reduced history of every declared or present target."""
    store = ReleaseStore(ws)
    names = sorted(set((config or load_targets()).targets) | set(store.known_targets()))
    return {name: read_history(store, name)[0] for name in names}


def published_at(mtime_ns: int | None) -> str | None:
    """A manifest file's publication time (its modification time, operational) in UTC ISO 8601."""
    if mtime_ns is None:
        return None
    return datetime.fromtimestamp(mtime_ns / 1e9, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def gate_figures(store: ReleaseStore, manifest: ReleaseManifest) -> dict[str, object]:
    """From the kept gate decision: the target metric (``{name, value, paired, delta}``: the
    challenger's value, and the mean paired delta against the incumbent when paired) and the first reason the
    decision gives (None when eligible); ``{"evidence": why}`` when the kept file cannot be read."""
    try:
        decision, comparison, policy = read_gate_evidence(store, manifest.gate.decision_id)
    except EvidenceError as exc:
        return {"metric": None, "first_reason": None, "evidence": str(exc)}
    name = policy.target.metric
    if comparison is not None:
        from ragpipe.experiment.comparison import ALL  # scipy: only where a comparison was read

        value = comparison.challenger.aggregates[name].value
        delta = comparison.slices[ALL].metrics[name].stats.mean
    else:
        floor = next((c for c in decision.checks if c.name == "floor" and c.metric == name), None)
        value, delta = (floor.value if floor else None), None
    return {
        "metric": {"name": name, "value": value, "paired": comparison is not None, "delta": delta},
        "first_reason": decision.reasons[0] if decision.reasons else None,
    }


def release_summaries(ws: Workspace, config: TargetsConfig | None = None) -> list[dict[str, object]]:
    """One row per published release (publication order): the ``release list --json`` objects."""
    states = target_states(ws, config)
    rows = []
    listing = list_manifests(ReleaseStore(ws))
    for rid, m in listing.valid:
        rows.append(
            {
                "release_id": rid,
                "published": published_at(listing.published.get(rid)),
                "revision": m.revision,
                "bundle_id": m.bundle_id,
                "change": m.gate.change,
                "incumbent": m.gate.incumbent,
                "eligible": m.gate.eligible,
                "decisive_phase": m.gate.decisive_phase,
                **gate_figures(ReleaseStore(ws), m),
                "active_targets": [t for t, s in states.items() if s.active == rid],
                "states": {t: s.states[rid] for t, s in states.items() if rid in s.states},
            }
        )
    return rows + [{"file": str(path), "invalid": reason} for path, reason in listing.invalid]


def what_happens_next(
    ws: Workspace, release_id: str, reasons: tuple[str, ...] = (), *, config: TargetsConfig | None = None
) -> str:
    """One line saying what becomes of a freshly built release on each target: activated by the
    sensor, awaiting an approval, waiting for a person, already live, or why not — with the
    command that acts on it (``ragpipe build`` prints it). ``reasons``: the gate's failing reasons."""
    store = ReleaseStore(ws)
    config = config or load_targets()
    manifest = load_manifest(store, release_id)
    short = release_id[:23]  # a unique prefix in any real store (16 hex digits)
    if not manifest.gate.eligible:
        why = reasons[0] if reasons else f"decisive phase {manifest.gate.decisive_phase}"
        return f"not eligible, so it goes live on no target: {why}"
    parts = []
    for name in sorted(config.targets):
        try:
            state = read_history(store, name)[0]
            c = _candidate(ws, release_id, manifest, name, config, config.accepted_policies(name), state)
        except (ReleaseError, LedgerError, ValueError) as exc:
            parts.append(f"{name}: {exc}")
            continue
        if c.status == "ready":
            parts.append(
                f"{name}: the activation sensor activates it while the Dagster daemon runs "
                f"(now: ragpipe release activate {short} --target {name})"
            )
        elif c.status == "approval missing":
            parts.append(
                f"{name}: awaiting approval (ragpipe release approve {short} --target {name} --by NAME --key KEYFILE)"
            )
        elif c.status == "needs a person":
            parts.append(f"{name}: a person activates it (ragpipe release activate {short} --target {name})")
        elif c.status == "active":
            parts.append(f"{name}: live")
        elif c.status == "gated against another release":
            against = manifest.gate.incumbent[:23] + "…" if manifest.gate.incumbent else "no release (bootstrap)"
            serves = state.active[:23] + "…" if state.active else "nothing"
            parts.append(f"{name}: not here: it was gated against {against} and {name} serves {serves}")
        else:
            parts.append(f"{name}: {c.reason}")
    return "; ".join(parts)
