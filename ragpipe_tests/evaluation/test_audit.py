"""The case audit: duplicates, near duplicates, leakage across splits and shared sources, exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.evaluation.audit import Leak, NearDuplicate, SharedSource, audit_cases, normal_form, shingles
from ragpipe.evaluation.suite import Case


def case(case_id: str, query: str, source: str = "d1") -> Case:
    return Case(id=case_id, query=query, target_level="document", judgments={source: 1})


CASES = [
    case("a", "Does aspirin lower the risk of stroke in older adults?", "d1"),
    case("b", "does ASPIRIN lower the risk of stroke in older adults", "d2"),  # duplicate of a
    case("c", "Does aspirin lower the risk of a stroke in older adults?", "d1"),  # near a and b
    case("d", "Which vitamin deficiency causes scurvy?", "d3"),
    case("e", "Is scurvy caused by a deficiency of vitamin C?", "d3"),  # shares d3, not the words
]


def test_normal_form_and_shingles():
    assert normal_form("  Does ASPIRIN\tlower… risk?! ") == "does aspirin lower risk"
    assert normal_form("Ｆｕｌｌｗｉｄｔｈ Café") == "fullwidth café"  # NFKC
    assert shingles("Aspirin, stroke?") == frozenset({"aspirin stroke"})
    assert shingles("a b c d") == frozenset({"a b c", "b c d"})


def test_the_report_names_every_finding_exactly():
    splits = {"a": "dev", "b": "holdout", "c": "dev", "d": "dev", "e": "holdout"}
    report = audit_cases(CASES, splits)
    assert report.cases == 5 and report.threshold == 0.8
    assert report.duplicates == (("a", "b"),)
    # a/c and b/c share 6 of 8 + 9 - 6 = 11 shingles: 0.5455 < 0.8, not near at 0.8
    assert report.near_duplicates == ()
    assert report.leakage == (Leak(a="a", b="b", kind="duplicate", splits=("dev", "holdout")),)
    assert report.shared_sources == (SharedSource(source="d3", splits=("dev", "holdout"), cases=("d", "e")),)


def test_a_lower_threshold_finds_the_near_duplicates_and_their_leaks():
    splits = {"a": "dev", "b": "holdout", "c": "holdout"}
    report = audit_cases(CASES, splits, threshold=0.5)
    assert report.near_duplicates == (
        NearDuplicate(a="a", b="c", jaccard=0.5455),
        NearDuplicate(a="b", b="c", jaccard=0.5455),
    )
    assert report.leakage == (
        Leak(a="a", b="b", kind="duplicate", splits=("dev", "holdout")),
        Leak(a="a", b="c", kind="near_duplicate", splits=("dev", "holdout")),
    )
    # d and e have no split: they take part in duplicates only, never in leakage or shared sources
    assert report.shared_sources == (SharedSource(source="d1", splits=("dev", "holdout"), cases=("a", "c")),)


def test_cases_in_one_split_never_leak():
    report = audit_cases(CASES, dict.fromkeys("abcde", "dev"), threshold=0.5)
    assert report.duplicates and report.near_duplicates and report.leakage == () and report.shared_sources == ()


def test_a_threshold_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match=r"^near-duplicate threshold must be in \(0, 1\], got 0$"):
        audit_cases(CASES, threshold=0)


WORDS = st.sampled_from(["aspirin", "stroke", "risk", "vitamin", "scurvy", "dose", "trial", "the"])
QUESTIONS = st.lists(WORDS, min_size=1, max_size=8).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(st.lists(QUESTIONS, min_size=1, max_size=12), st.randoms(use_true_random=False), st.floats(0.05, 1.0))
def test_laws_order_free_exact_and_no_self_pairs(questions, rng, threshold):
    """The report does not depend on the cases' order; a near-duplicate pair is exactly a pair of
    non-duplicates at or above the threshold (checked against all pairs); no case pairs with itself."""
    cases = [case(f"q{i:02d}", q) for i, q in enumerate(questions)]
    shuffled = list(cases)
    rng.shuffle(shuffled)
    report = audit_cases(cases, threshold=threshold)
    assert audit_cases(shuffled, threshold=threshold) == report
    expected = set()
    for i, x in enumerate(cases):
        for y in cases[i + 1 :]:
            sx, sy = shingles(x.query), shingles(y.query)
            if normal_form(x.query) != normal_form(y.query) and len(sx & sy) / len(sx | sy) >= threshold:
                expected.add((x.id, y.id))
    assert {(p.a, p.b) for p in report.near_duplicates} == expected
    assert all(p.a < p.b for p in report.near_duplicates)
    grouped = [i for group in report.duplicates for i in group]
    assert len(grouped) == len(set(grouped))  # each case in at most one duplicate group


def test_the_report_id_binds_its_findings():
    splits = {"a": "dev", "b": "holdout"}
    assert audit_cases(CASES, splits).id == audit_cases(list(reversed(CASES)), splits).id
    assert audit_cases(CASES, splits).id != audit_cases(CASES, {"a": "dev", "b": "dev"}).id
