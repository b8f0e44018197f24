"""Laws of ordering, collapse, weighted reciprocal-rank fusion and score-normalised convex
fusion (hypothesis)."""

from __future__ import annotations

import functools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.index.hits import Hit
from ragpipe.retrieval.fusion import fuse
from ragpipe.retrieval.fusion.convex import (
    affine,
    affine_of,
    bounded_sizes,
    bounded_window,
    normalized_convex,
    population,
)
from ragpipe.retrieval.fusion.order import collapse, hit_key, order_key
from ragpipe.retrieval.fusion.rrf import weighted_rrf
from ragpipe.retrieval.plan import load_plan, parse_plan

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
    assert all(
        order_key(a.score, a.document_id, a.chunk_id, a.representation_id)
        <= order_key(b.score, b.document_id, b.chunk_id, b.representation_id)
        for a, b in zip(fused, fused[1:])
    )
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


# --- score-normalised convex fusion (fusion/convex.py) -----------------------------------------

norms = st.sampled_from(["min_max", "z_score"])
windows = st.integers(1, 15)
levels = st.sampled_from(["chunk", "document"])
free_scores = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def free_hits(draw, channel: str):
    """Hits with arbitrary finite scores (fewer ties than ``hits``)."""
    return [h._replace(score=draw(free_scores)) for h in draw(hits(channel))]


def _key(h: Hit, level: str) -> str:
    return h.chunk_id if level == "chunk" else h.document_id


def _convex(lex, vec, wl, wv, win_l, win_v, norm, level):
    ranked = {"lexical": collapse(lex, level), "vector": collapse(vec, level)}
    return ranked, normalized_convex(
        ranked, {"lexical": wl, "vector": wv}, {"lexical": win_l, "vector": win_v}, norm, level
    )


@given(
    st.one_of(hits("lexical"), free_hits("lexical")),
    st.one_of(hits("vector"), free_hits("vector")),
    weights,
    weights,
    windows,
    windows,
    norms,
    levels,
)
def test_normalized_convex_laws(lex, vec, wl, wv, win_l, win_v, norm, level):
    ranked, fused = _convex(lex, vec, wl, wv, win_l, win_v, norm, level)
    w = {"lexical": wl, "vector": wv}
    win = {"lexical": win_l, "vector": win_v}
    # invariant to channel order
    assert (
        normalized_convex(dict(reversed(list(ranked.items()))), dict(reversed(list(w.items()))), win, norm, level)
        == fused
    )
    # every fused item comes from some channel, and all do, once
    assert sorted(f.key for f in fused) == sorted({_key(r.hit, level) for rs in ranked.values() for r in rs})
    live = sorted(n for n, rs in ranked.items() if rs)
    for f in fused:
        assert f.score == math.fsum(f.contributions.values()) and math.isfinite(f.score)
        assert list(f.contributions) == live  # a channel without hits contributes nothing
        for name in live:
            n = affine(ranked[name], win[name], norm)
            coefficient = w[name] / (wl + wv)
            if name in f.channel_ranks:
                (r,) = [r for r in ranked[name] if _key(r.hit, level) == f.key]
                assert f.channel_ranks[name] == r.rank
                assert f.contributions[name] == coefficient * n(r.hit.score)
            else:  # unseen: the channel's lowest returned score
                assert f.contributions[name] == coefficient * n(ranked[name][-1].hit.score)
        # the representative is the best-ranked channel hit, ties by IDs (never by raw score)
        best = min(
            (r.rank, r.hit.document_id, r.hit.chunk_id, r.hit.representation_id)
            for rs in ranked.values()
            for r in rs
            if _key(r.hit, level) == f.key
        )
        assert (f.document_id, f.chunk_id, f.representation_id) == best[1:]
    keys = [(-f.score, min(f.channel_ranks.values()), f.document_id, f.chunk_id, f.representation_id) for f in fused]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)  # a strict total order


