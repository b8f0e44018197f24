"""Running candidates end to end: a plan change on the parent's bundle, a build-side change
materialized through Dagster (child ``ragpipe build``) with the embedding cache reused, and a
two-step tune chain. One small workspace (100 SciFact-sample documents) per module."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ragpipe.candidates.asset_ids import EvaluatorSettings
from ragpipe.candidates.create import new_candidate, parent_from_revision
from ragpipe.candidates.folder import validate_candidate
from ragpipe.candidates.run import run_candidate
from ragpipe.candidates.tune import TuneSpace, label, tune
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.gate_policy import DEFAULT_POLICY_PATH
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.cli import homes_under, run_cli
from ragpipe_tests.support.paths import SAMPLE

PLAN = """schema: ragpipe.query_plan/v1
channels:
  lexical: {depth: 100, weight: 1.0}
  vector: {depth: 100, weight: 1.0}
fusion: {kind: weighted_rrf, k: 60}
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("cand")
    corpus = root / "rev-1-head.jsonl"
    corpus.write_text(
        "".join((SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:100]), encoding="utf-8"
    )
    ws, _, _ = build_all_stages(root / "ragpipe", "s1", corpus, "beir")
    (root / "plan.yaml").write_text(PLAN, encoding="utf-8")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAGPIPE_HOME", str(ws.home))
        env.setenv("DAGSTER_HOME", str(root / "dagster"))
        env.delenv("RAGPIPE_PIPELINE_SPEC", raising=False)
        yield root, ws


def parent(root: Path, ws):
    from ragpipe.spec import DEFAULT_SPEC_PATH

    return parent_from_revision(
        ws,
        "s1",
        DEFAULT_SPEC_PATH,
        root / "plan.yaml",
        load_suite(SAMPLE / "suite.jsonl"),
        DEFAULT_POLICY_PATH,
        EvaluatorSettings(),
    )


def test_plan_candidate_runs_on_the_parent_bundle(home):
    from ragpipe.cli.candidate import build_in_child

    root, ws = home
    c = new_candidate(parent(root, ws), ["query_plan.fusion.k=10"], root / "c-plan")
    result = run_candidate(ws, c, build_in_child)
    assert result.build is None
    inc, ch = load_arm(result.incumbent_run), load_arm(result.challenger_run)
    assert (inc.variant.arm, ch.variant.arm) == ("incumbent", "challenger")
    assert inc.variant.bundle_id == ch.variant.bundle_id  # the parent's bundle, reused
    assert (inc.variant.plan_id, ch.variant.plan_id) == (c.parent_plan.plan_id, c.plan.plan_id)
    assert inc.coordinates == ch.coordinates and inc.coordinates.suite_digest == c.suite.digest
    saved = json.loads((root / "c-plan/run/result.json").read_text())
    decision = json.loads((root / "c-plan/run/decision.json").read_text())
    comparison = json.loads((root / "c-plan/run/comparison.json").read_text())
    assert saved == json.loads(json.dumps(result.as_json()))
    assert (
        saved["decision_id"] == decision["decision_id"]
        and saved["comparison_id"] == comparison["comparison_id"] == decision["comparison_id"]
    )
    assert [c_["phase"] for c_ in decision["checks"]][:1] == ["hard"]
    assert (saved["eligible"], saved["decisive_phase"], decision["reasons"]) == (  # no wall clock decides
        False,
        "target",
        ["target ci_lower ndcg@10: 0 is not > 0"],
    )
    assert (decision["eligible"], decision["decisive_phase"]) == (False, "target")
    assert (
        comparison["certificate"]["incumbent"]["run_id"] == inc.run_id
        and comparison["certificate"]["challenger"]["run_id"] == ch.run_id
    )
    assert (
        saved["target"]["metric"] == "ndcg@10"
        and saved["target"]["n"] == comparison["slices"]["all"]["metrics"]["ndcg@10"]["stats"]["n"] > 0
    )
    with pytest.raises(
        ValueError, match=r"/run: already exists \(a candidate is run once; its result is .*/run/result.json\)$"
    ):
        run_candidate(ws, validate_candidate(root / "c-plan"), build_in_child)


def test_build_candidate_materializes_a_derived_revision_through_dagster(home):
    from ragpipe.cli.candidate import build_in_child

    root, ws = home
    parent_pointer = (ws.work / "s1" / "index_bundle" / "latest.json").read_bytes()
    c = new_candidate(parent(root, ws), ["representations.kinds=[raw]"], root / "c-build")
    derived = c.record.build_revision
    assert derived == "s1.c" + c.candidate_id[7:19]
    result = run_candidate(ws, c, build_in_child)
    built = result.build
    assert built is not None and built.revision == derived and built.up_to_date is False and built.dagster_run_id
    # only raw representations: every text is already in the cache from the parent's build
    assert (built.embedded, built.cache_hits) == (
        0,
        int(read_stage_record(ws, derived, "representations").facts["representations"]),
    )
    assert built.cache_hits > 0
    assert (ws.work / "s1" / "index_bundle" / "latest.json").read_bytes() == parent_pointer  # parent untouched
    inc, ch = load_arm(result.incumbent_run), load_arm(result.challenger_run)
    assert ch.variant.bundle_id == built.bundle_id != inc.variant.bundle_id
    assert inc.variant.plan_id == ch.variant.plan_id
    reg = json.loads((ws.registry / f"{derived}.json").read_text())
    assert reg["source_digest"] == json.loads((ws.registry / "s1.json").read_text())["source_digest"]


