"""A target's pointer and history on the object store (``ragpipe.release.target_sync``), on both
backends: what one machine activates every other machine reads; two machines racing on one
target give one swap and one ``ConflictError``; a writer killed at any step of an activation
leaves the store as it was; a store object that is not a target's is refused in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ragpipe.bundle.objects import push_bundle
from ragpipe.bundle.verify import open_bundle
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import ACTIVATION_STEPS, activate
from ragpipe.release.history import read_history
from ragpipe.release.pointer import read_pointer
from ragpipe.release.replica import push_run
from ragpipe.release.rollback import rollback
from ragpipe.release.status import resolve_active
from ragpipe.release.store import ConflictError, ReleaseError, ReleaseStore
from ragpipe.release.target_sync import target_key
from ragpipe.storage.local import LocalObjectStore
from ragpipe.storage.objects import ObjectStore
from ragpipe_tests.conftest import REPO
from ragpipe_tests.support.release_fixtures import evaluation_of, publish
from ragpipe_tests.support.storage_fixtures import store_env

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


@pytest.fixture
def releases(ws: Workspace, bundle: Path, store: ObjectStore, request, monkeypatch) -> tuple[str, str]:
    """Two releases (revisions r1, r2) published from ``ws`` with the store configured."""
    for name, value in store_env(store, request).items():
        monkeypatch.setenv(name, value)
    push_bundle(store, open_bundle(ws.bundles / bundle.name))
    push_run(ws, ws.home / "evaluations" / evaluation_of(bundle).name)
    return publish(ws, bundle, "r1"), publish(ws, bundle, "r2")


def history_of(ws: Workspace) -> list[tuple[str, str]]:
    return [(r.kind, r.payload["release_id"]) for r in read_history(ReleaseStore(ws), "staging")[1]]


def test_what_one_machine_activates_every_other_machine_reads(ws: Workspace, releases, tmp_path: Path):
    first, second = releases
    other = Workspace(tmp_path / "other")
    activate(ws, first, "staging", by="alice")
    assert read_pointer(ReleaseStore(other), "staging").release_id == first
    assert resolve_active(other, "staging")[0].release_id == first  # verified there: bundle and run fetched
    activate(other, second, "staging", by="bob")  # the other machine continues the same history
    assert read_pointer(ReleaseStore(ws), "staging").generation == 2
    rollback(ws, "staging", by="alice")
    expected = [
        ("intent", first),
        ("observed", first),
        ("intent", second),
        ("observed", second),
        ("intent", first),
        ("observed", first),
    ]
    assert history_of(other) == history_of(ws) == expected
    assert ReleaseStore(Workspace(tmp_path / "third")).known_targets() == ["staging"]


def test_two_machines_racing_on_one_target_give_one_swap(ws: Workspace, releases, tmp_path: Path):
    """Machine A has appended its intent when machine B activates the other release from start to
    end: A's put loses the compare-and-swap, A changes nothing and says so; its working copy is
    the store's again."""
    first, second = releases
    other = Workspace(tmp_path / "other")

    def meanwhile(step: str) -> None:
        if step == "intent_appended":
            activate(other, second, "staging", by="bob")

    with pytest.raises(ConflictError, match="target 'staging': another machine changed it first"):
        activate(ws, first, "staging", by="alice", on_step=meanwhile)
    assert read_pointer(ReleaseStore(ws), "staging").release_id == second
    assert history_of(ws) == history_of(other) == [("intent", second), ("observed", second)]
    assert activate(ws, first, "staging", by="alice").generation == 2  # after the conflict, a fresh try


CRASH = """
import os, signal, sys
from pathlib import Path
from ragpipe.release.activation import activate
from ragpipe.kernel.workspace import Workspace

def hook(step):
    if step == sys.argv[3]:
        os.kill(os.getpid(), signal.SIGKILL)
activate(Workspace(Path(sys.argv[1])), sys.argv[2], "staging", on_step=hook)
raise SystemExit("the hook was never called with " + sys.argv[3])
"""


@pytest.mark.parametrize("step", ACTIVATION_STEPS)
def test_a_writer_killed_at_any_step_leaves_the_store_as_it_was(
    ws: Workspace, releases, tmp_path: Path, step: str, store: ObjectStore
):
    first, second = releases
    activate(ws, first, "staging")
    before = store.get(target_key("staging"))
    proc = subprocess.run(
        [sys.executable, "-c", CRASH, str(ws.home), second, step],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert store.get(target_key("staging")) == before  # the same bytes and ETag
    other = Workspace(tmp_path / "other")
    assert resolve_active(other, "staging")[0].release_id == first
    assert resolve_active(ws, "staging")[0].release_id == first  # the killed writer's copy is reset
    assert history_of(ws) == [("intent", first), ("observed", first)]
    assert activate(ws, second, "staging").generation == 2


def test_a_store_object_that_is_not_a_target_is_refused_in_one_line(ws: Workspace, releases, store: ObjectStore):
    activate(ws, releases[0], "staging")
    if isinstance(store, LocalObjectStore):
        (store.root / target_key("staging")).write_bytes(b'{"schema": "other"}')
    else:
        store.client.put_object(Bucket=store.bucket, Key=store.prefix + target_key("staging"), Body=b"[]")
    with pytest.raises(ReleaseError) as err:
        read_pointer(ReleaseStore(ws), "staging")
    assert str(err.value) == (
        f"{store.url}{target_key('staging')}: not a ragpipe.release-target/v1 object "
        "(keys files and schema; files history.head, history.jsonl, pointer.json)"
    )
