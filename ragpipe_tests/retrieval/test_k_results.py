"""`k` means k: a query returns min(k, matching units) distinct results, the top of the full ranking.

Laws on the channel interface (any representation layout, any tie order a backend may use), then
the same laws end to end on a real bundle with two representations per chunk.
"""

from __future__ import annotations

import random
from collections.abc import Collection

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragpipe.index.hits import Hit
from ragpipe.index.prefilter import Prefilter
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.channels import rank_channel
from ragpipe.retrieval.fusion import fuse
from ragpipe.retrieval.fusion.order import collapse
from ragpipe.retrieval.fusion.rrf import weighted_rrf
from ragpipe.retrieval.plan import DepthPolicy, load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import write_beir


class ListBackend:
    """A channel backend over a fixed list of hits: the top ``depth`` by score, with ties broken
    by a fresh random order on every call (a backend owes no tie order), documents excluded
    before the cut when ``excludes_documents``. Counts what it was asked."""

    def __init__(self, hits: list[Hit], excludes_documents: bool, seed: int):
        self.hits, self.excludes_documents, self.size = hits, excludes_documents, len(hits)
        self.rng = random.Random(seed)
        self.requests: list[tuple[int, int]] = []

    def search(self, depth: int, exclude_documents: Collection[str]) -> list[Hit]:
        assert not exclude_documents or self.excludes_documents
        self.requests.append((depth, len(exclude_documents)))
        pool = [h for h in self.hits if h.document_id not in exclude_documents]
        self.rng.shuffle(pool)
        return sorted(pool, key=lambda h: -h.score)[:depth]  # stable sort: shuffled tie order


@st.composite
def layouts(draw, channel: str = "lexical"):
    """Hits of 1..6 documents x 1..8 chunks x 1..4 representations, a random subset matching,
    scores from a small set (many ties) or continuous."""
    tied = draw(st.booleans())
    score = st.sampled_from([0.5, 1.0, 1.5, 2.0]) if tied else st.floats(0, 10, allow_nan=False, allow_infinity=False)
    hits = []
    for d in range(draw(st.integers(1, 6))):
        for c in range(draw(st.integers(1, 8))):
            for r in range(draw(st.integers(1, 4))):
                if draw(st.integers(0, 4)) > 0:  # about one representation in five does not match
                    hits.append(Hit(channel, f"d{d}:c{c}:r{r}", f"d{d}:c{c}", f"d{d}", draw(score)))
    return hits


policies = st.builds(DepthPolicy, request_multiple=st.integers(1, 4), growth=st.integers(2, 3))


@settings(max_examples=400, deadline=None)
@given(
    layouts(),
    st.integers(1, 60),
    st.sampled_from(["chunk", "document"]),
    policies,
    st.booleans(),
    st.integers(0, 2**32),
)
def test_a_channel_ranks_exactly_the_top_units_of_its_full_ranking(hits, units, level, policy, excludes, seed):
    backend = ListBackend(hits, excludes, seed)
    got = rank_channel(backend, units, level, policy)
    oracle = collapse(hits, level)[:units]  # collapse the full ranking, then cut
    assert got.ranked == oracle  # same units, same representative hits, same ranks
    assert len(got.ranked) == min(units, len({h.chunk_id if level == "chunk" else h.document_id for h in hits}))
    assert [
        (r.requested, r.excluded_documents) for r in got.rounds if r.requested
    ] == backend.requests  # none asked for 0
    assert got.rounds[0].requested == min(policy.request_multiple * units, len(hits))


@settings(max_examples=200, deadline=None)
@given(
    layouts("lexical"),
    layouts("vector"),
    st.integers(1, 40),
    st.integers(1, 20),
    st.sampled_from(["chunk", "document"]),
    st.integers(0, 2**32),
)
def test_fused_top_k_is_k_and_equals_the_oracle(lexical, vector, k, depth, level, seed):
    """Each channel contributes max(depth, k) units, so the fused top k is well defined and has
    min(k, units matched by any channel) items."""
    policy = DepthPolicy()
    units = max(depth, k)
    ranked = {
        name: rank_channel(ListBackend(hits, True, seed), units, level, policy).ranked
        for name, hits in (("lexical", lexical), ("vector", vector))
    }
    weights = {"lexical": 1.0, "vector": 1.0}
    fused = weighted_rrf(ranked, weights, 60.0, level)[:k]
    oracle = weighted_rrf(
        {"lexical": collapse(lexical, level)[:units], "vector": collapse(vector, level)[:units]}, weights, 60.0, level
    )[:k]
    assert fused == oracle
    key = (lambda h: h.chunk_id) if level == "chunk" else (lambda h: h.document_id)
    assert len(fused) == min(k, len({key(h) for h in lexical + vector}))


