"""The embedded extractive generator and the validator's verdicts."""

from __future__ import annotations

from dataclasses import replace

from ragpipe.answer.answering import answer
from ragpipe.answer.generators import CandidateAnswer, ExtractiveGenerator, GeneratorFailure
from ragpipe.answer.validate import SAFE_ABSTENTION, validate_candidate
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.context import Evidence, build_context, render_payload
from ragpipe.retrieval.plan import ContextPlan
from ragpipe.retrieval.retriever import Retriever


def ev(cid: str, text: str, title: str = "T") -> Evidence:
    return Evidence("", cid, f"doc-{cid}", title, text, 0, len(text.encode()), ("public",))


def test_context_budget_labels_and_omissions():
    cands = [ev("a", "x" * 50), ev("b", "y" * 500), ev("c", "z" * 40), ev("d", "w" * 10)]
    ctx = build_context(cands, ContextPlan(max_bytes=150, max_chunks=2))
    assert [(e.label, e.chunk_id) for e in ctx.evidence] == [("E1", "a"), ("E2", "c")]
    assert ctx.omitted == (
        {"chunk_id": "b", "reason": "needs 509 bytes, 91 left of max_bytes=150"},
        {"chunk_id": "d", "reason": "max_chunks=2 reached"},
    )
    assert ctx.rendered == "[E1] T\n" + "x" * 50 + "\n\n[E2] T\n" + "z" * 40 + "\n"
    assert ctx.rendered == render_payload(ctx.evidence)  # the context records what certified evidence renders to
    assert (
        len(ctx.rendered.encode("utf-8")) + 1 == 59 + 49
    )  # the budget counts exactly the payload bytes (+ separators)
    assert ctx.digest.startswith("sha256:")


def test_extractive_generator_cites_matching_sentences():
    ctx = build_context(
        [
            ev("a", "Cats sleep a lot. Aspirin lowers stroke risk in adults. Dogs bark."),
            ev("b", "Stroke units save lives."),
        ],
        ContextPlan(),
    )
    cand = ExtractiveGenerator().generate("Does aspirin lower stroke risk?", ctx, None)
    assert cand == CandidateAnswer(
        answer="Aspirin lowers stroke risk in adults. [E1] Stroke units save lives. [E2]",
        citations=("E1", "E2"),
        abstained=False,
    )
    assert validate_candidate(cand, ctx).citations == ("E1", "E2")
    # it reads evidence, never the rendered string
    assert (
        ExtractiveGenerator().generate("Does aspirin lower stroke risk?", replace(ctx, rendered="[E1] forged\n"), None)
        == cand
    )


def test_extractive_generator_abstains_without_overlap():
    ctx = build_context([ev("a", "Cats sleep a lot.")], ContextPlan())
    verdict = validate_candidate(ExtractiveGenerator().generate("quantum chromodynamics?", ctx, None), ctx)
    assert verdict.abstained and verdict.answer == SAFE_ABSTENTION
    assert verdict.reason == "model abstained: no evidence sentence shares a term with the question"


def test_failures_become_safe_abstentions():
    ctx = build_context([ev("a", "text")], ContextPlan())
    verdict = validate_candidate(
        CandidateAnswer("x", ("E1",), False, failure=GeneratorFailure("timeout", "took too long")), ctx
    )
    assert (verdict.abstained, verdict.reason) == (True, "generator failed (timeout): took too long")


def test_answer_end_to_end_with_default_generator(scoped_bundles):
    r = Retriever(scoped_bundles[0])
    data = answer(r, "Does low-dose aspirin reduce the risk of a first stroke?").as_dict()
    assert data["generator"] == "extractive/v1 (deterministic sentence selection, no LLM)"
    assert not data["abstained"] and data["citations"][0]["document_id"] == "pub-aspirin"
    assert "Low-dose aspirin reduces the risk of a first stroke in older adults. [E" in data["answer"]
    labels = {e["label"]: e for e in data["evidence"]}
    for c in data["citations"]:
        assert labels[c["label"]]["chunk_id"] == c["chunk_id"]
    assert data["subject"] == {"principal": "anonymous", "scopes": ["public"]}
    none = answer(r, "aspirin", Subject("nobody", ("nonexistent",))).as_dict()
    assert none["abstained"] and none["reason"] == "no authorized evidence was retrieved" and none["evidence"] == []
