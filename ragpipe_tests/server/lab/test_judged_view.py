"""The trace inspector of a judged run: the judge's outcome, the answer's text and the verdict —
shown to a reviewer who may read every cited item, withheld from one who may not."""

from __future__ import annotations

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.judge_spec import DEFAULT_JUDGE_SPEC, judge_spec
from ragpipe.evaluation.judging import Judging
from ragpipe.evaluation.run_folder import verify_run
from ragpipe.evaluation.runner import new_run_id, run_evaluation
from ragpipe.evaluation.suite import Case, Suite
from ragpipe.retrieval.retriever import Retriever
from ragpipe.server.app import app_from
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.usage import load_prices
from ragpipe_tests.server.lab.test_views import login
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.lab_state import CASES, SCOPES, LabState
from ragpipe_tests.support.llm_server import LLMServer, judge_reply
from ragpipe_tests.support.served_http import served

ANSWER_TEXT = '<dt>Answer</dt><dd class="text">'
PROMPT = (DEFAULT_JUDGE_SPEC.parent / "prompts" / "judge.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def judged_home(tmp_path_factory, lab_state: LabState):
    """A home with one handbook bundle and one judged run of the lab's cases (facts added), the
    answers extractive, the judge a local server; the lab's keys."""
    root = tmp_path_factory.mktemp("judged-lab")
    home = root / "home"
    _, _, bundle = build_all_stages(home, "lab", write_tree(root / "lab", HANDBOOK), "markdown")
    cases = [Case(**{**c.canonical(), "required_facts": ["signing keys"]}) for c in CASES if c.id in ("goals", "keys")]
    with LLMServer() as server:
        server.scenario, server.responder = "responder", judge_reply
        spec_judge = judge_spec(
            {"model": "openai/gpt-4o-mini", "api_base": server.api_base, "rubric_version": 1}, PROMPT
        )
        retriever = Retriever(bundle)
        spec = EvaluationSpec.build(
            Suite.of(cases, "judged"), retriever.plan, bundle, retriever.bundle_id, k=10, scopes=SCOPES,
            answers=True, judge=spec_judge,
        )  # fmt: skip
        judging = Judging(spec_judge, root / "cache", ExecutionPolicy(max_attempts=1), load_prices())
        run_ids = [new_run_id(), new_run_id()]  # two runs of one spec: the lab compares them
        for run_id in run_ids:
            run = home / "evaluations" / run_id
            run_evaluation(spec, run, run_id=run_id, retriever_factory=lambda _: retriever, judging=judging)
        retriever.close()
    state = verify_run(home / "evaluations" / run_ids[0])
    with served(app_from(home, lab_state.config(), "staging")) as base:
        yield base, run_ids, state


def test_a_staff_reviewer_reads_the_verdict_a_public_one_does_not(judged_home, lab_state: LabState):
    base, (run_id, _), state = judged_home
    judged = {key[0]: p for key, p in state.terminal.items() if p.get("judge_outcome") == "judged"}
    assert "keys" in judged  # the answer on key rotation cites the staff-only runbook
    staff, public = login(base, lab_state.keys["rev-staff"]), login(base, lab_state.keys["rev-public"])
    try:
        page = staff.get(f"/lab/runs/{run_id}/cases/keys/0")
        assert page.status_code == 200
        label = ["0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"][
            int(judged["keys"]["metrics"]["answer_label"])
        ]
        assert "Judge verdict" in page.text and f"<dd>{label}</dd>" in page.text
        assert "signing keys — " in page.text and "Judge key <code>sha256:" in page.text
        assert ANSWER_TEXT in page.text
        withheld = public.get(f"/lab/runs/{run_id}/cases/keys/0")
        assert withheld.status_code == 200
        assert "Withheld: the answer cites sources outside your scopes." in withheld.text
        # neither the label nor the answer's text (it quotes the staff-only runbook)
        assert f"<dd>{label}</dd>" not in withheld.text and ANSWER_TEXT not in withheld.text
    finally:
        staff.close()
        public.close()


def test_the_comparison_shows_both_runs_label_distributions(judged_home, lab_state: LabState):
    base, (first, second), state = judged_home
    labels = [int(p["metrics"]["answer_label"]) for p in state.terminal.values() if "answer_label" in p["metrics"]]
    names = ["0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"]
    reviewer = login(base, lab_state.keys["rev-public"])
    try:
        page = reviewer.get("/lab/compare", params={"incumbent": first, "challenger": second})
        assert page.status_code == 200 and "<h2>Answer labels</h2>" in page.text
        for rank, name in enumerate(names):  # the same verdicts (cached) on both sides
            count = labels.count(rank)
            row = (
                f'<tr><th scope="row">{name}</th><td><a href="/lab/runs/{first}">{count}</a></td>'
                f'<td><a href="/lab/runs/{second}">{count}</a></td></tr>'
            )
            assert row in page.text
    finally:
        reviewer.close()
