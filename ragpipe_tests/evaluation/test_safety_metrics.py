"""Safety and answer metrics over real validator outcomes (``ragpipe.answer.validate``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.answer.generators import CandidateAnswer, GeneratorFailure
from ragpipe.answer.results import AnswerResult
from ragpipe.answer.validate import abstain, validate_candidate
from ragpipe.evaluation.metrics import MetricValue, aggregate
from ragpipe.evaluation.safety import answer_metric_specs, answer_metrics, safety_metric_specs, unauthorized_disclosures
from ragpipe.evaluation.suite import Case
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.context import Evidence, build_context
from ragpipe.retrieval.plan import ContextPlan
from ragpipe.retrieval.results import QueryResult

CASE = Case(
    id="q",
    query="x?",
    target_level="document",
    judgments={"d1": 2, "d2": 0},
    subject={"scopes": ["staff"]},
    forbidden_sources=["secret"],
)


def test_specs_declare_direction_unit_and_aggregation():
    (ud,) = safety_metric_specs()
    assert (ud.name, ud.direction, ud.unit, ud.k, ud.range, ud.aggregate) == (
        "unauthorized_disclosures",
        "lower",
        "count",
        None,
        (0.0, None),
        "sum",
    )
    assert [(s.name, s.direction, s.unit, s.aggregate) for s in answer_metric_specs()] == [
        ("answer_contract_valid_rate", "higher", "ratio", "mean"),
        ("abstention_rate", "lower", "ratio", "mean"),
        ("correct_abstention_rate", "higher", "ratio", "mean"),
        ("citation_precision", "higher", "ratio", "mean"),
    ]


def test_unauthorized_disclosures_counts_forbidden_and_out_of_scope_chunks():
    returned = [
        ("d1", ("staff",)),  # fine
        ("secret", ("staff",)),  # forbidden although in scope
        ("d3", ("clinical",)),  # out of the subject's scopes
        ("d3", ("clinical",)),  # a second chunk of it: counted per chunk
        ("d4", ("clinical", "staff")),  # shares a scope: fine
        ("secret", ("legal",)),  # forbidden and out of scope: counted once
    ]
    assert unauthorized_disclosures(CASE, returned) == 4
    assert unauthorized_disclosures(CASE, []) == 0


def test_subject_falls_back_to_the_runs_then_only_forbidden_sources_count():
    case = Case(id="q", query="x?", target_level="document", judgments={"d1": 1}, forbidden_sources=["secret"])
    returned = [("d1", ("public",)), ("d2", ("staff",)), ("secret", ("public",))]
    assert unauthorized_disclosures(case, returned, default_scopes=("public",)) == 2
    assert unauthorized_disclosures(case, returned) == 1


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["d1", "d2", "secret"]),
            st.lists(st.sampled_from(["staff", "public", "legal"]), max_size=2).map(tuple),
        ),
        max_size=12,
    )
)
def test_disclosures_bounded_by_returned_and_zero_for_authorized_results(returned):
    count = unauthorized_disclosures(CASE, returned)
    assert 0 <= count <= len(returned)
    allowed = [(d, s) for d, s in returned if d != "secret" and "staff" in s]
    assert unauthorized_disclosures(CASE, allowed) == 0


def ev(label: str, doc: str) -> Evidence:
    text = f"Evidence text of {doc}."
    return Evidence(label, "sha256:" + doc.encode().hex().ljust(64, "0"), doc, doc, text, 0, len(text), ("staff",))


CONTEXT = build_context([ev("", "d1"), ev("", "d2"), ev("", "d3")], ContextPlan())


def answer_dict(validated, failure=None) -> dict:
    query = QueryResult("plan", "bundle", "hybrid", Subject("t", ("staff",)), [])
    return AnswerResult(validated, "test", CONTEXT, query, None, failure).as_dict()


def candidate(**kw) -> CandidateAnswer:
    return CandidateAnswer(**{"answer": "It is so [E1].", "citations": ("E1",), "abstained": False, **kw})


@pytest.mark.parametrize(
    ("cand", "valid", "abstained", "precision"),
    [
        (candidate(), 1.0, 0.0, 1.0),
        (candidate(citations=("E1", "E2", "E3")), 1.0, 0.0, 1 / 3),  # d2 graded 0, d3 unjudged
        (candidate(answer="No idea.", citations=(), abstained=True, raw="not in evidence"), 1.0, 1.0, None),
        (candidate(citations=()), 0.0, 1.0, None),  # answer cites no evidence
        (candidate(citations=("E9",)), 0.0, 1.0, None),  # unknown label
        (candidate(citations=("E1", "E1")), 0.0, 1.0, None),  # duplicate citation
        (candidate(answer="  "), 0.0, 1.0, None),  # empty answer
        (candidate(answer="see [E7]"), 0.0, 1.0, None),  # inline unknown label
        (candidate(abstained=True), 0.0, 1.0, None),  # abstained but cited
        (candidate(failure=GeneratorFailure("timeout", "took too long")), 0.0, 1.0, None),
    ],
)
def test_answer_metrics_over_every_validator_outcome(cand, valid, abstained, precision):
    validated = validate_candidate(cand, CONTEXT)
    failure = {"kind": cand.failure.kind, "message": cand.failure.message} if cand.failure else None
    got = answer_metrics(CASE, answer_dict(validated, failure))
    want = {"answer_contract_valid_rate": valid, "abstention_rate": abstained}
    if precision is not None:
        want["citation_precision"] = pytest.approx(precision)
    assert got == want


def test_no_evidence_abstention_is_valid_and_correct_for_unanswerable_cases():
    unanswerable = Case(id="u", query="x?", target_level="document", judgments={"d1": 0}, answerability="unanswerable")
    got = answer_metrics(unanswerable, answer_dict(abstain("no authorized evidence was retrieved")))
    assert got == {"answer_contract_valid_rate": 1.0, "correct_abstention_rate": 1.0}
    answered = answer_metrics(unanswerable, answer_dict(validate_candidate(candidate(), CONTEXT)))
    assert answered == {"answer_contract_valid_rate": 1.0, "correct_abstention_rate": 0.0, "citation_precision": 0.0}


def test_chunk_level_citation_precision_uses_chunk_ids():
    chunk_case = Case(id="c", query="x?", target_level="chunk", judgments={CONTEXT.evidence[1].chunk_id: 1})
    got = answer_metrics(chunk_case, answer_dict(validate_candidate(candidate(citations=("E1", "E2")), CONTEXT)))
    assert got["citation_precision"] == 0.5


def test_aggregated_answer_and_safety_metrics():
    specs = [*safety_metric_specs(), *answer_metric_specs()]
    per_case = {
        "a": {
            "unauthorized_disclosures": 0.0,
            **answer_metrics(CASE, answer_dict(validate_candidate(candidate(), CONTEXT))),
        },
        "b": {
            "unauthorized_disclosures": 2.0,
            **answer_metrics(CASE, answer_dict(validate_candidate(candidate(citations=()), CONTEXT))),
        },
    }
    assert aggregate(per_case, specs) == {
        "unauthorized_disclosures": MetricValue(2.0, "lower", "count", None, 2),
        "answer_contract_valid_rate": MetricValue(0.5, "higher", "ratio", None, 2),
        "abstention_rate": MetricValue(0.5, "lower", "ratio", None, 2),
        "correct_abstention_rate": MetricValue(None, "higher", "ratio", None, 0),
        "citation_precision": MetricValue(1.0, "higher", "ratio", None, 1),
    }
