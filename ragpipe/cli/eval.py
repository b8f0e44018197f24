"""``ragpipe suite …`` and ``ragpipe eval …`` (typer apps ``suite_app`` and ``eval_app``).

    ragpipe suite import beir DIR --split test --out SUITE.jsonl
    ragpipe suite validate SUITE [--bundle PATH | --revision KEY] [--json]
    ragpipe eval --suite SUITE (--bundle PATH | --revision KEY) [--mode …] [--plan FILE] [--scope S …] [--out RUNDIR] [--json]
    ragpipe eval --resume RUNDIR [--json]
    ragpipe eval report RUNDIR [--json]
    ragpipe eval sql RUNDIR "SELECT … FROM cells" [--json]

Every expected error prints ``error: <message>`` on stderr and exits 1; ``--json`` prints exactly
one JSON object on stdout.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ragpipe.cli.common import BundleOpt, JsonOpt, Mode, RevisionOpt, bundle_path, emit_json, err, fail, out

suite_app = typer.Typer(help="Import and validate evaluation suites.", no_args_is_help=True, add_completion=False)
eval_app = typer.Typer(help="Evaluation runs with custody: run, resume, report, SQL.", add_completion=False)


class SuiteFormat(str, Enum):
    beir = "beir"


SplitOpt = Annotated[list[str] | None, typer.Option("--split", help="BEIR qrels split(s) (repeatable; default: test).")]


def guarded(action):
    """Run ``action``; the errors bad input can cause become one message and exit code 1."""
    from ragpipe.bundle.verify import BundleVerificationError
    from ragpipe.evaluation.ledger import LedgerError
    from ragpipe.evaluation.run_folder import RunError
    from ragpipe.evaluation.suite import SuiteError
    from ragpipe.evaluation.traces import TraceError
    from ragpipe.retrieval.plan import PlanError
    from ragpipe.retrieval.results import QueryError

    try:
        return action()
    except (
        SuiteError,
        LedgerError,
        RunError,
        TraceError,
        PlanError,
        QueryError,
        BundleVerificationError,
        ValueError,
        OSError,
    ) as exc:
        fail(str(exc))


@suite_app.command("import")
def suite_import(
    fmt: Annotated[SuiteFormat, typer.Argument(metavar="FORMAT", help="Source format (beir).")],
    directory: Annotated[Path, typer.Argument(help="BEIR folder: queries.jsonl and qrels/<split>.tsv.")],
    out_path: Annotated[Path, typer.Option("--out", help="Native suite file to write (canonical JSONL).")],
    split: SplitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Convert a BEIR folder's judged queries into a native suite file."""
    from ragpipe.evaluation.suite import write_suite
    from ragpipe.evaluation.suite_load import load_suite

    def run():
        if not directory.is_dir():
            raise ValueError(f"{directory}: not a BEIR folder (expected a directory)")
        suite = load_suite(directory, split=split or ["test"])
        write_suite(suite, out_path)
        return {"cases": len(suite.cases), "suite_digest": suite.digest, "out": str(out_path)}

    data = guarded(run)
    if as_json:
        emit_json(data)
    else:
        out.print(f"{data['cases']} cases → {escape(data['out'])} (digest {data['suite_digest']})")


