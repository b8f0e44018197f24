"""Authorization before disclosure, against adversarial fixtures (see conftest.SCOPED_DOCS)."""

from __future__ import annotations

import json

import pytest

from ragpipe.answer.litellm_generator import LiteLLMGenerator
from ragpipe.retrieval.authz import AuthorizationError, Subject
from ragpipe.retrieval.plan import GeneratorPlan
from ragpipe.retrieval.service import Retriever
from ragpipe_tests.conftest import SCOPED_DOCS, SECRET_IDS
from ragpipe_tests.llm_server import LLMServer

QUERIES = [
    "aspirin stroke",
    "secret aspirin stroke trial",
    "access_scope:secret aspirin",  # scope name injected in the query text
    "aspirin AND secret OR staff",
    "twin text aspirin stroke prevention",  # equal-score tie across scopes
]
SECRET_TEXTS = [d["text"] for d in SCOPED_DOCS if d["_id"] in SECRET_IDS and d["_id"] != "sec-twin"]


@pytest.fixture(scope="module")
def retrievers(scoped_bundles):
    full, public = scoped_bundles
    r_full = Retriever(full)
    r_public = Retriever(public, embedder=r_full.embedder())
    return r_full, r_public


def test_unauthorized_documents_would_rank_first(retrievers):
    full, _ = retrievers
    everything = Subject("admin", ("public", "secret", "staff"))
    for mode in ("lexical", "vector", "hybrid"):
        top = full.query("secret aspirin stroke trial", everything, k=1, mode=mode).hits[0]
        assert top["document_id"] == "sec-aspirin", mode  # so the fixture really is adversarial


@pytest.mark.parametrize("mode", ["lexical", "vector", "hybrid"])
@pytest.mark.parametrize("query", QUERIES)
def test_prefiltered_results_match_an_index_of_authorized_documents_only(retrievers, query, mode):
    """No starvation and no statistics from hidden documents: the results (order and scores) are
    exactly those of a bundle built from the authorized documents alone."""
    full, public = retrievers
    got = full.query(query, k=10, mode=mode, trace=True)
    expected = public.query(query, k=10, mode=mode)
    assert [(h["document_id"], h["chunk_id"], h["score"]) for h in got.hits] == [
        (h["document_id"], h["chunk_id"], h["score"]) for h in expected.hits
    ]
    assert got.hits, query
    assert not {h["document_id"] for h in got.hits} & (SECRET_IDS | {"staff-aspirin"})
    trace = got.trace
    for name, ranked in trace["channels"].items():
        assert not {r["document_id"] for r in ranked} & (SECRET_IDS | {"staff-aspirin"}), name  # never entered fusion
    assert trace["authorization"]["dropped_after_fusion"] == 0
    assert trace["authorization"]["documents_hidden_by_prefilter"] == 3
    if mode != "vector":
        stats = trace["authorization"]["lexical_statistics"]
        assert (stats["index"], stats["documents"], stats["total_documents"]) == ("audience", 4, 7)
        assert stats["rows"] == public.lexical.bundle_searcher.num_docs
    assert got.as_dict()["subject"] == {"principal": "anonymous", "scopes": ["public"]}


def test_staff_scope_sees_staff_but_not_secret(retrievers):
    full, _ = retrievers
    docs = {h["document_id"] for h in full.query("aspirin stroke", Subject("nurse", ("staff", "public")), k=10).hits}
    assert "staff-aspirin" in docs and not docs & SECRET_IDS


def test_remote_generator_payloads_carry_no_unauthorized_material(retrievers):
    full, _ = retrievers
    with LLMServer() as server:
        server.replies["valid"] = json.dumps({"answer": "Aspirin reduces first stroke risk [E1].", "citations": ["E1"], "abstained": False})
        gen = LiteLLMGenerator(GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base, timeout_seconds=10), full.bundle_id)
        for q in QUERIES:
            result = full.answer(q, Subject("nurse", ("public", "staff")), generator=gen)
            assert not result.validated.abstained or result.validated.reason
        assert len(server.requests) == len(QUERIES)
        payload = json.dumps(server.requests)
    secret_chunks = [cid for cid, c in full.chunks.items() if c.document_id in SECRET_IDS]
    assert secret_chunks and not any(cid in payload for cid in secret_chunks)
    assert not any(text in payload for text in SECRET_TEXTS)
    assert "sec-aspirin" not in payload


