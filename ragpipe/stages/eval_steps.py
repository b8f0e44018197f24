"""``evaluation_run`` and its check: evaluate a revision's bundle under the spec's ``evaluation:`` section.

Each materialization is an attempt with a fresh run ID (UUIDv7): ``run_evaluation`` writes the run
folder ``$RAGPIPE_HOME/evaluations/<run id>/`` (hash-chained ledger, bound inputs, traces,
reports; ``ragpipe.evaluation.runner``), then the revision's ``evaluation_run`` stage record points
at it (``ragpipe.stages.release_chain_store``). A crash mid-run leaves an incomplete run folder that no
record names; the next attempt starts a new one.

The record's facts count the suite's ``cases``, the ``evaluated`` and ``skipped`` ones, and the
skipped cases per reason code as ``skipped_<code>`` (``skipped_missing_judged_targets``,
``skipped_no_positive_judgment``), so a build can say that no suite case applies to the revision,
and why, without reading the run again (``ragpipe.orchestration.materialize``); and which vector
engine served the run and how (``vector_engine``, ``vector_engine_why``). When none applies,
the materialization's metadata says so too (``no_case_applies``), for the UI.

With a judge (``evaluation.judge``) the run's answers are judged (``ragpipe.evaluation.judging``;
the judge cache is the workspace's ``generation_cache/judge``). A judge budget
(``evaluation.judge_budget_micros``, for this step alone) reached mid-run fails the step with one
line (``judge_budget_stop``); the incomplete run folder is kept and no record names it.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ragpipe.bundle.objects import open_bundle_here
from ragpipe.evaluation.ledger import read_ledger
from ragpipe.evaluation.run_folder import verify_run
from ragpipe.evaluation.runner import ANSWERS, new_run_id, run_evaluation
from ragpipe.experiment.decision import skipped_cases_text
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.replica import push_run, run_dir
from ragpipe.retrieval.vector_engine import VectorEngine
from ragpipe.spec import PipelineSpec
from ragpipe.stages.chain_plan import chain_plan
from ragpipe.stages.release_chain_store import ChainResult, publish_chain
from ragpipe.stages.results import Table, table
from ragpipe.stages.stage_store import StageError, holding_workspace_lock, read_output
from ragpipe.storage.location import store_from_env
from ragpipe.work.failures import BudgetExhausted

STAGE = "evaluation_run"
SKIPPED_PREFIX = "skipped_"  # facts ``skipped_<reason code>``: skipped cases per reason


def attempt_version(spec_id: str, run_id: str) -> str:
    """The stage version of one evaluation attempt (module docstring of ``release_chain_store``)."""
    return content_id("evaluation-attempt", 1, {"spec_id": spec_id, "run_id": run_id})


def metric_table(metrics: dict[str, dict[str, Any]]) -> Table | None:
    rows = [
        [name, None if m["value"] is None else float(m["value"]), m["direction"], m["unit"], m["k"], int(m["n"])]
        for name, m in metrics.items()
    ]
    return table(
        [
            ("metric", "string"),
            ("value", "float"),
            ("direction", "string"),
            ("unit", "string"),
            ("k", "int"),
            ("n", "int"),
        ],
        rows,
    )


def tag_table(tags: dict[str, dict[str, Any]]) -> Table | None:
    """Per-tag slices, one row per (tag, metric)."""
    rows = [
        [tag, int(t["cases"]), name, None if m["value"] is None else float(m["value"]), int(m["n"])]
        for tag, t in tags.items()
        for name, m in t["metrics"].items()
    ]
    return table(
        [("tag", "string"), ("cases", "int"), ("metric", "string"), ("value", "float"), ("n", "int")], rows, limit=500
    )


def skipped_reasons(skipped: list[dict[str, Any]]) -> dict[str, int]:
    """Skipped cases per reason code (``missing_judged_targets``, ``no_positive_judgment``), sorted."""
    return dict(sorted(Counter(str(s["reason"]) for s in skipped).items()))


def recorded_skip_reasons(facts: dict[str, Any]) -> dict[str, int]:
    """``{reason code: skipped cases}`` from an ``evaluation_run`` record's facts (empty for a
    record made before they were recorded)."""
    return {k[len(SKIPPED_PREFIX) :]: int(v) for k, v in sorted(facts.items()) if k.startswith(SKIPPED_PREFIX)}


def engine_facts(engine: VectorEngine | None) -> dict[str, str]:
    """``vector_engine`` and ``vector_engine_why``: which engine served the run's vector channel on
    the machine that ran it, and why (none for a bundle without vectors). Execution facts: in the
    record's facts and the UI, never in a version or ID."""
    return {} if engine is None else {"vector_engine": engine.engine, "vector_engine_why": engine.why}


@contextmanager
def judge_budget_stop(run: Path) -> Iterator[None]:
    """A judge budget reached inside a chain step: ``StageError`` in one line saying what was
    spent and how to go on. The incomplete run folder ``run`` is kept for inspection, without its
    pending answers: the next attempt is a new run (a fresh run ID), which generates its answers
    again — the verdicts already paid for are served from the judge cache when an answer is the
    same (the judge key binds the answer's digest)."""
    try:
        yield
    except BudgetExhausted as exc:
        shutil.rmtree(run / ANSWERS, ignore_errors=True)  # no attempt resumes this run
        raise StageError(
            f"judge budget reached: {exc.spent} micros spent, {exc.not_admitted} answers of the open group not "
            f"admitted and later groups not judged; the incomplete run {run} is kept: raise "
            "evaluation.judge_budget_micros and materialize again (verdicts already paid for are cached)"
        ) from None


