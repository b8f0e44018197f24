"""SIGKILL at every step of a group commit, in a real evaluation process, then resume: each cell
of the killed group is closed or not (never half), what is on disk is exactly that, and the
resumed run closes every expected cell once with the metrics of an uninterrupted run."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import read_ledger, reduce_records
from ragpipe.evaluation.runner import resume_evaluation, run_evaluation
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401  (fixture)
from ragpipe_tests.support.paths import REPO

PER_COMMIT = 4
# The process wraps the runner's own functions and SIGKILLs itself inside the second group (cells
# 5-8): after its CellStarted records are durable, after its second cell ran, after its trace file
# is published (on the writer thread), after its closing records are fsynced but before the head
# moves, after the head.
KILL_IN_GROUP = """
import os, signal, sys
from pathlib import Path
from ragpipe.evaluation import ledger as eval_ledger, runner
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.kernel import ledger as kernel_ledger
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever

run, step, suite, bundle = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
calls = {}

def kill():
    os.kill(os.getpid(), signal.SIGKILL)

def counted(name):
    calls[name] = calls.get(name, 0) + 1
    return calls[name]

append_group, run_cell, write_traces = eval_ledger.Ledger.append_group, runner.run_cell, runner.write_traces
write_head = kernel_ledger.Ledger._write_head

def appended(self, events):
    records = append_group(self, events)
    kind = events[0][0] if events else None
    if kind in ("CellStarted", "CellCompleted") and counted(kind) == 2 and step == {"CellStarted": "started", "CellCompleted": "closed"}[kind]:
        kill()
    return records

def ran(*args):
    result = run_cell(*args)
    if counted("cell") == 6 and step == "ran":
        kill()
    return result

def traced(*args):
    refs = write_traces(*args)
    if counted("trace") == 2 and step == "traced":
        kill()
    return refs

def headed(self):
    if self.records[-1].kind == "CellCompleted" and counted("head") == 2 and step == "unheaded":
        kill()
    write_head(self)