def test_a_large_document_is_not_read_in_full_at_document_level():
    """One document with 5,000 matching chunks ranked above 30 small ones: with exclusion the
    channel reads a few hundred hits, not the large document's 10,000."""
    hits = [
        Hit("vector", f"big:c{c}:r{r}", f"big:c{c}", "big", 100.0 - c / 1000 - r / 10_000)
        for c in range(5000)
        for r in range(2)
    ]
    hits += [Hit("vector", f"d{d}:c0:r0", f"d{d}:c0", f"d{d}", 1.0 + d / 100) for d in range(30)]
    backend = ListBackend(hits, excludes_documents=True, seed=1)
    got = rank_channel(backend, 20, "document", DepthPolicy())
    assert [r.hit.document_id for r in got.ranked] == ["big"] + [f"d{d}" for d in range(29, 10, -1)]
    assert [(r.requested, r.returned, r.excluded_documents, r.settled) for r in got.rounds] == [
        (40, 40, 0, 1),
        (38, 30, 1, 31),
    ]


def test_units_must_be_positive():
    with pytest.raises(ValueError, match=r"^units must be >= 1, got 0$"):
        rank_channel(ListBackend([], True, 0), 0, "chunk", DepthPolicy())


# --- end to end on a real bundle ------------------------------------------------------------

WORDS = ["aspirin", "stroke", "statin", "cholesterol", "vitamin", "fracture", "insulin", "glucose", "tumour", "marker"]


def _corpus() -> list[dict]:
    rng = random.Random(11)
    docs = []
    for i in range(36):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))) + "."
        doc = {"_id": f"doc-{i:02d}" if i != 7 else "o'brien-note", "title": f"{rng.choice(WORDS)} notes", "text": text}
        if i % 6 == 5:
            doc["metadata"] = {"access_scopes": ["secret"]}
        docs.append(doc)
    return docs


@pytest.fixture(scope="module")
def k_retrievers(tmp_path_factory):
    """Retrievers over one bundle (36 documents, 2 representations per chunk) for plans of
    depth 1 and 3, collapsing by chunk and by document, whose first request asks for 1 or 2
    hits per unit wanted (1: a first request of u hits holds about u/2 chunks, so the channel
    must deepen)."""
    root = tmp_path_factory.mktemp("k")
    _, _, bundle = build_all_stages(root / "home", "k", write_beir(root / "k.jsonl", _corpus()), "beir")
    base = load_plan()
    out, embedder = {}, None
    for level in ("chunk", "document"):
        for depth in (1, 3):
            for multiple in (1, 2):
                channels = {n: c.model_copy(update={"depth": depth}) for n, c in base.channels.items()}
                policy = base.depth_policy.model_copy(update={"request_multiple": multiple})
                plan = base.model_copy(update={"channels": channels, "collapse": level, "depth_policy": policy})
                out[level, depth, multiple] = r = Retriever(bundle, plan=plan, embedder=embedder)
                embedder = r.embedder()
    yield out
    for r in out.values():
        r.close()


def _oracle(r: Retriever, text: str, subject: Subject, k: int, mode: str) -> list[tuple[str, float]]:
    """Collapse each channel's *full* ranking, cut at max(depth, k), fuse, cut at k."""
    plan = r.plan.with_channels({"hybrid": ("lexical", "vector"), "lexical": ("lexical",), "vector": ("vector",)}[mode])
    full = {}
    if "lexical" in plan.channels:
        searcher, _ = r.lexical.searcher_for(subject)
        full["lexical"] = searcher.search(text, 10**6, Prefilter(subject.scopes))
    if "vector" in plan.channels:
        full["vector"] = r.vector.search(r.embedder().embed_query(text), 10**6, Prefilter(subject.scopes))
    ranked = {n: collapse(hits, plan.collapse)[: max(plan.channels[n].depth, k)] for n, hits in full.items()}
    fused = fuse(plan, ranked)  # the checked-in plan's fusion (z-score convex since the SciFact tune)
    return [(f.chunk_id, f.score) for f in fused[:k]]


