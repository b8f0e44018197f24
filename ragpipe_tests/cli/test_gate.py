"""``ragpipe compare`` / ``ragpipe gate`` on real evaluation runs (run folders of ragpipe eval)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.runner import create_run, run_evaluation
from ragpipe.evaluation.suite import Suite
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.experiment.arm_source import ArmSourceError, load_arm
from ragpipe.experiment.gate_policy import load_policy
from ragpipe.retrieval.plan import load_plan, parse_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.eval_support import EVALUABLE, eval_bundle  # noqa: F401
from ragpipe_tests.support.gate_support import policy_doc


def gate_cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def runs(eval_bundle, tmp_path_factory):  # noqa: F811
    """Real runs on the sample bundle: incumbent (default plan, z-score fusion), challenger (RRF k=20), an A/A
    rerun of the incumbent, a run of a smaller suite and a run at another depth."""
    bundle, suite_path = eval_bundle
    root = tmp_path_factory.mktemp("gate-runs")
    suite = load_suite(suite_path)
    default = load_plan()
    k20 = parse_plan(
        {**default.model_dump(mode="json", by_alias=True), "fusion": {"kind": "weighted_rrf", "k": 20}}, "rrf-k20"
    )
    retrievers = {"default": Retriever(bundle, plan=default), "k20": Retriever(bundle, plan=k20)}
    smaller = Suite.of(suite.cases[:-5], "smaller")

    def run(name: str, plan_name: str, *, k: int = 50, arm: str = "a", of: Suite = suite) -> Path:
        r = retrievers[plan_name]
        spec = EvaluationSpec.build(of, r.plan, bundle, r.bundle_id, k=k, arm=arm)
        run_evaluation(spec, root / name, retriever_factory=lambda _: r)
        return root / name

    out = {
        "inc": run("inc", "default"),
        "ch": run("ch", "k20", arm="b"),
        "aa": run("aa", "default", arm="b"),
        "deep": run("deep", "k20", k=60),
        "smaller": run("smaller", "k20", of=smaller),
    }
    r = retrievers["default"]
    create_run(EvaluationSpec.build(suite, r.plan, bundle, r.bundle_id, k=50), root / "unfinished", r)
    out["unfinished"] = root / "unfinished"
    out["root"] = root
    return out


def test_arm_from_a_run_folder_matches_the_runs_report(runs):
    arm = load_arm(runs["inc"])
    report = json.loads((runs["inc"] / "report.json").read_text())
    assert (arm.run_id, arm.spec_id, arm.ledger_head) == (report["run_id"], report["spec_id"], report["ledger_head"])
    assert (arm.variant.bundle_id, arm.variant.plan_id, arm.variant.arm) == (
        report["bundle_id"],
        report["plan_id"],
        "a",
    )
    assert len(arm.cells) == len(arm.expected) == EVALUABLE and len(arm.skipped) == len(report["skipped"])
    from ragpipe.experiment.arms import summarize

    summary = summarize(arm)
    assert {n: (a.value, a.n) for n, a in summary.aggregates.items()} == {
        n: (m["value"], m["n"]) for n, m in report["metrics"].items()
    }
    assert summary.latency_p95_ms == report["latency_ms"]["p95"] and summary.evaluated_cases == report["evaluated"]


def test_compare_and_gate_on_real_runs(runs):
    out = runs["root"] / "cmp.json"
    done = gate_cli("compare", str(runs["inc"]), str(runs["ch"]), "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    stored = json.loads(out.read_text())
    assert printed == {**stored, "out": str(out)}
    assert (stored["certificate"]["incumbent"]["run_id"], stored["certificate"]["challenger"]["run_id"]) == (
        load_arm(runs["inc"]).run_id,
        load_arm(runs["ch"]).run_id,
    )
    assert len(stored["certificate"]["cells"]) == EVALUABLE
    assert list(stored["slices"]) == ["all", "tag:parity:even", "tag:parity:odd", "tag:short", "tag:synthetic"]
    again = gate_cli("compare", str(runs["inc"]), str(runs["ch"]), "--out", str(out), "--json")
    assert (
        again.returncode == 0 and json.loads(again.stdout)["comparison_id"] == stored["comparison_id"]
    )  # deterministic: a no-op

    decision_path = runs["root"] / "decision.json"
    gated = gate_cli("gate", str(out), "--json", "--out", str(decision_path))
    decision = json.loads(gated.stdout)
    # latency is advisory, so the outcome is a function of the runs alone: pinned exactly
    assert (gated.returncode, decision["eligible"], decision["decisive_phase"], decision["reasons"]) == (
        3,
        False,
        "hard",
        ["hard max unauthorized_disclosures: 2 is not <= 0", "target ci_lower ndcg@10: -0.00628115 is not > 0"],
    ), gated.stderr
    assert json.loads(decision_path.read_text()) == decision
    assert (decision["comparison_id"], decision["policy_id"], decision["mode"]) == (
        stored["comparison_id"],
        load_policy().policy_id,
        "paired",
    )
    assert [c["phase"] for c in decision["checks"]][:2] == ["hard", "hard"]
    human = gate_cli("gate", str(out))
    assert human.returncode == gated.returncode and f"gate decision {decision['decision_id']}" in human.stdout


def test_an_identical_challenger_is_not_eligible_exit_3(runs):
    out = runs["root"] / "aa.json"
    assert gate_cli("compare", str(runs["inc"]), str(runs["aa"]), "--out", str(out)).returncode == 0
    # The suite's x-forbidden case shows a document its subject must not see: both arms disclose
    # it, so under the default policy the hard phase decides before the target is even relevant.
    gated = gate_cli("gate", str(out), "--json")
    decision = json.loads(gated.stdout)
    assert (gated.returncode, decision["eligible"], decision["decisive_phase"]) == (3, False, "hard")
    assert decision["reasons"][0].startswith("hard max unauthorized_disclosures: ")
    no_hard = runs["root"] / "no-hard.yaml"
    no_hard.write_text(
        json.dumps(
            {
                **policy_doc(hard={}),
                "target": {"metric": "ndcg@10", "min_improvement": 0.0, "evidence": "p_value", "alpha": 0.05},
            }
        )
    )
    gated = gate_cli("gate", str(out), "--policy", str(no_hard), "--json")
    decision = json.loads(gated.stdout)
    assert (gated.returncode, decision["eligible"], decision["decisive_phase"]) == (3, False, "target")
    assert [c["verdict"] for c in decision["checks"] if c["phase"] == "target"] == ["pass", "fail"]  # 0 >= 0, but p = 1


def test_bootstrap_gate_on_a_run_folder(runs):
    doc = json.dumps(policy_doc(hard={}, bootstrap_floors={"ndcg@10": 0.0, "recall@100": 0.0}))
    passing = runs["root"] / "lenient.yaml"
    passing.write_text(doc)  # JSON is YAML
    done = gate_cli("gate", str(runs["inc"]), "--policy", str(passing), "--json")
    assert done.returncode == 0, done.stderr
    decision = json.loads(done.stdout)
    assert (decision["mode"], decision["eligible"], decision["incumbent"], decision["comparison_id"]) == (
        "bootstrap",
        True,
        None,
        None,
    )
    strict = runs["root"] / "strict.yaml"
    strict.write_text(doc.replace('"ndcg@10": 0.0', '"ndcg@10": 0.99'))
    done = gate_cli("gate", str(runs["inc"]), "--policy", str(strict), "--json")
    decision = json.loads(done.stdout)
    ndcg = json.loads((runs["inc"] / "report.json").read_text())["metrics"]["ndcg@10"]["value"]
    assert (done.returncode, decision["decisive_phase"], decision["reasons"]) == (
        3,
        "target",
        [f"target floor ndcg@10: {ndcg:.6g} is not >= 0.99"],
    )


def test_compare_refuses_runs_of_different_coordinates_and_damaged_runs(runs):
    out = runs["root"] / "never.json"
    done = gate_cli("compare", str(runs["inc"]), str(runs["deep"]), "--out", str(out))
    assert (
        done.returncode == 1
        and "error: runs differ in k: incumbent 50, challenger 60 (only bundle, plan and arm label may differ)"
        in done.stderr
    )
    done = gate_cli("compare", str(runs["inc"]), str(runs["smaller"]), "--out", str(out))
    assert done.returncode == 1 and "error: runs differ in suite_digest: incumbent 'sha256:" in done.stderr
    done = gate_cli("compare", str(runs["inc"]), str(runs["inc"]), "--out", str(out))
    assert (
        done.returncode == 1
        and f"error: incumbent and challenger are the same run {load_arm(runs['inc']).run_id}" in done.stderr
    )
    done = gate_cli("compare", str(runs["inc"]), str(runs["unfinished"]), "--out", str(out))
    assert (
        done.returncode == 1
        and f"error: {runs['unfinished'] / 'ledger.jsonl'}: the run is created, not completed; only a completed run can be compared"
        in done.stderr.replace("\n", "")
    )
    assert not out.exists()


def test_a_tampered_run_is_refused_by_its_custody(runs, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(runs["inc"], copy)
    ledger = copy / "ledger.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if b'"kind":"CellCompleted"' in line)  # after the group's starts
    assert b'"outcome":"success"' in lines[n]
    lines[n] = lines[n].replace(b'"outcome":"success"', b'"outcome":"abstained"')
    ledger.write_bytes(b"".join(lines))
    with pytest.raises(ArmSourceError, match=f"^{ledger}: record {n + 1}: hash does not match the record's content$"):
        load_arm(copy)


def test_gate_errors_exit_1_and_write_nothing(runs, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: ragpipe.gate_policy/v1\nspeed: {}\n")
    decision = tmp_path / "d.json"
    done = gate_cli("gate", str(runs["inc"]), "--policy", str(bad), "--out", str(decision))
    assert done.returncode == 1 and f"error: {bad}:2: speed: unknown phase" in done.stderr.replace("\n", "")
    done = gate_cli("gate", str(tmp_path / "missing.json"))
    assert (
        done.returncode == 1
        and f"error: {tmp_path / 'missing.json'}: cannot read comparison: No such file or directory"
        in done.stderr.replace("\n", "")
    )
    assert not decision.exists()