@suite_app.command("validate")
def suite_validate(
    suite: Annotated[Path, typer.Argument(help="Native suite file or BEIR folder.")],
    bundle: BundleOpt = None,
    revision: RevisionOpt = None,
    split: SplitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a suite's rules; with a bundle, also which cases it can evaluate (skipped cases are
    listed with their reasons, never scored)."""
    from ragpipe.evaluation.report import mark_provisional
    from ragpipe.evaluation.suite import check_against_bundle
    from ragpipe.evaluation.suite_load import load_suite

    def run() -> dict[str, Any]:
        loaded = load_suite(suite, split=split or ["test"])
        data: dict[str, Any] = {
            "valid": True,
            "suite": str(suite),
            "cases": len(loaded.cases),
            "suite_digest": loaded.digest,
            "provisional": list(loaded.provisional()),
        }
        if bundle is not None or revision is not None:
            from ragpipe.bundle.tables import CHUNKS, DOCUMENTS
            from ragpipe.bundle.verify import open_bundle

            opened = open_bundle(bundle_path(bundle, revision))
            tables = opened.tables  # the ID columns only, not every document and chunk as an object
            statuses = check_against_bundle(
                loaded,
                set(tables.table(DOCUMENTS, ["document_id"]).column(0).to_pylist()),
                set(tables.table(CHUNKS, ["chunk_id"]).column(0).to_pylist()),
            )
            data["bundle_id"] = opened.bundle_id
            data["evaluable"] = sum(s.evaluable for s in statuses)
            data["skipped"] = mark_provisional(
                [
                    {"case_id": s.case_id, "reason": s.reason, "missing": list(s.missing)}
                    for s in statuses
                    if not s.evaluable
                ],
                data["provisional"],
                "case_id",
            )
        return data

    data = guarded(run)
    if as_json:
        emit_json(data)
        return
    out.print(f"valid: {data['cases']} cases, digest {data['suite_digest']}")
    print_provisional(data["provisional"])
    if "bundle_id" in data:
        out.print(f"against bundle {data['bundle_id']}: {data['evaluable']} evaluable, {len(data['skipped'])} skipped")
        for s in data["skipped"]:
            out.print(
                f"  skipped {escape(s['case_id'])}{' (provisional)' if s.get('provisional') else ''}: {s['reason']}"
                + (f" (missing {escape(', '.join(s['missing']))})" if s["missing"] else "")
            )


def parse_cutoffs(values: list[str] | None) -> dict[str, int]:
    cutoffs = {}
    for value in values or []:
        family, sep, k = value.partition("=")
        if not sep or not k.isdigit():
            raise ValueError(f"--cutoff {value!r}: expected FAMILY=K, e.g. ndcg=20")
        cutoffs[family] = int(k)
    return cutoffs


def print_provisional(cases: list[str]) -> None:
    """The suite's provisional cases (not yet adjudicated by a person), when it has any."""
    if cases:
        out.print(f"{len(cases)} provisional (not yet adjudicated): " + ", ".join(escape(c) for c in cases))


def print_answer_quality(quality: dict[str, Any] | None) -> None:
    """A judged run's label distribution — always, and before any mean (the table's
    ``answer_label``) — over cells, and over cases when they differ (repeats), with what was
    labelled by rule and the judge's failures; then, when the suite has reference labels, one line
    of the judge's agreement with them."""
    if quality is None:
        return
    from ragpipe.evaluation.report import agreement_summary

    cells, cases = quality["cells"], quality["cases"]
    labels = " · ".join(f"{label} {n}" for label, n in cells["distribution"].items())
    failures = ", ".join(f"{kind} {n}" for kind, n in quality["failures"].items() if n) or "none"
    out.print(
        f"answer labels: {labels} ({quality['judged']} judged, {cells['by_rule']} abstentions 0_FAIL by rule; "
        f"judge failures: {failures})",
        highlight=False,
    )
    if cases["distribution"] != cells["distribution"]:
        per_case = " · ".join(f"{label} {n:g}" for label, n in cases["distribution"].items())
        out.print(f"answer labels per case (a case weighs 1, shared by its repeats): {per_case}", highlight=False)
    if (agreed := quality.get("agreement")) is not None:
        out.print(f"agreement with reference labels: {escape(agreement_summary(agreed))}", highlight=False)


