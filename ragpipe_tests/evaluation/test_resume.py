"""SIGKILL of a real ``eval`` process at six different cells, then ``--resume``: every expected
cell exactly once, metrics identical to an uninterrupted run of the same spec."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

from ragpipe.evaluation.ledger import LEDGER, read_ledger, reduce_records
from ragpipe_tests.support.eval_support import EVALUABLE, cli, eval_bundle, eval_popen  # noqa: F401

COMPLETED = b'"kind":"CellCompleted"'
KILL_AT = (3, 14, 27, 41, 55, 66)  # cumulative completed cells at which a process is killed


def completed_cells(run: Path) -> int:
    try:
        return (run / LEDGER).read_bytes().count(COMPLETED)
    except FileNotFoundError:
        return 0


def kill_when(proc, run: Path, target: int) -> int:
    """SIGKILL ``proc`` as soon as the ledger holds ``target`` completed cells."""
    deadline = time.monotonic() + 300
    while completed_cells(run) < target:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return completed_cells(run)


def test_sigkill_at_six_cells_then_resume(eval_bundle, tmp_path):  # noqa: F811
    bundle, suite = eval_bundle
    args = ("--suite", str(suite), "--bundle", str(bundle), "--k", "30", "--repeats", "2")
    run = tmp_path / "killed"
    moments = []
    proc = eval_popen("eval", *args, "--out", str(run), home=tmp_path)
    moments.append(kill_when(proc, run, KILL_AT[0]))
    for target in KILL_AT[1:]:
        proc = eval_popen("eval", "--resume", str(run), home=tmp_path)
        moments.append(kill_when(proc, run, target))
    assert len(set(moments)) == len(KILL_AT) and moments == sorted(moments) and moments[-1] < 2 * EVALUABLE, moments
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