@given(st.one_of(hits("lexical"), free_hits("lexical")), weights, windows, norms, levels)
def test_one_channel_keeps_its_own_order(lex, w, win, norm, level):
    ranked = collapse(lex, level)
    expected = [_key(r.hit, level) for r in ranked]
    alone = normalized_convex({"lexical": ranked}, {"lexical": w}, {"lexical": win}, norm, level)
    assert [f.key for f in alone] == expected
    # beside a channel that returned nothing: the same order
    beside = normalized_convex(
        {"lexical": ranked, "vector": []}, {"lexical": w, "vector": 1.0}, {"lexical": win, "vector": 5}, norm, level
    )
    assert [f.key for f in beside] == expected


def _scaled(hs: list[Hit], factor: float, shift: float = 0.0) -> list[Hit]:
    return [Hit(h.channel, h.representation_id, h.chunk_id, h.document_id, h.score * factor + shift) for h in hs]


@given(
    hits("lexical"),
    free_hits("vector"),
    weights,
    weights,
    windows,
    windows,
    norms,
    levels,
    st.integers(-4, 4),
    st.integers(-4, 4),
)
def test_normalisation_ignores_each_channels_scale(lex, vec, wl, wv, win_l, win_v, norm, level, j, jw):
    """Scaling a channel's scores (or all weights) by a power of two — exact in floating point —
    changes nothing: fusion sees only the shape of each channel's score distribution."""
    _, fused = _convex(lex, vec, wl, wv, win_l, win_v, norm, level)
    assert _convex(lex, _scaled(vec, 2.0**j), wl, wv, win_l, win_v, norm, level)[1] == fused
    assert _convex(lex, vec, wl * 2.0**jw, wv * 2.0**jw, win_l, win_v, norm, level)[1] == fused


@given(
    hits("lexical"), hits("vector"), weights, weights, windows, windows, levels, st.sampled_from([-2.0, -0.5, 1.0, 3.0])
)
def test_min_max_ignores_each_channels_offset(lex, vec, wl, wv, win_l, win_v, level, shift):
    """Shifting a channel's scores changes nothing under min_max (exact on these dyadic scores)."""
    _, fused = _convex(lex, vec, wl, wv, win_l, win_v, "min_max", level)
    assert _convex(_scaled(lex, 1.0, shift), vec, wl, wv, win_l, win_v, "min_max", level)[1] == fused


def test_normalized_convex_examples():
    lex = collapse([Hit("lexical", "r1", "c1", "d1", 3.0), Hit("lexical", "r2", "c2", "d2", 1.0)], "chunk")
    vec = collapse([Hit("vector", "r3", "c2", "d2", 0.75), Hit("vector", "r4", "c3", "d3", 0.25)], "chunk")
    fused = normalized_convex(
        {"lexical": lex, "vector": vec},
        {"lexical": 1.0, "vector": 3.0},
        {"lexical": 100, "vector": 100},
        "min_max",
        "chunk",
    )
    assert [(f.chunk_id, f.score, f.contributions, f.channel_ranks) for f in fused] == [
        ("c2", 0.75, {"lexical": 0.0, "vector": 0.75}, {"lexical": 2, "vector": 1}),
        ("c1", 0.25, {"lexical": 0.25, "vector": 0.0}, {"lexical": 1}),
        ("c3", 0.0, {"lexical": 0.0, "vector": 0.0}, {"vector": 2}),
    ]
    # z_score: lexical 3, 1 -> +1, -1; vector 0.75, 0.25 -> +1, -1. c1 and c2 tie at 0 with best
    # rank 1 each: document ID decides.
    fused = normalized_convex(
        {"lexical": lex, "vector": vec},
        {"lexical": 1.0, "vector": 1.0},
        {"lexical": 100, "vector": 100},
        "z_score",
        "chunk",
    )
    assert [(f.chunk_id, f.score, f.contributions) for f in fused] == [
        ("c1", 0.0, {"lexical": 0.5, "vector": -0.5}),
        ("c2", 0.0, {"lexical": -0.5, "vector": 0.5}),
        ("c3", -1.0, {"lexical": -0.5, "vector": -0.5}),
    ]
    # a window of one unit (or of equal scores) carries no order: the channel contributes 0
    fused = normalized_convex(
        {"lexical": lex, "vector": vec},
        {"lexical": 1.0, "vector": 1.0},
        {"lexical": 1, "vector": 100},
        "min_max",
        "chunk",
    )
    assert [(f.chunk_id, f.contributions) for f in fused] == [
        ("c2", {"lexical": 0.0, "vector": 0.5}),
        ("c1", {"lexical": 0.0, "vector": 0.0}),
        ("c3", {"lexical": 0.0, "vector": 0.0}),
    ]


