"""Reports: projections of a run rebuilt from its ledger and traces, byte-identical every time.

``build_report(run, records, state)`` derives everything from the verified ledger (after checking
each referenced trace file against its digest): counts, the skipped cases with their reasons, the
failed cells with their errors, the aggregate metrics, latency and the per-tag slices.

Aggregation: a case's value of a metric is the mean over its completed cells (its repeats); the
run's value is ``metrics.aggregate`` over the evaluated cases carrying the metric (mean, or sum
for counts such as ``unauthorized_disclosures``), with ``n`` the number of cases averaged.
Unanswerable cases carry no ranking metric; skipped cases and failed cells carry none at all.
Latency: p50 / p95 by nearest rank over the completed cells' query latencies, with the count.
``evaluated`` counts cases all of whose cells completed. A run that generates answers adds
``answer_usage``: the completed cells' model calls, cached answers, tokens and micros summed
(``sum_answer_usage``; a sum with any unknown part is unknown, ``null``); a judged run adds
``answer_quality`` (``answer_quality``: the label distributions first, over cells and over cases,
and the agreement with the suite's reference labels). Nothing operational that varies between
rebuilds (paths, time) is in a report; ``eval --json`` adds ``out``.

Provisional cases (suite cases no person has adjudicated yet, listed by ``RunCreated``): the report's
``provisional`` holds their ``count`` and ``cases``, and every case it lists (a skipped case, a
failed cell) carries ``"provisional": true`` when it is one; the Markdown marks each
``(provisional)`` and lists them in a section of their own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ragpipe.evaluation.judge_spec import LABELS
from ragpipe.evaluation.judge_step import FAILURE_STATUSES
from ragpipe.evaluation.ledger import Record
from ragpipe.evaluation.metrics import MetricSpec, aggregate
from ragpipe.evaluation.report_quality import agreement, label_counts
from ragpipe.evaluation.run_state import COMPLETED_OUTCOMES, FAILED_OUTCOMES, RunState, cell_dict
from ragpipe.evaluation.traces import verify_trace
from ragpipe.kernel.publish import write_file_atomic

REPORT_JSON = "report.json"
REPORT_MD = "report.md"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least ``q`` of the sample at or below)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _per_case(state: RunState) -> dict[str, dict[str, float]]:
    """Case ID -> metric -> mean over the case's completed cells (its repeats)."""
    sums: dict[str, dict[str, list[float]]] = {}
    for key, payload in state.terminal.items():
        if payload["outcome"] in COMPLETED_OUTCOMES:
            for name, value in payload["metrics"].items():
                sums.setdefault(key[0], {}).setdefault(name, []).append(float(value))
    return {case: {m: math.fsum(v) / len(v) for m, v in metrics.items()} for case, metrics in sums.items()}


USAGE_FIGURES = ("input_tokens", "output_tokens", "cost_micros")


