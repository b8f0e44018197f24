"""The chain's code versions with and without an answer judge (``evaluation.judge``): a spec
without one keeps its exact code versions, a judge's spec ID enters them, its budget and
concurrency never do, and an edited judge file (or its prompt) is read again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ragpipe.evaluation.judge_spec import load_judge_spec
from ragpipe.spec import PipelineSpec, load_pipeline_spec
from ragpipe.stages.chain_plan import chain_plan
from ragpipe_tests.support.paths import REPO

SPECS = REPO / "ragpipe" / "specs"
# The checked-in spec's code versions before judges existed: they must never move with this feature.
CHECKED_IN = {
    "evaluation_run": "sha256:9eca2a506138a3fb639911ac2926efcff9af13fe5a0f29092aa402ef4f49ec79",
    "gate_decision": "sha256:42203d2ec47677738df5d07a4c7d4e7063541d95788626320830f4a299bbce29",
    "release_manifest": "sha256:c8c5d5967d0562cf466a930a2af67b232dbddcb114df211081bdd52e7c900f72",
}


def with_section(spec: PipelineSpec, **changes) -> PipelineSpec:
    assert spec.evaluation is not None
    return spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update=changes)})


@pytest.fixture
def judge_file(tmp_path: Path) -> Path:
    (tmp_path / "prompts").mkdir()
    shutil.copyfile(SPECS / "prompts" / "judge.txt", tmp_path / "prompts" / "judge.txt")
    shutil.copyfile(SPECS / "judge.yaml", tmp_path / "judge.yaml")
    return tmp_path / "judge.yaml"


def test_a_spec_without_a_judge_keeps_its_exact_code_versions_whatever_its_judge_settings():
    spec = load_pipeline_spec()
    assert spec.evaluation is not None and spec.evaluation.judge is None
    assert chain_plan(spec).code_versions() == CHECKED_IN
    operational = with_section(spec, judge_budget_micros=0, judge_concurrency=64)
    assert chain_plan(operational).code_versions() == CHECKED_IN


def test_a_judge_enters_every_code_version_and_implies_answers(judge_file: Path):
    spec = load_pipeline_spec()
    judged = chain_plan(with_section(spec, judge=judge_file))
    judge = load_judge_spec(judge_file)
    assert judged.judge == judge
    body = judged.evaluation_spec(Path("."), "").body
    assert (body.judge, body.answers) == (judge.spec_id, True)
    versions = judged.code_versions()
    assert all(versions[k] != CHECKED_IN[k] for k in CHECKED_IN)
    # answers: true written out is the same chain (a judge implies answers)
    assert chain_plan(with_section(spec, judge=judge_file, answers=True)).code_versions() == versions
    # budget and concurrency are operational: never in a version
    cheap = with_section(spec, judge=judge_file, judge_budget_micros=1000, judge_concurrency=1)
    assert chain_plan(cheap).code_versions() == versions
    # answers without a judge are another chain again
    unjudged = chain_plan(with_section(spec, answers=True)).code_versions()
    assert len({unjudged["evaluation_run"], versions["evaluation_run"], CHECKED_IN["evaluation_run"]}) == 3


def test_an_edited_judge_file_or_prompt_is_read_again(judge_file: Path):
    spec = with_section(load_pipeline_spec(), judge=judge_file)
    before = chain_plan(spec)
    assert chain_plan(spec) is before  # read once per version of its files
    text = judge_file.read_text(encoding="utf-8")
    judge_file.write_text(text.replace("rubric_version: 1\n", "rubric_version: 2\n"), encoding="utf-8")
    info = judge_file.stat()
    os.utime(judge_file, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))  # a later edit, whatever the clock
    after = chain_plan(spec)
    assert after.judge is not None and after.judge.rubric_version == 2
    assert after.evaluation_code_version != before.evaluation_code_version
    # so is an edited prompt (the file the judge spec names)
    prompt = judge_file.parent / "prompts" / "judge.txt"
    prompt.write_text(prompt.read_text(encoding="utf-8") + "Be brief.\n", encoding="utf-8")
    info = prompt.stat()
    os.utime(prompt, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    edited = chain_plan(spec)
    assert edited.judge is not None and edited.judge.prompt_text.endswith("Be brief.\n")
    assert edited.evaluation_code_version not in (before.evaluation_code_version, after.evaluation_code_version)


def test_the_judge_path_is_resolved_against_the_spec_folder(tmp_path: Path, judge_file: Path):
    text = (SPECS / "pipeline.yaml").read_text(encoding="utf-8")
    suite = (SPECS / "../../data/scifact-sample/suite-stable.jsonl").resolve()
    text = text.replace("  suite: ../../data/scifact-sample/suite-stable.jsonl\n", f"  suite: {suite}\n")
    text = text.replace("  gate_policy: null ", "  judge: judge.yaml\n  gate_policy: null ")
    (tmp_path / "pipeline.yaml").write_text(text, encoding="utf-8")
    spec = load_pipeline_spec(tmp_path / "pipeline.yaml")
    assert spec.evaluation is not None and spec.evaluation.judge == judge_file
    assert (spec.evaluation.judge_budget_micros, spec.evaluation.judge_concurrency) == (None, 4)


def test_the_chains_judge_sends_under_the_pipeline_specs_disclosure_policy(judge_file: Path):
    """A judge behind a local proxy (loopback) the spec lets receive only public text: the chain's
    judge may send no staff evidence, and its spec ID says so (another ID than the default's)."""
    judge_file.write_text(
        judge_file.read_text(encoding="utf-8").replace("api_base: null", "api_base: http://localhost:4000"),
        encoding="utf-8",
    )
    spec = with_section(load_pipeline_spec(), judge=judge_file)
    spec = spec.model_copy(
        update={"disclosure": spec.disclosure.model_validate({"endpoints": {"http://localhost:4000": ["public"]}})}
    )
    judge = chain_plan(spec).judge
    assert judge is not None and judge.send_scopes == ("public",)
    assert (judge.may_send(("staff",)), judge.may_send(("public",))) == (False, True)
    assert judge.spec_id != load_judge_spec(judge_file).spec_id  # the default policy sends every scope here
