"""Suite cases with a metadata filter: part of the case and of the suite digest, applied to the
case's query in both channels, refused in one line when malformed, a failed cell (naming the
field) when the bundle lacks the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.runner import run_evaluation
from ragpipe.evaluation.sql import run_sql
from ragpipe.evaluation.suite import Case, suite_digest
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.release_fixtures import bundle_of

RUNBOOK = {"field": "source_role", "eq": "runbook"}
STAFF = {"scopes": ["public", "staff"]}


def test_a_filter_is_part_of_the_case_and_a_case_without_one_keeps_its_digest():
    plain = Case(id="a", query="q", target_level="document", judgments={"d": 1})
    filtered = Case(id="a", query="q", target_level="document", judgments={"d": 1}, filter=RUNBOOK)
    assert "filter" not in plain.canonical() and filtered.canonical()["filter"] == RUNBOOK
    assert suite_digest([plain]) != suite_digest([filtered])
    again = Case(
        id="a",
        query="q",
        target_level="document",
        judgments={"d": 1},
        filter={"or": [RUNBOOK, {"field": "tags", "in": ["b", "a", "b"]}]},
    )
    assert again.filter == {"or": [RUNBOOK, {"field": "tags", "in": ["a", "b"]}]}  # canonical form


def test_a_malformed_filter_is_refused_naming_the_rule():
    with pytest.raises(ValueError, match=r"'filter': filter\.and: expected a non-empty list of filters, got \[\]"):
        Case(id="a", query="q", target_level="document", judgments={"d": 1}, filter={"and": []})


def test_cases_run_under_their_filters(built_workspace, tmp_path: Path):
    bundle = bundle_of(built_workspace)
    cases = [
        {"id": "kept", "query": "rotate the signing keys", "filter": RUNBOOK},
        {"id": "excluded", "query": "rotate the signing keys", "filter": {"not": RUNBOOK}},
        {"id": "unfiltered", "query": "rotate the signing keys"},
        {"id": "unknown-field", "query": "rotate the signing keys", "filter": {"field": "year", "gte": 2020}},
    ]
    suite_path = tmp_path / "suite.jsonl"
    suite_path.write_text(
        "".join(
            json.dumps({"target_level": "document", "judgments": {"guide/ops.md": 1}, "subject": STAFF, **c}) + "\n"
            for c in cases
        )
    )
    plan = load_plan()
    retriever = Retriever(bundle, plan=plan)
    spec = EvaluationSpec.build(load_suite(suite_path), plan, bundle, retriever.bundle_id, k=10)
    out = tmp_path / "run"
    run_evaluation(spec, out, retriever_factory=lambda _: retriever)
    _, rows = run_sql(out, "select case_id, document_id from hits where stage = 'final' order by case_id, rank")
    documents: dict[str, set[str]] = {}
    for case_id, document_id in rows:
        documents.setdefault(case_id, set()).add(document_id)
    assert documents["kept"] == {"guide/ops.md"}
    assert "guide/ops.md" not in documents["excluded"] and documents["excluded"]
    assert "guide/ops.md" in documents["unfiltered"] and len(documents["unfiltered"]) > 1
    _, failed = run_sql(out, "select case_id, status, error from cells where error is not null")
    assert failed == [
        (
            "unknown-field",
            "failure",
            "FilterQueryError: filter field 'year' is not in this corpus (known fields: source_role)",
        )
    ]
    retriever.close()