def sum_answer_usage(usages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals of cells' ``answer_usage`` records: ``cells``, ``calls``, ``cached``, and each of
    ``USAGE_FIGURES`` — None when any cell's is unknown (never a smaller number) — with the count
    of cells whose cost is unknown."""
    totals: dict[str, Any] = {
        "cells": len(usages),
        "calls": sum(u["calls"] for u in usages),
        "cached": sum(bool(u["cached"]) for u in usages),
    }
    for name in USAGE_FIGURES:
        values = [u[name] for u in usages]
        totals[name] = None if any(v is None for v in values) else sum(values)
    totals["unknown_cost_cells"] = sum(u["cost_micros"] is None for u in usages)
    return totals


def _metric_table(
    per_case: Mapping[str, Mapping[str, float]], specs: Sequence[MetricSpec]
) -> dict[str, dict[str, Any]]:
    return {name: value.as_dict() for name, value in aggregate(per_case, specs).items()}


def build_report(
    run: Path, records: Sequence[Record], state: RunState, references: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The report object (module docstring); refuses when a referenced trace differs.
    ``references``: the run's bound suite's reference ``quality_label`` by case ID
    (``Suite.quality_labels``), which a judged run's answer labels are compared with."""
    created = state.created
    spec = created["spec"]
    specs = [MetricSpec.model_validate(m) for m in spec["metrics"]]
    checked: set[tuple[str, str]] = set()  # a file holds a group of cells: read and digest it once
    for record in records:
        if record.kind == "CellCompleted":
            ref = record.payload["trace"]
            if (ref["file"], ref["digest"]) not in checked:
                verify_trace(run, ref, f"{run / 'ledger.jsonl'}: record {record.seq}")
                checked.add((ref["file"], ref["digest"]))
    completed = 0
    failed = []
    latencies = []
    for key in state.expected:
        payload = state.terminal.get(key)
        if payload is None:
            continue
        if payload["outcome"] in COMPLETED_OUTCOMES:
            completed += 1
            latencies.append(float(payload["latency_ms"]))
        elif payload["outcome"] in FAILED_OUTCOMES:
            failed.append({**cell_dict(key), "outcome": payload["outcome"], "error": payload.get("error")})
    per_case = _per_case(state)
    provisional = sorted(created.get("provisional", ()))
    failed = mark_provisional(failed, provisional, "case")
    evaluated = evaluated_cases(state)
    tags: dict[str, list[str]] = {}
    for case in evaluated:
        for tag in created["tags"].get(case, ()):
            tags.setdefault(tag, []).append(case)
    report = {
        "schema": "ragpipe.evaluation_report/v1",
        "run_id": state.run_id,
        "spec_id": state.spec_id,
        "suite_digest": spec["suite_digest"],
        "bundle_id": spec["bundle_id"],
        "plan_id": spec["plan_id"],
        "mode": spec["mode"],
        "status": state.status,
        "cases": created["cases"],
        "cells": {
            "expected": len(state.expected),
            "completed": completed,
            "failed": len(failed),
            "pending": len(state.missing()),
        },
        "evaluated": len(evaluated),
        "provisional": {"count": len(provisional), "cases": provisional},
        "skipped": mark_provisional(created["skipped"], provisional, "case_id"),
        "failed": failed,
        "metrics": _metric_table({c: per_case.get(c, {}) for c in evaluated}, specs),
        "latency_ms": {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95), "n": len(latencies)},
        "tags": {
            tag: {"cases": len(cases), "metrics": _metric_table({c: per_case.get(c, {}) for c in cases}, specs)}
            for tag, cases in sorted(tags.items())
        },
        "ledger_head": records[-1].hash if records else None,
    }
    if spec.get("answers"):
        # a completed cell recorded before usage was kept counts as one of unknown usage
        unknown = {"calls": 0, "cached": False, "input_tokens": None, "output_tokens": None, "cost_micros": None}
        usages = [p.get("answer_usage", unknown) for p in state.terminal.values() if p["outcome"] in COMPLETED_OUTCOMES]
        report["answer_usage"] = sum_answer_usage(usages)
    if spec.get("judge") is not None:
        report["answer_quality"] = answer_quality(state, evaluated, references)
    return report


def evaluated_cases(state: RunState) -> list[str]:
    """The cases every expected cell of which completed (success or abstained), sorted: what the
    metric tables average over."""
    expected: dict[str, int] = {}
    done: dict[str, int] = {}
    for key in state.expected:
        expected[key[0]] = expected.get(key[0], 0) + 1
        payload = state.terminal.get(key)
        if payload is not None and payload["outcome"] in COMPLETED_OUTCOMES:
            done[key[0]] = done.get(key[0], 0) + 1
    return sorted(c for c, n in expected.items() if done.get(c) == n)


