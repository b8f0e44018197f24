"""Authorization before disclosure, against adversarial fixtures (see ragpipe_tests.support.corpora.SCOPED_DOCS)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.answer.answering import answer
from ragpipe.answer.litellm_generator import LiteLLMGenerator
from ragpipe.index.prefilter import Prefilter
from ragpipe.kernel.ids import bytes_digest
from ragpipe.retrieval.authz import AuthorizationError, CertifiedItem, ScopePolicy, Subject, issue_certificate
from ragpipe.retrieval.context import Context, Evidence, render_payload
from ragpipe.retrieval.fusion.order import FusedHit
from ragpipe.retrieval.plan import GeneratorPlan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.corpora import SCOPED_DOCS, SECRET_IDS
from ragpipe_tests.support.llm_server import LLMServer

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


def _fused(chunk, document_id: str | None = None) -> FusedHit:
    """What fusion hands to hydration for ``chunk``, naming ``document_id`` (default: its own)."""
    return FusedHit(chunk.chunk_id, chunk.chunk_id, document_id or chunk.document_id, "rep", 1.0, {}, {})


def test_hydration_rechecks_every_hit_whatever_the_index_claimed(retrievers):
    """Hydration is the last check before text leaves the bundle: it reads the chunk's document
    and that document's scopes from the verified tables, whatever a (misbehaving) index row said,
    and refuses on the first hit the subject may not see — also after a hit of the same query
    whose scope set it allowed (the verdict is kept per scope set, per query)."""
    full, _ = retrievers
    chunk_of = {c.document_id: c for c in full.chunks.values()}
    public, secret = chunk_of["pub-aspirin"], chunk_of["sec-aspirin"]
    nurse = Subject("nurse", ("public",))
    verdicts: dict[tuple[str, ...], bool] = {}
    shown = full._evidence(_fused(public), nurse, verdicts)
    assert (shown.chunk_id, shown.document_id, shown.text, shown.access_scopes) == (
        public.chunk_id,
        "pub-aspirin",
        public.text,
        ("public",),
    )
    assert verdicts == {("public",): True}
    with pytest.raises(AuthorizationError) as hidden:
        full._evidence(_fused(secret), nurse, verdicts)
    assert str(hidden.value) == f"chunk {secret.chunk_id} is not visible to nurse"
    # an index row that files the secret chunk under a public document is refused too
    with pytest.raises(AuthorizationError) as misfiled:
        full._evidence(_fused(secret, "pub-aspirin"), nurse, {})
    assert (
        str(misfiled.value)
        == f"index row names document pub-aspirin for chunk {secret.chunk_id} of document sec-aspirin"
    )
    # one immutable Evidence per chunk serves every query and subject allowed to see it
    assert full._evidence(_fused(public), Subject("admin", ("public", "secret")), {}) is shown
    assert full._evidence(_fused(secret), Subject("admin", ("secret",)), {}).access_scopes == ("secret",)
    # once the secret chunk's Evidence is cached, the nurse is still refused, both ways
    with pytest.raises(AuthorizationError) as again:
        full._evidence(_fused(secret), nurse, {})
    assert str(again.value) == f"chunk {secret.chunk_id} is not visible to nurse"
    with pytest.raises(AuthorizationError) as misfiled_again:
        full._evidence(_fused(secret, "pub-aspirin"), nurse, {})
    assert str(misfiled_again.value) == str(misfiled.value)


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
    got = full.query(query, k=10, mode=mode, audit=True)
    expected = public.query(query, k=10, mode=mode)
    assert [(h["document_id"], h["chunk_id"], h["score"]) for h in got.hits] == [
        (h["document_id"], h["chunk_id"], h["score"]) for h in expected.hits
    ]
    assert got.hits, query
    assert not {h["document_id"] for h in got.hits} & (SECRET_IDS | {"staff-aspirin"})
    trace = got.trace
    for name, ranked in trace["channels"].items():
        assert not {r["document_id"] for r in ranked} & (SECRET_IDS | {"staff-aspirin"}), name  # never entered fusion
    assert trace["authorization"]["dropped_by_recheck"] == 0
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
        server.replies["valid"] = json.dumps(
            {"answer": "Aspirin reduces first stroke risk [E1].", "citations": ["E1"], "abstained": False}
        )
        gen = LiteLLMGenerator(
            GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base, timeout_seconds=10),
            full.bundle_id,
        )
        for q in QUERIES:
            result = answer(full, q, Subject("nurse", ("public", "staff")), generator=gen)
            assert not result.validated.abstained or result.validated.reason
        assert len(server.requests) == len(QUERIES)
        payload = json.dumps(server.requests)
    secret_chunks = [cid for cid, c in full.chunks.items() if c.document_id in SECRET_IDS]
    assert secret_chunks and not any(cid in payload for cid in secret_chunks)
    assert not any(text in payload for text in SECRET_TEXTS)
    assert "sec-aspirin" not in payload


def test_generator_refuses_evidence_the_certificate_does_not_cover(retrievers):
    full, _ = retrievers
    ctx = answer(full, "aspirin stroke", generator=None).context
    cert = issue_certificate(Subject.default(), full.policy, full.bundle_id, ctx.evidence)
    # swap one evidence text (and what it renders to): the certificate no longer covers the payload
    forged = (replace(ctx.evidence[0], text="forged text"),) + ctx.evidence[1:]
    tampered = replace(ctx, evidence=forged, rendered=render_payload(forged))
    with LLMServer() as server:
        gen = LiteLLMGenerator(
            GeneratorPlan(kind="litellm", model="openai/local-test", api_base=server.api_base), full.bundle_id
        )
        with pytest.raises(AuthorizationError) as text_refused:
            gen.generate("aspirin stroke", tampered, cert)
        with pytest.raises(AuthorizationError) as bundle_refused:
            LiteLLMGenerator(
                GeneratorPlan(kind="litellm", model="openai/x", api_base=server.api_base), "sha256:" + "0" * 64
            ).generate("q", ctx, cert)
    assert (
        str(text_refused.value)
        == f"refusing to send: evidence E1 (chunk {ctx.evidence[0].chunk_id}): text differs from the certified text"
    )
    assert (
        str(bundle_refused.value)
        == f"refusing to send: the certificate is for bundle {full.bundle_id}, the adapter serves bundle sha256:{'0' * 64}"
    )
    assert (server.connections, server.requests) == (0, [])


# --- the certificate itself -------------------------------------------------------------------


def _evidence(label: str, title: str, text: str, scopes: tuple[str, ...] = ("public",)) -> Evidence:
    return Evidence(label, f"chunk-{label}", f"doc-{label}", title, text, 0, len(text.encode("utf-8")), scopes)


def _context(evidence: list[Evidence]) -> Context:
    return Context(evidence=tuple(evidence), omitted=(), rendered=render_payload(evidence))


GOLDEN_BUNDLE = "sha256:" + "ab" * 32


def test_certificate_golden_vector():
    """Pins the payload rendering, the payload digest and the certificate's canonical encoding."""
    evidence = [
        _evidence("E1", "Aspirin", "Aspirin lowers risk.  \n"),
        _evidence("E2", "Café", "Crème brûlée.", ("public", "staff")),
    ]
    cert = issue_certificate(Subject("alice", ("staff", "public")), ScopePolicy(), GOLDEN_BUNDLE, evidence)
    payload = "[E1] Aspirin\nAspirin lowers risk.\n\n[E2] Café\nCrème brûlée.\n"
    assert render_payload(evidence) == payload and cert.require_payload(GOLDEN_BUNDLE, _context(evidence)) == payload
    assert (cert.payload_format, cert.payload_digest) == ("evidence-block/v1", bytes_digest(payload.encode("utf-8")))
    assert (
        cert.payload_digest == "sha256:0522500e0ad90f69831df01e2f14c42470ac5601cf38bacc81f54939c162b4a9"
    )  # SHA-256 of the payload bytes (checked with sha256sum)
    assert cert.certificate_id == "sha256:e0aef407a0b054eb38a46d15fc4eca3e6fcc61679b3d79269050a7888bcebe00"
    assert cert.evidence[1] == CertifiedItem(
        "E2", "chunk-E2", bytes_digest("Café".encode()), bytes_digest("Crème brûlée.".encode()), ("public", "staff")
    )
    # v3 binds the release served: recomputed here from RFC 8785 bytes and SHA-256 directly
    release = "sha256:" + "cd" * 32
    served = issue_certificate(
        Subject("alice", ("staff", "public")), ScopePolicy(), GOLDEN_BUNDLE, evidence, release_id=release
    )
    body = {
        "subject": {"principal": "alice", "scopes": ["public", "staff"]},
        "policy_id": ScopePolicy().policy_id,
        "bundle_id": GOLDEN_BUNDLE,
        "release_id": release,
        "evidence": [e.as_dict() for e in served.evidence],
        "payload_format": "evidence-block/v1",
        "payload_digest": cert.payload_digest,
    }
    digest = hashlib.sha256(b"ragpipe/authorization-certificate/v3\0" + rfc8785.dumps(body)).hexdigest()
    assert served.certificate_id == f"sha256:{digest}" != cert.certificate_id


