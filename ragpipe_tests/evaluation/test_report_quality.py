"""Answer labels in a judged run's report: over cells and over cases, and against reference labels
(``ragpipe.evaluation.report_quality``), on cell records as the runner writes them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.evaluation.judge_spec import LABELS
from ragpipe.evaluation.report_quality import agreement, label_counts


def judged(label: int) -> dict:
    return {"metrics": {"answer_label": float(label)}, "judge_outcome": "judged"}


def by_rule() -> dict:
    return {"metrics": {"answer_label": 0.0}}


def failed(kind: str = "provider") -> dict:
    return {"metrics": {"judge_failure_rate": 1.0}, "judge_outcome": kind}


UNANSWERABLE = {"metrics": {"correct_abstention_rate": 1.0}}


def test_cells_count_each_cell_and_cases_share_one_weight_among_their_repeats():
    cells = [
        ("a", judged(2)),
        ("a", judged(3)),  # a: its repeats disagree, half a case each
        ("b", by_rule()),
        ("b", by_rule()),
        ("c", judged(1)),
        ("c", failed()),  # c: one labelled repeat carries the whole case
        ("d", UNANSWERABLE),
        ("d", UNANSWERABLE),
        ("e", judged(3)),  # e: not evaluated (a failed cell): a cell, never a case
    ]
    counts = label_counts(cells, evaluated=["a", "b", "c", "d"])
    assert counts == {
        "cells": {
            "distribution": {"0_FAIL": 2, "1_PARTIAL": 1, "2_SUBSTANTIAL": 1, "3_AUTHORITATIVE": 2},
            "labelled": 6,
            "by_rule": 2,
            "mean_label": 1.5,
        },
        "cases": {
            "distribution": {"0_FAIL": 1.0, "1_PARTIAL": 1.0, "2_SUBSTANTIAL": 0.5, "3_AUTHORITATIVE": 0.5},
            "labelled": 3,
            "mean_label": 3.5 / 3,
        },
    }


def test_nothing_labelled_has_no_mean():
    counts = label_counts([("a", failed()), ("d", UNANSWERABLE)], evaluated=["a", "d"])
    assert counts["cells"] == {
        "distribution": dict.fromkeys(LABELS, 0),
        "labelled": 0,
        "by_rule": 0,
        "mean_label": None,
    }
    assert counts["cases"] == {"distribution": dict.fromkeys(LABELS, 0.0), "labelled": 0, "mean_label": None}


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1))
def test_the_case_distribution_sums_to_the_cases_and_gives_the_case_mean(labels):
    cells = [(case, judged(label)) for case, ls in labels.items() for label in ls]
    cases = label_counts(cells, evaluated=list(labels))["cases"]
    assert cases["labelled"] == len(labels)
    assert math.isclose(math.fsum(cases["distribution"].values()), len(labels))
    weighted = math.fsum(rank * n for rank, n in enumerate(cases["distribution"].values())) / len(labels)
    assert cases["mean_label"] == pytest.approx(weighted)
    # the metric tables' mean of per-case means, exactly
    assert cases["mean_label"] == math.fsum(math.fsum(ls) / len(ls) for _, ls in sorted(labels.items())) / len(labels)


def test_agreement_compares_each_judged_cell_with_its_case_reference():
    cells = [
        ("a", judged(2)),
        ("a", judged(3)),  # reference 2: one exact, one within one
        ("b", judged(0)),  # reference 3: three apart
        ("c", judged(1)),
        ("c", failed("invalid_output")),  # a failure: counted apart, never a disagreement
        ("d", by_rule()),  # by rule: not the judge's label
        ("e", failed("withheld")),
        ("f", judged(3)),  # no reference: not compared
    ]
    references = {"a": "2_SUBSTANTIAL", "b": "3_AUTHORITATIVE", "c": "3_AUTHORITATIVE", "d": "0_FAIL", "e": "1_PARTIAL"}
    confusion = {ref: dict.fromkeys(LABELS, 0) for ref in LABELS}
    confusion["2_SUBSTANTIAL"].update({"2_SUBSTANTIAL": 1, "3_AUTHORITATIVE": 1})
    confusion["3_AUTHORITATIVE"].update({"0_FAIL": 1, "1_PARTIAL": 1})
    assert agreement(cells, references) == {
        "cells": 4,
        "cases": 3,
        "exact_rate": 0.25,
        "within_one_rate": 0.5,
        "confusion": confusion,
        "disagreements": ["b", "c"],
        "judge_failed": 2,
        "by_rule": 1,
    }


def test_no_reference_label_on_a_judged_case_means_no_agreement_section():
    assert agreement([("a", judged(2)), ("d", UNANSWERABLE)], {"d": "0_FAIL"}) is None
    assert agreement([("a", judged(2))], {}) is None


def test_only_failures_give_an_agreement_of_nothing_compared():
    confusion = {ref: dict.fromkeys(LABELS, 0) for ref in LABELS}
    assert agreement([("a", failed())], {"a": "2_SUBSTANTIAL"}) == {
        "cells": 0,
        "cases": 0,
        "exact_rate": None,
        "within_one_rate": None,
        "confusion": confusion,
        "disagreements": [],
        "judge_failed": 1,
        "by_rule": 0,
    }