def test_normalized_convex_refuses_bad_input():
    lex = collapse([Hit("lexical", "r1", "c1", "d1", 1e308), Hit("lexical", "r2", "c2", "d2", -1e308)], "chunk")
    for norm in ("min_max", "z_score"):
        with pytest.raises(ValueError, match=rf"^scores overflow the {norm} normalisation \(centre "):
            normalized_convex({"lexical": lex}, {"lexical": 1.0}, {"lexical": 10}, norm, "chunk")
    # the window's spread is finite, but an item below it falls off the scale
    deep = collapse(
        [
            Hit("lexical", "r1", "c1", "d1", 1e308),
            Hit("lexical", "r2", "c2", "d2", 9e307),
            Hit("lexical", "r3", "c3", "d3", -1e308),
        ],
        "chunk",
    )
    with pytest.raises(ValueError, match=r"^fusion: channel 'lexical' gives a non-finite normalised score -inf$"):
        normalized_convex({"lexical": deep}, {"lexical": 1.0}, {"lexical": 2}, "min_max", "chunk")
    with pytest.raises(ValueError, match=r"^channel 'lexical' weight must be finite and > 0, got nan$"):
        normalized_convex({"lexical": lex}, {"lexical": math.nan}, {"lexical": 10}, "min_max", "chunk")
    with pytest.raises(ValueError, match=r"^unknown score normalisation 'rank' \(min_max, z_score\)$"):
        normalized_convex({"lexical": lex}, {"lexical": 1.0}, {"lexical": 10}, "rank", "chunk")
    with pytest.raises(ValueError, match=r"^normalisation window must be >= 1, got 0$"):
        normalized_convex({"lexical": lex}, {"lexical": 1.0}, {"lexical": 0}, "z_score", "chunk")


@given(hits("lexical"), hits("vector"), st.sampled_from([1, 2, 50]), levels)
def test_fuse_dispatches_on_the_plan(lex, vec, depth, level):
    ranked = {"lexical": collapse(lex, level), "vector": collapse(vec, level)}
    raw = load_plan().model_dump(mode="json", by_alias=True)
    raw["collapse"] = level
    raw["channels"] = {"lexical": {"depth": depth, "weight": 1.0}, "vector": {"depth": depth, "weight": 2.0}}
    raw["fusion"] = {"kind": "weighted_rrf", "k": 60}
    assert fuse(parse_plan(raw, "x"), ranked) == weighted_rrf(ranked, {"lexical": 1.0, "vector": 2.0}, 60.0, level)
    raw["fusion"] = {"kind": "normalized_convex", "normalization": "z_score"}
    expected = normalized_convex(
        ranked, {"lexical": 1.0, "vector": 2.0}, {"lexical": depth, "vector": depth}, "z_score", level
    )
    assert fuse(parse_plan(raw, "x"), ranked) == expected
    raw["fusion"] = {"kind": "bounded_convex", "normalization": "z_score"}
    expected = bounded_convex(
        ranked, {"lexical": 1.0, "vector": 2.0}, {"lexical": depth, "vector": depth}, "z_score", level
    )
    assert fuse(parse_plan(raw, "x"), ranked) == expected
    raw["fusion"] = {"kind": "bounded_convex", "normalization": "z_score", "window": "eligible"}
    expected = bounded_convex(
        ranked, {"lexical": 1.0, "vector": 2.0}, {"lexical": depth, "vector": depth}, "z_score", level, eligible=True
    )
    assert fuse(parse_plan(raw, "x"), ranked) == expected


# --- bounded convex fusion (fusion/convex.py, "bounded") ---------------------------------------

bounded_convex = functools.partial(normalized_convex, bounded=True)


