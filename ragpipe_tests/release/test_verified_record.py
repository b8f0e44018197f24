"""A live release is verified in full once per target generation (``ragpipe.release.verified_record``):
later opens that only serve check the bundle's files and trust a sealed record for the rest; a
record that is forged, damaged, cut or stale is refused and the full verification runs again."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.seals import HOME_KEY, SealKey, sealed
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate
from ragpipe.release.live import live_release
from ragpipe.release.manifest import load_manifest
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.verified_record import (
    DOMAIN,
    VerifiedKey,
    record_path,
    remembered,
)
from ragpipe_tests.support.paths import REPO
from ragpipe_tests.support.release_fixtures import publish

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


def damage_evidence(ws: Workspace, release_id: str) -> tuple[Path, bytes]:
    """Flip one byte of one trace of the release's evaluation run (full verification refuses it);
    the trace and its original bytes."""
    manifest = load_manifest(ReleaseStore(ws), release_id)
    trace = sorted((ws.home / "evaluations" / manifest.evaluation.run_id / "traces").iterdir())[0]
    original = trace.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0x01
    trace.write_bytes(bytes(data))
    return trace, original


def key_of(ws: Workspace, target: str = "staging") -> VerifiedKey:
    return VerifiedKey.model_validate(json.loads(record_path(ws, target).read_text())["key"])


def test_the_full_verification_runs_once_per_generation(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    activate(ws, a, "staging")
    first = live_release(ws, "staging", remember=True)
    assert first.verified.arm is not None  # verified in full, then remembered
    key = key_of(ws)
    manifest = load_manifest(ReleaseStore(ws), a)
    assert (key.target, key.generation, key.release_id, key.material_digest, key.decision_id) == (
        "staging",
        1,
        a,
        manifest.material_digest,
        manifest.gate.decision_id,
    )
    assert remembered(ws, key) is not None
    trace, original = damage_evidence(ws, a)
    # remembered: served without re-reading the run (arm None), bundle verified all the same
    again = live_release(ws, "staging", remember=True)
    assert (again.release_id, again.verified.arm) == (a, None)
    with pytest.raises(ReleaseError, match=f"release {a} failed verification"):
        live_release(ws, "staging")  # a reader that does not remember verifies in full
    trace.write_bytes(original)
    # another generation (a rollback to the same release would do too): the record is stale
    b = publish(ws, bundle, "r2", against=a)
    activate(ws, b, "staging")
    served = live_release(ws, "staging", remember=True)
    assert (served.release_id, served.generation, served.verified.arm is not None) == (b, 2, True)
    assert (key_of(ws).generation, key_of(ws).release_id) == (2, b)


def forged_records(ws: Workspace, genuine: dict) -> dict[str, bytes]:
    """Every way a record can fail: each must be refused, never trusted."""
    content = {k: v for k, v in genuine.items() if k != "seal"}
    other = sealed(content, DOMAIN, SealKey(b"k" * 32))
    edited = json.loads(json.dumps(genuine))
    edited["seal"]["mac"] = "hmac-sha256:" + "0" * 64
    stale = json.loads(json.dumps(genuine))
    stale["key"]["generation"] = 7  # a record for another generation, seal and all: never this one's
    swapped = json.loads(json.dumps(genuine))
    swapped["bundle_manifest"] = "f" * 64
    return {
        "unsealed": canonical_bytes(content),
        "another key": canonical_bytes(other),
        "edited mac": canonical_bytes(edited),
        "bundle manifest changed": canonical_bytes(swapped),
        "stale": canonical_bytes(stale),
        "not json": b"{",
        "a list": b"[]",
        "duplicate key": b'{"key": 1, "key": 2}',
        "deep": b"[" * 5000 + b"]" * 5000,
    }


def test_a_forged_or_damaged_record_is_refused_and_verification_runs_in_full(
    ws: Workspace, bundle: Path, caplog: pytest.LogCaptureFixture
):
    a = publish(ws, bundle, "r1")
    activate(ws, a, "staging")
    live_release(ws, "staging", remember=True)
    path = record_path(ws, "staging")
    genuine = json.loads(path.read_bytes())
    damage_evidence(ws, a)
    for name, data in forged_records(ws, genuine).items():
        path.write_bytes(data)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ragpipe.release.verified_record"):
            with pytest.raises(ReleaseError, match=f"release {a} failed verification"):
                live_release(ws, "staging", remember=True)
        if name != "stale":  # a stale record is simply another generation's: no warning
            assert caplog.records and caplog.records[0].getMessage().startswith(
                f"{path}: verification record refused: "
            ), name
        assert path.read_bytes() == data, name  # a failed verification writes no record
    os.unlink(path)
    os.symlink(ws.home / "elsewhere.json", path)
    (ws.home / "elsewhere.json").write_bytes(canonical_bytes(genuine))
    with pytest.raises(ReleaseError, match="failed verification"):
        live_release(ws, "staging", remember=True)


def test_a_record_cut_at_any_byte_is_refused(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    activate(ws, a, "staging")
    live_release(ws, "staging", remember=True)
    path = record_path(ws, "staging")
    data, key = path.read_bytes(), key_of(ws)
    digest = json.loads(data)["bundle_manifest"]
    for size in range(len(data)):
        path.write_bytes(data[:size])
        assert remembered(ws, key) is None, size
    path.write_bytes(data)
    assert remembered(ws, key) == digest


def test_without_a_configured_key_the_home_key_seals_and_is_private(ws: Workspace, bundle: Path, monkeypatch):
    a = publish(ws, bundle, "r1")
    activate(ws, a, "staging")
    live_release(ws, "staging", remember=True)
    home_key = ws.verified / HOME_KEY
    assert stat.S_IMODE(home_key.stat().st_mode) == 0o600 and len(home_key.read_bytes()) == 32
    assert (
        json.loads(record_path(ws, "staging").read_bytes())["seal"]["key_id"] == SealKey(home_key.read_bytes()).key_id
    )
    # another home key (the file replaced): the record no longer verifies
    home_key.unlink()
    home_key.write_bytes(b"x" * 32)
    assert remembered(ws, key_of(ws)) is None
    # a configured key seals instead of the home's
    key = key_of_release(ws, a)
    monkeypatch.setenv("RAGPIPE_BUNDLE_KEY", "c" * 40)
    monkeypatch.delenv("RAGPIPE_BUNDLE_KEY_FILE", raising=False)
    record_path(ws, "staging").unlink()
    from ragpipe.release.verified_record import remember

    remember(ws, key, "e" * 64)
    assert json.loads(record_path(ws, "staging").read_bytes())["seal"]["key_id"] == SealKey(b"c" * 40).key_id
    assert remembered(ws, key_of(ws)) == "e" * 64


def key_of_release(ws: Workspace, release_id: str) -> VerifiedKey:
    manifest = load_manifest(ReleaseStore(ws), release_id)
    return VerifiedKey(
        target="staging",
        generation=1,
        history_head="sha256:" + "1" * 64,
        release_id=release_id,
        material_digest=manifest.material_digest,
        evaluation_ledger_head=manifest.evaluation.ledger_head,
        decision_id=manifest.gate.decision_id,
    )


CHILD = """
import json, sys
from pathlib import Path
from ragpipe.bundle import verify
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.live import live_release
ws = Workspace(Path(sys.argv[1]))
digest = sys.argv[2]
before = verify._known_good(digest, "payload")
live = live_release(ws, "staging", remember=True, defer_vector_table=True)
print(json.dumps([before, verify._known_good(digest, "payload"), live.verified.arm is None]))
"""


def test_a_new_process_trusts_the_recorded_payload_of_exactly_that_manifest(ws: Workspace, bundle: Path):
    """The payload checks (IDs recomputed, indexes cross-checked) of the recorded bundle manifest
    are skipped in a new process; every file's digest is checked all the same."""
    a = publish(ws, bundle, "r1")
    activate(ws, a, "staging")
    live_release(ws, "staging", remember=True)
    digest = json.loads(record_path(ws, "staging").read_bytes())["bundle_manifest"]
    env = {**os.environ, "RAGPIPE_HOME": str(ws.home)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ws.home), digest],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [False, True, True]
