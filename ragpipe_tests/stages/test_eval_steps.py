"""``judge_budget_stop``: a judge budget reached inside the chain's evaluation step."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.evaluation.runner import ANSWERS
from ragpipe.stages.eval_steps import judge_budget_stop
from ragpipe.stages.stage_store import StageError
from ragpipe.work.failures import BudgetExhausted
from ragpipe.work.usage import UsageTotals


def test_a_budget_stop_is_one_line_and_drops_the_stopped_runs_pending_answers(tmp_path: Path):
    run = tmp_path / "evaluations" / "r1"
    (run / ANSWERS / "cell").mkdir(parents=True)
    (run / ANSWERS / "cell" / "entry.json").write_text("{}", encoding="utf-8")
    (run / "ledger.jsonl").write_text("", encoding="utf-8")
    with pytest.raises(StageError) as stopped, judge_budget_stop(run):
        raise BudgetExhausted("judge", 100, 90, UsageTotals(calls=3), 5)
    assert str(stopped.value) == (
        "judge budget reached: 90 micros spent, 5 answers of the open group not admitted and later groups not "
        f"judged; the incomplete run {run} is kept: raise evaluation.judge_budget_micros and materialize again "
        "(verdicts already paid for are cached)"
    )
    assert sorted(p.name for p in run.iterdir()) == ["ledger.jsonl"]  # kept, without its answers