eval_ledger.Ledger.append_group, runner.run_cell, runner.write_traces = appended, ran, traced
kernel_ledger.Ledger._write_head = headed
retriever = Retriever(Path(bundle), plan=load_plan())
spec = EvaluationSpec.build(load_suite(Path(suite)), load_plan(), Path(bundle), retriever.bundle_id, k=20)
runner.run_evaluation(spec, run, retriever_factory=lambda _: retriever, cells_per_commit=4)
"""
# After the kill: the cells closed on disk, whether the second group's trace file exists, and the
# cells whose CellStarted records may be durable. A group closes after the next group's cells ran
# (its trace file is written meanwhile, on the runner's writer thread), so a kill inside group 2
# finds group 1 unclosed; a kill on the writer thread right after group 2's file finds group 3's
# starts appended, not, or cut inside their write, as the main thread had got there or not.
AFTER = {
    "started": (0, False, {8}),
    "ran": (0, False, {8}),
    "traced": (4, True, set(range(8, 13))),  # group 3's starts may be cut mid-write: a torn tail
    "unheaded": (8, True, {12}),
    "closed": (8, True, {12}),
}


@pytest.fixture(scope="module")
def clean(eval_bundle, tmp_path_factory):  # noqa: F811
    bundle, suite = eval_bundle
    retriever = Retriever(bundle, plan=load_plan())
    spec = EvaluationSpec.build(load_suite(suite), load_plan(), bundle, retriever.bundle_id, k=20)
    out = tmp_path_factory.mktemp("clean") / "run"
    run_evaluation(spec, out, retriever_factory=lambda _: retriever, cells_per_commit=PER_COMMIT)
    return reduce_records(read_ledger(out).records), retriever


@pytest.mark.parametrize("step", list(AFTER))
def test_sigkill_at_each_step_of_a_group_commit_then_resume(eval_bundle, clean, tmp_path, step: str):  # noqa: F811
    bundle, suite = eval_bundle
    expected_state, retriever = clean
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", KILL_IN_GROUP, str(run), step, str(suite), str(bundle)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    closed, has_file, starts = AFTER[step]
    state = reduce_records(read_ledger(run).records)
    assert sorted(state.terminal, key=state.expected.index) == list(state.expected[:closed])
    assert (run / "traces" / "cells-000005.parquet").exists() == has_file
    started = [k for k in state.expected if state.starts.get(k)]
    assert len(started) in starts and started == list(state.expected[: len(started)])

    resume_evaluation(run, retriever_factory=lambda _: retriever, cells_per_commit=PER_COMMIT)
    records = read_ledger(run).records
    done = reduce_records(records)
    closes = Counter(tuple(r.payload["cell"].values()) for r in records if r.kind in ("CellCompleted", "CellFailed"))
    assert done.status == "completed" and set(closes.values()) == {1} and len(closes) == len(done.expected)
    # exactly the cells started but not closed before the kill ran again
    assert [k for k in done.expected if done.starts[k] == 2] == [k for k in started if k not in state.terminal]
    assert {k: p["metrics"] for k, p in done.terminal.items()} == {
        k: p["metrics"] for k, p in expected_state.terminal.items()
    }


def test_a_failed_trace_write_stops_the_run_and_closes_nothing_of_its_group(
    eval_bundle,  # noqa: F811
    clean,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
):
    """The writer thread's error reaches the caller; the group it was writing stays unclosed."""
    from ragpipe.evaluation import runner

    bundle, suite = eval_bundle
    _, retriever = clean
    spec = EvaluationSpec.build(load_suite(suite), load_plan(), bundle, retriever.bundle_id, k=20)
    write_traces, calls = runner.write_traces, []

    def failing(*args):
        calls.append(args[1])
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return write_traces(*args)

    monkeypatch.setattr(runner, "write_traces", failing)
    with pytest.raises(OSError, match="No space left on device"):
        run_evaluation(spec, tmp_path / "run", retriever_factory=lambda _: retriever, cells_per_commit=PER_COMMIT)
    state = reduce_records(read_ledger(tmp_path / "run").records)
    assert calls == ["traces/cells-000001.parquet", "traces/cells-000005.parquet"]
    assert sorted(state.terminal, key=state.expected.index) == list(state.expected[:PER_COMMIT])
    assert not (tmp_path / "run" / "traces" / "cells-000005.parquet").exists()


def test_an_interrupt_while_a_group_runs_closes_the_group_whose_file_is_written(
    eval_bundle,  # noqa: F811
    clean,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,
):
    """KeyboardInterrupt (or a cancelled run) inside the second group: the first group's trace file
    is durable, so its cells are closed before the interrupt propagates; a resume runs the rest."""
    from ragpipe.evaluation import runner

    bundle, suite = eval_bundle
    expected_state, retriever = clean
    spec = EvaluationSpec.build(load_suite(suite), load_plan(), bundle, retriever.bundle_id, k=20)
    score_group, groups = runner.score_group, []

    def interrupted(*args):
        groups.append(len(args[0]))
        if len(groups) == 2:
            raise KeyboardInterrupt
        return score_group(*args)

    monkeypatch.setattr(runner, "score_group", interrupted)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(spec, run, retriever_factory=lambda _: retriever, cells_per_commit=PER_COMMIT)
    state = reduce_records(read_ledger(run).records)
    assert sorted(state.terminal, key=state.expected.index) == list(state.expected[:PER_COMMIT])
    assert {p["trace"]["file"] for p in state.terminal.values()} == {"traces/cells-000001.parquet"}
    assert sum(state.starts.values()) == 2 * PER_COMMIT
    monkeypatch.setattr(runner, "score_group", score_group)
    resume_evaluation(run, retriever_factory=lambda _: retriever, cells_per_commit=PER_COMMIT)
    done = reduce_records(read_ledger(run).records)
    assert [k for k in done.expected if done.starts[k] == 2] == list(state.expected[PER_COMMIT : 2 * PER_COMMIT])
    assert {k: p["metrics"] for k, p in done.terminal.items()} == {
        k: p["metrics"] for k, p in expected_state.terminal.items()
    }