def label_table(report: dict[str, Any]) -> Table | None:
    """A judged run's label distribution (all four labels; ``None`` unjudged) over completed
    cells (``answers``) and over cases (``cases``: each case weighs 1, shared by its repeats, as in
    the metric table): shown beside the metric table, so the mean label never stands alone."""
    quality = report.get("answer_quality")
    if quality is None:
        return None
    cells, cases = quality["cells"]["distribution"], quality["cases"]["distribution"]
    return table(
        [("label", "string"), ("answers", "int"), ("cases", "float")],
        [[label, int(n), float(cases[label])] for label, n in cells.items()],
    )


def report_metadata(report: dict[str, Any], run_path: Path) -> dict[str, Any]:
    cells = report["cells"]
    return {
        "run_id": report["run_id"],
        "spec_id": report["spec_id"],
        "ledger_head": report["ledger_head"],
        "suite_digest": report["suite_digest"],
        "bundle_id": report["bundle_id"],
        "plan_id": report["plan_id"],
        "mode": report["mode"],
        "cases": report["cases"],
        "evaluated": report["evaluated"],
        "skipped": len(report["skipped"]),
        "failed": cells["failed"],
        "run_path": run_path,
    }


@holding_workspace_lock
def run_evaluation_run(ws: Workspace, revision: str, spec: PipelineSpec) -> ChainResult:
    """Evaluate the revision's latest bundle (built under ``spec``) in a fresh run; publish its record."""
    t0 = time.perf_counter()
    chain = chain_plan(spec)
    bundle = read_output(ws, revision, "index_bundle", spec)
    bundle_path = ws.located(str(bundle.record.facts["bundle_path"]))
    if store_from_env() is not None:  # a machine that did not build it fetches it (verified) first
        open_bundle_here(bundle_path)
    ev = chain.evaluation_spec(bundle_path, str(bundle.record.facts["bundle_id"]))
    run_id = new_run_id()
    out = ws.evaluations / run_id
    out.parent.mkdir(parents=True, exist_ok=True)
    with judge_budget_stop(out):
        result = run_evaluation(ev, out, run_id=run_id, judging=chain.judging(ws.home))
    report = result.report
    push_run(ws, out)  # before its record: the gate and activation may run on other machines
    skips = skipped_reasons(report["skipped"])
    facts = {
        "spec_id": ev.spec_id,
        "run_id": run_id,
        "run_path": ws.stored(out),
        "ledger_head": report["ledger_head"],
        "cases": report["cases"],
        "evaluated": report["evaluated"],
        "skipped": len(report["skipped"]),
        "failed": report["cells"]["failed"],
        **{f"{SKIPPED_PREFIX}{code}": n for code, n in skips.items()},
        **engine_facts(result.vector_engine),
    }
    record = publish_chain(
        ws,
        STAGE,
        revision,
        chain.evaluation_code_version,
        attempt_version(ev.spec_id, run_id),
        {"index_bundle": bundle},
        facts,
    )
    metadata = {
        **report_metadata(report, out),
        **engine_facts(result.vector_engine),
        "duration_seconds": round(time.perf_counter() - t0, 3),
    }
    if not report["evaluated"] and not report["cells"]["failed"] and sum(skips.values()) == report["cases"]:
        # what the UI shows beside the counts (the build's summary says it too, with what to do next)
        metadata["no_case_applies"] = f"{skipped_cases_text(skips)} (suite {chain.section.suite})"
    tables = {
        "metrics": metric_table(report["metrics"]),
        "answer_labels": label_table(report),
        "tag_slices": tag_table(report["tags"]),
        "skipped_cases": table(
            [("case", "string"), ("reason", "string")], [[s["case_id"], s["reason"]] for s in report["skipped"]]
        ),
    }
    return ChainResult(record, ev.spec_id, metadata, {k: v for k, v in tables.items() if v is not None})


@holding_workspace_lock
def check_evaluation_run(ws: Workspace, revision: str) -> tuple[str, list[str]]:
    """Verify the latest evaluation run of ``revision``: (run folder, problems). A problem is a
    ledger, input or trace that does not verify, a run that is not completed, or a ledger head other
    than the one the stage record took from the run."""
    record = read_output(ws, revision, STAGE).record
    path = ws.evaluations / str(record.facts["run_id"])
    try:
        folder = run_dir(ws, path.name)  # fetched when the run was made elsewhere
        state = verify_run(folder)
        head = read_ledger(folder).records[-1].hash
    except (ValueError, OSError) as exc:  # LedgerError, RunError, TraceError name the file and record
        return str(path), [str(exc)]
    problems = []
    if state.status != "completed":
        problems.append(
            f"{path}: the run is {state.status}, not completed ({len(state.missing())} cells without an outcome)"
        )
    if state.run_id != record.facts["run_id"]:
        problems.append(f"{path}: run ID {state.run_id} is not the recorded {record.facts['run_id']}")
    if head != record.facts["ledger_head"]:
        problems.append(f"{path}: ledger head {head} is not the recorded {record.facts['ledger_head']}")
    return str(path), problems
