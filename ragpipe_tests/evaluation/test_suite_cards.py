"""Case cards: expected / acceptable sources as graded judgments, required facts, stratum, quality
label, provenance and review — each rule's exact message, the canonical form (old digests kept)
and the round trip (hypothesis)."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ragpipe.evaluation.suite import (
    ACCEPTABLE_GRADE,
    EXPECTED_GRADE,
    Case,
    CaseProvenance,
    SuiteError,
    parse_suite_bytes,
    suite_bytes,
)
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.kernel.ids import content_id
from ragpipe_tests.evaluation.test_suite import cases as plain_cases

CHUNK = "sha256:" + "ab" * 32
SPEC = "sha256:" + "5" * 64
GOOD = {"id": "q1", "query": "what is x?", "target_level": "document", "judgments": {"d1": 1}}
MODEL = {"author": "model", "by": "drafter-1", "model_spec_id": SPEC, "at": "2026-12-07T21:08:01Z"}
PERSON = {"author": "person", "by": "ana", "at": "2026-12-07T21:08:01.123456Z"}
DROP = object()


def line(**changes: object) -> str:
    case = {**GOOD, **changes}
    return json.dumps({k: v for k, v in case.items() if v is not DROP}) + "\n"


# (case changes, rule after "<file>:1: ")
REFUSED = [
    (dict(judgments=DROP), "missing required field 'judgments' (or 'expected' / 'acceptable')"),
    (dict(expected="d1"), "case 'q1': 'expected' must be an array of strings, got string"),
    (dict(expected=["d2", "d2"]), "case 'q1': 'expected' lists 'd2' twice"),
    (dict(acceptable=[""]), "case 'q1': 'acceptable' must hold non-empty strings, got ''"),
    (
        dict(expected=[CHUNK]),
        f"case 'q1': 'expected' mixes levels: '{CHUNK}' is a chunk ID but target_level is 'document'",
    ),
    (
        dict(target_level="chunk", judgments={CHUNK: 1}, acceptable=["d1"]),
        "case 'q1': 'acceptable' mixes levels: 'd1' is not a chunk ID (sha256:<64 hex>) but target_level is 'chunk'",
    ),
    (
        dict(expected=["a\u0007b"]),
        "case 'q1': 'expected' target 'a\\x07b' is not a valid document ID (1-512 characters, no control characters)",
    ),
    (
        dict(expected=["d2"], acceptable=["d2"]),
        "case 'q1': target 'd2' is in both 'expected' and 'acceptable' (a target has one grade)",
    ),
    (dict(expected=["d1"]), "case 'q1': target 'd1' is 'expected' (grade 2) but 'judgments' grades it 1"),
    (
        dict(judgments={"d1": 0}, acceptable=["d1"]),
        "case 'q1': target 'd1' is 'acceptable' (grade 1) but 'judgments' grades it 0",
    ),
    (
        dict(answerability="unanswerable", judgments=DROP, expected=["d2"]),
        "an unanswerable case has a relevant judgment: 'd2' (from 'expected')",
    ),
    (dict(forbidden_sources=["d2"], acceptable=["d2"]), "forbidden source 'd2' is also judged relevant"),
    (dict(required_facts="x"), "case 'q1': 'required_facts' must be an array of strings, got string"),
    (dict(required_facts=["a", " "]), "case 'q1': 'required_facts' must hold non-empty strings, got ' '"),
    (dict(required_facts=["a", 3]), "case 'q1': 'required_facts' must hold non-empty strings, got 3"),
    (dict(required_facts=["a", "a"]), "case 'q1': 'required_facts' lists 'a' twice"),
    (
        dict(required_facts=[f"f{i}" for i in range(33)]),
        "case 'q1': 'required_facts' has 33 facts, at most 32 allowed",
    ),
    (
        dict(required_facts=["ok", "x" * 501]),
        "case 'q1': 'required_facts' fact 2 has 501 characters, at most 500 allowed",
    ),
    (dict(stratum=3), "case 'q1': 'stratum' must be a string, got number"),
    (dict(stratum=" "), "case 'q1': 'stratum' is empty"),
    (
        dict(quality_label="good"),
        "case 'q1': 'quality_label' must be one of 0_FAIL, 1_PARTIAL, 2_SUBSTANTIAL, 3_AUTHORITATIVE, got 'good'",
    ),
    (
        dict(provenance=["ana"]),
        "case 'q1': 'provenance' must be an object {author, by, at, model_spec_id}, got array",
    ),
    (
        dict(provenance={**PERSON, "email": "a@b"}),
        "case 'q1': unknown field 'provenance.email' (allowed: author, by, model_spec_id, at)",
    ),
    (dict(provenance={"author": "person", "by": "ana"}), "case 'q1': missing required field 'provenance.at'"),
    (
        dict(provenance={**PERSON, "author": "bot"}),
        "case 'q1': 'provenance.author' must be 'person' or 'model', got 'bot'",
    ),
    (dict(provenance={**PERSON, "by": 7}), "case 'q1': 'provenance.by' must be a string, got number"),
    (
        dict(provenance={**PERSON, "by": "a\nb"}),
        "case 'q1': 'provenance.by' must be a non-empty name without control characters, got 'a\\nb'",
    ),
    (
        dict(provenance={**PERSON, "by": "a" * 201}),
        "case 'q1': 'provenance.by' has 201 characters, at most 200 allowed",
    ),
    *(
        (
            dict(provenance={**PERSON, "at": at}),
            f"case 'q1': 'provenance.at' must be an RFC 3339 UTC timestamp (YYYY-MM-DDTHH:MM:SS[.fraction]Z), got {at!r}",
        )
        for at in ("2026-12-07T21:08:01+00:00", "2026-12-07 21:08:01Z", "2026-13-07T21:08:01Z", 1765141681)
    ),
    (
        dict(provenance={**PERSON, "model_spec_id": SPEC}),
        "case 'q1': 'provenance.model_spec_id' is only for author 'model' (a person wrote this case)",
    ),
    (
        dict(provenance={k: v for k, v in MODEL.items() if k != "model_spec_id"}, review="provisional"),
        "case 'q1': a model-authored case needs 'provenance.model_spec_id' (the content ID of the model's spec)",
    ),
    (
        dict(provenance={**MODEL, "model_spec_id": "gpt-x"}, review="provisional"),
        "case 'q1': 'provenance.model_spec_id' must be a content ID (sha256:<64 hex>), got 'gpt-x'",
    ),
    (
        dict(provenance=MODEL),
        "case 'q1': a model-authored case must state 'review' ('provisional' until a person adjudicates it)",
    ),
    (dict(review="draft"), "case 'q1': 'review' must be 'provisional' or 'adjudicated', got 'draft'"),
]


@pytest.mark.parametrize(("changes", "rule"), REFUSED, ids=[r[1][:60] for r in REFUSED])
def test_each_card_rule_is_refused_with_file_line_case_and_rule(tmp_path: Path, changes: dict, rule: str):
    path = tmp_path / "suite.jsonl"
    path.write_text(line(id="q0") + line(**changes), encoding="utf-8")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert str(err.value) == f"{path}:2: {rule}"


def parse(*rows: str) -> tuple[Case, ...]:
    return parse_suite_bytes("".join(rows).encode(), "s.jsonl").cases


def test_expected_and_acceptable_are_graded_judgments_and_judgments_become_optional():
    assert (EXPECTED_GRADE, ACCEPTABLE_GRADE) == (2, 1)
    (case,) = parse(line(judgments=DROP, expected=["d2", "d1"], acceptable=["d3"]))
    assert case.judgments == {"d1": 2, "d2": 2, "d3": 1} and case.relevant == {"d1", "d2", "d3"}
    assert (case.expected, case.acceptable) == (("d1", "d2"), ("d3",))
    # the same grade written twice agrees (the canonical form lists a source in both places)
    (agreeing,) = parse(line(judgments={"d1": 2, "d9": 0}, expected=["d1"]))
    assert agreeing.judgments == {"d1": 2, "d9": 0}
    assert agreeing.canonical()["judgments"] == {"d1": 2, "d9": 0} and agreeing.canonical()["expected"] == ["d1"]
    # an answerable case without a positive target is still read, and skipped against a bundle
    (empty,) = parse(line(judgments=DROP, acceptable=[]))
    assert empty.judgments == {} and "acceptable" not in empty.canonical()


def test_unset_card_fields_are_left_out_and_old_digests_stay():
    (plain,) = parse(line())
    assert plain.canonical() == {
        "id": "q1",
        "query": "what is x?",
        "target_level": "document",
        "judgments": {"d1": 1},
        "tags": [],
        "answerability": "answerable",
        "subject": None,
        "forbidden_sources": [],
    }
    # a person's case is adjudicated by default: spelling that out changes nothing
    (spelled,) = parse(line(review="adjudicated"))
    assert spelled.canonical() == plain.canonical() and spelled.digest == plain.digest
    assert plain.digest == content_id("suite-case", 1, plain.canonical())


def test_a_full_card_canonical_form_and_pinned_digest():
    (card,) = parse(
        line(
            id="draft-1",
            judgments=DROP,
            expected=["d1"],
            acceptable=["d2"],
            required_facts=["x is a letter", "x follows w"],
            stratum="lookup",
            quality_label="2_SUBSTANTIAL",
            provenance=MODEL,
            review="provisional",
        )
    )
    assert card.provisional and card.provenance == CaseProvenance(**MODEL)
    assert card.canonical() == {
        "id": "draft-1",
        "query": "what is x?",
        "target_level": "document",
        "judgments": {"d1": 2, "d2": 1},
        "tags": [],
        "answerability": "answerable",
        "subject": None,
        "forbidden_sources": [],
        "expected": ["d1"],
        "acceptable": ["d2"],
        "required_facts": ["x is a letter", "x follows w"],  # kept in order: a judge answers by position
        "stratum": "lookup",
        "quality_label": "2_SUBSTANTIAL",
        "provenance": MODEL,
        "review": "provisional",
    }
    # a model's case states its review even when adjudicated (its canonical form must parse back)
    written = suite_bytes(parse_suite_bytes(line(provenance=MODEL, review="adjudicated").encode(), "a"))
    (adjudicated,) = parse_suite_bytes(written, "b").cases
    assert adjudicated.canonical()["review"] == "adjudicated" and not adjudicated.provisional
    # golden vector: pins the card's canonical encoding
    expected = "sha256:" + hashlib.sha256(b"ragpipe/suite-case/v1\0" + rfc8785.dumps(card.canonical())).hexdigest()
    assert card.digest == expected == "sha256:6ab3b49c126f584bb510465babc8a8bd7c46dca9d3647458cdd23a80d218c277"


def test_case_built_in_code_obeys_the_card_rules():
    case = Case(
        id="q1", query="x", target_level="document", judgments={}, expected=["d1"], provenance=CaseProvenance(**PERSON)
    )
    assert case.judgments == {"d1": 2} and case.review == "adjudicated" and "review" not in case.canonical()
    with pytest.raises(ValidationError, match=r"case 'q1': a model-authored case must state 'review'"):
        Case(id="q1", query="x", target_level="document", judgments={}, provenance=CaseProvenance(**MODEL))


def test_suite_lists_its_provisional_cases():
    suite = parse_suite_bytes(
        (
            line(id="b", provenance=MODEL, review="provisional")
            + line(id="a", review="provisional")
            + line(id="c", provenance=MODEL, review="adjudicated")
        ).encode(),
        "s.jsonl",
    )
    assert suite.provisional() == ("a", "b")


def test_suite_gives_its_reference_quality_labels_by_case():
    suite = parse_suite_bytes(
        (line(id="b", quality_label="0_FAIL") + line(id="a", quality_label="3_AUTHORITATIVE") + line(id="c")).encode(),
        "s.jsonl",
    )
    assert suite.quality_labels() == {"a": "3_AUTHORITATIVE", "b": "0_FAIL"}


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=10).filter(
    str.strip
)
stamps = st.builds(
    "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}{}Z".format,
    st.integers(1970, 2100),
    st.integers(1, 12),
    st.integers(1, 28),
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
    st.sampled_from(["", ".5", ".123456", ".123456789"]),
)


@st.composite
def cards(draw) -> dict:
    case = draw(plain_cases())
    if case.get("answerability") != "unanswerable":
        targets = sorted(case["judgments"])
        expected = draw(st.lists(st.sampled_from(targets), unique=True)) if targets else []
        acceptable = [t for t in targets if t not in expected and draw(st.booleans())]
        for field, chosen, grade in (("expected", expected, 2), ("acceptable", acceptable, 1)):
            if chosen or draw(st.booleans()):
                case[field] = chosen
            for t in chosen:  # agree in judgments, or leave them to the card
                if draw(st.booleans()):
                    case["judgments"][t] = grade
                else:
                    case["judgments"].pop(t)
        if (expected or acceptable) and draw(st.booleans()):
            case.pop("judgments")
    if draw(st.booleans()):
        case["required_facts"] = draw(st.lists(texts, max_size=4, unique_by=lambda f: unicodedata.normalize("NFC", f)))
    if draw(st.booleans()):
        case["stratum"] = draw(texts)
    if draw(st.booleans()):
        case["quality_label"] = draw(st.sampled_from(["0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"]))
    author = draw(st.sampled_from([None, "person", "model"]))
    if author is not None:
        case["provenance"] = {"author": author, "by": draw(texts), "at": draw(stamps)}
        if author == "model":
            case["provenance"]["model_spec_id"] = "sha256:" + draw(
                st.text("0123456789abcdef", min_size=64, max_size=64)
            )
    if author == "model" or draw(st.booleans()):
        case["review"] = draw(st.sampled_from(["provisional", "adjudicated"]))
    return case


@settings(max_examples=200, deadline=None)
@given(st.lists(cards(), min_size=1, max_size=5, unique_by=lambda c: unicodedata.normalize("NFC", c["id"])))
def test_cards_round_trip_parse_canonical_parse(rows):
    suite = parse_suite_bytes("".join(json.dumps(r) + "\n" for r in rows).encode(), "in.jsonl")
    again = parse_suite_bytes(suite_bytes(suite), "out.jsonl")
    assert again.cases == suite.cases and again.digest == suite.digest
    assert suite_bytes(again) == suite_bytes(suite)
    assert [c.digest for c in again.cases] == [c.digest for c in suite.cases]
    for case in suite.cases:
        grades = {t: 2 for t in case.expected} | {t: 1 for t in case.acceptable}
        assert {t: case.judgments[t] for t in grades} == grades
        assert case.provisional == (case.review == "provisional")
