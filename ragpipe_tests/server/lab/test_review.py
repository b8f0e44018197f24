"""The review queue's parts on their own: proposals held for a signature, the edit form's changes,
and the pairwise ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.evaluation.datasets import DatasetError, Proposal, propose
from ragpipe.kernel.ledger import read_ledger
from ragpipe.server.lab.review import (
    PAIRWISE_DOMAIN,
    Proposals,
    ReviewRefusal,
    choices,
    edited_fields,
    pairwise_path,
    record_choice,
)

PROPOSAL = Proposal(
    "d", "sha256:" + "0" * 64, "c", "sha256:" + "1" * 64, "sha256:" + "2" * 64, "accept", {}, None, "rita", "t"
)
CASE = {
    "id": "c",
    "query": "q?",
    "target_level": "document",
    "judgments": {"a": 2, "b": 1, "other": 1},
    "expected": ["a"],
    "acceptable": ["b"],
    "tags": ["x"],
}


def test_a_proposal_is_taken_once_by_its_session_before_it_expires():
    now = [100.0]
    held = Proposals(ttl_s=10, clock=lambda: now[0])
    token = held.put(PROPOSAL, "csrf-1")
    with pytest.raises(ReviewRefusal) as refused:
        held.take(token, "csrf-2")  # another session
    assert (refused.value.code, refused.value.status) == ("unknown_token", 409)
    assert held.take(token, "csrf-1") is PROPOSAL
    with pytest.raises(ReviewRefusal, match="used already"):
        held.take(token, "csrf-1")
    late = held.put(PROPOSAL, "csrf-1")
    now[0] += 10
    with pytest.raises(ReviewRefusal) as refused:
        held.take(late, "csrf-1")
    assert refused.value.code == "expired_token"


def test_the_edit_form_names_only_what_changed():
    form = {"query": " q? ", "tags": "x", "expected": "a", "acceptable": "b", "stratum": "", "quality_label": ""}
    assert edited_fields(CASE, form) == {}
    assert edited_fields(CASE, {**form, "tags": "y, x", "quality_label": "1_PARTIAL"}) == {
        "tags": ["y", "x"],
        "quality_label": "1_PARTIAL",
    }
    # new sources: the grades of every source listed before or after go, the others stay
    assert edited_fields(CASE, {**form, "expected": "b", "acceptable": ""}) == {
        "expected": ["b"],
        "acceptable": [],
        "judgments": {"other": 1},
    }
    assert edited_fields(CASE, {**form, "acceptable": "other"})["judgments"] == {}
    with pytest.raises(DatasetError, match="the edit form has no field 'id'"):
        edited_fields(CASE, {"id": "other"})
    with pytest.raises(DatasetError, match="an object of text fields"):
        edited_fields(CASE, {"tags": ["x"]})


def test_an_edited_source_list_is_a_valid_case(tmp_path: Path):
    from ragpipe.evaluation.datasets import add_cases, create_dataset
    from ragpipe.evaluation.suite import Case

    create_dataset(tmp_path, "d", "production", {"all": 1.0})
    add_cases(tmp_path, "d", [Case(**CASE)])
    edited = edited_fields(Case(**CASE).canonical(), {"expected": "b\nother", "acceptable": ""})
    result = propose(tmp_path, "d", "c", "edit", "rita", edited).result
    assert (result["expected"], result.get("acceptable", []), result["judgments"]) == (
        ["b", "other"],
        [],
        {"b": 2, "other": 2},
    )


def test_pairwise_choices_chain_in_one_ledger(tmp_path: Path):
    assert choices(tmp_path) == ()
    first = {"a": "r1", "b": "r2", "case_id": "c", "repeat": 0, "choice": "a", "by": "sam", "at": "t1"}
    record_choice(tmp_path, first)
    record_choice(tmp_path, {**first, "choice": "tie", "at": "t2"})
    records = read_ledger(pairwise_path(tmp_path), PAIRWISE_DOMAIN).records
    assert [(r.seq, r.kind, r.payload["choice"]) for r in records] == [(1, "choice", "a"), (2, "choice", "tie")]
    assert records[1].prev == records[0].hash
    assert choices(tmp_path) == tuple(records)
