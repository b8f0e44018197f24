"""With ``RAGPIPE_STORE`` set, the bundle stage publishes its bundle to the store (blobs, then the
manifest object) and says so in its metadata; a rebuild finds it there."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ragpipe.bundle.objects import hydrate_bundle, manifest_key
from ragpipe.stages import steps
from ragpipe.storage.objects import ObjectStore
from ragpipe_tests.bundle.test_bundle import copy_workspace
from ragpipe_tests.support.storage_fixtures import store_env


def test_the_bundle_stage_pushes_to_the_configured_store(
    built_workspace, tmp_path: Path, store: ObjectStore, request: pytest.FixtureRequest, monkeypatch
):
    ws, spec = built_workspace
    ws2 = copy_workspace(ws, tmp_path / "home")
    shutil.rmtree(ws2.stage_dir("hb", "index_bundle"))
    for name, value in store_env(store, request).items():
        monkeypatch.setenv(name, value)
    first = steps.run_index_bundle(ws2, "hb", spec)
    bundle_id = str(first.data_version)
    assert {k: first.metadata[k] for k in ("store", "store_publication")} == {
        "store": store.url,
        "store_publication": "published",
    }
    assert store.list("bundles/") == [manifest_key(bundle_id.removeprefix("sha256:"))]
    elsewhere = hydrate_bundle(store, bundle_id, tmp_path / "elsewhere")
    assert elsewhere.bundle_id == bundle_id
    shutil.rmtree(ws2.stage_dir("hb", "index_bundle"))
    assert steps.run_index_bundle(ws2, "hb", spec).metadata["store_publication"] == "existing"