def test_issue_certificate_rechecks_every_item():
    nurse = Subject("nurse", ("public",))
    secret = _evidence("E2", "Memo", "secret", ("secret",))
    with pytest.raises(AuthorizationError, match=r"^chunk chunk-E2 is not visible to nurse$"):
        issue_certificate(nurse, ScopePolicy(), GOLDEN_BUNDLE, [_evidence("E1", "T", "x"), secret])
    with pytest.raises(
        ValueError, match=r"^evidence for chunk chunk- has no label: certify the evidence of a built context$"
    ):
        issue_certificate(nurse, ScopePolicy(), GOLDEN_BUNDLE, [_evidence("", "T", "x")])
    with pytest.raises(ValueError, match=r"^evidence label E1 is used more than once$"):
        issue_certificate(nurse, ScopePolicy(), GOLDEN_BUNDLE, [_evidence("E1", "T", "x"), _evidence("E1", "U", "y")])


_titles = st.text(min_size=0, max_size=20)
_texts = st.text(min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(st.tuples(_titles, _texts), min_size=1, max_size=5), data=st.data())
def test_only_exactly_certified_titles_and_texts_can_be_sent(items, data):
    """Law: the certified payload is returned for the certified context; changing any one title or
    text (even by whitespace the renderer strips) is refused, naming that label and field."""
    evidence = [_evidence(f"E{i}", title, text) for i, (title, text) in enumerate(items, start=1)]
    cert = issue_certificate(Subject.default(), ScopePolicy(), GOLDEN_BUNDLE, evidence)
    payload = cert.require_payload(GOLDEN_BUNDLE, _context(evidence))
    assert payload == render_payload(evidence) and bytes_digest(payload.encode("utf-8")) == cert.payload_digest
    index = data.draw(st.integers(0, len(evidence) - 1))
    field = data.draw(st.sampled_from(["title", "text"]))
    old = getattr(evidence[index], field)
    new = data.draw(st.text(max_size=60).filter(lambda s: s != old))
    changed = list(evidence)
    changed[index] = replace(changed[index], **{field: new})
    with pytest.raises(AuthorizationError) as refused:
        cert.require_payload(GOLDEN_BUNDLE, _context(changed))
    assert (
        str(refused.value)
        == f"refusing to send: evidence E{index + 1} (chunk chunk-E{index + 1}): {field} differs from the certified {field}"
    )