def _bounded(lex, vec, wl, wv, win_l, win_v, norm, level, eligible):
    ranked = {"lexical": collapse(lex, level), "vector": collapse(vec, level)}
    return ranked, bounded_convex(
        ranked, {"lexical": wl, "vector": wv}, {"lexical": win_l, "vector": win_v}, norm, level, eligible=eligible
    )


@given(
    st.one_of(hits("lexical"), free_hits("lexical")),
    st.one_of(hits("vector"), free_hits("vector")),
    weights,
    weights,
    windows,
    windows,
    norms,
    levels,
    st.booleans(),
)
def test_bounded_convex_laws(lex, vec, wl, wv, win_l, win_v, norm, level, eligible):
    ranked, fused = _bounded(lex, vec, wl, wv, win_l, win_v, norm, level, eligible)
    w = {"lexical": wl, "vector": wv}
    win = {"lexical": win_l, "vector": win_v}
    reordered = dict(reversed(list(ranked.items()))), dict(reversed(list(w.items())))
    assert bounded_convex(*reordered, win, norm, level, eligible=eligible) == fused
    assert sorted(f.key for f in fused) == sorted({_key(r.hit, level) for rs in ranked.values() for r in rs})
    live = sorted(n for n, rs in ranked.items() if rs)
    for f in fused:
        assert f.score == math.fsum(f.contributions.values()) and math.isfinite(f.score)
        assert list(f.contributions) == live
        units = population(ranked, win) if eligible else None
        for name in live:
            scores, floor = bounded_window(name, ranked[name], win[name], units)
            # the window is exactly its size, or the units the query could rank (never fewer than
            # the channel returned); a short channel is filled with its floor
            size = win[name] if units is None else min(win[name], max(units, len(ranked[name])))
            assert len(scores) == size and floor <= min(scores)
            # the floor lies outside the window only when the channel returned every unit the query
            # could rank (nothing is padded; no unit is left for the floor to score)
            assert floor == min(scores) or len(ranked[name]) == size < win[name]
            if len(ranked[name]) < win[name]:
                lowest = ranked[name][-1].hit.score
                assert floor == (min(0.0, lowest) if name == "lexical" else lowest)
            n = affine_of(scores, norm)
            coefficient = w[name] / (wl + wv)
            rank = f.channel_ranks.get(name)
            if rank is not None and rank <= size:
                (r,) = [r for r in ranked[name] if _key(r.hit, level) == f.key]
                assert f.contributions[name] == coefficient * n(r.hit.score)
            else:  # below the window, or not returned: the floor — no further say
                assert f.contributions[name] == coefficient * n(floor)

    # ties: the best rank inside a window before any rank below one, then the representative's IDs
    def standing(f):
        return min((0 if rank <= win[name] else 1, rank) for name, rank in f.channel_ranks.items())

    keys = [(-f.score, standing(f), f.document_id, f.chunk_id, f.representation_id) for f in fused]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


@given(
    st.one_of(hits("lexical"), free_hits("lexical")),
    st.one_of(hits("vector"), free_hits("vector")),
    windows,
    windows,
    norms,
    levels,
    st.integers(0, 12),
    st.booleans(),
)
def test_bounded_convex_does_not_depend_on_how_deep_channels_were_read(
    lex, vec, win_l, win_v, norm, level, extra, eligible
):
    """Every item inside some channel's window has the same fused score, representative and order
    however deep the channels were read (a query's k), and comes before every item inside none."""
    ranked = {"lexical": collapse(lex, level), "vector": collapse(vec, level)}
    win = {"lexical": win_l, "vector": win_v}
    w = {"lexical": 1.0, "vector": 1.0}
    deep = bounded_convex(ranked, w, win, norm, level, eligible=eligible)
    read = {n: rs[: win[n] + extra] for n, rs in ranked.items()}
    shallow = bounded_convex(read, w, win, norm, level, eligible=eligible)

    def inside(fused):
        keys = {_key(r.hit, level) for n, rs in ranked.items() for r in rs[: win[n]]}
        head = [(f.key, f.score, f.chunk_id, f.representation_id) for f in fused if f.key in keys]
        assert [f.key for f in fused[: len(head)]] == [h[0] for h in head]  # before every other item
        return head

    assert inside(shallow) == inside(deep)