def test_tune_chain_reuses_the_incumbent_run(home):
    from ragpipe.cli.candidate import build_in_child

    root, ws = home
    space = TuneSpace.model_validate(
        {
            "dimensions": [
                {"name": "fusion-k", "options": ["query_plan.fusion.k=60", "query_plan.fusion.k=30"]},
                {"name": "weights", "options": [["query_plan.channels.vector.weight=0.5"]]},
            ]
        }
    )
    p = parent(root, ws)
    result = tune(ws, p, space, root / "tune", build_in_child)
    data = json.loads((root / "tune" / "tune.json").read_text())
    assert data == json.loads(json.dumps(result.as_json()))
    steps = data["steps"]
    assert [(s["dimension"], s["option"], s["status"]) for s in steps] == [
        ("fusion-k", 1, "skipped"),
        ("fusion-k", 2, "evaluated"),
        ("weights", 1, "evaluated"),
    ]
    assert steps[0]["reason"].startswith("--set leaves asset 'query_plan' unchanged")
    assert data["candidates"] == 2 and data["embedding"] == {"builds": 0, "embedded": 0, "cache_hits": 0}
    runs = [json.loads((Path(s["folder"]) / "run" / "result.json").read_text()) for s in steps[1:]]
    first_inc = load_arm(Path(runs[0]["incumbent_run"]))
    assert first_inc.variant.arm == label(p.snapshot.snapshot_id)
    accepted = [s for s in steps if s["accepted"]]
    assert data["accepted"] == len(accepted) and all(s["eligible"] for s in accepted)
    # the second step's incumbent is the first step's challenger when accepted, else the same parent run
    expected_inc = runs[0]["challenger_run"] if steps[1]["accepted"] else runs[0]["incumbent_run"]
    assert runs[1]["incumbent_run"] == expected_inc
    chosen = Path(data["chosen"]["query_plan"]).read_text()
    assert (
        chosen == (Path(steps[1]["folder"]) / "query_plan.yaml").read_text() if steps[1]["accepted"] else chosen == PLAN
    )


def cli(*args: str, root: Path) -> subprocess.CompletedProcess:
    return run_cli(*args, env=homes_under(root), unset=("RAGPIPE_PIPELINE_SPEC",))


def test_cli_new_validate_and_errors(home):
    root, _ = home
    done = cli(
        "candidate",
        "new",
        "--parent",
        "s1",
        "--suite",
        str(SAMPLE / "suite.jsonl"),
        "--plan",
        str(root / "plan.yaml"),
        "--set",
        "query_plan.fusion.k=15",
        "--out",
        str(root / "c-cli"),
        "--json",
        root=root,
    )
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    done = cli("candidate", "validate", str(root / "c-cli"), "--json", root=root)
    assert done.returncode == 0 and json.loads(done.stdout) == made
    assert (
        made["asset"] == "query_plan" and made["build_revision"] == "s1" and made["edits"] == ["query_plan.fusion.k=15"]
    )
    done = cli(
        "candidate",
        "new",
        "--parent",
        "nope",
        "--suite",
        str(SAMPLE / "suite.jsonl"),
        "--set",
        "query_plan.fusion.k=15",
        "--out",
        str(root / "c-x"),
        root=root,
    )
    assert done.returncode == 1 and "error: parent 'nope': revision 'nope' is not registered" in done.stderr
    done = cli(
        "candidate", "new", "--parent", "s1", "--set", "query_plan.fusion.k=15", "--out", str(root / "c-x"), root=root
    )
    assert (
        done.returncode == 1
        and done.stderr.strip() == "error: give --suite SUITE: a candidate locks the suite it is evaluated on"
    )
    bad_suite = root / "other-suite.jsonl"
    bad_suite.write_bytes(b"".join((SAMPLE / "suite.jsonl").read_bytes().splitlines(keepends=True)[:5]))
    done = cli("candidate", "run", str(root / "c-cli"), "--suite", str(bad_suite), root=root)
    assert (
        done.returncode == 1
        and f"error: --suite {bad_suite}: digest " in done.stderr
        and "differs from the candidate's locked suite" in done.stderr
    )
    assert not (root / "c-x").exists() and not (root / "c-cli" / "run").exists()
