"""Candidate folders: ``--set`` edits and ``validate`` refusing malformed candidates with exact messages."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ragpipe.candidates.asset_ids import ASSETS, EvaluatorSettings, Snapshot, asset_ids, corpus_revision_id, snapshot_id
from ragpipe.candidates.create import Parent, new_candidate
from ragpipe.candidates.folder import CandidateError, candidate_id, validate_candidate
from ragpipe.corpus.registry import RevisionRecord
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.experiment.gate_policy import DEFAULT_POLICY_PATH, load_policy
from ragpipe.kernel.ids import bytes_digest
from ragpipe.retrieval.plan import parse_plan
from ragpipe.spec import DEFAULT_SPEC_PATH, load_pipeline_spec
from ragpipe_tests.support.paths import SAMPLE

PLAN = b"""schema: ragpipe.query_plan/v1
channels:
  lexical: {depth: 100, weight: 1.0}
  vector: {depth: 100, weight: 1.0}
fusion: {kind: weighted_rrf, k: 60}
"""


@pytest.fixture(scope="module")
def parent() -> Parent:
    import yaml

    suite = load_suite(SAMPLE / "suite.jsonl")
    record = RevisionRecord(
        revision="r1", source_path="/nowhere", format="beir", default_scope="public", source_digest="sha256:" + "0" * 64
    )
    settings = EvaluatorSettings()
    plan = parse_plan(yaml.safe_load(PLAN), "plan")
    assets = asset_ids(
        corpus_revision_id(record),
        load_pipeline_spec(DEFAULT_SPEC_PATH),
        plan,
        suite.digest,
        load_policy().policy_id,
        settings,
    )
    return Parent(
        Snapshot(revision="r1", assets=assets),
        DEFAULT_SPEC_PATH.read_bytes(),
        PLAN,
        suite,
        DEFAULT_POLICY_PATH.read_bytes(),
        settings,
    )


@pytest.fixture
def cand(parent: Parent, tmp_path: Path) -> Path:
    return new_candidate(parent, ["query_plan.fusion.k=20"], tmp_path / "c").folder


def rewrite(folder: Path, name: str, data: bytes, update_digest: bool = True) -> None:
    (folder / name).write_bytes(data)
    if update_digest:
        record = json.loads((folder / "candidate.json").read_text())
        record["files"][name] = bytes_digest(data)
        (folder / "candidate.json").write_text(json.dumps(record))


def edit_record(folder: Path, fn) -> None:
    record = json.loads((folder / "candidate.json").read_text())
    fn(record)
    (folder / "candidate.json").write_text(json.dumps(record))


def refused(folder: Path) -> str:
    with pytest.raises(CandidateError) as info:
        validate_candidate(folder)
    return str(info.value)


def test_new_plan_candidate_ids_and_files(parent: Parent, cand: Path):
    c = validate_candidate(cand)
    assert c.asset == "query_plan" and c.record.build_revision == "r1"
    assert c.record.change.edits == ("query_plan.fusion.k=20",)
    assert c.plan.fusion.k == 20.0 and c.parent_plan.fusion.k == 60.0
    assert c.candidate_id == candidate_id(parent.snapshot.snapshot_id, "query_plan", c.snapshot.assets["query_plan"])
    assert {a for a in ASSETS if c.snapshot.assets[a] != parent.snapshot.assets[a]} == {"query_plan"}
    assert c.snapshot.snapshot_id == snapshot_id(c.snapshot.assets) != parent.snapshot.snapshot_id
    assert sorted(p.relative_to(cand).as_posix() for p in cand.rglob("*") if p.is_file()) == [
        "candidate.json",
        "gate_policy.yaml",
        "parent/pipeline.yaml",
        "parent/query_plan.yaml",
        "pipeline.yaml",
        "query_plan.yaml",
        "suite.jsonl",
    ]
    assert (cand / "parent/query_plan.yaml").read_bytes() == PLAN


def test_build_side_candidate_gets_a_derived_revision(parent: Parent, tmp_path: Path):
    c = new_candidate(parent, ["chunks.max_bytes=800", "chunks.overlap_bytes=100"], tmp_path / "b")
    assert c.asset == "chunks" and c.pipeline.chunker.max_bytes == 800 and c.pipeline.chunker.overlap_bytes == 100
    assert c.record.build_revision == "r1.c" + c.candidate_id[7:19]
    # the stage's own spec ID changes; downstream own IDs do not: exactly one changed asset
    assert [a for a in ASSETS if c.snapshot.assets[a] != parent.snapshot.assets[a]] == ["chunks"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["query_plan.fusion.k=60"],
            "--set leaves asset 'query_plan' unchanged ({old}): a candidate must change its asset",
        ),
        (
            ["suite.cases=1"],
            "--set 'suite.cases=1': asset 'suite' is locked (corpus_revision, suite, gate_policy, evaluator are locked)",
        ),
        (
            ["evaluator.k=10"],
            "--set 'evaluator.k=10': asset 'evaluator' is locked (corpus_revision, suite, gate_policy, evaluator are locked)",
        ),
        (
            ["query_plan.fusion.k=20", "chunks.max_bytes=800"],
            "--set edits 2 assets (query_plan, chunks): a candidate changes exactly one asset",
        ),
        (
            ["reranker.depth=3"],
            "--set 'reranker.depth=3': unknown asset 'reranker' (settable: source_snapshot, chunks, representations, embeddings, lexical_index, vector_index, query_plan, answer_plan)",
        ),
        (["index_bundle.x=1"], "--set 'index_bundle.x=1': asset 'index_bundle' has no settable spec"),
        (
            ["query_plan.answer.context=1"],
            "--set 'query_plan.answer.context=1': the answer section is the asset answer_plan (use answer_plan.context)",
        ),
        (
            ["query_plan=3"],
            "--set 'query_plan=3': expected ASSET.PATH=VALUE, e.g. query_plan.channels.vector.weight=0.7",
        ),
        (
            ["query_plan.fusion.k"],
            "--set 'query_plan.fusion.k': expected ASSET.PATH=VALUE, e.g. query_plan.channels.vector.weight=0.7",
        ),
        (
            ["query_plan.fusion.k=-1"],
            "--set: edited query_plan.yaml: invalid query plan: fusion.k: Input should be greater than 0",
        ),
        (["query_plan.fusion.kind.x=1"], "--set 'query_plan.fusion.kind.x=1': fusion.kind is not a mapping"),
        ([], "give at least one --set ASSET.PATH=VALUE"),
    ],
)
def test_new_refuses(parent: Parent, tmp_path: Path, sets: list[str], message: str):
    with pytest.raises(CandidateError) as info:
        new_candidate(parent, sets, tmp_path / "x")
    assert str(info.value) == message.format(old=parent.snapshot.assets["query_plan"])
    assert not (tmp_path / "x").exists()


def test_new_refuses_an_existing_folder(parent: Parent, cand: Path):
    with pytest.raises(CandidateError, match=r"already exists \(a candidate folder is created once\)$"):
        new_candidate(parent, ["query_plan.fusion.k=30"], cand)


def test_two_changed_assets(cand: Path):
    spec = (cand / "pipeline.yaml").read_text().replace("max_bytes: 1200", "max_bytes: 900")
    rewrite(cand, "pipeline.yaml", spec.encode())
    assert (
        refused(cand)
        == f"{cand}/candidate.json: 2 assets changed (chunks, query_plan): a candidate changes exactly one asset; make a chain of one-change candidates"
    )


def test_no_change(cand: Path):
    rewrite(cand, "query_plan.yaml", PLAN)
    assert (
        refused(cand)
        == f"{cand}/candidate.json: no asset changed: a candidate changes exactly one asset of its parent snapshot"
    )


def test_locked_suite_change(cand: Path, parent: Parent):
    lines = (cand / "suite.jsonl").read_bytes().splitlines(keepends=True)
    rewrite(cand, "suite.jsonl", b"".join(lines[:-1]))
    new = load_suite(cand / "suite.jsonl").digest
    assert refused(cand) == (
        f"{cand}/candidate.json: locked asset 'suite' changed ({parent.snapshot.assets['suite']} -> {new}): "
        "corpus_revision, suite, gate_policy, evaluator are locked"
    )


def test_locked_policy_change(cand: Path, parent: Parent):
    rewrite(
        cand, "gate_policy.yaml", (cand / "gate_policy.yaml").read_bytes().replace(b"min_cases: 20", b"min_cases: 5")
    )
    msg = refused(cand)
    assert msg.startswith(
        f"{cand}/candidate.json: locked asset 'gate_policy' changed ({parent.snapshot.assets['gate_policy']} -> sha256:"
    )


def test_locked_evaluator_change(cand: Path, parent: Parent):
    edit_record(cand, lambda r: r["evaluator"].update(k=100))
    assert refused(cand) == (
        f"{cand}/candidate.json: locked asset 'evaluator' changed ({parent.snapshot.assets['evaluator']} -> "
        f"{EvaluatorSettings(k=100).evaluator_id}): corpus_revision, suite, gate_policy, evaluator are locked"
    )


def test_symlink_escape(cand: Path, tmp_path: Path):
    outside = tmp_path / "outside.yaml"
    outside.write_bytes((cand / "query_plan.yaml").read_bytes())
    (cand / "query_plan.yaml").unlink()
    (cand / "query_plan.yaml").symlink_to(outside)
    assert refused(cand) == f"{cand}/query_plan.yaml: resolves to {outside}, outside the candidate folder {cand}"


def test_parent_directory_symlink_escape(cand: Path, tmp_path: Path):
    (cand / "parent").rename(tmp_path / "elsewhere")
    (cand / "parent").symlink_to(tmp_path / "elsewhere")
    assert (
        refused(cand)
        == f"{cand}/parent/pipeline.yaml: resolves to {tmp_path / 'elsewhere' / 'pipeline.yaml'}, outside the candidate folder {cand}"
    )


def test_symlink_inside_is_followed(cand: Path):
    (cand / "copy.yaml").write_bytes((cand / "query_plan.yaml").read_bytes())
    (cand / "query_plan.yaml").unlink()
    (cand / "query_plan.yaml").symlink_to("copy.yaml")
    assert validate_candidate(cand).asset == "query_plan"


def test_special_file(cand: Path):
    (cand / "suite.jsonl").unlink()
    os.mkfifo(cand / "suite.jsonl")
    assert refused(cand) == f"{cand}/suite.jsonl: not a regular file (a candidate holds only regular files)"


def test_directory_in_place_of_a_file(cand: Path):
    (cand / "gate_policy.yaml").unlink()
    (cand / "gate_policy.yaml").mkdir()
    assert refused(cand) == f"{cand}/gate_policy.yaml: not a regular file (a candidate holds only regular files)"


def test_digest_mismatch(cand: Path):
    data = (cand / "query_plan.yaml").read_bytes() + b"\n"
    recorded = json.loads((cand / "candidate.json").read_text())["files"]["query_plan.yaml"]
    rewrite(cand, "query_plan.yaml", data, update_digest=False)
    assert refused(cand) == f"{cand}/query_plan.yaml: digest {bytes_digest(data)} differs from the recorded {recorded}"


def test_unknown_asset_in_the_record(cand: Path):
    edit_record(cand, lambda r: r["change"].update(asset="reranker"))
    assert (
        refused(cand) == f"{cand}/candidate.json: change names unknown asset 'reranker' (assets: {', '.join(ASSETS)})"
    )


def test_unknown_asset_in_the_parent_snapshot(cand: Path):
    edit_record(cand, lambda r: r["parent"]["assets"].update(weights="sha256:" + "1" * 64))
    assert refused(cand) == f"{cand}/candidate.json: parent: unknown asset 'weights' (assets: {', '.join(ASSETS)})"


def test_missing_file(cand: Path):
    (cand / "parent" / "query_plan.yaml").unlink()
    assert refused(cand) == (
        f"{cand}/parent/query_plan.yaml: missing (a candidate holds candidate.json and pipeline.yaml, query_plan.yaml, "
        "parent/pipeline.yaml, parent/query_plan.yaml, suite.jsonl, gate_policy.yaml)"
    )


def test_unknown_file_listed(cand: Path):
    edit_record(cand, lambda r: r["files"].update({"../x": "sha256:" + "0" * 64}))
    assert refused(cand) == (
        f"{cand}/candidate.json: files names '../x', which is not a candidate file (pipeline.yaml, query_plan.yaml, "
        "parent/pipeline.yaml, parent/query_plan.yaml, suite.jsonl, gate_policy.yaml)"
    )


def test_wrong_candidate_id(cand: Path):
    true_id = json.loads((cand / "candidate.json").read_text())["candidate_id"]
    edit_record(cand, lambda r: r.update(candidate_id="sha256:" + "2" * 64))
    assert (
        refused(cand) == f"{cand}/candidate.json: candidate ID sha256:{'2' * 64} differs from its content ID {true_id}"
    )


def test_record_naming_another_asset(cand: Path):
    edit_record(cand, lambda r: r["change"].update(asset="chunks"))
    assert refused(cand) == f"{cand}/candidate.json: the changed asset is 'query_plan', but the record names 'chunks'"


def test_parent_copy_not_the_parent(cand: Path, parent: Parent):
    data = PLAN.replace(b"k: 60", b"k: 61")
    rewrite(cand, "parent/query_plan.yaml", data)
    plan_id = asset_ids(
        parent.snapshot.assets["corpus_revision"],
        load_pipeline_spec(DEFAULT_SPEC_PATH),
        parse_plan(__import__("yaml").safe_load(data), "p"),
        parent.suite.digest,
        load_policy().policy_id,
        parent.settings,
    )["query_plan"]
    assert (
        refused(cand)
        == f"{cand}/parent/query_plan.yaml: asset query_plan is {plan_id}, the parent snapshot's is {parent.snapshot.assets['query_plan']}"
    )


def test_record_not_json(cand: Path):
    (cand / "candidate.json").write_text("{")
    assert (
        refused(cand) == f"{cand}/candidate.json: not JSON: Expecting property name enclosed in double quotes at line 1"
    )


def test_record_schema(cand: Path):
    edit_record(cand, lambda r: r.pop("build_revision"))
    assert refused(cand) == f"{cand}/candidate.json: invalid candidate record: build_revision: Field required"


def test_not_a_folder(tmp_path: Path):
    assert refused(tmp_path / "nope") == f"{tmp_path / 'nope'}: not a candidate folder (no such directory)"
