"""SIGKILL at every step of activation and rollback: the pointer always resolves to a verified
release, and after recovery the history and the pointer agree."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ragpipe.release.activation import ACTIVATION_STEPS, activate
from ragpipe.release.history import read_history
from ragpipe.release.pointer import read_pointer
from ragpipe.release.recovery import MOVED, NOT_MOVED, recover_target
from ragpipe.release.status import resolve_active
from ragpipe.release.store import ReleaseStore
from ragpipe_tests.support.paths import REPO
from ragpipe_tests.support.release_fixtures import fresh_ws, publish

CRASH = """
import os, signal, sys
from pathlib import Path
from ragpipe.release.activation import activate
from ragpipe.release.rollback import rollback
from ragpipe.kernel.workspace import Workspace

ws, op, release_id, at = Workspace(Path(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4]
def hook(step):
    if step == at:
        os.kill(os.getpid(), signal.SIGKILL)
if op == "activate":
    activate(ws, release_id, "staging", on_step=hook)
else:
    rollback(ws, "staging", on_step=hook)
raise SystemExit("the hook was never called with " + at)
"""
SWAPPED_FROM = ACTIVATION_STEPS.index("pointer_renamed")


def crash(ws, op: str, release_id: str, step: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(ws.home), op, release_id, step],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def check_after_crash(ws, step: str, old: str, new: str, new_generation: int, before: tuple) -> None:
    store = ReleaseStore(ws)
    swapped = ACTIVATION_STEPS.index(step) >= SWAPPED_FROM
    # before any recovery, a reader resolves a verified release: the old one or the new one
    manifest, path = resolve_active(ws, "staging")
    assert manifest.release_id == (new if swapped else old) and path.is_dir()
    observed = recover_target(ws, "staging")
    if step in ("verified", "observed_appended"):
        assert observed is None  # nothing open: no intent yet, or the intent was already observed
    else:
        outcome, reason = ("active", MOVED) if swapped else ("failed", NOT_MOVED)
        assert (observed.payload["outcome"], observed.payload["reason"], observed.payload["release_id"]) == (
            outcome,
            reason,
            new,
        )
    state, records = read_history(store, "staging")
    pointer = read_pointer(store, "staging")
    assert state.open_intent is None
    assert (pointer.release_id, pointer.generation, pointer.ledger_head) == (
        state.active,
        state.generation,
        state.active_intent,
    )
    assert state.active == (new if swapped else old)
    assert state.generation == (new_generation if swapped else new_generation - 1)
    if step == "verified":
        assert records == before  # the killed writer wrote nothing
    else:
        assert state.states[new] == ("active" if swapped else "failed")
    assert recover_target(ws, "staging") is None  # settled once, agrees from then on


# Fixture releases are gated under fixture policies (release_fixtures.fixture_policy): the targets accept them.
pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


@pytest.mark.parametrize("step", ACTIVATION_STEPS)
def test_sigkill_during_activation(bundle: Path, tmp_path: Path, step: str):
    ws = fresh_ws(tmp_path, bundle)
    old = publish(ws, bundle, "r1")
    new = publish(ws, bundle, "r2", against=old)
    activate(ws, old, "staging")
    before = read_history(ReleaseStore(ws), "staging")[1]
    crash(ws, "activate", new, step)
    check_after_crash(ws, step, old, new, 2, before)
    result = activate(ws, new, "staging")  # the next activation continues the generations without a gap
    assert (result.generation, result.changed) == (2, not (ACTIVATION_STEPS.index(step) >= SWAPPED_FROM))
    leftovers = [p.name for p in ReleaseStore(ws).target_dir("staging").iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []


@pytest.mark.parametrize("step", ACTIVATION_STEPS)
def test_sigkill_during_rollback(bundle: Path, tmp_path: Path, step: str):
    ws = fresh_ws(tmp_path, bundle)
    first = publish(ws, bundle, "r1")
    second = publish(ws, bundle, "r2", against=first)
    activate(ws, first, "staging")
    activate(ws, second, "staging")
    before = read_history(ReleaseStore(ws), "staging")[1]
    crash(ws, "rollback", first, step)
    check_after_crash(ws, step, second, first, 3, before)
    state, _ = read_history(ReleaseStore(ws), "staging")
    if ACTIVATION_STEPS.index(step) >= SWAPPED_FROM:
        assert (state.stack, state.states[second]) == ((first,), "rolled_back")
    else:
        assert state.stack == (first, second)
