"""Suites: canonical form, digest laws, BEIR import, the committed sample suite, bundle checks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.evaluation.suite import (
    SUITE_ID_KIND,
    SUITE_ID_VERSION,
    Case,
    CaseStatus,
    Suite,
    check_against_bundle,
    parse_suite_bytes,
    suite_bytes,
    suite_digest,
    write_suite,
)
from ragpipe.evaluation.suite_beir import import_beir
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.kernel.ids import content_id
from ragpipe_tests.support.paths import SAMPLE

SCIFACT = Path("/work/shared/datasets/scifact")
CHUNK = "sha256:" + "0" * 64

ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=8)
names = st.text("abcdefgh", min_size=1, max_size=5)
scopes = st.text("abcxyz", min_size=1, max_size=4)


@st.composite
def cases(draw, case_id=ids) -> dict:
    level = draw(st.sampled_from(["document", "chunk"]))
    targets = draw(
        st.lists(
            names
            if level == "document"
            else st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda h: "sha256:" + h),
            max_size=4,
            unique=True,
        )
    )
    answerability = draw(st.sampled_from(["answerable", "unanswerable"]))
    top = 1 if answerability == "unanswerable" else 4
    judgments = {t: draw(st.integers(0, top - 1) if top == 1 else st.integers(0, 3)) for t in targets}
    case: dict = {
        "id": draw(case_id),
        "query": draw(st.text(min_size=1, max_size=12).filter(str.strip)),
        "target_level": level,
        "judgments": judgments,
    }
    if draw(st.booleans()):
        case["tags"] = draw(st.lists(names, max_size=3, unique=True))
    if draw(st.booleans()):
        case["answerability"] = answerability
    elif answerability == "unanswerable":
        case["judgments"] = {t: 0 for t in targets}
    if draw(st.booleans()):
        case["subject"] = {"scopes": draw(st.lists(scopes, min_size=1, max_size=3, unique=True))}
    if draw(st.booleans()):
        case["forbidden_sources"] = draw(st.lists(names.map(lambda s: "f-" + s), max_size=2, unique=True))
    return case


suites = st.lists(
    cases(), min_size=1, max_size=6, unique_by=lambda c: __import__("unicodedata").normalize("NFC", c["id"])
)


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


@settings(max_examples=150, deadline=None)
@given(suites, st.randoms(use_true_random=False))
def test_digest_independent_of_line_order_key_order_and_defaults(rows, rnd):
    suite = parse_suite_bytes(jsonl(rows), "a.jsonl")
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    reordered = [dict(sorted(r.items(), reverse=True)) for r in shuffled]
    other = parse_suite_bytes(jsonl(reordered), "b.jsonl")
    assert other.digest == suite.digest and other.cases == suite.cases
    assert [c.id for c in suite.cases] == sorted(c.id for c in suite.cases)


@settings(max_examples=150, deadline=None)
@given(suites)
def test_canonical_round_trip(rows):
    suite = parse_suite_bytes(jsonl(rows), "in.jsonl")
    again = parse_suite_bytes(suite_bytes(suite), "out.jsonl")
    assert again.cases == suite.cases and again.digest == suite.digest
    assert suite_bytes(again) == suite_bytes(suite)  # canonical bytes are a fixed point


@settings(max_examples=100, deadline=None)
@given(suites, st.integers(0, 5), st.integers(0, 3))
def test_digest_changes_with_any_judgment(rows, which, grade):
    suite = parse_suite_bytes(jsonl(rows), "a.jsonl")
    case = suite.cases[which % len(suite.cases)]
    target = CHUNK if case.target_level == "chunk" else "new-doc"
    if target in case.judgments:
        return
    changed = case.model_copy(update={"judgments": {**case.judgments, target: 0}})
    other = Suite.of([changed if c.id == case.id else c for c in suite.cases], "b")
    assert other.digest != suite.digest


def test_digest_pinned_and_source_not_hashed(tmp_path: Path):
    a = tmp_path / "a.jsonl"
    a.write_text('{"id": "q1", "query": "x", "target_level": "document", "judgments": {"d1": 2.0}}\n')
    b = tmp_path / "b.jsonl"
    b.write_text(
        '{"forbidden_sources": [], "judgments": {"d1": 2}, "query": "x", "target_level": "document", '
        '"id": "q1", "tags": [], "answerability": "answerable", "subject": null}'
    )
    sa, sb = load_suite(a), load_suite(b)
    assert sa.source == str(a) and sb.source == str(b)
    # content_id("suite", 1, [canonical case]) — pinned so an encoding change cannot pass unnoticed
    assert sa.digest == sb.digest == "sha256:0f853ff5fbba0252d36f2cddccd20b7f33789fe366c73fbb08eb31d83e573877"
    canonical = [
        {
            "answerability": "answerable",
            "forbidden_sources": [],
            "id": "q1",
            "judgments": {"d1": 2},
            "query": "x",
            "subject": None,
            "tags": [],
            "target_level": "document",
        }
    ]
    assert sa.digest == "sha256:" + hashlib.sha256(b"ragpipe/suite/v1\0" + rfc8785.dumps(canonical)).hexdigest()
    assert suite_bytes(sa) == (
        b'{"answerability":"answerable","forbidden_sources":[],"id":"q1","judgments":{"d1":2},'
        b'"query":"x","subject":null,"tags":[],"target_level":"document"}\n'
    )


def test_write_suite_is_canonical_and_atomic(tmp_path: Path):
    suite = load_suite(SAMPLE / "suite.jsonl")
    out = tmp_path / "copy.jsonl"
    write_suite(suite, out)
    assert out.read_bytes() == (SAMPLE / "suite.jsonl").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.jsonl"]  # no temp left behind


def test_committed_sample_suite_is_the_import_of_the_sample():
    imported = load_suite(SAMPLE, split=["rev-1", "rev-2"])
    committed = load_suite(SAMPLE / "suite.jsonl")
    assert suite_bytes(imported) == (SAMPLE / "suite.jsonl").read_bytes()
    assert committed.digest == imported.digest
    assert len(committed.cases) == 104
    assert committed.digest == "sha256:6f687a0d2ade6e02617b9ba3c61494e86809f75472251e7fcb1c39eb7245f11e"
    assert committed.by_id()["1"] == Case(
        id="1",
        query="0-dimensional biomaterials show inductive properties.",
        target_level="document",
        judgments={"31715818": 1},
        split=["rev-1", "rev-2"],  # the qrels files that judge it
    )


def test_beir_import_of_scifact_test():
    suite = load_suite(SCIFACT)  # split "test" by default; read-only
    assert len(suite.cases) == 300
    assert all(c.target_level == "document" and c.answerability == "answerable" and c.relevant for c in suite.cases)
    assert sum(len(c.judgments) for c in suite.cases) == 339
    assert {c.split for c in suite.cases} == {("test",)}
    assert suite.digest == "sha256:cd2f38a70e82372b496c4b8a3bc313bfc26e07c6f326fc37d454b8bd99644b84"


def revision_documents(name: str) -> set[str]:
    return {json.loads(line)["_id"] for line in (SAMPLE / f"{name}.jsonl").open(encoding="utf-8")}


def test_sample_suite_against_each_revision_skips_and_counts():
    suite = load_suite(SAMPLE / "suite.jsonl")
    for rev, skipped in (
        (
            "rev-1",
            {
                "1379": ("16322674", "17450673", "23557241", "27123743"),
                "1385": ("306006",),
                "1389": ("23895668",),
                "1395": ("17717391",),
            },
        ),
        ("rev-2", {"1137": ("33370",)}),
    ):
        statuses = check_against_bundle(suite, revision_documents(rev), set())
        assert [s.case_id for s in statuses] == [c.id for c in suite.cases]
        assert {s.case_id: s.missing for s in statuses if not s.evaluable} == skipped
        assert {s.reason for s in statuses if not s.evaluable} == {"missing_judged_targets"}
        assert sum(s.evaluable for s in statuses) == 104 - len(skipped)


def test_bundle_check_reasons():
    rows = [
        {"id": "a", "query": "x", "target_level": "document", "judgments": {"d1": 1, "d9": 0}},
        {"id": "b", "query": "x", "target_level": "document", "judgments": {"d1": 0}},
        {"id": "c", "query": "x", "target_level": "document", "judgments": {"d1": 0}, "answerability": "unanswerable"},
        {"id": "d", "query": "x", "target_level": "chunk", "judgments": {CHUNK: 2}},
        {"id": "e", "query": "x", "target_level": "document", "judgments": {"d1": 3}},
    ]
    suite = parse_suite_bytes(jsonl(rows), "s.jsonl")
    assert check_against_bundle(suite, {"d1"}, set()) == [
        CaseStatus("a", False, "missing_judged_targets", ("d9",)),  # a grade-0 target missing still skips
        CaseStatus("b", False, "no_positive_judgment", ()),
        CaseStatus("c", True, None, ()),
        CaseStatus("d", False, "missing_judged_targets", (CHUNK,)),
        CaseStatus("e", True, None, ()),
    ]
    assert check_against_bundle(suite, {"d1", "d9"}, {CHUNK})[3] == CaseStatus("d", True, None, ())


def test_optional_fields_normalised():
    case = Case.model_validate(
        {
            "id": "q",
            "query": "x",
            "target_level": "document",
            "judgments": {"d": 1.0},
            "tags": ["b", "a"],
            "subject": {"scopes": ["staff", "public"]},
            "forbidden_sources": ["z", "y"],
        }
    )
    assert case.judgments == {"d": 1} and type(case.judgments["d"]) is int
    assert (
        case.tags == ("a", "b") and case.subject.scopes == ("public", "staff") and case.forbidden_sources == ("y", "z")
    )
    assert Case.model_validate(case) is case


def test_cases_carry_their_split_and_a_split_less_case_keeps_its_digest(tmp_path):
    """BEIR import records the splits a query is judged in; a case without splits encodes as it
    did before splits existed (its canonical form has no ``split`` key)."""
    plain = Case(id="a", query="q", target_level="document", judgments={"d": 1})
    assert "split" not in plain.canonical()
    assert suite_digest([plain]) == content_id(SUITE_ID_KIND, SUITE_ID_VERSION, [plain.canonical()])
    (tmp_path / "qrels").mkdir()
    (tmp_path / "queries.jsonl").write_text('{"_id": "1", "text": "one"}\n{"_id": "2", "text": "two"}\n')
    (tmp_path / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n2\td2\t1\n")
    suite = import_beir(tmp_path, ["train", "test"])
    assert [(c.id, c.split) for c in suite.cases] == [("1", ("test", "train")), ("2", ("test",))]
    assert [c.id for c in suite.cases_of_split("train")] == ["1"]
