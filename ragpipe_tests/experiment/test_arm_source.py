"""A real run of a suite with case cards as an arm: strata as run tags (report slices, arm tags),
provisional cases counted from the bound suite, and a gate bounding them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import read_ledger
from ragpipe.evaluation.runner import run_evaluation
from ragpipe.evaluation.suite import check_against_bundle
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.experiment.arm_source import ArmSourceError, load_arm
from ragpipe.experiment.decision import decide
from ragpipe.experiment.gate_policy import parse_policy
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.evaluation.test_recompute import rewrite
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401
from ragpipe_tests.support.gate_support import policy_doc

CASES = 12
DRAFT = {
    "provenance": {
        "author": "model",
        "by": "drafter",
        "model_spec_id": "sha256:" + "5" * 64,
        "at": "2026-12-07T21:08:01Z",
    },
    "review": "provisional",
}


@pytest.fixture(scope="module")
def carded(eval_bundle, tmp_path_factory):  # noqa: F811
    """A run of 12 evaluable sample cases: strata ``lookup`` / ``claim`` alternating, the first case
    a model's provisional draft whose relevant document is its ``expected`` source."""
    bundle, suite_path = eval_bundle
    retriever = Retriever(bundle, plan=load_plan())
    full = load_suite(suite_path)
    statuses = check_against_bundle(full, retriever.scopes.keys(), retriever.chunks.keys())
    evaluable = {s.case_id for s in statuses if s.evaluable}
    chosen = [
        c for c in full.cases if c.id in evaluable and c.answerability == "answerable" and not c.id.startswith("x-")
    ]
    rows = []
    for i, case in enumerate(chosen[:CASES]):
        row = {**case.canonical(), "stratum": "lookup" if i % 2 == 0 else "claim"}
        if i == 0:
            row = {**row, **DRAFT, "expected": sorted(case.judgments), "judgments": {}}
        rows.append(row)
    root = tmp_path_factory.mktemp("cards")
    (root / "suite.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    suite = load_suite(root / "suite.jsonl")
    spec = EvaluationSpec.build(suite, load_plan(), bundle, retriever.bundle_id, k=20)
    result = run_evaluation(spec, root / "run", retriever_factory=lambda _: retriever)
    return suite, root / "run", result.report


def test_strata_are_run_tags_and_report_slices(carded):
    suite, run, report = carded
    tags = {c.id: sorted([*c.tags, f"stratum:{c.stratum}"]) for c in suite.cases}  # with the sample's own tags
    assert read_ledger(run).records[0].payload["tags"] == tags
    strata = {tag: t["cases"] for tag, t in report["tags"].items() if tag.startswith("stratum:")}
    assert strata == {"stratum:claim": 6, "stratum:lookup": 6}
    assert set(report["tags"]["stratum:lookup"]["metrics"]) == set(report["metrics"])
    assert load_arm(run).tags == {case: tuple(t) for case, t in tags.items()}


def test_provisional_cases_are_reported_and_known_to_the_arm(carded):
    suite, run, report = carded
    (draft,) = [c.id for c in suite.cases if c.provisional]
    assert suite.provisional() == (draft,) and suite.by_id()[draft].expected
    assert report["provisional"] == {"count": 1, "cases": [draft]}
    assert f"- `{draft}` (provisional)" in (run / "report.md").read_text(encoding="utf-8")
    assert load_arm(run).provisional == (draft,)


def test_a_gate_refuses_the_suite_under_a_zero_bound_and_passes_without_it(carded):
    _, run, _ = carded
    arm = load_arm(run)
    doc = policy_doc(
        hard={"unauthorized_disclosures": {"max": 0}},
        bootstrap_floors={"ndcg@10": 0.0, "recall@100": 0.0},
        regression={"overall": {}, "tags": {"stratum:lookup": {"ndcg@10": 0.05}}},
    )
    unset = decide(parse_policy(doc, "p.yaml"), None, arm)
    assert (unset.eligible, unset.decisive_phase) == (True, None)
    doc["coverage"] = {**doc["coverage"], "max_provisional_cases": 0}
    refused = decide(parse_policy(doc, "p.yaml"), None, arm)
    assert (refused.eligible, refused.decisive_phase) == (False, "coverage")
    assert refused.reasons == (
        "coverage provisional_cases: 1 is not <= 0 (the suite holds 1 provisional case, not yet adjudicated by a "
        "person; max_provisional_cases is 0)",
    )


def test_a_run_record_that_hides_a_provisional_case_is_refused(carded, tmp_path: Path):
    """RunCreated's list (what reports show) must be the bound suite's: a forger who drops it,
    with every hash recomputed, does not get an arm without provisional cases."""
    suite, run, _ = carded
    forged = Path(shutil.copytree(run, tmp_path / "run"))

    def hide(payloads):
        payloads[0][1].pop("provisional")

    rewrite(forged, hide)
    with pytest.raises(ArmSourceError) as err:
        load_arm(forged)
    assert str(err.value) == (
        f"{forged / 'ledger.jsonl'}: record 1: RunCreated lists provisional cases [], "
        f"the bound suite {list(suite.provisional())}"
    )