def test_bounded_convex_depth_law_examples():
    """Unequal windows, all scores tied (a case Hypothesis found against the first version, which let
    a rank below a window break ties): reading deeper changes nothing inside the windows."""
    lex = collapse([Hit("lexical", "a:0:r0", "a:0", "a", 0.5), Hit("lexical", "c:1:r0", "c:1", "c", 0.5)], "chunk")
    vec = collapse(
        [Hit("vector", f"{c}:r0", c, c[0], 0.5) for c in ("a:1", "b:0", "c:1", "d:0", "e:0")],
        "chunk",
    )
    win = {"lexical": 1, "vector": 4}
    w = {"lexical": 1.0, "vector": 1.0}
    deep = bounded_convex({"lexical": lex, "vector": vec}, w, win, "z_score", "chunk")
    shallow = bounded_convex({"lexical": lex[:1], "vector": vec[:4]}, w, win, "z_score", "chunk")
    assert [f.key for f in shallow] == ["a:0", "a:1", "b:0", "c:1", "d:0"]
    assert [f.key for f in deep] == ["a:0", "a:1", "b:0", "c:1", "d:0", "e:0"]
    # document level: a document's representative is its best hit inside a window, not a deeper one
    lexd = collapse([Hit("lexical", f"{d}:r", f"{d}:x", d, 3.0 - i) for i, d in enumerate("PQRD")], "document")
    vecd = collapse(
        [Hit("vector", f"{d}:r", f"{d}:y" if d == "D" else f"{d}:x", d, 1.0 - i / 10) for i, d in enumerate("STUVWD")],
        "document",
    )
    win = {"lexical": 2, "vector": 6}
    deep = bounded_convex({"lexical": lexd, "vector": vecd}, w, win, "min_max", "document")
    shallow = bounded_convex({"lexical": lexd[:2], "vector": vecd}, w, win, "min_max", "document")
    (d_deep,) = [f for f in deep if f.key == "D"]
    (d_shallow,) = [f for f in shallow if f.key == "D"]
    assert (d_deep.chunk_id, d_deep.score) == (d_shallow.chunk_id, d_shallow.score) == ("D:y", d_shallow.score)


@given(st.one_of(hits("lexical"), free_hits("lexical")), weights, windows, norms, levels)
def test_bounded_one_channel_keeps_its_own_order(lex, w, win, norm, level):
    ranked = collapse(lex, level)
    alone = bounded_convex({"lexical": ranked}, {"lexical": w}, {"lexical": win}, norm, level)
    assert [f.key for f in alone] == [_key(r.hit, level) for r in ranked]


def test_bounded_convex_examples():
    """A lexical channel that matched two documents is judged over its whole window (the rest score
    0): its first document outranks the vector channel's first, where plain z-scoring over the two
    returned scores (+1, -1) lets the vector channel's pick win."""
    lex = collapse([Hit("lexical", "r1", "c1", "d1", 8.0), Hit("lexical", "r2", "c2", "d2", 2.0)], "chunk")
    # the vector channel ranks c3..c11 first and the lexical channel's c1 tenth (scores 1.0 .. 0.55)
    order = [3, 4, 5, 6, 7, 8, 9, 10, 11, 1]
    vec = collapse([Hit("vector", f"v{i}", f"c{i}", f"d{i}", 1.0 - 0.05 * j) for j, i in enumerate(order)], "chunk")
    channels, weights_, win = (
        {"lexical": lex, "vector": vec},
        {"lexical": 1.0, "vector": 1.0},
        {"lexical": 10, "vector": 10},
    )
    assert [f.chunk_id for f in normalized_convex(channels, weights_, win, "z_score", "chunk")][:2] == ["c3", "c4"]
    bounded = bounded_convex(channels, weights_, win, "z_score", "chunk")
    assert [f.chunk_id for f in bounded][:2] == ["c1", "c3"]
    # lexical window [8, 2, 0 x 8]: mean 1, population std sqrt((49 + 1 + 8) / 10)
    assert bounded[0].contributions["lexical"] == 0.5 * (8.0 - 1.0) / math.sqrt(5.8)
    assert bounded[1].contributions["lexical"] == 0.5 * (0.0 - 1.0) / math.sqrt(5.8)
    # a vector item below a window of 2 gets the window's lowest score
    fused = bounded_convex({"vector": vec}, {"vector": 1.0}, {"vector": 2}, "min_max", "chunk")
    assert [(f.chunk_id, f.score) for f in fused][:4] == [("c3", 1.0), ("c4", 0.0), ("c5", 0.0), ("c6", 0.0)]
    with pytest.raises(ValueError, match=r"^normalisation window must be >= 1, got 0$"):
        bounded_convex({"vector": vec}, {"vector": 1.0}, {"vector": 0}, "min_max", "chunk")