def answer_quality(
    state: RunState, evaluated: Sequence[str], references: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A judged run's answer quality over its completed cells: the label counts over ``cells`` and
    over ``cases`` (``report_quality.label_counts``: all four labels, always — the mean never
    replaces them), the ``judged`` calls and the judge's ``failures`` by kind (never a label),
    ``judge_usage`` (summed like ``answer_usage``, but a verdict taken from the judge cache is
    ``cached``, no call, and costs nothing: its call was paid for by the run that made it), and —
    when a cell of a case with a reference ``quality_label`` (``references``) was put to the judge
    — the ``agreement`` with those labels (``report_quality.agreement``)."""
    completed = [(key[0], p) for key, p in state.terminal.items() if p["outcome"] in COMPLETED_OUTCOMES]
    outcomes = [p.get("judge_outcome") for _, p in completed]
    usages = [_judge_usage(p) for _, p in completed if isinstance(p.get("judge_usage"), dict)]
    quality = {
        **label_counts(completed, evaluated),
        "judged": outcomes.count("judged"),
        "failures": {kind: outcomes.count(kind) for kind in FAILURE_STATUSES},
        "judge_usage": sum_answer_usage(usages),
    }
    if (agreed := agreement(completed, references or {})) is not None:
        quality["agreement"] = agreed
    return quality


def _judge_usage(payload: Mapping[str, Any]) -> dict[str, Any]:
    """One judged cell's usage as ``sum_answer_usage`` reads it: a provider call, or a cached verdict."""
    if payload.get("judge_cached"):
        return {"calls": 0, "cached": True, "input_tokens": 0, "output_tokens": 0, "cost_micros": 0}
    usage = payload["judge_usage"]
    return {"calls": 1, "cached": False, **{k: usage.get(k) for k in USAGE_FIGURES}}


def mark_provisional(
    entries: Sequence[Mapping[str, Any]], provisional: Sequence[str], key: str
) -> list[dict[str, Any]]:
    """``entries`` (each naming a case under ``key``), those of a provisional case with
    ``"provisional": true`` added (the others exactly as they were)."""
    marked = set(provisional)
    return [{**e, "provisional": True} if e[key] in marked else dict(e) for e in entries]


def _flag(entry: Mapping[str, Any]) -> str:
    return " (provisional)" if entry.get("provisional") else ""


def _fmt(value: object, unit: str = "ratio") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:g}" if unit == "count" else f"{value:.4f}"
    return str(value)


def _count(value: float) -> str:
    return f"{value:g}"  # a case count is a whole number unless the case's repeats disagree


def _quality_lines(q: Mapping[str, Any]) -> list[str]:
    """The answer-quality section: the label distributions (cells, then cases), then the mean,
    then the agreement with the reference labels when there is one."""
    cells, cases = q["cells"], q["cases"]
    mean = "n/a" if cells["mean_label"] is None else f"{cells['mean_label']:.3f}"
    case_mean = "n/a" if cases["mean_label"] is None else f"{cases['mean_label']:.3f}"
    failures = ", ".join(f"{kind} {n}" for kind, n in q["failures"].items())
    lines = [
        "| over | " + " | ".join(cells["distribution"]) + " |",
        "|---|" + "---|" * len(cells["distribution"]),
        "| cells | " + " | ".join(str(n) for n in cells["distribution"].values()) + " |",
        "| cases | " + " | ".join(_count(n) for n in cases["distribution"].values()) + " |",
        "",
        f"{cells['labelled']} answers labelled ({q['judged']} judged, {cells['by_rule']} abstentions 0_FAIL by rule) "
        f"in {cases['labelled']} cases (a case weighs 1, shared by its repeats) · mean label {mean} over cells, "
        f"{case_mean} over cases (0–3; the distribution above is the figure) · judge failures: {failures}",
    ]
    u = q["judge_usage"]
    cost = "unknown" if u["cost_micros"] is None else f"{u['cost_micros']} micros"
    lines += ["", f"Judge usage: {u['calls']} calls · {u['cached']} cached · cost {cost}"]
    if (a := q.get("agreement")) is not None:
        lines += ["", f"Agreement with reference labels: {agreement_summary(a)}", ""]
        lines += ["| reference ↓ judge → | " + " | ".join(LABELS) + " |", "|---|" + "---|" * len(LABELS)]
        lines += [
            f"| {ref} | " + " | ".join(str(n) for n in row.values()) + " |" for ref, row in a["confusion"].items()
        ]
    return lines


