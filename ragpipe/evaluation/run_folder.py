"""Reading a run folder: verify its custody and rebuild what is derived from it.

``verify_run`` checks the chain, the head, the transitions, the bound inputs and every referenced
trace, and recomputes every completed cell's metrics from its trace (``recompute.py``), without
writing anything; ``load_inputs`` rebuilds the evaluation spec from the folder's
bound copies, each checked against its ``InputBound`` digest; ``rebuild_report`` rewrites the
reports from the verified ledger. Nothing here runs a query: verifying a release reads run folders
without importing the retrieval stack (running cells is ``runner.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragpipe.evaluation.ann import ANN_RECALL, measures_ann
from ragpipe.evaluation.eval_spec import EvaluationSpec, SpecBody, searches_approximately
from ragpipe.evaluation.judge_spec import JudgeSpec
from ragpipe.evaluation.ledger import LEDGER, LedgerError, read_ledger, reduce_records
from ragpipe.evaluation.recompute import check_cells
from ragpipe.evaluation.report import build_report, write_reports
from ragpipe.evaluation.run_state import RunState
from ragpipe.evaluation.suite import SuiteError, parse_suite_bytes
from ragpipe.kernel.ids import bytes_digest
from ragpipe.kernel.strict_load import load_json
from ragpipe.retrieval.plan import PlanError, parse_plan

INPUTS = {"suite": "inputs/suite.jsonl", "query_plan": "inputs/query_plan.json", "spec": "inputs/spec.json"}
JUDGE_INPUT = {"judge": "inputs/judge.json"}  # bound only in runs whose answers are judged
BUNDLE_INPUT = "bundle"  # the InputBound record of the evaluated bundle (nothing copied: see bundle_binding)
BUILD_FIGURES = ("vectors", "payload_bytes")


class RunError(ValueError):
    """A run cannot be created, resumed or verified; the message names the file or record."""


def _bound_seq(ledger_records, name: str) -> int:
    return next(r.seq for r in ledger_records if r.kind == "InputBound" and r.payload["name"] == name)


def _bound_inputs(state: RunState) -> dict[str, str]:
    """The copied inputs a run binds: the three of every run, and the judge's when it has one."""
    judged = isinstance(state.created.get("spec"), dict) and state.created["spec"].get("judge") is not None
    return {**INPUTS, **(JUDGE_INPUT if judged else {})}


def _judge_of(data: bytes | None, body: SpecBody, run: Path) -> JudgeSpec | None:
    """The bound judge spec, parsed and checked against the spec's judge ID."""
    if data is None:
        return None
    path = run / JUDGE_INPUT["judge"]
    try:
        judge = JudgeSpec.model_validate(load_json(data.decode("utf-8"), str(path)))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RunError(f"{path}: bound input does not parse: {str(exc).splitlines()[0]}") from None
    if judge.spec_id != body.judge:
        raise RunError(f"{path}: judge spec ID {judge.spec_id} differs from the spec's {body.judge}")
    return judge


