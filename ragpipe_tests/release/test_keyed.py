"""With a key configured, the whole release chain is sealed: the evaluation run's ledger head, the
kept decision, the manifest, the history's head and the pointer. A home written with the key
serves with it; the same home without the key, or with another, is refused; a record rewritten
without the key (every hash recomputed) is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragpipe.bundle.manifest import BundleManifest, make_manifest, manifest_bytes
from ragpipe.evaluation.run_folder import verify_run
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.decision import decide
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.seals import KEY_ENV, SealKey
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate
from ragpipe.release.kept_decision import evidence_path, publish_gate_evidence
from ragpipe.release.live import live_release
from ragpipe.release.manifest import publish_manifest
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe_tests.support.release_fixtures import BOOTSTRAP, fixture_policy, manifest_of, new_evaluation_run

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")
SECRET = "a release key of at least 32 bytes!"
OTHER = "another key that is 32 bytes long!!"


def sealed_home(tmp_path: Path, bundle: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Workspace, str]:
    """A home built under the key: the bundle resealed with it, a new evaluation run, its kept
    decision and manifest, activated on staging."""
    monkeypatch.setenv(KEY_ENV, SECRET)
    ws = Workspace(tmp_path / "home")
    ws.bundles.mkdir(parents=True)
    copy = Path(shutil.copytree(bundle, ws.bundles / bundle.name, symlinks=True))
    m = BundleManifest.model_validate_json((copy / "manifest.json").read_bytes())
    resealed = make_manifest(m.semantic, m.material.embeddings_digest, m.files, SealKey(SECRET.encode()))
    (copy / "manifest.json").write_bytes(manifest_bytes(resealed))
    run_id = new_evaluation_run(copy, ws.home / "evaluations")
    arm = load_arm(ws.home / "evaluations" / run_id)
    policy = fixture_policy(None)
    decision = decide(policy, None, arm, BOOTSTRAP)  # a v2 decision: a v1 one activates nowhere new
    store = ReleaseStore(ws)
    publish_gate_evidence(store, decision.as_json(), None, policy)
    manifest = manifest_of(copy, arm, policy, decision)
    release_id = publish_manifest(store, manifest)[0]
    activate(ws, release_id, "staging")
    return ws, release_id


@pytest.fixture
def home(tmp_path: Path, bundle: Path, monkeypatch: pytest.MonkeyPatch):
    return sealed_home(tmp_path, bundle, monkeypatch)


def test_every_record_of_the_chain_is_sealed_and_the_release_is_live(home):
    ws, release_id = home
    store = ReleaseStore(ws)
    run = next((ws.home / "evaluations").iterdir())
    files = [
        run / "ledger.head",
        store.target_dir("staging") / "history.head",
        store.pointer_path("staging"),
        store.manifest_path(release_id),
        next((store.root / "decisions").iterdir()),
    ]
    for path in files:
        assert json.loads(path.read_bytes())["seal"]["key_id"] == SealKey(SECRET.encode()).key_id, path
    assert live_release(ws, "staging").release_id == release_id


def test_the_sealed_home_is_refused_without_the_key_and_with_another(home, monkeypatch: pytest.MonkeyPatch):
    ws, _ = home
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ValueError, match="sealed with key .*, but no key is configured"):
        live_release(ws, "staging")
    monkeypatch.setenv(KEY_ENV, OTHER)
    with pytest.raises(ValueError, match=r"sealed with key .*, the configured key is"):
        live_release(ws, "staging")


def test_a_pointer_rewritten_without_the_key_is_refused(home):
    ws, release_id = home
    path = ReleaseStore(ws).pointer_path("staging")
    pointer = json.loads(path.read_bytes())
    pointer.pop("seal")
    path.write_bytes(canonical_bytes(pointer) + b"\n")  # the canonical unkeyed form
    with pytest.raises(ReleaseError, match=r"pointer\.json: not sealed, but key .* is configured"):
        live_release(ws, "staging")


def test_a_manifest_and_a_decision_rewritten_without_the_key_are_refused(home):
    ws, release_id = home
    store = ReleaseStore(ws)
    path = store.manifest_path(release_id)
    original = path.read_bytes()
    doc = json.loads(original)
    doc.pop("seal")
    path.write_bytes(canonical_bytes(doc) + b"\n")
    with pytest.raises(ReleaseError, match=r"\.json: not sealed, but key .* is configured"):
        live_release(ws, "staging")
    path.write_bytes(original)
    decision = json.loads(path.read_bytes())["manifest"]["gate"]["decision_id"]
    kept = evidence_path(store, decision)
    doc = json.loads(kept.read_bytes())
    doc["seal"] = {**doc["seal"], "mac": "hmac-sha256:" + "0" * 64}
    kept.write_bytes(canonical_bytes(doc) + b"\n")
    with pytest.raises(ReleaseError, match="the seal does not match the record"):
        live_release(ws, "staging")


def test_a_run_whose_head_was_recomputed_without_the_key_is_refused(home):
    ws, _ = home
    run = next((ws.home / "evaluations").iterdir())
    assert verify_run(run).status == "completed"
    head = json.loads((run / "ledger.head").read_bytes())
    head.pop("seal")
    (run / "ledger.head").write_bytes(canonical_bytes(head) + b"\n")
    with pytest.raises(ValueError, match=r"ledger\.head: not sealed, but key .* is configured"):
        verify_run(run)
    with pytest.raises(ReleaseError, match="not sealed"):
        live_release(ws, "staging")


def test_a_malformed_key_is_one_line_for_every_release_command(home, cli):

    ws, release_id = home
    env = {KEY_ENV: "short"}
    for args in (
        ("release", "list"),
        ("release", "current"),
        ("release", "activate", release_id, "--target", "staging"),
        ("release", "rollback", "--target", "staging"),
        ("query", "aspirin"),
    ):
        done = cli(*args, home=ws.home, env=env, timeout=300)
        assert (done.returncode, done.stdout) == (1, ""), args
        assert "RAGPIPE_BUNDLE_KEY: key has 5 bytes, at least 32 are required" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, args
