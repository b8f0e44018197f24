"""A target's pointer and history on the object store (``ragpipe.release.target_sync``), on both
backends: what one machine activates every other machine reads; two machines racing on one
target give one swap and one ``ConflictError``; a writer killed at any step of an activation
leaves the store as it was, one killed right after its put has activated; turning the store on
uploads a home's targets; a replayed or erased object is refused; a torn working copy is replaced;
a put whose reply was lost is found applied; a store object that is not a target's is refused in
one line."""

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
from ragpipe.server.follower import ReleaseFollower
from ragpipe.storage.local import LocalObjectStore
from ragpipe.storage.objects import ObjectStore
from ragpipe_tests.support.paths import REPO
from ragpipe_tests.support.release_fixtures import evaluation_of, publish
from ragpipe_tests.support.storage_fixtures import delete, store_env

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


@pytest.fixture
def releases(ws: Workspace, bundle: Path, store: ObjectStore, request, monkeypatch) -> tuple[str, str]:
    """Two releases published from ``ws`` with the store configured: r1 (bootstrap) and r2, gated
    against r1 (on the bundle's second run, pushed as well)."""
    for name, value in store_env(store, request).items():
        monkeypatch.setenv(name, value)
    push_bundle(store, open_bundle(ws.bundles / bundle.name))
    push_run(ws, ws.home / "evaluations" / evaluation_of(bundle).name)
    first = publish(ws, bundle, "r1")
    second = publish(ws, bundle, "r2", against=first)
    push_run(ws, ws.home / "evaluations" / evaluation_of(bundle, second=True).name)
    return first, second


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


def test_two_machines_racing_on_one_target_give_one_swap(ws: Workspace, bundle: Path, releases, tmp_path: Path):
    """Machine A has appended its intent when machine B activates the other release from start to
    end: A's put loses the compare-and-swap, A changes nothing and says so; its working copy is
    the store's again. Both releases are gated against what is live when the race starts (nothing):
    ``first`` and ``rival``, another bootstrap release of the same run."""
    first, _ = releases
    rival = publish(ws, bundle, "r1-rival")
    after_rival = publish(ws, bundle, "r3", against=rival)
    other = Workspace(tmp_path / "other")

    def meanwhile(step: str) -> None:
        if step == "intent_appended":
            activate(other, rival, "staging", by="bob")

    with pytest.raises(ConflictError, match="target 'staging': another machine changed it first"):
        activate(ws, first, "staging", by="alice", on_step=meanwhile)
    assert read_pointer(ReleaseStore(ws), "staging").release_id == rival
    assert history_of(ws) == history_of(other) == [("intent", rival), ("observed", rival)]
    with pytest.raises(ReleaseError) as refused:  # its bootstrap decision says nothing about replacing rival
        activate(ws, first, "staging", by="alice")
    assert str(refused.value) == (
        f"release {first} was gated without an incumbent (bootstrap), but target 'staging' serves release {rival}: "
        "its decision says nothing about replacing that (build the revision again to gate it against what is live)"
    )
    # after the conflict, a fresh try (of a release gated against what machine B made live)
    assert activate(ws, after_rival, "staging", by="alice").generation == 2


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


def killed(script: str, *args: str) -> None:
    """Run ``script`` in a process of its own, which must die by SIGKILL."""
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=os.environ
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize("step", ACTIVATION_STEPS)
def test_a_writer_killed_at_any_step_leaves_the_store_as_it_was(
    ws: Workspace, releases, tmp_path: Path, step: str, store: ObjectStore
):
    first, second = releases
    activate(ws, first, "staging")
    before = store.get(target_key("staging"))
    killed(CRASH, str(ws.home), second, step)
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


PUT_THEN_KILL = """
import os, signal, sys
from pathlib import Path
from ragpipe.release import target_sync
from ragpipe.release.activation import activate
from ragpipe.kernel.workspace import Workspace

put = target_sync.TargetSync.push
def push_then_die(self):
    if put(self):  # a reader's hold puts nothing: the activation's put is the first that does
        os.kill(os.getpid(), signal.SIGKILL)
    return False
target_sync.TargetSync.push = push_then_die
activate(Workspace(Path(sys.argv[1])), sys.argv[2], "staging")
raise SystemExit("push was never called")
"""


def test_a_writer_killed_right_after_its_put_has_activated_for_every_machine(
    ws: Workspace, releases, tmp_path: Path, store: ObjectStore
):
    """The put is the commit: killed after it (before its sync mark is kept), the activation
    stands everywhere, and the killed machine's next hold takes it as its own history."""
    first, second = releases
    activate(ws, first, "staging")
    before = store.get(target_key("staging"))
    killed(PUT_THEN_KILL, str(ws.home), second)
    assert store.get(target_key("staging")).etag != before.etag
    expected = [("intent", first), ("observed", first), ("intent", second), ("observed", second)]
    assert history_of(Workspace(tmp_path / "other")) == history_of(ws) == expected
    assert resolve_active(ws, "staging")[0].release_id == second
    assert rollback(ws, "staging").generation == 3


