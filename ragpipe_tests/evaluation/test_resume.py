"""SIGKILL of a real evaluation process at six chosen cells (its progress hook), then ``--resume``: every expected
cell exactly once, metrics identical to an uninterrupted run of the same spec."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from ragpipe.evaluation.ledger import LEDGER, read_ledger, reduce_records
from ragpipe_tests.support.eval_support import EVALUABLE, cli, eval_bundle  # noqa: F401
from ragpipe_tests.support.paths import REPO

COMPLETED = b'"kind":"CellCompleted"'
KILL_AT = (3, 14, 27, 41, 55, 66)  # cumulative cells whose progress call kills the process
PER_COMMIT = 4  # each kill lands after the group commit holding that cell: at a multiple of 4
# The process kills itself with SIGKILL from the runner's progress hook, called for each cell of a
# group right after the group's closing records are durable: the kill point is a cell count, never
# a timing. (Kills inside a group commit: test_group_commit.py.)
KILLED_AT = """
import os, signal, sys
from pathlib import Path
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.runner import resume_evaluation, run_evaluation
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever

run, target, suite, bundle = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

def stop(done, expected, key):
    if done == target:
        os.kill(os.getpid(), signal.SIGKILL)

if run.exists():
    resume_evaluation(run, on_progress=stop, cells_per_commit=4)
else:
    retriever = Retriever(Path(bundle))
    spec = EvaluationSpec.build(load_suite(Path(suite)), load_plan(), Path(bundle), retriever.bundle_id, k=30, repeats=2)
    run_evaluation(spec, run, retriever_factory=lambda _: retriever, on_progress=stop, cells_per_commit=4)
"""


def completed_cells(run: Path) -> int:
    return (run / LEDGER).read_bytes().count(COMPLETED)


def killed_at(run: Path, target: int, suite: Path, bundle: Path) -> int:
    """Create or resume ``run`` in a new process that SIGKILLs itself after ``target`` cells."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_AT, str(run), str(target), str(suite), str(bundle)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return completed_cells(run)


def test_sigkill_at_six_cells_then_resume(eval_bundle, tmp_path):  # noqa: F811
    bundle, suite = eval_bundle
    args = ("--suite", str(suite), "--bundle", str(bundle), "--k", "30", "--repeats", "2")
    run = tmp_path / "killed"
    assert [killed_at(run, target, suite, bundle) for target in KILL_AT] == [
        -(-t // PER_COMMIT) * PER_COMMIT for t in KILL_AT
    ]
    done = cli("eval", "--resume", str(run), "--json", home=tmp_path)
    assert done.returncode == 0, done.stderr
    resumed = json.loads(done.stdout)

    records = read_ledger(run).records
    closed = Counter(
        (r.payload["cell"]["case"], r.payload["cell"]["repeat"])
        for r in records
        if r.kind in ("CellCompleted", "CellFailed")
    )
    state = reduce_records(records)
    assert state.status == "completed" and len(state.expected) == 2 * EVALUABLE
    assert set(closed) == {(c, r) for c, r, _ in state.expected} and set(closed.values()) == {1}
    assert [r.kind for r in records].count("RunCreated") == 1 and [r.kind for r in records].count("RunCompleted") == 1

    clean = cli("eval", *args, "--out", str(tmp_path / "clean"), "--json", home=tmp_path)
    assert clean.returncode == 0, clean.stderr
    uninterrupted = json.loads(clean.stdout)
    assert resumed["spec_id"] == uninterrupted["spec_id"] and resumed["run_id"] != uninterrupted["run_id"]
    assert resumed["metrics"] == uninterrupted["metrics"] and resumed["tags"] == uninterrupted["tags"]
    clean_state = reduce_records(read_ledger(tmp_path / "clean").records)
    assert {k: p["metrics"] for k, p in state.terminal.items()} == {
        k: p["metrics"] for k, p in clean_state.terminal.items()
    }
    # a resumed completed run is a no-op
    before = (run / LEDGER).read_bytes()
    again = cli("eval", "--resume", str(run), "--json", home=tmp_path)
    assert again.returncode == 0 and (run / LEDGER).read_bytes() == before
