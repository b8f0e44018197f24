"""Choosing representations, generated kinds included, with ``ragpipe tune``: the checked-in
``tune_space_representations.yaml`` walked from a parent whose spec configures questions and
summary (a relative prompt path) against the local OpenAI-protocol server. Every option is a
build-side candidate: a child ``ragpipe build`` through Dagster, evaluated and gated. The server's
replies are deterministic and say nothing about quality: what is asserted is what ran, what it
cost, and that the cache carries generated texts from one candidate to the next.
One workspace (100 SciFact-sample documents) per module."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
import yaml

from ragpipe.candidates.asset_ids import EvaluatorSettings
from ragpipe.candidates.create import new_candidate, parent_from_revision
from ragpipe.candidates.folder import CandidateError
from ragpipe.candidates.tune import load_space, tune
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.gate_policy import DEFAULT_POLICY_PATH
from ragpipe.spec import DEFAULT_SPEC_PATH
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.candidates.test_run import PLAN
from ragpipe_tests.representations.generated_support import questions_for
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.llm_server import LLMServer, words
from ragpipe_tests.support.paths import REPO, SAMPLE

SPACE = REPO / "ragpipe" / "specs" / "tune_space_representations.yaml"
MODEL = "openai/gpt-4o-mini"  # priced in ragpipe/specs/prices.yaml: 150,000 in, 600,000 out per 10^6 tokens
PROMPT = "List what a scientist could ask that this abstract answers.\n"
KINDS = [["raw"], ["raw", "questions"], ["raw", "summary"], ["raw", "title_breadcrumb", "questions", "summary"]]


def kind_of(request: dict) -> str:
    return "summary" if '"summary"' in request["messages"][0]["content"] else "questions"


def reply(request: dict) -> str:
    if kind_of(request) == "questions":
        return questions_for(request)
    title = request["messages"][-1]["content"].splitlines()[0]
    return json.dumps({"summary": f"A summary of {title[:80]}."})


def parent_spec(folder: Path, api_base: str) -> Path:
    """The checked-in spec (without its evaluation section), configuring both generated kinds it
    does not list — so the parent keeps its bundle — with a prompt named relative to the file."""
    doc = yaml.safe_load(DEFAULT_SPEC_PATH.read_text(encoding="utf-8"))
    doc.pop("evaluation")
    doc["representations"]["generated"] = {
        "questions": {"model": MODEL, "prompt": "prompts/questions.txt", "n": 2, "max_chars": 200},
        "summary": {"model": MODEL, "max_chars": 300},
    }
    doc["execution"]["generation"] = {"api_base": api_base, "backoff_seconds": 0, "timeout_seconds": 10}
    (folder / "prompts").mkdir(parents=True)
    (folder / "prompts" / "questions.txt").write_text(PROMPT, encoding="utf-8")
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory):
    from ragpipe.cli.candidate import build_in_child

    root = tmp_path_factory.mktemp("tune-reps")
    corpus = root / "rev-1-head.jsonl"
    lines = (SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:100]
    corpus.write_text("".join(lines), encoding="utf-8")
    ws, _, _ = build_all_stages(root / "ragpipe", "s1", corpus, "beir")  # the checked-in spec
    (root / "plan.yaml").write_text(PLAN, encoding="utf-8")
    with LLMServer() as server, pytest.MonkeyPatch.context() as env:
        server.scenario, server.responder = "responder", reply
        env.setenv("RAGPIPE_HOME", str(ws.home))
        env.setenv("DAGSTER_HOME", str(root / "dagster"))
        env.delenv("RAGPIPE_PIPELINE_SPEC", raising=False)
        env.chdir(root)  # not the spec's folder: its prompt path must still name its file
        spec = parent_spec(root / "spec", server.api_base)
        suite = load_suite(SAMPLE / "suite.jsonl")
        parent = parent_from_revision(
            ws, "s1", spec, root / "plan.yaml", suite, DEFAULT_POLICY_PATH, EvaluatorSettings()
        )
        result = tune(ws, parent, load_space(SPACE), root / "tune", build_in_child)
        yield ws, parent, server.requests, json.loads((root / "tune" / "tune.json").read_text()), result


def chunk_count(ws) -> int:
    return int(read_stage_record(ws, "s1", "chunks").facts["chunks"])


def test_every_option_is_a_gated_build_side_candidate(walk):
    ws, _, _, data, _ = walk
    steps = data["steps"]
    assert [(s["edits"], s["status"]) for s in steps] == [
        ([f"representations.kinds=[{', '.join(k)}]"], "evaluated") for k in KINDS
    ]
    assert data["candidates"] == 4 and data["embedding"]["builds"] == 4
    chunks = chunk_count(ws)
    for step, kinds in zip(steps, KINDS):
        run = json.loads((Path(step["folder"]) / "run" / "result.json").read_text())
        derived = run["build"]["revision"]
        reps = read_stage_record(ws, derived, "representations").facts
        generated = [k for k in kinds if k in ("questions", "summary")]
        # the server's replies all meet their contract: one representation per chunk and kind
        assert int(reps["representations"]) == chunks * len(kinds)
        assert int(reps.get("generated", 0)) == chunks * len(generated)
        challenger = load_arm(Path(run["challenger_run"]))
        assert challenger.variant.bundle_id == run["build"]["bundle_id"]
        assert challenger.build is not None and challenger.build.vectors == chunks * len(kinds)
        decision = json.loads((Path(step["folder"]) / "run" / "decision.json").read_text())
        assert step["eligible"] is decision["eligible"] and step["decisive_phase"] == decision["decisive_phase"]


def test_the_model_is_asked_once_per_chunk_and_kind_with_the_parents_prompt(walk):
    ws, _, requests, _, _ = walk
    chunks = chunk_count(ws)
    assert Counter(kind_of(r) for r in requests) == {"questions": chunks, "summary": chunks}
    assert len({(kind_of(r), r["messages"][-1]["content"]) for r in requests}) == len(requests)
    # the candidate folders' copies carry the parent's prompt, wherever the walk ran from
    assert all(r["messages"][0]["content"].startswith(PROMPT + "\n") for r in requests if kind_of(r) == "questions")
    assert all(r["model"] == MODEL.split("/", 1)[1] for r in requests)


def test_each_candidate_folder_holds_the_prompts_inline(walk):
    """A candidate's copy of the spec names no prompt file: editing or moving the parent's later
    cannot change what the candidate built, and the folder's file digests cover the prompt."""
    _, _, _, data, _ = walk
    for step in data["steps"]:
        for name in ("pipeline.yaml", "parent/pipeline.yaml"):
            generated = yaml.safe_load((Path(step["folder"]) / name).read_text())["representations"]["generated"]
            assert generated["questions"]["prompt_text"] == PROMPT and "prompt" not in generated["questions"]
            assert "prompt" not in generated["summary"] and generated["summary"]["prompt_text"].strip()


