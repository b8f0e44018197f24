"""The gate decision a release names, kept with the release and re-made before it is used.

A manifest binds a gate decision ID, a gate policy ID and (paired gates) a comparison ID. Their
documents are made in the ``gate_decision`` stage folder, which ``ragpipe gc`` may collect; so
``release_manifest`` keeps them here before publishing the manifest:

```
releases/decisions/<decision id hex>.json   {"comparison": <comparison.json object> | null,
                                             "decision": <decision.json object>,
                                             "policy": <the gate policy, as a policy document>}
```

The file is canonical JSON, named by the decision's content ID, written once (temp, fsync,
rename, fsync dir) and never replaced; with a key configured it carries a ``seal`` member
(``ragpipe.kernel.seals``) and an unsealed or wrongly sealed file is refused. ``gate_problems`` (run by activation, rollback and serving)
parses the three documents strictly (each must be exactly the canonical form of what it parses
to; the policy passes the policy file's rules), recomputes their IDs, requires the manifest's
links to hold (decision ID, eligibility, decisive phase, policy, comparison, challenger run, and —
schema v2 — change kind and incumbent release), computes a v2 decision's change again from the
releases it names (``ragpipe.release.change_basis``: the challenger's basis from this release, the
incumbent's from the release it was made against, whose evaluation run — or re-evaluation — must
be of that release's bundle and plan), and then **makes the decision again**: ``gating.gate_runs`` on the evaluation runs it names — the
challenger's (already verified by ``evidence``) and, for a paired decision, the incumbent's
``evaluations/<run id>/`` (never collected) — under the kept policy and the comparison's own
spec. The recomputed comparison and decision must have the kept IDs, so neither an edited
statistic, a check, an eligibility flag nor a run that does not exist can make a release eligible.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ragpipe.experiment.arms import ArmRun
from ragpipe.experiment.change import change_text
from ragpipe.experiment.decision import Decision, GateError, decide
from ragpipe.experiment.gate_policy import PHASES, GatePolicy, PolicyError, parse_policy, policy_document
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.seals import SealKey, configured_key, sealed, unsealed
from ragpipe.release.change_basis import change_against, release_basis
from ragpipe.release.manifest import ReleaseManifest, load_manifest
from ragpipe.release.replica import fetch_file, push_file
from ragpipe.release.store import ReleaseError, ReleaseStore, check_release_id

Model = TypeVar("Model", bound=BaseModel)
SEAL_DOMAIN = "gate-evidence/v1"  # the kept file's seal, with a key configured (ragpipe.kernel.seals)
RunLoader = Callable[[str], ArmRun]  # run ID -> the verified, completed run (raises ValueError otherwise)

# A decision with its comparison: every paired cell's deltas (a 100k-cell comparison is ~30 MiB).
MAX_EVIDENCE_BYTES = 256 * 2**20


class EvidenceError(ValueError):
    """The kept documents are not what they claim to be."""


def evidence_path(store: ReleaseStore, decision_id: str) -> Path:
    return store.root / "decisions" / f"{check_release_id(decision_id).split(':', 1)[1]}.json"


def _strict(obj: object, model: type[Model], id_key: str, what: str) -> tuple[str, Model]:
    """``(ID, document)`` of an object that must be exactly a ``model`` body plus its content ID
    under ``id_key`` — no coerced value, no extra or missing key."""
    if not isinstance(obj, dict):
        raise EvidenceError(f"the {what} is not a JSON object")
    body = {k: v for k, v in obj.items() if k != id_key}
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        n = exc.error_count()
        raise EvidenceError(
            f"not a {what}: {n} problem{'s' if n != 1 else ''}, first: {exc.errors()[0]['msg']}"
        ) from None
    recomputed = getattr(parsed, id_key)
    if obj.get(id_key) != recomputed:
        raise EvidenceError(f"{id_key} {obj.get(id_key)} is not its content ID {recomputed}")
    if canonical_bytes(body) != canonical_bytes(
        parsed.model_dump(mode="json", by_alias=True)
    ):  # bytes: 1 == True in Python
        raise EvidenceError(f"the {what} is not in its canonical form (a value was changed in type or format)")
    return recomputed, parsed


def _policy(doc: object) -> GatePolicy:
    if isinstance(doc, dict):  # canonical JSON sorts keys; a policy document lists its phases in order
        order = ["schema", "human_apply_required", *PHASES, "bootstrap_floors"]
        doc = {**{k: doc[k] for k in order if k in doc}, **{k: v for k, v in doc.items() if k not in order}}
    try:
        policy = parse_policy(doc, "the kept gate policy")
    except (PolicyError, AttributeError, KeyError, TypeError, ArithmeticError) as exc:
        raise EvidenceError(f"not a gate policy: {exc}") from None
    if canonical_bytes(doc) != canonical_bytes(policy_document(policy)):
        raise EvidenceError("the gate policy is not in its canonical form (a value was changed in type or format)")
    return policy


def _parse(obj: object) -> tuple[Decision, Any, GatePolicy]:
    """The kept file's decision, comparison (or None) and policy, each checked alone and linked."""
    from ragpipe.experiment.comparison import Comparison  # scipy: only when a comparison is read

    if not isinstance(obj, dict) or sorted(obj) != ["comparison", "decision", "policy"]:
        raise EvidenceError("expected exactly the keys comparison, decision, policy")
    _, decision = _strict(obj["decision"], Decision, "decision_id", "gate decision")
    comparison = (
        _strict(obj["comparison"], Comparison, "comparison_id", "comparison")[1]
        if obj["comparison"] is not None
        else None
    )
    policy = _policy(obj["policy"])
    if policy.policy_id != decision.policy_id:
        raise EvidenceError(f"the kept policy is {policy.policy_id}, the decision's {decision.policy_id}")
    if (comparison.comparison_id if comparison else None) != decision.comparison_id:
        raise EvidenceError(
            f"the decision names comparison {decision.comparison_id}, the file holds "
            f"{comparison.comparison_id if comparison else 'none'}"
        )
    return decision, comparison, policy


