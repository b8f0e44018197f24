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
    """No starvation: the prefiltered results hold exactly the authorized hits an index of the
    authorized documents alone returns. Vector order is identical too; BM25 order may differ,
    because tantivy's IDF and average length are index-wide statistics (docs/retrieval.md)."""
    full, public = retrievers
    got = full.query(query, k=10, mode=mode, trace=True)
    expected = public.query(query, k=10, mode=mode)
    pairs = [(h["document_id"], h["chunk_id"]) for h in got.hits]
    expected_pairs = [(h["document_id"], h["chunk_id"]) for h in expected.hits]
    assert sorted(pairs) == sorted(expected_pairs)
    if mode == "vector":
        assert pairs == expected_pairs
        assert [h["score"] for h in got.hits] == [h["score"] for h in expected.hits]
    assert not {h["document_id"] for h in got.hits} & (SECRET_IDS | {"staff-aspirin"})
    trace = got.trace
    for name, ranked in trace["channels"].items():
        assert not {r["document_id"] for r in ranked} & (SECRET_IDS | {"staff-aspirin"}), name  # never entered fusion
    assert trace["authorization"]["dropped_after_fusion"] == 0
    assert trace["authorization"]["documents_hidden_by_prefilter"] == 3
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
