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
    assert plan.model_dump(mode="json", by_alias=True)["depth_policy"] == {"kind": "settled_units/v1", "request_multiple": 2, "growth": 2}
    assert {n: c.depth for n, c in plan.channels.items()} == {"lexical": 100, "vector": 100}
    assert parse_plan({"channels": {"lexical": {}}}, "x").depth_policy == plan.depth_policy  # the default when omitted


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"channels": {"lexical": {"depth": 10, "weight": 0}}}, "channels.lexical.weight: Input should be greater than 0"),
        ({"channels": {"lexical": {"depth": 10, "weight": -1.5}}}, "channels.lexical.weight: Input should be greater than 0"),
        ({"channels": {"lexical": {"depth": 10, "weight": float("inf")}}}, "channels.lexical.weight: Input should be a finite number"),
        ({"channels": {"lexical": {"depth": 10, "weight": float("nan")}}}, "channels.lexical.weight: Input should be a finite number"),
        ({"channels": {"lexical": {"depth": 10, "weight": 1, "boost": 2}}}, "channels.lexical.boost: Extra inputs are not permitted"),
        ({"rerank": True}, "rerank: Extra inputs are not permitted"),
        ({"channels": {"bm42": {"depth": 10, "weight": 1}}}, "channels.bm42.[key]: Input should be 'lexical' or 'vector'"),
        ({"fusion": {"kind": "weighted_rrf", "k": 0}}, "fusion.k: Input should be greater than 0"),
        ({"channels": {}}, "channels: Dictionary should have at least 1 item"),
        ({"depth_policy": {"kind": "top_hits"}}, "depth_policy.kind: Input should be 'settled_units/v1'"),
        ({"depth_policy": {"growth": 1}}, "depth_policy.growth: Input should be greater than or equal to 2"),
        ({"depth_policy": {"request_multiple": 0}}, "depth_policy.request_multiple: Input should be greater than or equal to 1"),
        ({"depth_policy": {"request_multiple": 2, "round_limit": 3}}, "depth_policy.round_limit: Extra inputs are not permitted"),
        ({"channels": {"lexical": {"depth": 0, "weight": 1}}}, "channels.lexical.depth: Input should be greater than or equal to 1"),
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
