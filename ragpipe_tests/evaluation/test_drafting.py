"""Drafting cases against the real local OpenAI-protocol server and a real small bundle: stable
draft IDs, the cache, disclosure, every outcome counted, the budget stop and resume, validation
against the bundle and the exclusion of leaking drafts."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.bundle.verify import open_bundle
from ragpipe.evaluation.draft_spec import DEFAULT_DRAFT_SPEC, DraftSpec, draft_spec, load_draft_spec
from ragpipe.evaluation.drafting import (
    DraftChunk,
    InvalidDraft,
    bundle_corpus,
    choose_chunks,
    draft_case_id,
    draft_chunks,
    draft_input,
    draft_key,
    draft_step,
    exclude_against,
    parse_drafts,
    validate_drafts,
)
from ragpipe.evaluation.suite import Case
from ragpipe.kernel.ids import bytes_digest, content_id
from ragpipe.work.admission import Budget
from ragpipe.work.disclosure import DisclosurePolicy
from ragpipe.work.entries import JsonEntryStore, value_bytes
from ragpipe.work.failures import BudgetExhausted
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.usage import PriceTable
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401
from ragpipe_tests.support.llm_server import LLMServer, draft_reply

PROMPT = (DEFAULT_DRAFT_SPEC.parent / "prompts" / "case_draft.txt").read_text(encoding="utf-8")
ONCE = ExecutionPolicy(max_attempts=1)  # each fault is the chunk's outcome (no retry hides it)
PRICES = PriceTable.model_validate(
    {"schema": "ragpipe.prices/v1", "models": {"openai/draft-test": {"input": 1_000_000, "output": 2_000_000}}}
)
AT = "2026-12-07T21:00:00Z"
CHK_A = "sha256:" + "a" * 64  # chunk IDs are content IDs
ASPIRIN = DraftChunk(
    chunk_id=CHK_A,
    document_id="doc-a",
    title="Aspirin",
    text="Low-dose aspirin reduced stroke risk in older adults.",
    access_scopes=("public",),
)
STAFF = DraftChunk(
    chunk_id="chk-s", document_id="doc-s", title="Notes", text="Internal dosing notes here.", access_scopes=("staff",)
)


def chunk(i: int) -> DraftChunk:
    return DraftChunk(
        chunk_id=f"chk-{i}", document_id=f"doc-{i}", title=f"T{i}", text=f"word{i} alpha beta gamma", access_scopes=()
    )


def spec_for(server: LLMServer, disclosure: DisclosurePolicy | None = None, **fields) -> DraftSpec:
    data = {"model": "openai/draft-test", "api_base": server.api_base, "n": 2, "max_facts": 3, "timeout_seconds": 1.0}
    return draft_spec(data | fields, PROMPT, disclosure)


def drafting(server: LLMServer) -> LLMServer:
    server.scenario, server.responder = "responder", draft_reply
    return server


def test_the_default_spec_loads_and_its_id_covers_the_prompt_and_bounds_but_not_the_timeout():
    spec = load_draft_spec()
    assert (spec.n, spec.max_facts, spec.contract, spec.endpoint) == (2, 3, "ragpipe.case-draft/v1", "openai:default")
    assert spec.spec_id == content_id("case-draft-spec", 1, spec.identity())
    assert "prompt_text" not in spec.identity() and "timeout_seconds" not in spec.identity()
    data = {"model": "openai/x", "n": 2}
    base = draft_spec(data, PROMPT).spec_id
    assert draft_spec(data | {"timeout_seconds": 5}, PROMPT).spec_id == base
    assert draft_spec(data | {"n": 3}, PROMPT).spec_id != base
    assert draft_spec(data | {"max_facts": 4}, PROMPT).spec_id != base
    assert draft_spec(data, PROMPT + " ").spec_id != base


def test_a_spec_out_of_bounds_is_refused_in_one_line(tmp_path):
    from ragpipe.evaluation.draft_spec import DraftSpecError

    path = tmp_path / "draft.yaml"
    path.write_text(f"model: openai/x\nprompt: {DEFAULT_DRAFT_SPEC.parent / 'prompts/case_draft.txt'}\nn: 6\n")
    with pytest.raises(DraftSpecError) as info:
        load_draft_spec(path)
    assert str(info.value) == f"{path}: invalid case-draft spec: n: Input should be less than or equal to 5"


def test_drafts_have_stable_ids_model_provenance_and_are_provisional_cases(tmp_path):
    with drafting(LLMServer()) as server:
        spec = spec_for(server)
        first = draft_chunks(spec, [ASPIRIN], tmp_path / "a", ONCE, PRICES, at=AT)
        again = draft_chunks(spec, [ASPIRIN], tmp_path / "b", ONCE, PRICES, at=AT)  # another cache: asked again
        assert len(server.requests) == 2
    assert first.counts() == {"drafted": 1, "invalid_output": 0, "refused": 0, "provider": 0, "withheld": 0}
    ids = [d["id"] for d in first.drafts]
    assert ids == [d["id"] for d in again.drafts] == [draft_case_id(spec.spec_id, CHK_A, i) for i in (0, 1)]
    digest = content_id("case-draft", 1, {"spec": spec.spec_id, "chunk": CHK_A, "index": 0})
    assert ids[0] == "draft-" + digest.removeprefix("sha256:")[:16]
    assert first.drafts[0] == {
        "id": ids[0],
        "query": "What is reported about Low-dose aspirin reduced stroke risk in older adults?",
        "target_level": "document",
        "expected": ["doc-a"],
        "required_facts": ["Low-dose aspirin reduced stroke"],
        "tags": ["drafted"],
        "provenance": {"author": "model", "by": "openai/draft-test", "model_spec_id": spec.spec_id, "at": AT},
        "review": "provisional",
    }
    case = Case(**first.drafts[1])
    assert (case.provisional, case.judgments, case.required_facts) == (
        True,
        {"doc-a": 2},
        ("risk in older adults.",),
    )
    assert case.provenance.model_dump() == {
        "author": "model",
        "by": "openai/draft-test",
        "at": AT,
        "model_spec_id": spec.spec_id,
    }
    user = server.requests[0]["messages"][1]["content"]
    assert user == "Title: Aspirin\n\nLow-dose aspirin reduced stroke risk in older adults."


def test_chunk_level_drafts_expect_the_chunk(tmp_path):
    with drafting(LLMServer()) as server:
        run = draft_chunks(spec_for(server), [ASPIRIN], tmp_path, ONCE, PRICES, target_level="chunk", at=AT)
    assert [(d["target_level"], d["expected"]) for d in run.drafts] == [("chunk", [CHK_A])] * 2


def test_a_cache_hit_makes_no_request_and_a_changed_text_is_a_new_key(tmp_path):
    with drafting(LLMServer()) as server:
        spec = spec_for(server)
        first = draft_chunks(spec, [ASPIRIN], tmp_path, ONCE, PRICES, at=AT)
        again = draft_chunks(spec, [ASPIRIN], tmp_path, ONCE, PRICES, at=AT)
        assert len(server.requests) == 1
        assert (again.report.cache_hits, again.report.computed) == (1, 0)
        assert again.drafts == first.drafts
        edited = ASPIRIN.model_copy(update={"text": ASPIRIN.text + " More."})
        assert draft_key(spec, edited) != draft_key(spec, ASPIRIN)
        draft_chunks(spec, [edited], tmp_path, ONCE, PRICES, at=AT)
        assert len(server.requests) == 2


def test_a_forged_cache_entry_breaking_the_contract_is_refused_and_drafted_again(tmp_path, caplog):
    with drafting(LLMServer()) as server:
        spec = spec_for(server)
        first = draft_chunks(spec, [ASPIRIN], tmp_path, ONCE, PRICES, at=AT)
        path = JsonEntryStore(tmp_path, "case-draft cache").path_of(first.outcomes[0].key)
        value = json.loads(path.read_text())["value"]
        value["content"] = json.dumps({"cases": []})  # a reply this run would refuse, its digest recomputed
        value["response"]["choices"][0]["message"]["content"] = value["content"]
        path.write_text(
            json.dumps({"key": first.outcomes[0].key, "value": value, "value_digest": bytes_digest(value_bytes(value))})
        )
        with caplog.at_level(logging.WARNING, logger="ragpipe.work.entries"):
            again = draft_chunks(spec, [ASPIRIN], tmp_path, ONCE, PRICES, at=AT)
        assert len(server.requests) == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"case-draft cache: {path}: its reply is not a set of drafts: cases has 0 items, 2 were asked for; "
        f"set aside as {path.name}.refused, computing it again"
    ]
    assert again.drafts == first.drafts


def test_a_withheld_chunk_sends_nothing(tmp_path):
    with drafting(LLMServer()) as server:
        # the local server is treated as a remote endpoint that may receive only public text
        spec = spec_for(server, DisclosurePolicy(endpoints={server.api_base: ("public",)}))
        run = draft_chunks(spec, [STAFF], tmp_path, ONCE, PRICES, at=AT)
        assert (server.connections, run.report) == (0, None)
        mixed = draft_chunks(spec, [STAFF, ASPIRIN], tmp_path, ONCE, PRICES, at=AT)
        assert [m["content"] for m in server.requests[0]["messages"][1:]] == [f"Title: Aspirin\n\n{ASPIRIN.text}"]
    (withheld,) = run.outcomes
    assert (withheld.status, withheld.drafts) == ("withheld", ())
    assert withheld.message == (
        f"chunk chk-s (scopes staff) may not be sent to {spec.endpoint} (it may receive public)"
    )
    assert [o.status for o in mixed.outcomes] == ["withheld", "drafted"]


@pytest.mark.parametrize(
    ("fault", "status", "kind", "message"),
    [
        (
            "content:not json",
            "invalid_output",
            "invalid_output",
            "reply is not JSON (not valid JSON: Expecting value (column 1))",
        ),
        (
            'content:{"cases": [{"question": "Q?", "required_facts": ["f"]}]}',
            "invalid_output",
            "invalid_output",
            "cases has 1 items, 2 were asked for",
        ),
        ("refusal", "refused", "refused", "the model refused: I can't help with judging this."),
        ("429:0", "provider", "rate_limited", None),
        ("timeout", "provider", "timeout", None),
    ],
)
def test_each_fault_is_counted_as_its_kind_and_drafts_nothing(tmp_path, fault, status, kind, message):
    with drafting(LLMServer()) as server:
        server.faults.append(fault)
        run = draft_chunks(spec_for(server), [ASPIRIN], tmp_path, ONCE, PRICES, at=AT)
    (outcome,) = run.outcomes
    assert (outcome.status, outcome.kind, outcome.drafts) == (status, kind, ())
    if message is not None:
        assert outcome.message == message
    assert run.counts()[status] == 1 and sum(run.counts().values()) == 1


def test_a_fenced_reply_is_accepted():
    reply = '```json\n{"cases": [{"question": "Why?", "required_facts": ["because"]}]}\n```'
    assert [d.question for d in parse_drafts(reply, 1, 1)] == ["Why?"]


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ('{"cases": [], "x": 1}', "reply must be an object with exactly the key cases"),
        ('{"cases": {}}', "cases must be a list"),
        (
            '{"cases": [{"question": "Q?"}]}',
            "cases[1] must be an object with exactly the keys question, required_facts",
        ),
        ('{"cases": [{"question": " ", "required_facts": []}]}', "cases[1].question must be a non-empty string"),
        ('{"cases": [{"question": "Q?", "required_facts": ["a", " "]}]}', "cases[1].required_facts[2] is empty"),
        (
            '{"cases": [{"question": "Q?", "required_facts": ["a", "b", "c"]}]}',
            "cases[1].required_facts has 3 facts, at most 2 allowed",
        ),
        ('{"cases": [{"question": "Q?", "required_facts": "a"}]}', "cases[1].required_facts must be a list of strings"),
        (
            '{"cases": [{"question": "' + "q" * 501 + '", "required_facts": []}]}',
            "cases[1].question has 501 characters, more than 500",
        ),
        ('{"cases": [], "cases": []}', "reply is not JSON (cases: duplicate key (first at column 2))"),
    ],
)
def test_a_reply_breaking_the_contract_names_the_rule(reply, why):
    with pytest.raises(InvalidDraft) as info:
        parse_drafts(reply, 1, 2)
    assert str(info.value) == why


def test_a_budget_stop_leaves_the_rest_undrafted_and_a_resume_drafts_only_the_rest(tmp_path):
    chunks = [chunk(i) for i in range(4)]
    with drafting(LLMServer()) as server:
        spec = spec_for(server)
        worst = draft_step(spec, PRICES).worst_cost([draft_input(spec, chunks[0])[1]])
        with pytest.raises(BudgetExhausted) as info:
            draft_chunks(spec, chunks, tmp_path, ONCE, PRICES, budget=Budget(worst), at=AT)
        assert len(server.requests) == 1 and info.value.not_admitted == 3
        assert str(info.value).endswith(
            "(finished items are cached: raise --budget-micros and build again to continue)"
        )
        resumed = draft_chunks(spec, chunks, tmp_path, ONCE, PRICES, budget=Budget(10 * worst), at=AT)
        assert len(server.requests) == 4  # only the three left
    assert (resumed.report.cache_hits, resumed.report.computed) == (1, 3)
    assert resumed.counts()["drafted"] == 4 and len(resumed.drafts) == 8


def _draft(case_id: str, query: str, expected: str = "doc-a", facts=("a fact",), level: str = "document") -> dict:
    spec_id = "sha256:" + "0" * 64
    return {
        "id": case_id,
        "query": query,
        "target_level": level,
        "expected": [expected],
        "required_facts": list(facts),
        "tags": ["drafted"],
        "provenance": {"author": "model", "by": "m", "model_spec_id": spec_id, "at": AT},
        "review": "provisional",
    }


def test_validation_excludes_absent_sources_empty_facts_and_duplicates_with_reasons():
    drafts = [
        _draft("draft-1", "What lowers stroke risk?"),
        _draft("draft-2", "What lowers  STROKE risk"),  # the same normal form
        _draft("draft-3", "Who wrote it?", expected="doc-gone"),
        _draft("draft-4", "Which chunk?", expected="chk-gone", level="chunk"),
        _draft("draft-5", "What dose?", facts=()),
        _draft("draft-6", "What else?", facts=("same", "same")),
        _draft("draft-7", "Which chunk says so?", expected=CHK_A, level="chunk"),
    ]
    kept, excluded = validate_drafts(drafts, {"doc-a"}, {CHK_A})
    assert [c.id for c in kept] == ["draft-1", "draft-7"]
    assert [(e.case_id, e.reason, e.message) for e in excluded] == [
        ("draft-2", "duplicate", "asks what draft-1 asks ('what lowers stroke risk')"),
        ("draft-3", "absent_source", "expected document doc-gone is not in the bundle"),
        ("draft-4", "absent_source", "expected chunk chk-gone is not in the bundle"),
        ("draft-5", "no_facts", "the model gave no required facts"),
        ("draft-6", "invalid_case", "case 'draft-6': 'required_facts' lists 'same' twice"),
    ]


def test_a_draft_leaking_into_another_split_is_excluded_and_one_in_the_same_split_is_a_duplicate():
    existing = Case(**_draft("old-1", "What lowers stroke risk?") | {"provenance": None, "review": "adjudicated"})
    leak, copy, new, again = (
        Case(**_draft("draft-a", "What lowers stroke risk")),
        Case(**_draft("draft-b", "what lowers stroke risk?")),
        Case(**_draft("draft-c", "Which trial enrolled older adults?")),
        Case(**_draft("old-1", "A draft the dataset already holds?")),
    )
    splits = {"old-1": "dev", "draft-a": "holdout", "draft-b": "dev", "draft-c": "holdout"}
    kept, excluded, report = exclude_against([leak, copy, new, again], [existing], splits)
    assert [c.id for c in kept] == ["draft-c"]
    assert [(e.case_id, e.reason, e.message) for e in excluded] == [
        ("old-1", "already_in_dataset", "the dataset already holds this case"),
        ("draft-a", "leakage", "duplicate of case old-1 (dev) in another split (holdout)"),
        ("draft-b", "duplicate", "asks what case old-1 asks"),
    ]
    assert report.cases == 4 and len(report.leakage) == 2  # draft-a ~ old-1 and draft-a ~ draft-b


def test_a_near_duplicate_across_splits_is_leakage():
    existing = Case(**_draft("old-1", "What is the capital of France?"))
    near = Case(**_draft("draft-a", "What is the capital city of France?"))
    kept, excluded, _ = exclude_against([near], [existing], {"old-1": "dev", "draft-a": "holdout"})
    assert kept == [] and [(e.reason, e.message) for e in excluded] == [
        ("leakage", "near duplicate of case old-1 (dev) in another split (holdout)")
    ]


@given(
    st.lists(st.text(alphabet="abcdef0123", min_size=1, max_size=6), max_size=30),
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=0, max_value=2**32),
)
def test_the_chunk_draw_is_a_sorted_subset_fixed_by_ids_count_and_seed(ids, count, seed):
    chosen = choose_chunks(ids, count, seed)
    assert chosen == sorted(chosen) and set(chosen) <= set(ids)
    assert len(chosen) == min(count, len(set(ids)))
    assert choose_chunks(list(reversed(ids)), count, seed) == chosen


def test_drafting_from_a_real_bundle_reads_its_chunks_and_validates_against_it(eval_bundle, tmp_path):  # noqa: F811
    bundle, _ = eval_bundle
    corpus = bundle_corpus(open_bundle(bundle).tables)
    chosen = corpus.select(3, seed=7)
    assert (
        [c.chunk_id for c in chosen] == choose_chunks(corpus.chunks, 3, 7) == [c.chunk_id for c in corpus.select(3, 7)]
    )
    document = chosen[0].document_id
    assert {c.document_id for c in corpus.select(None, 0, [document])} == {document}
    with pytest.raises(ValueError, match="^--documents: document nope is not in the bundle$"):
        corpus.select(None, 0, ["nope"])
    with drafting(LLMServer()) as server:
        run = draft_chunks(spec_for(server), chosen, tmp_path, ONCE, PRICES, at=AT)
        assert len(server.requests) == 3
        sent = sorted(r["messages"][1]["content"] for r in server.requests)  # the runner asks in key order
        assert sent == sorted(f"Title: {c.title}\n\n{c.text}" if c.title else c.text for c in chosen)
    kept, excluded = validate_drafts(run.drafts, corpus.document_ids, corpus.chunk_ids)
    assert {c.expected[0] for c in kept} <= corpus.document_ids
    assert len(kept) + len(excluded) == 6 and all(e.reason == "duplicate" for e in excluded)
    _, gone = validate_drafts(run.drafts, corpus.document_ids - {document}, corpus.chunk_ids)
    assert {e.reason for e in gone if e.case_id.startswith("draft-")} >= {"absent_source"}