def evidence_bytes(decision: dict, comparison: dict | None, policy: GatePolicy, key: SealKey | None) -> bytes:
    """The canonical kept file of a decision, its comparison and its policy, after checking them
    (sealed with ``key`` when one is given)."""
    obj = {"comparison": comparison, "decision": decision, "policy": policy_document(policy)}
    _parse(obj)
    return canonical_bytes(sealed(obj, SEAL_DOMAIN, key)) + b"\n"


def publish_gate_evidence(store: ReleaseStore, decision: dict, comparison: dict | None, policy: GatePolicy) -> Path:
    """Keep ``decision`` (with its ``comparison`` and ``policy``) in the release store; a no-op when
    the same file exists. ``ReleaseError`` for documents that do not verify or a file that holds
    other bytes."""
    decision_id = decision.get("decision_id") if isinstance(decision, dict) else None
    try:
        data = evidence_bytes(decision, comparison, policy, configured_key())
        path = evidence_path(store, str(decision_id))
        if not write_file_atomic(path, data, replace=False) and read_regular(path, MAX_EVIDENCE_BYTES) != data:
            raise EvidenceError(f"{path}: holds other bytes (edited)")
        push_file(store.ws, path)
    except (EvidenceError, ReleaseError, OSError) as exc:
        raise ReleaseError(f"gate decision {decision_id}: cannot keep it: {exc}") from None
    return path


def read_gate_evidence(store: ReleaseStore, decision_id: str) -> tuple[Decision, Any, GatePolicy]:
    """The kept decision, comparison and policy of ``decision_id``; ``EvidenceError`` naming the file."""
    path = evidence_path(store, decision_id)
    try:
        fetch_file(store.ws, path)
        data = read_regular(path, MAX_EVIDENCE_BYTES)  # never through a link, never waiting on a FIFO
        obj = json.loads(data)
        content, problem = unsealed(obj, SEAL_DOMAIN, configured_key()) if isinstance(obj, dict) else (obj, None)
        if problem is not None:
            raise EvidenceError(problem)
        decision, comparison, policy = _parse(content)
        if data != canonical_bytes(obj) + b"\n":
            raise EvidenceError("its bytes are not the canonical rendering of its content (edited)")
    except FileNotFoundError:
        raise EvidenceError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError, RecursionError, ValueError, ArithmeticError) as exc:
        raise EvidenceError(f"{path}: {exc}") from None
    return decision, comparison, policy


