"""The judge's request (exact messages) and its verdict contract (exact one-line refusals)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.evaluation.judge import (
    INSTRUCTION,
    MAX_REPLY_CHARS,
    CitedEvidence,
    InvalidVerdict,
    answer_digest,
    judge_request,
    parse_verdict,
)
from ragpipe.evaluation.judge_spec import LABELS, load_judge_spec

E1 = CitedEvidence(
    label="E1", title="Aspirin", text="Low-dose aspirin reduced stroke risk.\n", access_scopes=("public",)
)
E3 = CitedEvidence(label="E3", title="Trial", text="The trial followed 19,114 adults.", access_scopes=("staff",))


def verdict(**changes) -> dict:
    base = {
        "label": "2_SUBSTANTIAL",
        "facts": [{"index": 1, "stated": True}, {"index": 2, "stated": False}],
        "claims": [{"text": "Aspirin reduced stroke risk.", "supported_by": ["E1"]}],
        "grounded": True,
        "explanation": "One of two facts.",
    }
    return base | changes


def reply(**changes) -> str:
    return json.dumps(verdict(**changes))


def test_the_request_is_the_prompt_the_contract_and_the_answer_with_its_cited_evidence():
    spec = load_judge_spec()
    request = judge_request(
        spec,
        "Does aspirin prevent strokes?",
        ["aspirin  lowers\nstroke risk", "19,114 adults"],
        "Aspirin lowers stroke risk [E1].",
        ["E3", "E1"],
        [E1, E3],
    )
    assert request.model == "openai/gpt-4o-mini"
    assert (request.temperature, request.max_tokens, request.seed, request.response_format) == (
        0.0,
        1000,
        0,
        "json_object",
    )
    system, user = request.messages
    assert system.role == "system" and system.content == spec.prompt_text.rstrip() + "\n\n" + INSTRUCTION.format(n=2)
    assert user.role == "user"
    assert user.content == (
        "Question:\nDoes aspirin prevent strokes?\n\n"
        "Required facts:\n1. aspirin lowers stroke risk\n2. 19,114 adults\n\n"
        "Answer:\nAspirin lowers stroke risk [E1].\n\n"
        "Citations:\nE3, E1\n\n"
        "Cited evidence:\n[E3] Trial\nThe trial followed 19,114 adults.\n\n[E1] Aspirin\nLow-dose aspirin reduced stroke risk.\n"
    )


def test_an_answer_without_citations_or_facts_says_none():
    request = judge_request(load_judge_spec(), "Q?", [], "", [], [])
    assert request.messages[1].content == (
        "Question:\nQ?\n\nRequired facts:\n(none)\n\nAnswer:\n(empty)\n\nCitations:\n(none)\n\nCited evidence:\n(none)"
    )


@pytest.mark.parametrize(
    ("citations", "evidence", "message"),
    [
        (["E1"], [E1, E3], "cited evidence ['E1', 'E3'] is not exactly the cited labels ['E1']"),
        (["E1", "E3"], [E1], "cited evidence ['E1'] is not exactly the cited labels ['E1', 'E3']"),
        (["E1", "E1"], [E1], "citations repeat a label: ['E1', 'E1']"),
        (["E1"], [E1, E1], "cited evidence ['E1', 'E1'] is not exactly the cited labels ['E1']"),
    ],
)
def test_the_evidence_sent_is_exactly_the_cited_items(citations, evidence, message):
    with pytest.raises(ValueError) as info:
        judge_request(load_judge_spec(), "Q?", [], "A.", citations, evidence)
    assert str(info.value) == message


def test_the_answer_digest_binds_text_citations_and_cited_text_exactly():
    base = answer_digest("Aspirin lowers risk.", ["E1"], [E1])
    assert base == answer_digest("Aspirin lowers risk.", ("E1",), (E1,))
    others = {
        answer_digest("Aspirin lowers risk!", ["E1"], [E1]),
        answer_digest("Aspirin lowers risk.", ["E3"], [E3]),
        answer_digest("Aspirin lowers risk.", ["E1"], [E1.model_copy(update={"text": "Other text."})]),
        answer_digest("Cafe\u0301.", [], []),
        answer_digest("Caf\u00e9.", [], []),  # NFC and NFD are different answers: bytes, not normalised
    }
    assert len(others | {base}) == 6
    # the scopes decide whether to send, not what is judged
    assert answer_digest("A.", ["E1"], [E1.model_copy(update={"access_scopes": ("x",)})]) == answer_digest(
        "A.", ["E1"], [E1]
    )


def test_a_valid_reply_parses_to_its_verdict():
    parsed = parse_verdict(reply(), 2, ["E1", "E3"])
    assert (parsed.label, parsed.score, parsed.stated, parsed.grounded) == ("2_SUBSTANTIAL", 2, 1, True)
    assert [(c.text, c.supported_by) for c in parsed.claims] == [("Aspirin reduced stroke risk.", ("E1",))]
    # no claims: every claim (there is none) has support
    assert parse_verdict(reply(claims=[], grounded=True), 2, []).grounded is True
    assert parse_verdict(reply(facts=[], label="0_FAIL"), 0, ["E1"]).facts == ()


def test_a_fenced_reply_is_accepted_and_text_around_the_fence_is_not():
    assert parse_verdict("```json\n" + reply() + "\n```", 2, ["E1"]).label == "2_SUBSTANTIAL"
    assert parse_verdict("  ```\n" + reply() + "```  ", 2, ["E1"]).label == "2_SUBSTANTIAL"
    with pytest.raises(InvalidVerdict) as info:
        parse_verdict("Here it is:\n```json\n" + reply() + "\n```", 2, ["E1"])
    assert str(info.value) == "reply is not JSON (not valid JSON: Expecting value (column 1))"


LONG = "x" * (MAX_REPLY_CHARS + 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "reply is not JSON (not valid JSON: Expecting value (column 1))"),
        (reply() + reply(), "reply is not JSON (more than one JSON value (column 231))"),
        ("[" * 100 + "]" * 100, "reply is not JSON (nesting deeper than 64 levels (column 65))"),
        (
            '{"label": "0_FAIL", "label": "3_AUTHORITATIVE"}',
            "reply is not JSON (label: duplicate key (first at column 2))",
        ),
        ('{"grounded": NaN}', "reply is not JSON (non-finite number NaN is not JSON)"),
        (LONG, f"reply has {MAX_REPLY_CHARS + 1} characters, more than {MAX_REPLY_CHARS}"),
        (
            reply(explanation="\\ud800").replace("\\\\ud800", "\\ud800"),
            "reply is not valid Unicode text (an unpaired surrogate)",
        ),
        (
            json.dumps(verdict(explanation="\ud800"), ensure_ascii=False),
            "reply is not valid Unicode text (an unpaired surrogate)",
        ),
        (reply(explanation="x" * 501), "explanation has 501 characters, more than 500"),
        (reply(explanation=None), "explanation must be a string"),
        (
            "[]",
            "reply must be an object with exactly the keys label, facts, claims, grounded, explanation (not an object)",
        ),
        (
            json.dumps({k: v for k, v in verdict().items() if k != "grounded"} | {"score": 2}),
            "reply must be an object with exactly the keys label, facts, claims, grounded, explanation "
            "(missing grounded; unexpected score)",
        ),
        (reply(label="3"), 'label must be one of 0_FAIL, 1_PARTIAL, 2_SUBSTANTIAL, 3_AUTHORITATIVE, not "3"'),
        (reply(label=3), "label must be one of 0_FAIL, 1_PARTIAL, 2_SUBSTANTIAL, 3_AUTHORITATIVE, not 3"),
        (
            reply(label=["0_FAIL"]),
            'label must be one of 0_FAIL, 1_PARTIAL, 2_SUBSTANTIAL, 3_AUTHORITATIVE, not ["0_FAIL"]',
        ),
        (reply(facts={"1": True}), "facts must be a list"),
        (
            reply(facts=[{"index": 1, "stated": True}]),
            "facts must have one entry per required fact, indices 1..2 in order, not [1]",
        ),
        (
            reply(facts=[{"index": 1, "stated": True}, {"index": 1, "stated": False}]),
            "facts must have one entry per required fact, indices 1..2 in order, not [1, 1]",
        ),
        (
            reply(facts=[{"index": 2, "stated": True}, {"index": 1, "stated": False}]),
            "facts must have one entry per required fact, indices 1..2 in order, not [2, 1]",
        ),
        (
            reply(facts=[{"index": 1, "stated": "yes"}, {"index": 2, "stated": False}]),
            "facts[1]: index must be an integer and stated a boolean",
        ),
        (
            reply(facts=[{"index": True, "stated": True}, {"index": 2, "stated": False}]),
            "facts[1]: index must be an integer and stated a boolean",
        ),
        (
            reply(facts=[{"index": 1}, {"index": 2, "stated": False}]),
            "facts[1] must be an object with exactly the keys index, stated",
        ),
        (reply(claims="all"), "claims must be a list"),
        (
            reply(claims=[{"text": "x", "supported_by": ["E1"], "why": ""}]),
            "claims[1] must be an object with exactly the keys supported_by, text",
        ),
        (reply(claims=[{"text": " ", "supported_by": ["E1"]}]), "claims[1].text must be a non-empty string"),
        (reply(claims=[{"text": "x", "supported_by": "E1"}]), "claims[1].supported_by must be a list of labels"),
        (reply(claims=[{"text": "x", "supported_by": ["E1", "E1"]}]), "claims[1].supported_by repeats a label"),
        (
            reply(claims=[{"text": "x", "supported_by": ["E2"]}]),
            'claims[1].supported_by names "E2", which the answer does not cite',
        ),
        (reply(grounded="true"), "grounded must be a boolean"),
        (reply(grounded=False), "grounded is false but every claim has support"),
        (
            reply(claims=[{"text": "x", "supported_by": ["E1"]}, {"text": "y", "supported_by": []}]),
            "grounded is true but a claim has no support",
        ),
    ],
)
def test_a_reply_that_breaks_the_contract_is_refused_with_its_rule(text, message):
    with pytest.raises(InvalidVerdict) as info:
        parse_verdict(text, 2, ["E1", "E3"])
    assert str(info.value) == message


@given(
    label=st.sampled_from(LABELS),
    stated=st.lists(st.booleans(), max_size=8),
    claims=st.lists(
        st.tuples(st.text(min_size=1).filter(str.strip), st.sets(st.sampled_from(["E1", "E2", "E3"]))), max_size=6
    ),
    explanation=st.text(max_size=500),
)
def test_every_reply_that_meets_the_contract_parses_to_exactly_what_it_says(label, stated, claims, explanation):
    value = {
        "label": label,
        "facts": [{"index": i + 1, "stated": s} for i, s in enumerate(stated)],
        "claims": [{"text": t, "supported_by": sorted(s)} for t, s in claims],
        "grounded": all(s for _, s in claims),
        "explanation": explanation,
    }
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return  # a lone surrogate in generated text: refused, tested above
    parsed = parse_verdict(json.dumps(value), len(stated), ["E1", "E2", "E3"])
    assert parsed.label == label and parsed.score == LABELS.index(label)
    assert [f.stated for f in parsed.facts] == stated
    assert [(c.text, list(c.supported_by)) for c in parsed.claims] == [(t, sorted(s)) for t, s in claims]
    assert (parsed.grounded, parsed.explanation) == (value["grounded"], explanation)
