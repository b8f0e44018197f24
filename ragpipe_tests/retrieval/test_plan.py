"""The query plan file: validation messages and identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.retrieval.plan import PlanError, load_plan, parse_plan


def test_default_plan_loads_and_its_id_covers_every_field():
    plan = load_plan()
    assert set(plan.channels) == {"lexical", "vector"}
    assert plan.plan_id.startswith("sha256:")
    raw = plan.model_dump(mode="json", by_alias=True)
    raw["context"]["max_bytes"] = 5000
    assert parse_plan(raw, "x").plan_id != plan.plan_id
    assert plan.with_channels(("lexical",)).plan_id != plan.plan_id
    raw = plan.model_dump(mode="json", by_alias=True)
    raw["depth_policy"]["request_multiple"] = 3
    assert parse_plan(raw, "x").plan_id != plan.plan_id


def test_depth_policy_is_recorded_in_the_plan():
    plan = load_plan()
    assert plan.model_dump(mode="json", by_alias=True)["depth_policy"] == {
        "kind": "settled_units/v1",
        "request_multiple": 2,
        "growth": 2,
    }
    assert {n: c.depth for n, c in plan.channels.items()} == {"lexical": 100, "vector": 100}
    assert parse_plan({"channels": {"lexical": {}}}, "x").depth_policy == plan.depth_policy  # the default when omitted


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            {"channels": {"lexical": {"depth": 10, "weight": 0}}},
            "channels.lexical.weight: Input should be greater than 0",
        ),
        (
            {"channels": {"lexical": {"depth": 10, "weight": -1.5}}},
            "channels.lexical.weight: Input should be greater than 0",
        ),
        (
            {"channels": {"lexical": {"depth": 10, "weight": float("inf")}}},
            "channels.lexical.weight: Input should be a finite number",
        ),
        (
            {"channels": {"lexical": {"depth": 10, "weight": float("nan")}}},
            "channels.lexical.weight: Input should be a finite number",
        ),
        (
            {"channels": {"lexical": {"depth": 10, "weight": 1, "boost": 2}}},
            "channels.lexical.boost: Extra inputs are not permitted",
        ),
        ({"rerank": True}, "rerank: Extra inputs are not permitted"),
        (
            {"channels": {"bm42": {"depth": 10, "weight": 1}}},
            "channels.bm42.[key]: Input should be 'lexical' or 'vector'",
        ),
        ({"fusion": {"kind": "weighted_rrf", "k": 0}}, "fusion.k: Input should be greater than 0"),
        ({"channels": {}}, "channels: Dictionary should have at least 1 item"),
        ({"depth_policy": {"kind": "top_hits"}}, "depth_policy.kind: Input should be 'settled_units/v1'"),
        ({"depth_policy": {"growth": 1}}, "depth_policy.growth: Input should be greater than or equal to 2"),
        (
            {"depth_policy": {"request_multiple": 0}},
            "depth_policy.request_multiple: Input should be greater than or equal to 1",
        ),
        (
            {"depth_policy": {"request_multiple": 2, "round_limit": 3}},
            "depth_policy.round_limit: Extra inputs are not permitted",
        ),
        (
            {"channels": {"lexical": {"depth": 0, "weight": 1}}},
            "channels.lexical.depth: Input should be greater than or equal to 1",
        ),
    ],
)
def test_invalid_plans_are_refused_with_the_field_named(patch, message):
    raw = {**load_plan().model_dump(mode="json", by_alias=True), **patch}
    with pytest.raises(PlanError) as info:
        parse_plan(raw, "plan.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("plan.yaml: invalid query plan:")


def test_unreadable_plan(tmp_path: Path):
    with pytest.raises(PlanError, match="cannot read query plan"):
        load_plan(tmp_path / "missing.yaml")


def test_a_plan_with_a_key_twice_or_nested_past_the_bound_is_one_line(tmp_path: Path):
    path = tmp_path / "plan.yaml"
    path.write_text("schema: ragpipe.query_plan/v1\nchannels: {}\nchannels: {}\n")
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert str(info.value) == f"{path}:3: channels: duplicate key (first at line 2)"
    path.write_text("a: " + "[" * 10_000 + "]" * 10_000 + "\n")
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert str(info.value).startswith(f"{path}:1: nesting deeper than 64 levels (column ")


# --- fusion kinds ---------------------------------------------------------------------------

# Golden IDs: the checked-in plan (bounded z-score convex fusion with eligible windows; exact
# vector scores float64_sequential/v1), the same plan with bounded fusion's first rule (depth
# windows), with plain z-score convex fusion (chosen by `ragpipe tune` on SciFact train, the
# default before) and with weighted RRF, k = 60 (the default before that; docs/retrieval.md "Fusion").
RRF60_PLAN_ID = "sha256:220a4473696f4442c7ad0eae9a70073b0b8cf67d25b4709c48f17e157e21ba5f"
ZSCORE_PLAN_ID = "sha256:3b13cbdd158eb75c21f9cdfda6bd9ae703ca2ffa87a41d211ef92cb98ff2b21a"
BOUNDED_PLAN_ID = "sha256:d7f05dc21de8984f75875c98f491ccc11627788c7bb741343e99131b308ef0f6"
ELIGIBLE_PLAN_ID = "sha256:bbe22a9bee6343173b432806f1f76ec7f9c020c7713733f2740dd0d81da98a88"


def _with_fusion(fusion: object) -> dict:
    raw = load_plan().model_dump(mode="json", by_alias=True)
    raw["fusion"] = fusion
    return raw


def test_rrf_plans_keep_their_encoding_and_id():
    """An RRF fusion dumps as before, and a fusion without ``kind`` is still weighted RRF."""
    assert load_plan().plan_id == ELIGIBLE_PLAN_ID
    plan = parse_plan(_with_fusion({"kind": "weighted_rrf", "k": 60}), "x")
    assert plan.plan_id == RRF60_PLAN_ID
    assert plan.model_dump(mode="json", by_alias=True)["fusion"] == {"kind": "weighted_rrf", "k": 60.0}
    assert parse_plan(_with_fusion({"k": 60}), "x").plan_id == RRF60_PLAN_ID
    assert parse_plan(_with_fusion({"k": 20}), "x").plan_id != RRF60_PLAN_ID


def test_score_fusion_is_in_the_plan_id():
    ids = {
        parse_plan(_with_fusion({"kind": kind, "normalization": norm}), "x").plan_id
        for norm in ("min_max", "z_score")
        for kind in ("normalized_convex", "bounded_convex")
    }
    assert len(ids) == 4 and RRF60_PLAN_ID not in ids and BOUNDED_PLAN_ID in ids
    plan = parse_plan(_with_fusion({"kind": "normalized_convex", "normalization": "z_score"}), "x")
    assert plan.model_dump(mode="json", by_alias=True)["fusion"] == {
        "kind": "normalized_convex",
        "normalization": "z_score",
    }
    assert plan.plan_id == ZSCORE_PLAN_ID
    # bounded fusion's first rule (depth windows) dumps, and hashes, as before the window field
    first = {"kind": "bounded_convex", "normalization": "z_score"}
    for fusion in (first, {**first, "window": "depth"}):
        bounded = parse_plan(_with_fusion(fusion), "x")
        assert (bounded.plan_id, bounded.model_dump(mode="json", by_alias=True)["fusion"]) == (BOUNDED_PLAN_ID, first)
    eligible = parse_plan(_with_fusion({**first, "window": "eligible"}), "x")
    assert eligible.plan_id == ELIGIBLE_PLAN_ID and eligible.fusion.window == "eligible"
    assert eligible.model_dump(mode="json", by_alias=True)["fusion"] == {**first, "window": "eligible"}
    # the channel depth is the normalisation window: it is in the ID too
    raw = plan.model_dump(mode="json", by_alias=True)
    raw["channels"]["vector"]["depth"] = 50
    assert parse_plan(raw, "x").plan_id != plan.plan_id


@pytest.mark.parametrize(
    ("fusion", "message"),
    [
        (
            {"kind": "borda"},
            "fusion: Input should be a mapping whose kind is 'weighted_rrf', 'normalized_convex' or 'bounded_convex'",
        ),
        (
            "rrf",
            "fusion: Input should be a mapping whose kind is 'weighted_rrf', 'normalized_convex' or 'bounded_convex'",
        ),
        ({"kind": "normalized_convex"}, "fusion.normalization: Field required"),
        ({"kind": "bounded_convex"}, "fusion.normalization: Field required"),
        (
            {"kind": "bounded_convex", "normalization": "z_score", "k": 60},
            "fusion.k: Extra inputs are not permitted",
        ),
        (
            {"kind": "bounded_convex", "normalization": "z_score", "window": "corpus"},
            "fusion.window: Input should be 'depth' or 'eligible'",
        ),
        (
            {"kind": "normalized_convex", "normalization": "z_score", "window": "eligible"},
            "fusion.window: Extra inputs are not permitted",
        ),
        (
            {"kind": "normalized_convex", "normalization": "rank"},
            "fusion.normalization: Input should be 'min_max' or 'z_score'",
        ),
        (
            {"kind": "normalized_convex", "normalization": "z_score", "k": 60},
            "fusion.k: Extra inputs are not permitted",
        ),
        ({"kind": "weighted_rrf", "normalization": "z_score"}, "fusion.normalization: Extra inputs are not permitted"),
        ({"kind": "weighted_rrf", "k": float("nan")}, "fusion.k: Input should be a finite number"),
        ({"kind": "weighted_rrf", "k": float("inf")}, "fusion.k: Input should be a finite number"),
    ],
)
def test_invalid_fusions_are_refused_with_the_field_named(fusion, message):
    with pytest.raises(PlanError) as info:
        parse_plan(_with_fusion(fusion), "plan.yaml")
    assert str(info.value) == f"plan.yaml: invalid query plan: {message}"


@pytest.mark.parametrize(
    ("fusion", "depths", "windows"),
    [
        ({"kind": "normalized_convex", "normalization": "z_score"}, (3, 4), {"lexical": 3, "vector": 4}),
        ({"kind": "bounded_convex", "normalization": "z_score"}, (3, 4), {"lexical": 3, "vector": 4}),
        # the staff subject may see 5 chunks (4 public, 1 staff): at depth 100 the vector channel
        # returns all 5, so eligible windows are those 5 units' scores in each channel
        (
            {"kind": "bounded_convex", "normalization": "z_score", "window": "eligible"},
            (100, 100),
            {"lexical": 5, "vector": 5},
        ),
        ({"kind": "bounded_convex", "normalization": "z_score"}, (100, 100), {"lexical": 100, "vector": 100}),
    ],
)
def test_a_score_fusion_plan_serves_queries(scoped_bundles, fusion, depths, windows):
    """On a real bundle: hybrid hits are the plan's fusion of the channels the trace shows; one
    channel keeps its own order; the trace names the fusion and the windows it normalised over."""
    from benchmarks.plan_cache import rankings_from_trace
    from ragpipe.retrieval.authz import Subject
    from ragpipe.retrieval.fusion import fuse
    from ragpipe.retrieval.retriever import Retriever

    kind = fusion["kind"]
    raw = _with_fusion(fusion)
    raw["channels"] = {"lexical": {"depth": depths[0], "weight": 1.0}, "vector": {"depth": depths[1], "weight": 1.0}}
    plan = parse_plan(raw, "x")
    r = Retriever(scoped_bundles[0], plan=plan)
    try:
        subject = Subject("staff", ("public", "staff"))
        result = r.query("aspirin stroke", subject, k=5, mode="hybrid", trace=True)
        assert result.plan_id == plan.plan_id
        fused = fuse(plan, rankings_from_trace(result.trace))
        assert [(h["chunk_id"], h["score"]) for h in result.hits] == [(f.chunk_id, f.score) for f in fused[:5]]
        assert {k: v for k, v in result.trace["fusion"].items() if k != "items"} == {
            **fusion,
            "weights": {"lexical": 1.0, "vector": 1.0},
            "normalization_windows": windows,
        }
        # the channel read max(depth, k = 5) units: all 5 the subject may see, whatever the depth
        assert len(result.trace["channels"]["vector"]) == 5
        assert result.trace["fusion"]["items"][0]["contributions"] == fused[0].contributions
        if kind == "bounded_convex":  # a deeper query reads the channels deeper: same first hits, same scores
            deeper = r.query("aspirin stroke", subject, k=40, mode="hybrid")
            assert [(h["chunk_id"], h["score"]) for h in deeper.hits[:5]] == [
                (h["chunk_id"], h["score"]) for h in result.hits
            ]
        for mode in ("lexical", "vector"):
            one = r.query("aspirin stroke", subject, k=5, mode=mode, trace=True)
            assert [h["chunk_id"] for h in one.hits] == [c["chunk_id"] for c in one.trace["channels"][mode]][:5]
        assert not {h["document_id"] for h in result.hits} & {"sec-aspirin", "sec-twin"}
    finally:
        r.close()