def test_turning_the_store_on_uploads_a_home_s_targets_and_deletes_nothing(
    ws: Workspace, releases, tmp_path: Path, store: ObjectStore, monkeypatch
):
    """A home activated without a store keeps its history when a store is configured: the first
    hold puts the folder as the target's first object (create-only)."""
    first, second = releases
    with monkeypatch.context() as without:
        without.delenv("RAGPIPE_STORE")
        activate(ws, first, "staging")
        activate(ws, second, "staging")
        local = history_of(ws)
    assert store.get(target_key("staging")) is None
    assert read_pointer(ReleaseStore(ws), "staging").release_id == second  # a reader's hold seeds it
    assert store.get(target_key("staging")) is not None
    assert history_of(ws) == history_of(Workspace(tmp_path / "other")) == local
    assert len(local) == 4
    assert rollback(Workspace(tmp_path / "other"), "staging").generation == 3


def test_an_older_target_object_put_back_is_refused_and_changes_nothing_here(
    ws: Workspace, releases, store: ObjectStore
):
    """Replay: the store's history must begin with the history this machine last synced."""
    first, second = releases
    activate(ws, first, "staging")
    older = store.get(target_key("staging")).data
    activate(ws, second, "staging")
    folder = ReleaseStore(ws).target_dir("staging")
    held = {p.name: p.read_bytes() for p in folder.iterdir()}
    store.put_if(target_key("staging"), older, store.get(target_key("staging")).etag)
    with pytest.raises(ReleaseError) as err:
        read_pointer(ReleaseStore(ws), "staging")
    marked = len((folder / "history.jsonl").read_bytes())
    assert str(err.value) == (
        f"{store.url}{target_key('staging')}: target 'staging''s history there does not begin with the "
        f"{marked} bytes this machine last synced (an older object put back, the object erased, or another "
        f"store?); nothing was changed — to accept the store's, delete {folder / '.synced.json'}"
    )
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == held


def test_an_erased_target_object_is_refused_where_the_target_was_synced(ws: Workspace, releases, store: ObjectStore):
    activate(ws, releases[0], "staging")
    delete(store, target_key("staging"))
    with pytest.raises(ReleaseError, match="does not begin with the [0-9]+ bytes this machine last synced"):
        read_pointer(ReleaseStore(ws), "staging")
    assert store.get(target_key("staging")) is None  # not re-seeded from a copy the store disowned


def test_a_working_copy_torn_inside_a_character_is_replaced_by_the_store_s(ws: Workspace, releases):
    """A writer killed inside a multi-byte character leaves bytes that are not UTF-8: the next
    hold replaces them with the store's copy instead of failing on them."""
    first, _ = releases
    activate(ws, first, "staging", by="zoë")
    history = ReleaseStore(ws).history_path("staging")
    whole = history.read_bytes()
    history.write_bytes(whole + '{"by": "zoë'.encode()[:-1])
    assert read_pointer(ReleaseStore(ws), "staging").release_id == first
    assert history.read_bytes() == whole


def test_a_put_whose_reply_was_lost_is_found_applied_not_reported_as_a_conflict(
    ws: Workspace, releases, store: ObjectStore
):
    """The retry of a put that was applied meets its own document under another ETag: success."""
    from ragpipe.release.target_sync import TargetSync, _document, _read_local

    first, second = releases
    activate(ws, first, "staging")
    sync = TargetSync(store, ReleaseStore(ws).target_dir("staging"), "staging")
    sync.pull()
    pointer = sync.folder / "pointer.json"
    pointer.write_bytes(pointer.read_bytes())  # unchanged bytes: nothing to put
    assert sync.push() is False
    (sync.folder / "history.head").write_text("changed\n")
    store.put_if(target_key("staging"), _document(_read_local(sync.folder)), sync.etag)  # the first attempt
    assert sync.push() is True
    assert store.get(target_key("staging")).data == _document(_read_local(sync.folder))


def test_an_error_in_the_block_is_what_the_caller_sees_when_the_push_conflicts_too(
    ws: Workspace, releases, tmp_path: Path
):
    first, second = releases
    other = Workspace(tmp_path / "other")
    activate(ws, first, "staging")
    with pytest.raises(RuntimeError, match="^the block's own error\nand its record did not reach") as err:
        with ReleaseStore(ws).target_lock("staging"):
            (ReleaseStore(ws).target_dir("staging") / "history.head").write_text("mine\n")
            activate(other, second, "staging")
            raise RuntimeError("the block's own error")
    (note,) = err.value.__notes__
    assert note.startswith("and its record did not reach the store: target 'staging': another machine changed it")
    assert read_pointer(ReleaseStore(ws), "staging").release_id == second


def test_a_server_on_a_machine_that_built_nothing_follows_the_store_s_target(ws: Workspace, releases, tmp_path: Path):
    """The follower watches the target object's version (a HEAD on S3): it serves what another
    machine activates, follows a rollback, and loads nothing again while the version stays."""
    first, second = releases
    follower = ReleaseFollower(Workspace(tmp_path / "server"), "staging", 0.01)
    try:
        follower.poll()
        assert follower.current_release_id is None
        activate(ws, first, "staging", by="alice")
        follower.poll()
        assert follower.current_release_id == first
        activate(ws, second, "staging", by="alice")
        follower.poll()
        follower.poll()  # the same version: nothing loads again
        assert (follower.current_release_id, follower.swaps) == (second, 2)
        rollback(ws, "staging", by="alice")
        follower.poll()
        assert (follower.current_release_id, follower.swaps) == (first, 3)
    finally:
        follower.stop()
