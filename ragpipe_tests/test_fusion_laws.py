"""Laws of ordering, collapse and weighted reciprocal-rank fusion (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.retrieval.fusion import Hit, collapse, hit_key, order_key, weighted_rrf

ids = st.sampled_from(["a", "b", "c", "d"])
scores = st.sampled_from([0.0, 0.5, 1.0, 2.5, -1.0])


@st.composite
def hits(draw, channel: str):
    n = draw(st.integers(0, 12))
    out = []
    for _ in range(n):
        doc = draw(ids)
        chunk = f"{doc}:{draw(st.integers(0, 2))}"
        out.append(Hit(channel, f"{chunk}:r{draw(st.integers(0, 1))}", chunk, doc, draw(scores)))
    return out


@given(hits("x"))
def test_order_is_total_and_deterministic(hs):
    keys = [hit_key(h) for h in hs]
    ranked = sorted(hs, key=hit_key)
    # equal keys imply equal hits, so every input order sorts to the same list
    assert sorted(reversed(hs), key=hit_key) == ranked
    for a in keys:
        for b in keys:
            assert (a < b) + (b < a) + (a == b) == 1  # trichotomy
    assert all(hit_key(x) <= hit_key(y) for x, y in zip(ranked, ranked[1:]))


@given(hits("x"), st.sampled_from(["chunk", "document"]))
def test_collapse_keeps_best_per_key(hs, level):
    ranked = collapse(hs, level)
    keyf = (lambda h: h.chunk_id) if level == "chunk" else (lambda h: h.document_id)
    assert len(ranked) == len({keyf(h) for h in hs})
    assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
    for r in ranked:
        assert hit_key(r.hit) == min(hit_key(h) for h in hs if keyf(h) == keyf(r.hit))


weights = st.floats(min_value=0.1, max_value=5, allow_nan=False)


@given(hits("lexical"), hits("vector"), weights, weights, st.floats(1, 100), st.sampled_from(["chunk", "document"]))
def test_fusion_laws(lex, vec, wl, wv, k, level):
    ranked = {"lexical": collapse(lex, level), "vector": collapse(vec, level)}
    w = {"lexical": wl, "vector": wv}
    fused = weighted_rrf(ranked, w, k, level)
    # invariant to channel order
    swapped = weighted_rrf(dict(reversed(list(ranked.items()))), dict(reversed(list(w.items()))), k, level)
    assert fused == swapped
    keyf = (lambda h: h.chunk_id) if level == "chunk" else (lambda h: h.document_id)
    channel_keys = {keyf(r.hit) for rs in ranked.values() for r in rs}
    assert {f.key for f in fused} == channel_keys  # every fused item comes from some channel, and all do
    for f in fused:
        assert math.isclose(f.score, math.fsum(f.contributions.values()), rel_tol=0, abs_tol=1e-15)
        for name, rank in f.channel_ranks.items():
            assert f.contributions[name] == w[name] / (k + rank)
    assert all(order_key(a.score, a.document_id, a.chunk_id, a.representation_id) <= order_key(b.score, b.document_id, b.chunk_id, b.representation_id) for a, b in zip(fused, fused[1:]))
    # a channel with zero hits changes nothing
    assert weighted_rrf({**ranked, "empty": []}, {**w, "empty": 1.0}, k, level) == fused


def test_fusion_refuses_bad_parameters():
    with pytest.raises(ValueError, match="weight must be finite and > 0"):
        weighted_rrf({"a": []}, {"a": 0.0}, 60, "chunk")
    with pytest.raises(ValueError, match="fusion k must be finite"):
        weighted_rrf({"a": []}, {"a": 1.0}, math.inf, "chunk")
    with pytest.raises(ValueError, match="non-finite lexical score nan"):
        Hit("lexical", "r", "c", "d", math.nan)


def test_fusion_example():
    lex = collapse([Hit("lexical", "r1", "c1", "d1", 3.0), Hit("lexical", "r2", "c2", "d2", 2.0)], "chunk")
    vec = collapse([Hit("vector", "r3", "c2", "d2", 0.9)], "chunk")
    fused = weighted_rrf({"lexical": lex, "vector": vec}, {"lexical": 1.0, "vector": 2.0}, 60, "chunk")
    assert [(f.chunk_id, f.contributions) for f in fused] == [
        ("c2", {"lexical": 1 / 62, "vector": 2 / 61}),
        ("c1", {"lexical": 1 / 61}),
    ]