def test_eligible_windows_stop_at_the_units_the_query_could_rank():
    """A corpus of 6 chunks under windows of 10: the vector channel returned all 6, so the query
    could rank 6; the lexical window is its 2 scores and 4 zeros (BM25 of the chunks matching no
    term), not 8 zeros, and the vector window its 6 scores, unpadded. With the first rule (depth
    windows) both are padded to 10, and the lone lexical leader weighs more."""
    lex = collapse([Hit("lexical", "r1", "c1", "d1", 8.0), Hit("lexical", "r2", "c2", "d2", 2.0)], "chunk")
    vec = collapse([Hit("vector", f"v{i}", f"c{i}", f"d{i}", 1.0 - 0.1 * i) for i in range(1, 7)], "chunk")
    channels, w, win = ({"lexical": lex, "vector": vec}, {"lexical": 1.0, "vector": 1.0}, {"lexical": 10, "vector": 10})
    assert population(channels, win) == 6
    assert population({"lexical": lex}, win) is None  # a lexical list says only how many matched
    assert population({"vector": vec}, {"vector": 6}) is None  # a full window says nothing either
    assert bounded_window("lexical", lex, 10, 6) == ([8.0, 2.0, 0.0, 0.0, 0.0, 0.0], 0.0)
    assert bounded_window("vector", vec, 10, 6) == ([r.hit.score for r in vec], vec[-1].hit.score)
    eligible = bounded_convex(channels, w, win, "z_score", "chunk", eligible=True)
    first = bounded_convex(channels, w, win, "z_score", "chunk")
    # lexical window [8, 2, 0, 0, 0, 0]: mean 5/3, population std sqrt((8-5/3)^2 + (2-5/3)^2 + 4 (5/3)^2) / 6)
    mean = 10 / 6
    std = math.sqrt(math.fsum((s - mean) ** 2 for s in (8.0, 2.0, 0.0, 0.0, 0.0, 0.0)) / 6)
    assert eligible[0].chunk_id == "c1" and eligible[0].contributions["lexical"] == 0.5 * (8.0 - mean) / std
    # depth windows: [8, 2, 0 x 8], z of the leader (8 - 1) / sqrt(5.8) > (8 - 5/3) / std
    assert (
        first[0].contributions["lexical"] == 0.5 * (8.0 - 1.0) / math.sqrt(5.8) > eligible[0].contributions["lexical"]
    )
    # a vector channel that fills its window says nothing of how many units there are: the two
    # rules agree (window 4 over the 6 vector units; the lexical window padded to 10 either way)
    win4 = {"lexical": 10, "vector": 4}
    assert population(channels, win4) is None
    assert bounded_convex(channels, w, win4, "z_score", "chunk", eligible=True) == bounded_convex(
        channels, w, win4, "z_score", "chunk"
    )
    assert bounded_sizes(channels, win4, True) == bounded_sizes(channels, win4, False) == {"lexical": 10, "vector": 4}
    assert bounded_sizes(channels, win, True) == {"lexical": 6, "vector": 6}
    assert bounded_sizes(channels, win, False) == {"lexical": 10, "vector": 10}
    # only a complete channel counts, and only a non-empty one
    assert population({"lexical": lex, "vector": []}, win) is None
    assert population({"lexical": vec, "vector": lex}, win) == 2
    assert population({"sparse": vec}, {"sparse": 10}) is None
    # a lexical channel longer than the count (impossible on a real path) is never cut
    assert bounded_window("lexical", vec, 10, 2)[0] == [r.hit.score for r in vec]