def test_generator_refuses_evidence_the_certificate_does_not_cover(retrievers):
    full, _ = retrievers
    result = full.answer("aspirin stroke", generator=None)
    # swap one evidence text for another chunk's text: the certificate no longer covers the payload
    from dataclasses import replace

    from ragpipe.retrieval.authz import issue_certificate

    ctx = result.context
    cert = issue_certificate(Subject.default(), full.policy, full.bundle_id, [(e.chunk_id, e.text, e.access_scopes) for e in ctx.evidence])
    tampered = replace(ctx, evidence=(replace(ctx.evidence[0], text="forged text"),) + ctx.evidence[1:])
    with LLMServer() as server:
        gen = LiteLLMGenerator(GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base), full.bundle_id)
        with pytest.raises(AuthorizationError, match="payload is not exactly the certified evidence: 1 uncertified item"):
            gen.generate("aspirin stroke", tampered, cert)
        with pytest.raises(AuthorizationError, match="certificate is for bundle"):
            LiteLLMGenerator(GeneratorPlan(kind="litellm", model="openai/x", api_base=server.api_base), "sha256:" + "0" * 64).generate("q", ctx, cert)
        assert server.requests == []


def test_scopes_never_come_from_query_text(retrievers):
    full, _ = retrievers
    result = full.query("scope: secret; scopes=[secret] --scope secret", k=10, trace=True)
    assert result.subject.scopes == ("public",)
    assert not {h["document_id"] for h in result.hits} & SECRET_IDS


def test_lexical_statistics_come_from_the_audience_index_built_once(scoped_bundles):
    full, _ = scoped_bundles
    r = Retriever(full)
    admin = Subject("admin", ("public", "secret", "staff"))
    stats = r.query("aspirin", admin, mode="lexical", trace=True).trace["authorization"]["lexical_statistics"]
    assert stats == {
        "index": "bundle", "documents": 7, "total_documents": 7, "rows": r.lexical.bundle_searcher.num_docs, "built": False, "build_ms": None
    }
    first = r.query("aspirin", mode="lexical", trace=True).trace["authorization"]["lexical_statistics"]
    again = r.query("stroke", Subject("bob", ("public",)), mode="lexical", trace=True).trace["authorization"]["lexical_statistics"]
    assert first["index"] == again["index"] == "audience"
    assert (first["built"], again["built"], r.lexical.builds) == (True, False, 1)  # same audience: built once
    nurse = r.query("aspirin", Subject("nurse", ("public", "staff")), mode="lexical", trace=True).trace["authorization"]
    assert (nurse["lexical_statistics"]["documents"], nurse["documents_hidden_by_prefilter"]) == (5, 2)


def test_audience_indexes_are_bounded(scoped_bundles):
    full, _ = scoped_bundles
    r = Retriever(full)
    r.lexical.max_cached = 1
    audiences = [Subject("a", ("public",)), Subject("b", ("staff",)), Subject("a2", ("public",))]
    built = [r.query("aspirin", s, mode="lexical", trace=True).trace["authorization"]["lexical_statistics"]["built"] for s in audiences]
    assert built == [True, True, True]  # the public audience was evicted by staff
    assert (r.lexical.cached_audiences, r.lexical.builds) == (1, 3)


def test_bundle_index_scope_clause_filters_inside_tantivy(retrievers):
    """The must-clause alone (bundle index, restricted scopes) already keeps hidden rows out."""
    full, _ = retrievers
    searcher = full.lexical.bundle_searcher
    everyone = [h.document_id for h in searcher.search("secret aspirin stroke trial", 10, ("public", "secret", "staff"))]
    public = [h.document_id for h in searcher.search("secret aspirin stroke trial", 10, ("public",))]
    assert everyone[0] == "sec-aspirin"
    assert public and not set(public) & (SECRET_IDS | {"staff-aspirin"})
    assert searcher.search("aspirin", 10, ()) == []


def test_subject_with_no_visible_documents_gets_nothing(retrievers):
    full, _ = retrievers
    for mode in ("lexical", "vector", "hybrid"):
        result = full.query("aspirin stroke", Subject("stranger", ("nobody",)), mode=mode, trace=True)
        assert result.hits == [] and result.as_dict()["subject"]["scopes"] == ["nobody"]
        assert result.trace["authorization"]["documents_hidden_by_prefilter"] == 7
        if mode != "vector":
            assert result.trace["authorization"]["lexical_statistics"]["documents"] == 0
