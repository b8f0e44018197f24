"""The review state ``benchmarks.lab_bench`` builds on a copy of a home (state only; the benchmark's
times are measured, never asserted)."""

from __future__ import annotations

from benchmarks.lab_bench import DRAFTED_BY, REVIEW_DATASET, REVIEW_SUITE, add_drafts
from ragpipe.evaluation.datasets import read_dataset
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.server.lab.review import ReviewReader


def test_every_suite_case_becomes_a_provisional_draft_pending_in_the_queue(tmp_path):
    suite = {c.id: c for c in load_suite(REVIEW_SUITE).cases}
    assert add_drafts(tmp_path, REVIEW_SUITE, REVIEW_DATASET) == len(suite) == 101
    state, _ = read_dataset(tmp_path, REVIEW_DATASET)
    assert state.target == "staging"
    reader = ReviewReader(tmp_path, "staging", None)
    assert reader.datasets() == [REVIEW_DATASET]
    assert reader.dataset(REVIEW_DATASET)[1] == {"pending": 101, "accepted": 0, "rejected": 0}
    queue = reader.queue(REVIEW_DATASET)
    assert [item.case["id"] for item in queue] == sorted(f"draft-{i}" for i in suite)
    for item in queue:
        case = suite[item.case["id"].removeprefix("draft-")]
        assert item.kind == "case" and item.provisional
        assert item.case["query"] == case.query
        assert item.case["expected"] == sorted(t for t, grade in case.judgments.items() if grade > 0)
        assert item.case["provenance"] == DRAFTED_BY
    assert [item.case["id"] for item in reader.queue()] == [item.case["id"] for item in queue]  # no disputed answer