SUBJECTS = [Subject("anon", ("public",)), Subject("admin", ("public", "secret")), Subject("spy", ("secret",))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    level=st.sampled_from(["chunk", "document"]),
    depth=st.sampled_from([1, 3]),
    multiple=st.sampled_from([1, 2]),
    mode=st.sampled_from(["lexical", "vector", "hybrid"]),
    subject=st.sampled_from(SUBJECTS),
    k=st.integers(1, 80),
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
)
def test_k_results_equal_the_full_ranking_oracle_on_a_real_bundle(
    k_retrievers, level, depth, multiple, mode, subject, k, words
):
    r = k_retrievers[level, depth, multiple]
    text = " ".join(words)
    hits = r.query(text, subject, k=k, mode=mode).hits
    assert [(h["chunk_id"], h["score"]) for h in hits] == _oracle(r, text, subject, k, mode)
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    units = [h["chunk_id"] if level == "chunk" else h["document_id"] for h in hits]
    assert len(set(units)) == len(units)  # distinct after collapse
    assert not {h["document_id"] for h in hits} - {d for d, s in r.scopes.items() if set(s) & set(subject.scopes)}


@pytest.mark.parametrize("mode", ["lexical", "vector", "hybrid"])
def test_k_is_k_where_each_chunk_has_two_representations(k_retrievers, mode):
    """The reported bug: depth 3 asked for 3 *representations*, collapse halved them. Every
    visible chunk matches the vector channel; the lexical channel matches chunks with 'aspirin'."""
    r = k_retrievers["chunk", 3, 1]
    anon = Subject("anon", ("public",))
    visible = [c for c in r.chunks.values() if "secret" not in r.scopes[c.document_id]]
    assert len(r.chunks) == 36 and len(visible) == 30  # one chunk per document; 6 secret
    matching = {
        "lexical": sum("aspirin" in (c.text + r.titles[c.document_id]).lower() for c in visible),
        "vector": 30,
        "hybrid": 30,
    }
    assert 5 < matching["lexical"] < 30
    for k in (1, 3, 10, 29, 30, 31, 100):
        result = r.query("aspirin", anon, k=k, mode=mode, trace=True)
        assert len({h["chunk_id"] for h in result.hits}) == len(result.hits) == min(k, matching[mode]), k
        for name, depth in result.trace["depth"]["channels"].items():
            assert depth["units"] == max(3, k) and depth["ranked"] == min(max(3, k), matching[name])
            assert depth["rounds"][0]["requested"] == min(max(3, k), 60)  # 60 visible rows
    deepened = r.query("aspirin", anon, k=10, mode="vector", trace=True).trace["depth"]["channels"]["vector"]["rounds"]
    assert [(d["requested"], d["returned"]) for d in deepened][:2] == [(10, 10), (20, 20)]


def test_document_level_vector_exclusion_quotes_document_ids(k_retrievers):
    """Round two excludes settled documents in the lancedb prefilter, a quote in an ID included."""
    r = k_retrievers["document", 1, 2]
    admin = Subject("admin", ("public", "secret"))
    vector = r.embedder().embed_query("aspirin stroke")
    everything = r.vector.search(vector, 1000, Prefilter(admin.scopes))
    assert "o'brien-note" in {h.document_id for h in everything}
    rest = r.vector.search(vector, 1000, Prefilter(admin.scopes, exclude_documents=["o'brien-note", "doc-00"]))
    assert {h.representation_id for h in rest} == {
        h.representation_id for h in everything if h.document_id not in ("o'brien-note", "doc-00")
    }


def test_k_must_be_a_positive_integer(k_retrievers):
    r = k_retrievers["chunk", 1, 2]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"^k must be an integer >= 1, got {bad!r}$"):
            r.query("aspirin", k=bad)