# Figures compared to 1e-9 (relative): a bootstrap interval or a randomization p-value may move in
# its last bits between scipy or numpy releases with the same seed, and a latency percentile is
# wall-clock data that decides nothing (advisory); every other figure is compared exactly.
RESAMPLED = ("ci_low", "ci_high", "p_value", "latency_p95_ms")


def _differs(made: Any, kept: Any, path: str = "") -> str | None:
    """The first path where a recomputed comparison differs from the kept one. Only the figures of
    ``RESAMPLED`` may differ, by 1e-9 relative: verification must not fail every paired release
    after an upgrade, and a mean or count nudged onto a threshold must not pass."""
    if isinstance(made, dict) and isinstance(kept, dict):
        if sorted(made) != sorted(kept):
            return path or "(top)"
        return next((d for k in sorted(made) if (d := _differs(made[k], kept[k], f"{path}.{k}" if path else k))), None)
    if isinstance(made, list) and isinstance(kept, list):
        if len(made) != len(kept):
            return path
        return next((d for i, (a, b) in enumerate(zip(made, kept)) if (d := _differs(a, b, f"{path}[{i}]"))), None)
    if isinstance(made, float) and isinstance(kept, float | int) and not isinstance(kept, bool):
        # canonical JSON writes 1.0 as 1: a number is compared as a number
        if path.rsplit(".", 1)[-1] in RESAMPLED:
            return None if math.isclose(made, kept, rel_tol=1e-9, abs_tol=1e-12) else path
        return None if made == kept else path
    return None if type(made) is type(kept) and made == kept else path


def _change_problems(
    store: ReleaseStore,
    manifest: ReleaseManifest,
    decision: Decision,
    policy: GatePolicy,
    runs: tuple[ArmRun, ArmRun | None],
    load_run: RunLoader,
) -> list[str]:
    """A v2 decision's change made again from the releases it names: the challenger's basis from
    ``manifest``, the incumbent's from the release the decision was made against; and the
    incumbent run (of ``runs``: challenger, incumbent) must be that release's own run — or, only
    where the gate's rule says so (``gating.needs_reevaluation``), a run of that release's bundle
    and query plan."""
    from ragpipe.experiment.gating import needs_reevaluation  # scipy: only when a decision is made again

    challenger, incumbent = runs
    change = decision.change
    if change is None:
        return []
    try:
        again = change_against(store.ws, release_basis(store.ws, manifest), change.incumbent_release)
        inc_manifest = None if change.incumbent_release is None else load_manifest(store, change.incumbent_release)
    except (ReleaseError, ValueError) as exc:
        return [f"its change cannot be computed again: {exc}"]
    if again != change:
        return [f"it records the change {change_text(change)}, but the releases it names give {change_text(again)}"]
    if inc_manifest is None or incumbent is None:
        return []
    want = (inc_manifest.bundle_id, inc_manifest.query_plan_id)
    if (incumbent.variant.bundle_id, incumbent.variant.plan_id) != want:
        return [
            f"its incumbent run {incumbent.run_id} evaluated bundle {incumbent.variant.bundle_id} under plan "
            f"{incumbent.variant.plan_id}, not the incumbent release's bundle {want[0]} under plan {want[1]}"
        ]
    bound = inc_manifest.evaluation
    if incumbent.run_id == bound.run_id:
        return []
    try:
        own = load_run(bound.run_id)
    except (OSError, ValueError) as exc:
        return [f"its incumbent release's run {bound.run_id}: {exc}"]
    if not needs_reevaluation(policy, own, challenger):
        return [
            f"it pairs run {incumbent.run_id} as the incumbent, not the incumbent release's own run {bound.run_id}, "
            "which pairs as it is: gate the revision again (ragpipe build)"
        ]
    return []