def test_each_build_reports_its_calls_and_the_walk_sums_them(walk):
    ws, _, requests, data, _ = walk
    chunks = chunk_count(ws)
    builds = [json.loads((Path(s["folder"]) / "run" / "result.json").read_text())["build"] for s in data["steps"]]
    calls = [
        None if b["generation"] is None else (b["generation"]["calls"], b["generation"]["cache_hits"]) for b in builds
    ]
    # [raw] generates nothing; questions and summary each ask once per chunk; "all" finds every
    # text in the cache the two before it filled, and asks for nothing
    assert calls == [None, (chunks, 0), (chunks, 0), (0, 2 * chunks)]
    cost = 0
    for request in requests:
        tokens_in = sum(words(m["content"]) for m in request["messages"])
        cost += -(-(tokens_in * 150_000 + words(reply(request)) * 600_000) // 1_000_000)
    assert sum(b["generation"]["cost_micros"] for b in builds if b["generation"]) == cost
    assert data["generation"] == {
        "calls": 2 * chunks,
        "cache_hits": 2 * chunks,
        "input_tokens": sum(sum(words(m["content"]) for m in r["messages"]) for r in requests),
        "output_tokens": sum(words(reply(r)) for r in requests),
        "cost_micros": cost,
        "cost_known": True,
    }
    assert builds[3]["generation"]["cost"] == "0 micros"


def test_the_representations_materialization_carries_the_same_sums_in_dagster(walk):
    from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

    ws, _, _, data, _ = walk
    build = json.loads((Path(data["steps"][1]["folder"]) / "run" / "result.json").read_text())["build"]
    with DagsterInstance.from_config(os.environ["DAGSTER_HOME"]) as instance:
        (record,) = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("representations"), asset_partitions=[build["revision"]]), limit=1
        ).records
        metadata = {k: v.value for k, v in record.asset_materialization.metadata.items()}  # type: ignore[union-attr]
    assert record.run_id == build["dagster_run_id"]
    assert {k: metadata[f"generation_{k}"] for k in build["generation"]} == build["generation"]
    assert metadata["generation_items"] == chunk_count(ws) and metadata["generation_invalid_output"] == 0


def test_a_parent_that_does_not_configure_a_kind_cannot_make_its_candidate(walk, tmp_path: Path):
    ws, parent, _, _, _ = walk
    bare = parent_from_revision(
        ws, "s1", DEFAULT_SPEC_PATH, DEFAULT_SPEC_PATH.parent / "query_plan.yaml", parent.suite,
        DEFAULT_POLICY_PATH, EvaluatorSettings(),
    )  # fmt: skip
    with pytest.raises(CandidateError) as info:
        new_candidate(bare, ["representations.kinds=[raw, questions]"], tmp_path / "c")
    assert str(info.value) == (
        "--set: edited pipeline.yaml: invalid pipeline spec: representations: kinds: 'questions' is "
        "generated: configure it under representations.generated.questions"
    )
    assert not (tmp_path / "c").exists()