def agreement_summary(a: Mapping[str, Any]) -> str:
    """One line of ``answer_quality.agreement`` (the report's Markdown and ``ragpipe eval``)."""
    rate = {k: "n/a" if a[k] is None else f"{a[k]:.3f}" for k in ("exact_rate", "within_one_rate")}
    apart = ", ".join(a["disagreements"]) or "none"
    return (
        f"{a['cells']} judged answers of {a['cases']} cases · exact {rate['exact_rate']} · "
        f"within one {rate['within_one_rate']} · 2+ apart: {apart} · not compared: "
        f"{a['judge_failed']} judge failures, {a['by_rule']} abstentions by rule"
    )


def render_markdown(report: Mapping[str, Any]) -> str:
    """The Markdown summary: identities, counts, the metric table, latency, per-tag table,
    provisional cases (when there are any), skipped cases and failed cells."""
    lines = [f"# Evaluation run {report['run_id']}", ""]
    for key in ("status", "spec_id", "suite_digest", "bundle_id", "plan_id", "mode", "ledger_head"):
        lines.append(f"- {key}: `{report[key]}`")
    cells = report["cells"]
    provisional = report["provisional"]
    lines += [
        f"- cases: {report['cases']} · evaluated {report['evaluated']} · skipped {len(report['skipped'])} · "
        + (f"provisional {provisional['count']} · " if provisional["count"] else "")
        + f"cells {cells['completed']}/{cells['expected']} completed, {cells['failed']} failed, {cells['pending']} pending",
        "",
        "## Metrics",
        "",
        "| metric | value | direction | unit | k | n |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in report["metrics"].items():
        lines.append(
            f"| {name} | {_fmt(m['value'], m['unit'])} | {m['direction']} | {m['unit']} | {_fmt(m['k'])} | {m['n']} |"
        )
    lat = report["latency_ms"]
    lines += ["", f"Latency (query, ms): p50 {_fmt(lat['p50'])} · p95 {_fmt(lat['p95'])} · n {lat['n']}"]
    if (u := report.get("answer_usage")) is not None:
        cost = "unknown" if u["cost_micros"] is None else f"{u['cost_micros']} micros"
        lines += [
            "",
            f"Answers (model usage over {u['cells']} cells): {u['calls']} calls · {u['cached']} cached · "
            f"tokens in {_fmt(u['input_tokens'])} · out {_fmt(u['output_tokens'])} · cost {cost}"
            + (f" ({u['unknown_cost_cells']} cells of unknown cost)" if u["unknown_cost_cells"] else ""),
        ]
    if (q := report.get("answer_quality")) is not None:
        lines += ["", "## Answer quality", "", *_quality_lines(q)]
    lines += [
        "",
        "## Per tag",
        "",
    ]
    names = list(report["metrics"])
    if report["tags"]:
        lines += ["| tag | cases | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for tag, t in report["tags"].items():
            lines.append(
                f"| {tag} | {t['cases']} | "
                + " | ".join(_fmt(t["metrics"][n]["value"], t["metrics"][n]["unit"]) for n in names)
                + " |"
            )
    else:
        lines.append("No case has a tag.")
    if provisional["count"]:  # a suite of adjudicated cases reports as it always did
        lines += ["", "## Provisional cases", "", "Not yet adjudicated by a person:", ""]
        lines += [f"- `{case}` (provisional)" for case in provisional["cases"]]
    lines += ["", "## Skipped cases", ""]
    lines += [
        f"- `{s['case_id']}`{_flag(s)}: {s['reason']}"
        + (f" (missing: {', '.join(s['missing'])})" if s["missing"] else "")
        for s in report["skipped"]
    ] or ["None."]
    lines += ["", "## Failed cells", ""]
    lines += [
        f"- `{f['case']}`{_flag(f)} repeat {f['repeat']} arm {f['arm']}: {f['error']}" for f in report["failed"]
    ] or ["None."]
    return "\n".join(lines) + "\n"


def report_bytes(report: Mapping[str, Any]) -> tuple[bytes, bytes]:
    as_json = json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return as_json.encode("utf-8"), render_markdown(report).encode("utf-8")


def write_reports(run: Path, report: Mapping[str, Any]) -> None:
    """Write ``report.json`` and ``report.md`` atomically (each replaces its previous version)."""
    as_json, as_md = report_bytes(report)
    write_file_atomic(run / REPORT_JSON, as_json)
    write_file_atomic(run / REPORT_MD, as_md)