def _remade(
    store: ReleaseStore,
    manifest: ReleaseManifest,
    decision: Decision,
    comparison: Any,
    policy: GatePolicy,
    challenger: ArmRun,
    load_run: RunLoader,
) -> list[str]:
    """Problems found by making the decision again from the runs it names (module docstring)."""
    from ragpipe.experiment.gating import gate_runs
    from ragpipe.experiment.statistics import ComparisonSpec

    if comparison is not None and comparison.spec != ComparisonSpec():
        # The chain compares with the default spec; another seed or resample count is a way to shop
        # for an interval (or to make verification take hours), never a setting of a release.
        return [
            f"its comparison uses {comparison.spec.as_json()}, not the chain's comparison spec {ComparisonSpec().as_json()}"
        ]
    incumbent = None
    if decision.incumbent is not None:
        try:
            incumbent = load_run(decision.incumbent.run_id)
        except (OSError, ValueError) as exc:
            return [f"its incumbent run {decision.incumbent.run_id}: {exc}"]
        if incumbent.ref() != decision.incumbent:
            return [
                f"its incumbent run {decision.incumbent.run_id}: the folder holds run {incumbent.run_id} "
                f"with ledger head {incumbent.ledger_head}, not the decision's {decision.incumbent.ledger_head}"
            ]
    changed = _change_problems(store, manifest, decision, policy, (challenger, incumbent), load_run)
    if changed:
        return changed
    try:
        again, compared = gate_runs(policy, challenger, incumbent, ComparisonSpec(), decision.change)
        if comparison is not None:
            if compared is None:
                return [
                    f"made again from its runs it is {again.decision_id} (not pairable: {'; '.join(again.reasons)}), not the kept one"
                ]
            where = _differs(compared.body(), comparison.body())
            if where is not None:
                return [
                    f"the comparison of its runs differs from the kept {comparison.comparison_id} at {where} (statistics differ)"
                ]
            again = decide(
                policy, comparison, challenger, decision.change
            )  # the kept comparison: exact, whatever scipy computes
    except (GateError, ValueError, ArithmeticError) as exc:
        return [f"it cannot be made again from its runs: {exc}"]
    if again.decision_id != decision.decision_id:
        return [
            f"made again from its runs and policy it is {again.decision_id} "
            f"(eligible {again.eligible}, decisive phase {again.decisive_phase}), not the kept one"
        ]
    return []


def gate_problems(
    store: ReleaseStore, manifest: ReleaseManifest, challenger: ArmRun | None, load_run: RunLoader
) -> list[str]:
    """Why the gate decision ``manifest`` binds does not vouch for it (empty: it does).
    ``challenger``: the manifest's evaluation run, already verified; None when it is not, or when
    the caller only serves the release: the decision is then checked but not made again."""
    where = f"gate decision {manifest.gate.decision_id}"
    try:
        decision, comparison, policy = read_gate_evidence(store, manifest.gate.decision_id)
    except EvidenceError as exc:
        return [f"{where}: {exc}"]
    run = manifest.evaluation
    bound = {
        "ID": (decision.decision_id, manifest.gate.decision_id),
        "eligibility": (decision.eligible, manifest.gate.eligible),
        "decisive phase": (decision.decisive_phase, manifest.gate.decisive_phase),
        "gate policy": (decision.policy_id, manifest.gate_policy_id),
        "change": (decision.change.kind if decision.change else None, manifest.gate.change),
        "incumbent release": (decision.change.incumbent_release if decision.change else None, manifest.gate.incumbent),
        "comparison": (decision.comparison_id, manifest.comparison_id),
        "challenger run": (
            (decision.challenger.run_id, decision.challenger.spec_id, decision.challenger.ledger_head),
            (run.run_id, run.spec_id, run.ledger_head),
        ),
    }
    problems = [
        f"{where}: {name} {got} is not the release's {want}" for name, (got, want) in bound.items() if got != want
    ]
    if problems or challenger is None:
        return problems
    return [f"{where}: {p}" for p in _remade(store, manifest, decision, comparison, policy, challenger, load_run)]