def test_scopes_never_come_from_query_text(retrievers):
    full, _ = retrievers
    result = full.query("scope: secret; scopes=[secret] --scope secret", k=10, trace=True)
    assert result.subject.scopes == ("public",)
    assert not {h["document_id"] for h in result.hits} & SECRET_IDS


def test_lexical_statistics_come_from_the_audience_view_opened_once(scoped_bundles):
    full, _ = scoped_bundles
    r = Retriever(full)
    admin = Subject("admin", ("public", "secret", "staff"))
    searcher, stats = r.lexical.searcher_for(admin)
    assert searcher is r.lexical.bundle_searcher and stats.as_dict() == {
        "index": "bundle",
        "documents": 7,
        "total_documents": 7,
        "rows": r.lexical.bundle_searcher.num_docs,
        "built": False,
        "build_ms": None,
    }
    r.query("aspirin", mode="lexical")  # the public audience's first query opens its view
    r.query("stroke", Subject("bob", ("public",)), mode="lexical")
    view, again = r.lexical.searcher_for(Subject("carol", ("public",)))
    assert (again.index, again.build_ms, again.rows, r.lexical.builds) == (
        "audience",
        None,
        8,
        1,
    )  # 4 public documents × 2 representations; opened once
    _, nurse = r.lexical.searcher_for(Subject("nurse", ("public", "staff")))
    assert (nurse.documents, nurse.total_documents, nurse.build_ms is not None, r.lexical.builds) == (5, 7, True, 2)
    r.lexical.close()


def test_audience_indexes_are_bounded(scoped_bundles):
    full, _ = scoped_bundles
    r = Retriever(full)
    r.lexical.max_views = 1
    audiences = [Subject("a", ("public",)), Subject("b", ("staff",)), Subject("a2", ("public",))]
    builds = []
    for s in audiences:
        r.query("aspirin", s, mode="lexical")
        builds.append(r.lexical.builds)
    assert builds == [1, 2, 3]  # the public audience's view was closed for staff's, then reopened
    assert (r.lexical.cached_audiences, r.lexical.builds) == (1, 3)
    r.lexical.close()


def test_bundle_index_scope_clause_filters_inside_tantivy(retrievers):
    """The must-clause alone (bundle index, restricted scopes) already keeps hidden rows out."""
    full, _ = retrievers
    searcher = full.lexical.bundle_searcher
    everyone = [
        h.document_id
        for h in searcher.search("secret aspirin stroke trial", 10, Prefilter(("public", "secret", "staff")))
    ]
    public = [h.document_id for h in searcher.search("secret aspirin stroke trial", 10, Prefilter(("public",)))]
    assert everyone[0] == "sec-aspirin"
    assert public and not set(public) & (SECRET_IDS | {"staff-aspirin"})
    assert searcher.search("aspirin", 10, Prefilter(())) == []


def test_subject_with_no_visible_documents_gets_nothing(retrievers):
    full, _ = retrievers
    for mode in ("lexical", "vector", "hybrid"):
        result = full.query("aspirin stroke", Subject("stranger", ("nobody",)), mode=mode, audit=True)
        assert result.hits == [] and result.as_dict()["subject"]["scopes"] == ["nobody"]
        assert result.trace["authorization"]["documents_hidden_by_prefilter"] == 7
        if mode != "vector":
            assert result.trace["authorization"]["lexical_statistics"]["documents"] == 0
