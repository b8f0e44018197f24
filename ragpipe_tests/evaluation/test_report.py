"""Report projections: exact Markdown, nearest-rank latency, aggregation over repeats and tags.
(Byte-identical rebuilds of a real run: test_eval_cli.py.)"""

from __future__ import annotations

import json

import pytest

from ragpipe.evaluation.eval_spec import metric_specs
from ragpipe.evaluation.ledger import Ledger
from ragpipe.evaluation.report import build_report, percentile, render_markdown, report_bytes
from ragpipe.evaluation.run_state import cell_dict
from ragpipe.evaluation.traces import hit_table, write_traces
from ragpipe.retrieval.results import Rankings


def test_percentile_is_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([5.0], 0.95) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.95)) == (50.0, 95.0)
    assert (percentile([3.0, 1.0, 2.0, 4.0], 0.5), percentile([3.0, 1.0, 2.0, 4.0], 0.95)) == (2.0, 4.0)


def _run(tmp_path, **created):
    """A hand-built run: case a (tag t, 2 repeats completed), case b (tags t, u; its cell failed),
    case c pending, case d skipped; the traces are written for real. ``created``: more RunCreated
    fields."""
    specs = [m.model_dump(mode="json") for m in metric_specs({"ndcg": 10})[:1] + metric_specs()[-1:]]
    cells = [("a", 0, "a"), ("a", 1, "a"), ("b", 0, "a"), ("c", 0, "a")]
    spec = {
        "suite_digest": "sha256:s",
        "bundle_id": "sha256:b",
        "plan_id": "sha256:p",
        "mode": "hybrid",
        "metrics": specs,
    }
    run = tmp_path / "run"
    run.mkdir()
    (run / "traces").mkdir()
    ledger = Ledger.create(run)
    ledger.append(
        "RunCreated",
        {
            "run_id": "r-1",
            "spec_id": "sha256:x",
            "spec": spec,
            "cases": 5,
            "cells": [cell_dict(c) for c in cells],
            "skipped": [{"case_id": "d", "reason": "missing_judged_targets", "missing": ["z"]}],
            "tags": {"a": ["t"], "b": ["t", "u"]},
            **created,
        },
    )
    for i, (key, ndcg, latency) in enumerate([(cells[0], 0.5, 10.0), (cells[1], 0.25, 30.0)], start=1):
        ledger.append("CellStarted", {"cell": cell_dict(key)})
        record = {
            "cell": cell_dict(key),
            "outcome": "success",
            "metrics": {"ndcg@10": ndcg, "unauthorized_disclosures": 1},
            "latency_ms": latency,
        }
        trace_table = hit_table(cell_dict(key), Rankings({}, []), [], [])
        (ref,) = write_traces(run, f"traces/cells-{i:06d}.parquet", [(trace_table, record)])
        ledger.append("CellCompleted", {**record, "hits": 0, "trace": ref})
    ledger.append("CellStarted", {"cell": cell_dict(cells[2])})
    ledger.append("CellFailed", {"cell": cell_dict(cells[2]), "outcome": "failure", "error": "QueryError: boom"})
    return run, ledger


def test_report_aggregates_repeats_tags_failures_and_pending(tmp_path):
    run, ledger = _run(tmp_path)
    report = build_report(run, ledger.records, ledger.state)
    assert report["cells"] == {"expected": 4, "completed": 2, "failed": 1, "pending": 1}
    assert (report["status"], report["evaluated"], report["cases"]) == ("running", 1, 5)
    assert report["provisional"] == {"count": 0, "cases": []}  # and the Markdown says nothing of it
    assert report["metrics"]["ndcg@10"] == {"value": 0.375, "direction": "higher", "unit": "ratio", "k": 10, "n": 1}
    assert report["metrics"]["unauthorized_disclosures"] == {
        "value": 1.0,
        "direction": "lower",
        "unit": "count",
        "k": None,
        "n": 1,
    }
    assert report["latency_ms"] == {"p50": 10.0, "p95": 30.0, "n": 2}
    assert report["tags"] == {
        "t": {"cases": 1, "metrics": report["metrics"]}
    }  # b failed, so only a is in t; u has no case
    assert report["failed"] == [
        {"case": "b", "repeat": 0, "arm": "a", "outcome": "failure", "error": "QueryError: boom"}
    ]
    assert report_bytes(report) == report_bytes(build_report(run, ledger.records, ledger.state))
    assert (
        render_markdown(report)
        == f"""# Evaluation run r-1

- status: `running`
- spec_id: `sha256:x`
- suite_digest: `sha256:s`
- bundle_id: `sha256:b`
- plan_id: `sha256:p`
- mode: `hybrid`
- ledger_head: `{ledger.records[-1].hash}`
- cases: 5 · evaluated 1 · skipped 1 · cells 2/4 completed, 1 failed, 1 pending

## Metrics

| metric | value | direction | unit | k | n |
|---|---|---|---|---|---|
| ndcg@10 | 0.3750 | higher | ratio | 10 | 1 |
| unauthorized_disclosures | 1 | lower | count | — | 1 |

Latency (query, ms): p50 10.0000 · p95 30.0000 · n 2

## Per tag

| tag | cases | ndcg@10 | unauthorized_disclosures |
|---|---|---|---|
| t | 1 | 0.3750 | 1 |

## Skipped cases

- `d`: missing_judged_targets (missing: z)

## Failed cells

- `b` repeat 0 arm a: QueryError: boom
"""
    )
    assert json.loads(report_bytes(report)[0]) == report


def test_report_refuses_a_tampered_trace(tmp_path):
    run, ledger = _run(tmp_path)
    path = run / "traces" / "cells-000002.parquet"
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(
        ValueError,
        match=r"ledger.jsonl: record 5: trace .*cells-000002.parquet does not match the digest in the ledger$",
    ):
        build_report(run, ledger.records, ledger.state)


def test_report_marks_provisional_cases_wherever_it_lists_cases(tmp_path):
    """Cases no person has adjudicated (RunCreated lists them): counted, listed, and marked in
    the skipped and failed lists; a report without any stays as it was (test above)."""
    run, ledger = _run(tmp_path, provisional=["b", "c", "d"])
    report = build_report(run, ledger.records, ledger.state)
    assert report["provisional"] == {"count": 3, "cases": ["b", "c", "d"]}
    assert report["skipped"] == [
        {"case_id": "d", "reason": "missing_judged_targets", "missing": ["z"], "provisional": True}
    ]
    assert report["failed"] == [
        {"case": "b", "repeat": 0, "arm": "a", "outcome": "failure", "error": "QueryError: boom", "provisional": True}
    ]
    md = render_markdown(report)
    assert "- cases: 5 · evaluated 1 · skipped 1 · provisional 3 · cells 2/4 completed, 1 failed, 1 pending\n" in md
    assert md.endswith(
        """## Provisional cases

Not yet adjudicated by a person:

- `b` (provisional)
- `c` (provisional)
- `d` (provisional)

## Skipped cases

- `d` (provisional): missing_judged_targets (missing: z)

## Failed cells

- `b` (provisional) repeat 0 arm a: QueryError: boom
"""
    )
    assert json.loads(report_bytes(report)[0]) == report
