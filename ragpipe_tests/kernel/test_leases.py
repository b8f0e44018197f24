"""Bundle leases: held while the holder lives, gone when it dies (even by SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ragpipe.kernel.leases import BundleLease, held_bundles, leases_dir
from ragpipe.kernel.workspace import Workspace
from ragpipe_tests.support.paths import REPO

B1, B2 = "sha256:" + "a" * 64, "sha256:" + "b" * 64
HOLD = """
import signal, sys
from pathlib import Path
from ragpipe.kernel.leases import BundleLease
from ragpipe.kernel.workspace import Workspace
BundleLease(Workspace(Path(sys.argv[1])), sys.argv[2])
print("held", flush=True)
signal.pause()  # until killed
"""


def test_a_lease_is_held_until_released(tmp_path: Path):
    ws = Workspace(tmp_path)
    first, second = BundleLease(ws, B1), BundleLease(ws, B2)
    assert held_bundles(ws) == {B1, B2}
    first.release()
    first.release()  # idempotent
    assert held_bundles(ws) == {B2}
    second.release()
    assert held_bundles(ws) == frozenset() and list(leases_dir(ws).iterdir()) == []


def test_the_lease_of_a_killed_holder_is_stale_and_removed(tmp_path: Path):
    ws = Workspace(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), B1], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        assert held_bundles(ws) == {B1}  # another process's live lease
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # the holder is reaped, so its descriptors (and the lock) are gone
    assert held_bundles(ws) == frozenset() and list(leases_dir(ws).iterdir()) == []


def test_only_bundle_ids_can_be_leased(tmp_path: Path):
    with pytest.raises(ValueError, match=r"'abc' is not a bundle ID \(sha256:<64 hex>\)"):
        BundleLease(Workspace(tmp_path), "abc")
