"""A judged release chain through Dagster: ``evaluation.judge`` set, the judge a real local
OpenAI-protocol server, a tiny corpus. The evaluation run's report carries the label
distribution, and the gate applies a hard ``groundedness_rate`` bound — one policy passes, a
stricter one refuses with its exact reason; the incumbent release's bundle is judged by the
chain's judge when the judge changes, so the arms pair; a judge budget reached fails the step
with one line and keeps the run folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance

from ragpipe.corpus.registry import register_revision
from ragpipe.defs import build_definitions
from ragpipe.evaluation.judge_spec import load_judge_spec
from ragpipe.evaluation.ledger import read_ledger
from ragpipe.evaluation.run_folder import verify_run
from ragpipe.experiment.arm_source import load_arm
from ragpipe.kernel.workspace import Workspace
from ragpipe.orchestration.failures import failure_messages
from ragpipe.release.activation import activate
from ragpipe.release.targets import load_targets
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages.gate_steps import read_decision
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.support.corpora import write_beir
from ragpipe_tests.support.gate_support import policy_doc
from ragpipe_tests.support.llm_server import LLMServer, judge_reply
from ragpipe_tests.support.paths import REPO

CHAIN = ("evaluation_run", "gate_decision", "release_manifest")
SPECS = REPO / "ragpipe" / "specs"
DOCS = [
    {"_id": "d-aspirin", "title": "Aspirin", "text": "Aspirin lowers the risk of stroke in older adults."},
    {"_id": "d-statin", "title": "Statins", "text": "Statins lower cholesterol and prevent heart attacks."},
    {"_id": "d-sleep", "title": "Sleep", "text": "Adults need seven hours of sleep for good memory."},
    {"_id": "d-water", "title": "Water", "text": "Drinking water before meals helps weight loss."},
]
CASES = [
    {"id": "c-aspirin", "query": "Does aspirin lower the risk of stroke?", "judgments": {"d-aspirin": 1},
     "required_facts": ["aspirin", "stroke"]},
    {"id": "c-statin", "query": "What do statins prevent?", "judgments": {"d-statin": 1},
     "required_facts": ["heart attacks"]},
    {"id": "c-sleep", "query": "How many hours of sleep do adults need?", "judgments": {"d-sleep": 1},
     "required_facts": ["seven hours", "memory", "placebo"]},
    {"id": "c-water", "query": "Does drinking water before meals help weight loss?", "judgments": {"d-water": 1},
     "required_facts": ["water", "randomised trial", "placebo"]},
]  # fmt: skip
# Labels by the share of facts the (extractive) answer states: 3, 3, 2 (two of three), 1 (one of three).
UNGROUNDED = "What do statins prevent?"  # the judge finds the answer to this case ungrounded: groundedness 3/4


class Judge(LLMServer):
    """The judge: ``judge_reply``, except that answers about ``UNGROUNDED`` cite no support."""

    def reply(self, request: dict) -> str:
        verdict = json.loads(judge_reply(request))
        if UNGROUNDED in str(request["messages"][-1]["content"]):
            verdict["claims"] = [{**c, "supported_by": []} for c in verdict["claims"]]
            verdict["grounded"] = False
        return json.dumps(verdict)


def write_policy(path: Path, groundedness_min: float) -> Path:
    doc = policy_doc(
        hard={
            "unauthorized_disclosures": {"max": 0},
            "judge_failure_rate": {"max": 0.0},
            "groundedness_rate": {"min": groundedness_min},
        },
        coverage={"max_failed_rate": 0.0, "min_cases": 1},
        regression={"overall": {}, "tags": {}},
        bootstrap_floors={"ndcg@10": 0.0, "recall@100": 0.0},
    )
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def write_spec(folder: Path, policy: str, judge: str, budget: int | None = None) -> Path:
    spec = yaml.safe_load((SPECS / "pipeline.yaml").read_text(encoding="utf-8"))
    spec["evaluation"] = {"suite": "suite.jsonl", "k": 10, "gate_policy": policy, "judge": judge}
    if budget is not None:
        spec["evaluation"]["judge_budget_micros"] = budget
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def write_judge(folder: Path, name: str, api_base: str, rubric_version: int = 1) -> str:
    (folder / "prompts").mkdir(exist_ok=True)
    shutil.copyfile(SPECS / "prompts" / "judge.txt", folder / "prompts" / "judge.txt")
    judge = {"schema": "ragpipe.judge_spec/v1", "model": "openai/gpt-4o-mini", "api_base": api_base,
             "prompt": "prompts/judge.txt", "rubric_version": rubric_version, "seed": 0}  # fmt: skip
    (folder / name).write_text(yaml.safe_dump(judge, sort_keys=False), encoding="utf-8")
    return name


def judge_calls(server: LLMServer) -> int:
    return sum("3_AUTHORITATIVE" in str(r["messages"][0]["content"]) for r in server.requests)


def materialize(ws: Workspace, instance: DagsterInstance, spec_path: Path, chain_only: bool = True) -> list[str]:
    """Run ``build_revision`` for revision ``tiny`` under the spec at ``spec_path`` (only the chain's
    assets when ``chain_only``); the failure messages (none: it succeeded)."""
    job = build_definitions(load_pipeline_spec(spec_path), home=str(ws.home)).resolve_job_def("build_revision")
    selection = [AssetKey(a) for a in CHAIN] if chain_only else None
    result = job.execute_in_process(
        partition_key="tiny", instance=instance, asset_selection=selection, raise_on_error=False
    )
    return [] if result.success else failure_messages(result.all_events)


@pytest.fixture(scope="module")
def judged_chain(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("judged-chain")
    cfg = root / "cfg"
    cfg.mkdir()
    (cfg / "suite.jsonl").write_text(
        "".join(json.dumps({**c, "target_level": "document"}) + "\n" for c in CASES), encoding="utf-8"
    )
    write_policy(cfg / "lenient.yaml", 0.7)
    write_policy(cfg / "strict.yaml", 0.9)
    ws = Workspace(root / "ragpipe")
    (root / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(root / "dagster"))
    instance.add_dynamic_partitions("corpus_revisions", ["tiny"])
    register_revision(ws.registry, "tiny", write_beir(root / "tiny.jsonl", DOCS), "beir", "public")
    targets = cfg / "targets.yaml"  # staging also accepts the two test policies
    text = (SPECS / "targets.yaml").read_text(encoding="utf-8")
    targets.write_text(
        text.replace("gate_policies: [default]   #", "gate_policies: [default, lenient.yaml, strict.yaml]   #", 1),
        encoding="utf-8",
    )
    with Judge() as server, pytest.MonkeyPatch.context() as env:
        env.setenv("RAGPIPE_TARGETS", str(targets))
        server.scenario, server.responder = "responder", server.reply
        judge = write_judge(cfg, "judge.yaml", server.api_base)
        out: dict = {"ws": ws, "cfg": cfg, "server": server, "instance": instance}
        out["lenient"] = materialize(ws, instance, write_spec(cfg, "lenient.yaml", judge), chain_only=False)
        out["lenient_eval"] = read_stage_record(ws, "tiny", "evaluation_run")
        out["lenient_gate"] = read_stage_record(ws, "tiny", "gate_decision")
        out["calls_after_lenient"] = judge_calls(server)
        # the lenient release goes live: later gates pair with it (the incumbent)
        out["release"] = read_stage_record(ws, "tiny", "release_manifest").data_version
        activate(ws, out["release"], "staging", config=load_targets(targets))
        # the same judge, a stricter policy: the new run's verdicts come from the judge cache
        out["strict"] = materialize(ws, instance, write_spec(cfg, "strict.yaml", judge))
        out["strict_eval"] = read_stage_record(ws, "tiny", "evaluation_run")
        out["strict_gate"] = read_stage_record(ws, "tiny", "gate_decision")
        out["calls_after_strict"] = judge_calls(server)
        # another judge: the incumbent's run (judged by the first) no longer pairs, so the gate
        # evaluates the incumbent's bundle again, judged by the new judge
        v2 = write_judge(cfg, "judge-v2.yaml", server.api_base, rubric_version=2)
        out["v2"] = materialize(ws, instance, write_spec(cfg, "lenient.yaml", v2))
        out["v2_eval"] = read_stage_record(ws, "tiny", "evaluation_run")
        out["v2_gate"] = read_stage_record(ws, "tiny", "gate_decision")
        out["calls_after_v2"] = judge_calls(server)
        # a third judge (nothing cached) on a budget of 1 micro: the evaluation step stops
        v3 = write_judge(cfg, "judge-v3.yaml", server.api_base, rubric_version=3)
        out["budget"] = materialize(ws, instance, write_spec(cfg, "lenient.yaml", v3, budget=1))
        out["calls_after_budget"] = judge_calls(server)
        yield out
    instance.dispose()


def decision(ws: Workspace, record) -> dict:
    return read_decision(ws.stage_dir("tiny", "gate_decision") / record.data_version.split(":")[1])


def test_the_evaluation_run_is_judged_and_its_report_carries_the_label_distribution(judged_chain):
    ws, record = judged_chain["ws"], judged_chain["lenient_eval"]
    assert judged_chain["lenient"] == []
    run = ws.located(str(record.facts["run_path"]))
    assert verify_run(run).status == "completed"  # every verdict recomputes from its evidence
    report = json.loads((run / "report.json").read_bytes())
    quality = report["answer_quality"]
    cells = quality["cells"]
    assert cells["distribution"] == {"0_FAIL": 0, "1_PARTIAL": 1, "2_SUBSTANTIAL": 1, "3_AUTHORITATIVE": 2}
    assert (quality["judged"], cells["labelled"], cells["mean_label"]) == (4, 4, 2.25)
    assert set(quality["failures"].values()) == {0}
    assert {m: report["metrics"][m]["value"] for m in ("groundedness_rate", "judge_failure_rate")} == {
        "groundedness_rate": 0.75,
        "judge_failure_rate": 0.0,
    }
    assert judged_chain["calls_after_lenient"] == 4  # one call per answer
    # the Dagster UI shows the distribution beside the metrics
    found = judged_chain["instance"].fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("evaluation_run"), asset_partitions=["tiny"]), limit=10
    )
    (m,) = [
        r.asset_materialization
        for r in found.records
        if r.asset_materialization.metadata["run_id"].value == record.facts["run_id"]
    ]
    labels = m.metadata["answer_labels"].value.records
    assert [(r.data["label"], r.data["answers"], r.data["cases"]) for r in labels] == [
        ("0_FAIL", 0, 0.0),
        ("1_PARTIAL", 1, 1.0),
        ("2_SUBSTANTIAL", 1, 1.0),
        ("3_AUTHORITATIVE", 2, 2.0),
    ]
    # the run binds the chain's judge, which is in its coordinates: only runs of one judge pair
    assert load_arm(run).coordinates.judge == load_judge_spec(judged_chain["cfg"] / "judge.yaml").spec_id


def test_a_hard_groundedness_bound_passes_one_policy_and_refuses_a_stricter_one(judged_chain):
    ws = judged_chain["ws"]
    lenient = decision(ws, judged_chain["lenient_gate"])
    assert (lenient["eligible"], lenient["decisive_phase"], lenient["reasons"]) == (True, None, [])
    bound = next(c for c in lenient["checks"] if c.get("metric") == "groundedness_rate")
    assert (bound["phase"], bound["value"], bound["threshold"], bound["verdict"]) == ("hard", 0.75, 0.7, "pass")
    assert judged_chain["strict"] == []
    strict = decision(ws, judged_chain["strict_gate"])
    assert (strict["mode"], strict["eligible"], strict["decisive_phase"]) == ("paired", False, "hard")
    assert strict["reasons"] == ["hard min groundedness_rate: 0.75 is not >= 0.9"]
    # the stricter policy's run was a new evaluation of the same judge: every verdict from the cache
    assert judged_chain["strict_eval"].facts["run_id"] != judged_chain["lenient_eval"].facts["run_id"]
    assert judged_chain["calls_after_strict"] == judged_chain["calls_after_lenient"]


def test_a_judge_budget_reached_fails_the_evaluation_step_with_one_line_and_keeps_the_run(judged_chain):
    ws = judged_chain["ws"]
    (message,) = judged_chain["budget"]
    run = message.split("the incomplete run ", 1)[1].split(" is kept", 1)[0]
    assert message == (
        "evaluation_run: judge budget reached: 0 micros spent, 4 answers of the open group not admitted and later "
        f"groups not judged; the incomplete run {run} is kept: raise evaluation.judge_budget_micros and materialize "
        "again (verdicts already paid for are cached)"
    )
    assert Path(run).parent == ws.home / "evaluations" and read_ledger(Path(run)).records  # kept, incomplete
    assert verify_run(Path(run)).status == "running"
    assert judged_chain["calls_after_budget"] == judged_chain["calls_after_v2"]  # nothing was admitted
    # no record names it: the revision's evaluation_run is still the last one that completed
    last = judged_chain["v2_eval"].facts["run_id"]
    assert read_stage_record(ws, "tiny", "evaluation_run").facts["run_id"] == last


def test_the_incumbent_is_judged_by_the_chains_judge_so_the_runs_pair(judged_chain):
    ws = judged_chain["ws"]
    same = judged_chain["strict_gate"].facts  # the incumbent's own run was judged by this judge
    assert (same["incumbent_release"], same["incumbent_reevaluated"]) == (judged_chain["release"], None)
    assert same["incumbent_run"] == judged_chain["lenient_eval"].facts["run_id"]
    assert judged_chain["v2"] == []
    facts = judged_chain["v2_gate"].facts
    assert facts["incumbent_release"] == judged_chain["release"]
    assert facts["incumbent_reevaluated"] == facts["incumbent_run"] != same["incumbent_run"]
    v2 = load_judge_spec(judged_chain["cfg"] / "judge-v2.yaml").spec_id
    incumbent = load_arm(ws.home / "evaluations" / str(facts["incumbent_run"]))
    challenger = load_arm(ws.located(str(judged_chain["v2_eval"].facts["run_path"])))
    assert incumbent.coordinates == challenger.coordinates and incumbent.coordinates.judge == v2
    # the challenger's 4 answers were judged anew; the incumbent's (the same bundle: the same
    # answers) came from the judge cache
    assert judged_chain["calls_after_v2"] == judged_chain["calls_after_strict"] + 4
    d = decision(ws, judged_chain["v2_gate"])
    assert (d["mode"], d["eligible"], d["decisive_phase"], d["reasons"]) == ("paired", True, None, [])
    assert d["comparison_id"] is not None  # paired case by case: the labels of one judge on both sides
