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
    assert normal_form("  Does ASPIRIN\tlower  risk?! ") == "does aspirin lower risk"
    assert normal_form("Ｆｕｌｌｗｉｄｔｈ Café.") == "fullwidth café"  # NFKC
    assert normal_form("1+1?") != normal_form("1-1?") and normal_form("C++ or C#?") != normal_form("C or C?")
    assert shingles("Why?") == frozenset({"why"})
    assert shingles("abcdef") == frozenset({"abcd", "bcde", "cdef"})


@pytest.mark.parametrize(
    ("first", "second", "jaccard"),
    [
        ("What is the capital of France?", "What is the capital city of France?", 0.7273),
        ("What's the dose of aspirin?", "What is the dose of aspirin?", 0.6786),
        (
            "0-dimensional biomaterials lack inductive properties.",
            "0-dimensional biomaterials show inductive properties.",
            0.75,
        ),
        (
            "Does aspirin lower the risk of stroke?",
            "Does aspirin reduce the risk of stroke?",
            None,
        ),  # a synonym: lexical
        ("Which vitamin deficiency causes scurvy?", "Is scurvy caused by a deficiency of vitamin C?", None),
        ("1+1?", "1-1?", None),
    ],
)
def test_what_counts_as_a_near_duplicate(first: str, second: str, jaccard: float | None):
    report = audit_cases([case("a", first), case("b", second)])
    assert report.duplicates == ()
    assert report.near_duplicates == (() if jaccard is None else (NearDuplicate(a="a", b="b", jaccard=jaccard),))


def test_the_report_names_every_finding_exactly():
    splits = {"a": "dev", "b": "holdout", "c": "dev", "d": "dev", "e": "holdout"}
    report = audit_cases(CASES, splits)
    assert report.cases == 5 and report.threshold == 0.65
    assert report.duplicates == (("a", "b"),)
    assert report.near_duplicates == (
        NearDuplicate(a="a", b="c", jaccard=0.8889),
        NearDuplicate(a="b", b="c", jaccard=0.8889),
    )
    assert report.leakage == (
        Leak(a="a", b="b", kind="duplicate", splits=("dev", "holdout")),
        Leak(a="b", b="c", kind="near_duplicate", splits=("holdout", "dev")),
    )
    # d and e ask different questions about one source: reported, never a leak
    assert report.shared_sources == (SharedSource(source="d3", splits=("dev", "holdout"), cases=("d", "e")),)


def test_cases_without_a_split_take_part_in_duplicates_only():
    report = audit_cases(CASES, {"a": "dev", "c": "holdout"})
    assert report.leakage == (Leak(a="a", b="c", kind="near_duplicate", splits=("dev", "holdout")),)
    assert report.shared_sources == (SharedSource(source="d1", splits=("dev", "holdout"), cases=("a", "c")),)


def test_cases_in_one_split_never_leak():
    report = audit_cases(CASES, dict.fromkeys("abcde", "dev"))
    assert report.duplicates and report.near_duplicates and report.leakage == () and report.shared_sources == ()


def test_a_threshold_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match=r"^near-duplicate threshold must be in \(0, 1\], got 0$"):
        audit_cases(CASES, threshold=0)


WORDS = st.sampled_from(["aspirin", "stroke", "risk", "vitamin", "scurvy", "dose", "trial", "the", "a", "C++"])
QUESTIONS = st.lists(WORDS, min_size=1, max_size=8).map(" ".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(QUESTIONS, min_size=1, max_size=20), st.randoms(use_true_random=False), st.floats(0.05, 1.0))
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