def print_result(data: dict[str, Any]) -> None:
    cells = data["cells"]
    out.print(
        f"[bold]run {data['run_id']}[/] · {data['status']} · {data['evaluated']}/{data['cases']} cases evaluated, "
        f"{len(data['skipped'])} skipped, {cells['failed']} cells failed · {escape(str(data.get('out', '')))}"
    )
    print_provisional(data["provisional"]["cases"])
    print_answer_quality(data.get("answer_quality"))
    table = Table(title=f"spec {data['spec_id'][:19]}…")
    for col in ("metric", "value", "direction", "unit", "k", "n"):
        table.add_column(col)
    for name, m in data["metrics"].items():
        table.add_row(
            name,
            "—" if m["value"] is None else f"{m['value']:.4f}",
            m["direction"],
            m["unit"],
            str(m["k"] or "—"),
            str(m["n"]),
        )
    out.print(table)
    lat = data["latency_ms"]
    out.print(f"latency p50 {lat['p50']} ms · p95 {lat['p95']} ms · n {lat['n']} · ledger head {data['ledger_head']}")


def _progress(as_json: bool):
    def report(done: int, total: int, _cell) -> None:
        if done == total or done % max(1, total // 10) == 0:
            err.print(f"[dim]{done}/{total} cells[/]")

    return None if as_json else report


@eval_app.callback(invoke_without_command=True)
def eval_run(
    ctx: typer.Context,
    suite: Annotated[Path | None, typer.Option("--suite", help="Native suite file or BEIR folder.")] = None,
    bundle: BundleOpt = None,
    revision: RevisionOpt = None,
    mode: Annotated[Mode, typer.Option("--mode", help="Channels: hybrid, lexical or vector.")] = Mode.hybrid,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Query plan file (default: ragpipe/specs/query_plan.yaml).")
    ] = None,
    scope: Annotated[
        list[str] | None,
        typer.Option("--scope", "-s", help="Subject scope for cases without their own (repeatable; default: public)."),
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Run folder to create (default: $RAGPIPE_HOME/evaluations/<run ID>).")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue this run folder: only its missing cells run.")
    ] = None,
    split: SplitOpt = None,
    k: Annotated[int, typer.Option("--k", help="Hits retrieved per case (the ranking depth).")] = 1000,
    cutoff: Annotated[
        list[str] | None, typer.Option("--cutoff", help="Metric cutoff FAMILY=K, e.g. ndcg=20 (repeatable).")
    ] = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Cells per case.")] = 1,
    answers: Annotated[bool, typer.Option("--answers", help="Also generate answers and score them.")] = False,
    judge: Annotated[
        Path | None,
        typer.Option(
            "--judge", help="Judge the answers with this judge spec (e.g. ragpipe/specs/judge.yaml); implies --answers."
        ),
    ] = None,
    judge_budget: Annotated[
        int | None, typer.Option("--judge-budget-micros", help="Most this invocation may spend on judge calls.")
    ] = None,
    judge_concurrency: Annotated[int, typer.Option("--judge-concurrency", help="Judge calls in flight at once.")] = 4,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a suite against a bundle (or resume a run); subcommands: report, sql."""
    if ctx.invoked_subcommand is not None:
        return
    from ragpipe.evaluation.runner import new_run_id, resume_evaluation, run_evaluation

    def reach(spec):
        from ragpipe.evaluation.judging import judging_for
        from ragpipe.kernel.workspace import default_home

        return judging_for(spec.judge, default_home(), judge_budget, judge_concurrency)

    def run():
        if resume is not None:
            if suite is not None or bundle is not None or revision is not None or out_dir is not None or judge:
                raise ValueError("--resume takes only the run folder: the spec comes from its ledger")
            with budget_stop(resume):
                return resume_evaluation(resume, on_progress=_progress(as_json), judging=reach)
        if suite is None:
            raise ValueError("give --suite SUITE (with --bundle or --revision), or --resume RUNDIR")
        from ragpipe.evaluation.eval_spec import EvaluationSpec, metric_specs
        from ragpipe.evaluation.judge_spec import load_judge_spec
        from ragpipe.evaluation.suite_load import load_suite
        from ragpipe.kernel.workspace import Workspace, default_home
        from ragpipe.retrieval.plan import load_plan
        from ragpipe.retrieval.retriever import Retriever

        # everything cheap is checked before the bundle is opened
        cutoffs = parse_cutoffs(cutoff)
        judge_spec = None if judge is None else load_judge_spec(judge)
        metric_specs(cutoffs, answers or judge_spec is not None)
        run_id = new_run_id()
        target = out_dir or Workspace(default_home()).evaluations / run_id
        if target.exists():
            raise ValueError(f"{target}: already exists (a run folder is created once; use --resume to continue it)")
        loaded = load_suite(suite, split=split or ["test"])
        path = bundle_path(bundle, revision)
        qplan = load_plan(plan)
        retriever = Retriever(path, plan=qplan)
        spec = EvaluationSpec.build(
            loaded,
            qplan,
            path,
            retriever.bundle_id,
            mode=mode.value,
            scopes=tuple(scope or ("public",)),
            k=k,
            cutoffs=cutoffs,
            repeats=repeats,
            answers=answers or judge_spec is not None,
            judge=judge_spec,
        )
        _require_an_evaluable_case(loaded, retriever, suite)
        with budget_stop(target):
            return run_evaluation(
                spec,
                target,
                retriever_factory=lambda _: retriever,
                on_progress=_progress(as_json),
                run_id=run_id,
                judging=None if judge_spec is None else reach(spec),
            )

    data = guarded(run).as_dict()
    if as_json:
        emit_json(data)
    else:
        print_result(data)


@contextmanager
def budget_stop(run_dir: Path):
    """A judge budget reached mid-run: one line saying what was spent and how to go on (the run
    folder keeps every closed cell; judged calls are cached)."""
    from ragpipe.work.failures import BudgetExhausted

    try:
        yield
    except BudgetExhausted as exc:
        raise ValueError(
            f"judge budget reached: {exc.spent} micros spent, {exc.not_admitted} answers of the open group not "
            f"admitted and later groups not judged; the run is kept: continue it with ragpipe eval --resume {run_dir} "
            "--judge-budget-micros N"
        ) from None


def _require_an_evaluable_case(suite, retriever, source: Path) -> None:
    """Refuse, before any run folder exists, a suite none of whose cases this bundle can evaluate
    (a run of zero cells would measure nothing). The build's chain runs such a suite all the same:
    its gate is then ineligible, naming the same reason (``experiment.decision.no_evaluable_case``)."""
    from collections import Counter

    from ragpipe.evaluation.suite import check_against_bundle
    from ragpipe.experiment.decision import skipped_cases_text

    statuses = check_against_bundle(suite, retriever.scopes.keys(), retriever.chunks.keys())
    if not any(s.evaluable for s in statuses):
        why = skipped_cases_text(Counter(s.reason for s in statuses)) if statuses else "the suite has no case"
        raise ValueError(f"{source}: no evaluable case against bundle {retriever.bundle_id}: {why}")


@eval_app.command("report")
def eval_report(run_dir: Annotated[Path, typer.Argument(help="Run folder.")], as_json: JsonOpt = False) -> None:
    """Rebuild report.json and report.md from the ledger and traces (byte-identical each time)."""
    from ragpipe.evaluation.report import REPORT_JSON, REPORT_MD
    from ragpipe.evaluation.run_folder import rebuild_report

    guarded(lambda: rebuild_report(run_dir))
    sys.stdout.write((run_dir / (REPORT_JSON if as_json else REPORT_MD)).read_text(encoding="utf-8"))


@eval_app.command("sql")
def eval_sql(
    run_dir: Annotated[Path, typer.Argument(help="Run folder.")],
    query: Annotated[str, typer.Argument(help="SQL over the views cells, hits, metrics.")],
    as_json: JsonOpt = False,
) -> None:
    """Query a run with DuckDB (views: cells, hits, metrics)."""
    import duckdb

    from ragpipe.evaluation.sql import run_sql

    def run():
        try:
            return run_sql(run_dir, query)
        except duckdb.Error as exc:
            raise ValueError(f"SQL error: {exc}") from None

    columns, rows = guarded(run)
    if as_json:
        emit_json({"columns": columns, "rows": [list(r) for r in rows]})
        return
    sys.stdout.write("\t".join(columns) + "\n")
    for row in rows:
        sys.stdout.write("\t".join("" if v is None else str(v) for v in row) + "\n")