def load_inputs(run: Path, records, state: RunState) -> EvaluationSpec:
    """The spec rebuilt from the copied inputs, each verified against its InputBound digest and
    its content ID, and the spec ID against RunCreated's."""
    where = str(run / LEDGER)
    data = {}
    for name, path in _bound_inputs(state).items():
        bound = state.inputs.get(name)
        if bound is None:
            raise RunError(f"{where}: record {len(records)}: no InputBound record for {name!r}")
        try:
            data[name] = (run / path).read_bytes()
        except OSError as exc:
            raise RunError(f"{run / path}: cannot read bound input: {exc.strerror}") from None
        if bytes_digest(data[name]) != bound["digest"]:
            raise RunError(
                f"{run / path}: differs from the digest of its InputBound record {_bound_seq(records, name)}"
            )
    try:
        body = SpecBody.model_validate(load_json(data["spec"].decode("utf-8"), str(run / INPUTS["spec"])))
        suite = parse_suite_bytes(data["suite"], str(run / INPUTS["suite"]))
        plan_json = load_json(data["query_plan"].decode("utf-8"), str(run / INPUTS["query_plan"]))
        plan = parse_plan(plan_json, str(run / INPUTS["query_plan"]))
    except (ValueError, SuiteError, PlanError) as exc:
        raise RunError(f"{run / 'inputs'}: bound inputs do not parse: {exc}") from None
    if body.spec_id != state.spec_id or body.as_json() != state.created["spec"]:
        raise RunError(
            f"{run / INPUTS['spec']}: spec ID {body.spec_id} differs from RunCreated's {state.spec_id} (record 1)"
        )
    if suite.digest != body.suite_digest:
        raise RunError(
            f"{run / INPUTS['suite']}: suite digest {suite.digest} differs from the spec's {body.suite_digest}"
        )
    if plan.plan_id != body.plan_id:
        raise RunError(f"{run / INPUTS['query_plan']}: plan ID {plan.plan_id} differs from the spec's {body.plan_id}")
    approximate = searches_approximately(plan, body.mode)
    if measures_ann(body.metrics) != approximate:
        # every run of an approximate plan measures its recall, and only such runs: a run that
        # left the metric out would pass a gate bound with if_measured unmeasured
        rule = (
            "searches approximately but does not measure"
            if approximate
            else "does not search approximately but measures"
        )
        raise RunError(f"{run / INPUTS['spec']}: mode {body.mode!r} under plan {plan.plan_id} {rule} {ANN_RECALL}")
    _check_bundle_binding(where, records, state.inputs.get(BUNDLE_INPUT), body)
    judge = _judge_of(data.get("judge"), body, run)
    # Relative to the run folder (runs before that stored it absolute: ``/`` keeps those as they are).
    return EvaluationSpec(body, suite, plan, (run / state.created["bundle_path"]).resolve(), judge)


def _check_bundle_binding(where: str, records, bound: Any, body: SpecBody) -> None:
    """The bundle's InputBound record, when the run has one (runs made before it existed do not):
    the spec's bundle, and each build figure an integer >= 0."""
    if bound is None:
        return
    seq = _bound_seq(records, BUNDLE_INPUT)
    if bound.get("content_id") != body.bundle_id:
        raise RunError(
            f"{where}: record {seq}: InputBound {BUNDLE_INPUT!r} names bundle {bound.get('content_id')}, not the spec's bundle {body.bundle_id}"
        )
    for key in BUILD_FIGURES:
        value = bound.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RunError(
                f"{where}: record {seq}: InputBound {BUNDLE_INPUT!r}: {key} must be an integer >= 0, got {value!r}"
            )


def verify_run(out: Path) -> RunState:
    """Read-only verification: chain, head, transitions, inputs, every referenced trace, and every
    completed cell's metrics recomputed from its trace and the bound suite (``recompute.py``). Raises ``LedgerError`` / ``RunError`` / ``TraceError`` naming the record on damage."""
    out = Path(out)
    read = read_ledger(out)
    state = reduce_records(read.records, str(out / LEDGER))
    if state.status == "empty":
        raise LedgerError(f"{out / LEDGER}: record 1: the ledger holds no record")
    spec = load_inputs(out, read.records, state)
    check_cells(out, read.records, spec)  # each trace against its digest, each metric recomputed
    return state


def rebuild_report(out: Path) -> dict[str, Any]:
    """Rebuild ``report.json`` / ``report.md`` from the verified ledger and traces (read-only on
    the ledger: a torn tail is ignored, not truncated) and return the report."""
    out = Path(out)
    read = read_ledger(out)
    state = reduce_records(read.records, str(out / LEDGER))
    if state.status == "empty":
        raise LedgerError(f"{out / LEDGER}: record 1: the ledger holds no record")
    spec = load_inputs(out, read.records, state)
    check_cells(out, read.records, spec)
    report = build_report(out, read.records, state, spec.suite.quality_labels())
    write_reports(out, report)
    return report
