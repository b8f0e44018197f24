"""Snapshot asset IDs: what enters each, what never does, and the snapshot ID's laws."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.candidates.asset_ids import (
    ASSETS,
    LOCKED,
    EvaluatorSettings,
    Snapshot,
    SnapshotError,
    answer_plan_id,
    asset_ids,
    changed_assets,
    check_assets,
    corpus_revision_id,
    query_plan_id,
    snapshot_id,
)
from ragpipe.corpus.registry import RevisionRecord
from ragpipe.experiment.statistics import ComparisonSpec
from ragpipe.retrieval.plan import parse_plan
from ragpipe.spec import load_pipeline_spec

PLAN = {
    "schema": "ragpipe.query_plan/v1",
    "channels": {"lexical": {"depth": 100, "weight": 1.0}, "vector": {"depth": 100, "weight": 1.0}},
    "fusion": {"kind": "weighted_rrf", "k": 60},
}
RECORD = RevisionRecord(
    revision="r1",
    source_path="/a/corpus.jsonl",
    format="beir",
    default_scope="public",
    source_digest="sha256:" + "0" * 64,
)


def assets(pipeline=None, plan=None, settings=None) -> dict[str, str]:
    return asset_ids(
        corpus_revision_id(RECORD),
        pipeline or load_pipeline_spec(),
        plan or parse_plan(PLAN, "p"),
        "sha256:" + "1" * 64,
        "sha256:" + "2" * 64,
        settings or EvaluatorSettings(),
    )


def test_asset_names_and_locks():
    assert list(assets()) == list(ASSETS)
    assert LOCKED == ("corpus_revision", "suite", "gate_policy", "evaluator")


def test_corpus_id_ignores_key_and_path_but_not_content():
    moved = RECORD.model_copy(update={"revision": "other", "source_path": "/b/c.jsonl"})
    assert corpus_revision_id(moved) == corpus_revision_id(RECORD)
    assert corpus_revision_id(RECORD.model_copy(update={"default_scope": "staff"})) != corpus_revision_id(RECORD)
    assert corpus_revision_id(RECORD.model_copy(update={"source_digest": "sha256:" + "3" * 64})) != corpus_revision_id(
        RECORD
    )


def test_a_chunker_change_is_one_changed_asset():
    spec = load_pipeline_spec()
    chunked = spec.model_copy(update={"chunker": spec.chunker.model_copy(update={"max_bytes": 800})})
    assert changed_assets(assets(), assets(pipeline=chunked)) == ["chunks"]


def test_execution_settings_change_no_asset():
    spec = load_pipeline_spec()
    faster = spec.model_copy(
        update={"execution": spec.execution.model_copy(update={"embed_batch_size": 7, "torch_threads": 1})}
    )
    assert changed_assets(assets(), assets(pipeline=faster)) == []


def test_query_and_answer_plans_are_separate_assets():
    plan = parse_plan(PLAN, "p")
    answered = parse_plan({**PLAN, "answer": {"generator": {"kind": "extractive", "seed": 8}}}, "p")
    assert query_plan_id(answered) == query_plan_id(plan) and answer_plan_id(answered) != answer_plan_id(plan)
    assert changed_assets(assets(plan=plan), assets(plan=answered)) == ["answer_plan"]
    rrf20 = parse_plan({**PLAN, "fusion": {"kind": "weighted_rrf", "k": 20}}, "p")
    assert changed_assets(assets(plan=plan), assets(plan=rrf20)) == ["query_plan"]


def test_evaluator_covers_settings_and_comparison_spec():
    base = EvaluatorSettings()
    for other in (
        EvaluatorSettings(k=100),
        EvaluatorSettings(mode="lexical"),
        EvaluatorSettings(comparison=ComparisonSpec(seed=1)),
    ):
        assert changed_assets(assets(settings=base), assets(settings=other)) == ["evaluator"]


@given(st.permutations(list(ASSETS)))
def test_snapshot_id_ignores_mapping_order(order):
    a = assets()
    assert snapshot_id({k: a[k] for k in order}) == snapshot_id(a)
    assert (
        Snapshot(revision="x", assets={k: a[k] for k in order}).snapshot_id
        == Snapshot(revision="y", assets=a).snapshot_id
    )


def test_check_assets_refuses_unknown_and_missing():
    a = assets()
    with pytest.raises(SnapshotError, match=r"^snap: unknown asset 'weights' \(assets: corpus_revision, "):
        check_assets({**a, "weights": "sha256:" + "0" * 64}, "snap")
    with pytest.raises(SnapshotError, match=r"^snap: asset 'suite' is missing$"):
        check_assets({k: v for k, v in a.items() if k != "suite"}, "snap")


def test_a_suite_with_test_split_cases_is_refused_unless_allowed_and_then_recorded(tmp_path, cli):
    """Tuning on the test split spends the measure a project reports: ``candidate new`` and
    ``tune`` refuse such a suite (before anything else) unless --allow-test-split, which enters the
    evaluator settings (and ID) the candidate locks; settings without it keep their old ID."""

    from ragpipe.candidates.create import CandidateError, refuse_test_split
    from ragpipe.evaluation.suite import Case, Suite
    from ragpipe_tests.support.paths import REPO

    suite = Suite.of(
        [
            Case(id="a", query="q", target_level="document", judgments={"d": 1}, split=["train"]),
            Case(id="b", query="q", target_level="document", judgments={"d": 1}, split=["test"]),
        ],
        "s.jsonl",
    )
    with pytest.raises(CandidateError) as refused:
        refuse_test_split(suite, EvaluatorSettings())
    assert str(refused.value) == (
        "suite s.jsonl: 1 of its 2 cases are judged on the test split (first: 'b'); tune on another split "
        "(--split train), or pass --allow-test-split, which the candidate records"
    )
    allowed = EvaluatorSettings(test_split_allowed=True)
    refuse_test_split(suite, allowed)  # allowed: no refusal
    assert "test_split_allowed" not in EvaluatorSettings().model_dump() and allowed.model_dump()["test_split_allowed"]
    assert allowed.evaluator_id != EvaluatorSettings().evaluator_id
    (tmp_path / "qrels").mkdir()
    (tmp_path / "queries.jsonl").write_text('{"_id": "1", "text": "one"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n")
    for command in (
        ("candidate", "new", "--set", "query_plan.fusion.k=15", "--out", str(tmp_path / "c")),
        ("tune", "--space", str(REPO / "ragpipe" / "specs" / "tune_space.yaml")),
    ):
        done = cli(*command, "--parent", "r1", "--suite", str(tmp_path), home=tmp_path / "home", timeout=300)
        assert (done.returncode, done.stdout) == (1, ""), command
        assert "1 of its 1 cases are judged on the test split (first: '1')" in " ".join(done.stderr.split()), (
            done.stderr
        )
