"""The gate decision and comparison a release names, kept with the release and checked before use.

A manifest binds a gate decision ID and (paired gates) a comparison ID. Their documents live first
in the ``gate_decision`` stage folder, which ``ragpipe gc`` may collect; so ``release_manifest``
copies them here before publishing the manifest, and activation, rollback and serving read them
from here:

```
releases/decisions/<decision id hex>.json   {"comparison": <comparison.json object> | null,
                                             "decision": <decision.json object>}
```

The file is canonical JSON, named by the decision's content ID, written once (temp, fsync,
rename, fsync dir) and never replaced. ``gate_problems`` recomputes both content IDs from the
documents and requires every link the manifest states to hold: the decision's ID, eligibility,
decisive phase, policy and comparison are the manifest's, it decided on the manifest's evaluation
run, and the comparison's arms are the decision's. What it cannot do is recompute the comparison's
statistics: that needs the incumbent's run, which may be gone; the IDs make an edit detectable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from ragpipe.experiment.comparison import Comparison
from ragpipe.experiment.decision import Decision
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.release.manifest import ReleaseManifest
from ragpipe.release.store import ReleaseError, ReleaseStore, check_release_id

Model = TypeVar("Model", Decision, Comparison)


def evidence_path(store: ReleaseStore, decision_id: str) -> Path:
    return store.root / "decisions" / f"{check_release_id(decision_id).split(':', 1)[1]}.json"


def _without(obj: dict, key: str) -> dict:
    return {k: v for k, v in obj.items() if k != key}


def _parse(obj: object, model: type[Model], id_key: str, what: str) -> tuple[str, Model]:
    """``(recomputed ID, document)`` of a file object holding a ``model`` body plus its ID under
    ``id_key``; ``ValueError`` when it is not one or the ID is not the body's content ID."""
    if not isinstance(obj, dict):
        raise ValueError(f"the {what} is not a JSON object")
    try:
        parsed = model.model_validate(_without(obj, id_key))
    except ValidationError as exc:
        raise ValueError(f"not a {what}: {exc.error_count()} problems, first: {exc.errors()[0]['msg']}") from None
    recomputed = getattr(parsed, id_key)
    if obj.get(id_key) != recomputed:
        raise ValueError(f"{id_key} {obj.get(id_key)} is not its content ID {recomputed}")
    return recomputed, parsed


def parse_decision(obj: object) -> tuple[str, Decision]:
    return _parse(obj, Decision, "decision_id", "gate decision")


def parse_comparison(obj: object) -> tuple[str, Comparison]:
    return _parse(obj, Comparison, "comparison_id", "comparison")


def _links(decision: Decision, comparison: Comparison | None) -> list[str]:
    if (decision.comparison_id is None) != (comparison is None):
        return [f"decision names comparison {decision.comparison_id}, the file holds {'one' if comparison else 'none'}"]
    if comparison is None:
        return []
    problems = []
    if comparison.comparison_id != decision.comparison_id:
        problems.append(f"comparison {comparison.comparison_id} is not the decision's {decision.comparison_id}")
    if comparison.challenger.ref != decision.challenger:
        problems.append(f"comparison's challenger run {comparison.challenger.ref.run_id} is not the decision's {decision.challenger.run_id}")
    if comparison.incumbent.ref != decision.incumbent:
        problems.append(f"comparison's incumbent run {comparison.incumbent.ref.run_id} is not the decision's "
                        f"{decision.incumbent.run_id if decision.incumbent else None}")
    return problems


def evidence_bytes(decision: dict, comparison: dict | None) -> bytes:
    """The canonical file of a decision and its comparison, after checking both IDs and their links."""
    _, parsed = parse_decision(decision)
    compared = parse_comparison(comparison)[1] if comparison is not None else None
    problems = _links(parsed, compared)
    if problems:
        raise ValueError("; ".join(problems))
    return canonical_bytes({"comparison": comparison, "decision": decision}) + b"\n"


def publish_gate_evidence(store: ReleaseStore, decision: dict, comparison: dict | None) -> Path:
    """Keep ``decision`` (and its ``comparison``) in the release store; a no-op when the same file
    exists. ``ReleaseError`` for documents that do not verify or a file that holds other bytes."""
    decision_id = decision.get("decision_id") if isinstance(decision, dict) else None
    try:
        data = evidence_bytes(decision, comparison)
    except ValueError as exc:
        raise ReleaseError(f"gate decision {decision_id}: {exc}") from None
    path = evidence_path(store, str(decision_id))
    if not write_file_atomic(path, data, replace=False) and path.read_bytes() != data:
        raise ReleaseError(f"{path}: holds other bytes than gate decision {decision_id} (edited)")
    return path


def gate_problems(store: ReleaseStore, manifest: ReleaseManifest) -> list[str]:
    """Why the gate decision ``manifest`` binds does not vouch for it (empty: it does)."""
    where = f"gate decision {manifest.gate.decision_id}"
    path = evidence_path(store, manifest.gate.decision_id)
    try:
        obj = json.loads(path.read_bytes())
        if not isinstance(obj, dict) or sorted(obj) != ["comparison", "decision"]:
            raise ValueError("expected exactly the keys comparison, decision")
        decision_id, decision = parse_decision(obj["decision"])
        comparison = parse_comparison(obj["comparison"])[1] if obj["comparison"] is not None else None
        if path.read_bytes() != evidence_bytes(obj["decision"], obj["comparison"]):
            raise ValueError("its bytes are not the canonical rendering of its content (edited)")
    except FileNotFoundError:
        return [f"{where}: {path} is missing"]
    except (UnicodeDecodeError, ValueError) as exc:
        return [f"{where}: {path}: {exc}"]
    run = manifest.evaluation
    bound = {
        "ID": (decision_id, manifest.gate.decision_id),
        "eligibility": (decision.eligible, manifest.gate.eligible),
        "decisive phase": (decision.decisive_phase, manifest.gate.decisive_phase),
        "gate policy": (decision.policy_id, manifest.gate_policy_id),
        "comparison": (decision.comparison_id, manifest.comparison_id),
        "challenger run": ((decision.challenger.run_id, decision.challenger.spec_id, decision.challenger.ledger_head),
                           (run.run_id, run.spec_id, run.ledger_head)),
    }
    problems = [f"{where}: {name} {got} is not the release's {want}" for name, (got, want) in bound.items() if got != want]
    return problems + [f"{where}: {p}" for p in _links(decision, comparison)]
