"""A release whose bundle was built elsewhere: with ``RAGPIPE_STORE`` set and no local copy, the
bundle is hydrated from the store — as the release bound it — before anything serves it; a store
without it refuses the activation and moves nothing; a damaged local copy is fetched again. (A
store holding another material for the bundle ID is refused by ``hydrate_bundle``'s material
check: ``ragpipe_tests/bundle/test_objects.py``.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ragpipe.bundle.objects import manifest_key, push_bundle
from ragpipe.bundle.verify import open_bundle
from ragpipe.release.activation import activate, verify_release
from ragpipe.release.manifest import load_manifest
from ragpipe.release.pointer import read_pointer
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.storage.objects import ObjectStore
from ragpipe_tests.support.release_fixtures import bundle_ids, publish
from ragpipe_tests.support.storage_fixtures import store_env

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


@pytest.fixture
def remote(ws, store: ObjectStore, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``ws``'s bundle pushed to ``store`` and removed locally; the store configured. Its path."""
    (local,) = [p for p in ws.bundles.iterdir() if not p.name.startswith(".")]
    push_bundle(store, open_bundle(local))
    shutil.rmtree(local)
    for name, value in store_env(store, request).items():
        monkeypatch.setenv(name, value)
    return local


def test_activation_hydrates_the_bundle_from_the_store(ws, bundle: Path, remote: Path):
    rid = publish(ws, bundle)
    assert activate(ws, rid, None, by="alice").generation == 1
    assert open_bundle(remote).bundle_id == bundle_ids(bundle)[0]
    assert read_pointer(ReleaseStore(ws), "staging").release_id == rid


def test_a_store_without_the_bundle_refuses_the_activation(ws, bundle: Path, remote: Path, store: ObjectStore):
    rid = publish(ws, bundle)
    bundle_id = bundle_ids(bundle)[0]
    if hasattr(store, "root"):
        (store.root / manifest_key(bundle_id.removeprefix("sha256:"))).unlink()
    else:
        store.client.delete_object(
            Bucket=store.bucket, Key=store.prefix + manifest_key(bundle_id.removeprefix("sha256:"))
        )
    with pytest.raises(ReleaseError, match=f"bundle {bundle_id}: not published in the store"):
        activate(ws, rid, None, by="alice")
    assert read_pointer(ReleaseStore(ws), "staging") is None and not remote.exists()


def test_a_damaged_local_copy_is_fetched_again_before_it_serves(ws, bundle: Path, remote: Path):
    rid = publish(ws, bundle)
    activate(ws, rid, None, by="alice")
    (remote / "documents.parquet").write_bytes(b"damaged")
    manifest = load_manifest(ReleaseStore(ws), rid)
    assert verify_release(ws, manifest) == []
    assert (remote / "documents.parquet").read_bytes() == (bundle / "documents.parquet").read_bytes()
