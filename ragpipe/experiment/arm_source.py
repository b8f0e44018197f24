"""An evaluation run folder (``ragpipe eval``) as an ``ArmRun`` (the only module here that knows the folder).

``load_arm(run)`` first verifies the folder with ``ragpipe.evaluation.run_folder.verify_run`` (ledger
chain and head, bound inputs against their digests and content IDs, the spec ID, every trace
against its record) and refuses a run that is not completed (``RunCompleted``: every expected
cell terminal). It then reads only the verified ledger state:

* identities: ``RunCreated.run_id`` / ``spec_id``, and the hash of the ledger's last record;
* coordinates from the spec body (``SpecBody``): suite digest, evaluator, mode, scopes, depth
  ``k``, repeats, answers, and each metric's name, direction, unit, cutoff, measure, aggregate;
* variant: bundle ID, query plan ID and arm label;
* ``expected`` from ``RunCreated.cells``, ``skipped`` and ``tags`` from ``RunCreated``;
* cells from the terminal records (``CellCompleted`` / ``CellFailed``): outcome, metrics,
  ``latency_ms``; a failed cell's class is the exception type that prefixes its ``error``
  (``"TimeoutError: …"``), a cancelled cell's class is ``cancelled``; a completed cell's
  ``answer_usage`` when the run generated answers;
* ``build`` from the ``bundle`` InputBound record (``runner.bundle_binding``: material digest,
  vectors, payload bytes), already checked by ``verify_run`` against the spec's bundle; ``None``
  for a run made before runs recorded it;
* ``provisional`` from the bound suite (its cases no person has adjudicated yet): the suite copy
  verified against its digest, not ``RunCreated``'s list, which must agree with it (a run whose
  record says otherwise is refused, naming both).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragpipe.evaluation.eval_spec import SpecBody
from ragpipe.evaluation.ledger import LEDGER, read_ledger
from ragpipe.evaluation.run_folder import BUNDLE_INPUT, load_inputs, verify_run
from ragpipe.experiment.arms import ArmRun, BuildCost, CellOutcome, Coordinates, MetricDecl, Variant


class ArmSourceError(ValueError):
    """A run folder cannot be an arm; the message names the folder, file or record."""


def _failure_class(payload: dict[str, Any]) -> str | None:
    if payload["outcome"] in ("success", "abstained"):
        return None
    if payload["outcome"] == "cancelled":
        return "cancelled"
    error = str(payload.get("error") or "")
    name = error.split(":", 1)[0].strip()
    return name if name.isidentifier() else "failure"


def _cell(case: str, repeat: int, payload: dict[str, Any]) -> CellOutcome:
    completed = payload["outcome"] in ("success", "abstained")
    return CellOutcome(
        case_id=case,
        repeat=repeat,
        outcome=payload["outcome"],
        failure_class=_failure_class(payload),
        metrics={k: float(v) for k, v in payload.get("metrics", {}).items()} if completed else {},
        latency_ms=float(payload["latency_ms"]) if completed and payload.get("latency_ms") is not None else None,
        answer_usage=payload.get("answer_usage") if completed else None,
    )


def _coordinates(body: SpecBody) -> Coordinates:
    metrics = tuple(
        MetricDecl(name=m.name, direction=m.direction, unit=m.unit, k=m.k, measure=m.measure, aggregate=m.aggregate)
        for m in body.metrics
    )
    return Coordinates(
        suite_digest=body.suite_digest,
        evaluator=body.evaluator,
        mode=body.mode,
        scopes=body.scopes,
        k=body.k,
        repeats=body.repeats,
        answers=body.answers,
        metrics=metrics,
        judge=body.judge,
    )


def _build(bound: Any) -> BuildCost | None:
    if bound is None:
        return None
    return BuildCost(material_digest=bound["digest"], vectors=bound["vectors"], payload_bytes=bound["payload_bytes"])


def load_arm(run: Path) -> ArmRun:
    """The verified, completed run folder ``run`` as an ``ArmRun`` (module docstring)."""
    run = Path(run)
    try:
        state = verify_run(run)
        records = read_ledger(run).records
        provisional = load_inputs(run, records, state).suite.provisional()
    except ValueError as exc:  # LedgerError, RunError, TraceError: each names the file and record
        raise ArmSourceError(str(exc)) from None
    if state.status != "completed":
        raise ArmSourceError(
            f"{run / LEDGER}: the run is {state.status}, not completed; only a completed run can be compared"
        )
    if len(records) != state.events:
        raise ArmSourceError(f"{run / LEDGER}: the ledger changed while it was read")
    recorded = tuple(sorted(state.created.get("provisional", ())))
    if recorded != provisional:
        raise ArmSourceError(
            f"{run / LEDGER}: record 1: RunCreated lists provisional cases {list(recorded)}, "
            f"the bound suite {list(provisional)}"
        )
    body = SpecBody.model_validate(state.created["spec"])
    wrong_arm = next((k for k in state.expected if k[2] != body.arm), None)
    if wrong_arm is not None:
        raise ArmSourceError(f"{run / LEDGER}: record 1: cell {wrong_arm!r} is not of the spec's arm {body.arm!r}")
    return ArmRun(
        run_id=state.run_id,
        spec_id=state.spec_id,
        ledger_head=records[-1].hash,
        coordinates=_coordinates(body),
        variant=Variant(bundle_id=body.bundle_id, plan_id=body.plan_id, arm=body.arm),
        expected=tuple((case, repeat) for case, repeat, _ in state.expected),
        cells=tuple(
            _cell(case, repeat, dict(state.terminal[(case, repeat, arm)])) for case, repeat, arm in state.expected
        ),
        skipped={s["case_id"]: s["reason"] for s in state.created.get("skipped", ())},
        missing={
            s["case_id"]: tuple(s.get("missing", ())) for s in state.created.get("skipped", ()) if s.get("missing")
        },
        tags={case: tuple(tags) for case, tags in state.created.get("tags", {}).items()},
        build=_build(state.inputs.get(BUNDLE_INPUT)),
        provisional=provisional,
    )
