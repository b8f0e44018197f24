"""Steps on machines that share no disk meet in the object store (``RAGPIPE_STORE``): two homes,
one store, the build's steps alternating between them — the registering home's corpus deleted
before any step runs — produce exactly the stage data versions and bundle ID of a one-home build.
A crash between pushing a version and moving the store's pointer leaves the pointer where it was;
a damaged blob is refused with one line and publishes nothing. Both backends."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragpipe.bundle.objects import hydrate_bundle, manifest_key
from ragpipe.corpus.registry import RevisionError, register_revision
from ragpipe.kernel.workspace import Workspace
from ragpipe.stages import steps
from ragpipe.stages.stage_store import STORE_STEPS, StageError
from ragpipe.storage.blobs import blob_key, folder_files, listing_of, put_blob, read_listing
from ragpipe.storage.local import LocalObjectStore
from ragpipe.storage.objects import ObjectStore
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.storage_fixtures import store_env

STAGES = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]


@pytest.fixture
def configured(store: ObjectStore, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for name, value in store_env(store, request).items():
        monkeypatch.setenv(name, value)
    return store


def registered_elsewhere(tmp_path: Path) -> Workspace:
    """Home A registers the handbook, then its corpus is gone: only the store has it."""
    a = Workspace(tmp_path / "a")
    corpus = write_tree(tmp_path / "only-on-a" / "handbook", HANDBOOK)
    register_revision(a.registry, "hb", corpus, "markdown", "public")
    shutil.rmtree(tmp_path / "only-on-a")
    return a


def test_steps_alternating_between_two_homes_equal_a_one_home_build(built_workspace, tmp_path: Path, configured):
    reference, spec = built_workspace  # one home, no store
    a, b = registered_elsewhere(tmp_path), Workspace(tmp_path / "b")
    homes = [b, b, a, a, b, b, b]
    for run, ws in zip(steps.BUILD_STEPS, homes):
        run(ws, "hb", spec)
    assert not b.registry.exists() and (b.sources).is_dir()  # B read the record and the corpus from the store
    for stage in STAGES:
        got = steps.read_stage_record(a, "hb", stage).data_version
        assert got == steps.read_stage_record(reference, "hb", stage).data_version, stage
    bundle_id = steps.read_stage_record(b, "hb", "index_bundle").data_version
    assert configured.list("bundles/") == [manifest_key(bundle_id.removeprefix("sha256:"))]
    assert hydrate_bundle(configured, bundle_id, tmp_path / "c" / "bundles").bundle_id == bundle_id


CRASH = """
import os, signal, sys
from pathlib import Path
from ragpipe.kernel.workspace import Workspace
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages import steps

def hook(step):
    if step == sys.argv[2]:
        os.kill(os.getpid(), signal.SIGKILL)
steps.run_chunks(Workspace(Path(sys.argv[1])), "hb", load_pipeline_spec(), on_step=hook)
"""


@pytest.mark.parametrize("step", STORE_STEPS)
def test_sigkill_while_publishing_to_the_store(
    built_workspace, tmp_path: Path, configured: ObjectStore, request: pytest.FixtureRequest, step: str
):
    _, spec = built_workspace
    a, b = registered_elsewhere(tmp_path), Workspace(tmp_path / "b")
    steps.run_source_snapshot(a, "hb", spec)
    env = {**os.environ, **store_env(configured, request)}
    proc = subprocess.run([sys.executable, "-c", CRASH, str(a.home), step], env=env, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    if step == "store_folder_pushed":  # the version is in the store, the store's pointer not yet moved
        with pytest.raises(StageError, match="^chunks has not been materialized for revision 'hb'"):
            steps.run_representations(b, "hb", spec)
        steps.run_chunks(a, "hb", spec)  # the rerun moves it
    steps.run_representations(b, "hb", spec)
    assert steps.read_stage_record(b, "hb", "chunks") == steps.read_stage_record(a, "hb", "chunks")


def test_a_damaged_blob_is_refused_and_nothing_is_published(built_workspace, tmp_path: Path, configured):
    _, spec = built_workspace
    a, b = registered_elsewhere(tmp_path), Workspace(tmp_path / "b")
    steps.run_source_snapshot(a, "hb", spec)
    steps.run_chunks(a, "hb", spec)
    version = steps.read_stage_record(a, "hb", "chunks").data_version.removeprefix("sha256:")
    listing = read_listing(configured, f"work/hb/chunks/{version}/listing.json")
    entry = next(e for e in listing.files if e.path == "chunks.parquet")
    key = blob_key(entry.sha256)
    data = configured.get(key).data
    if isinstance(configured, LocalObjectStore):
        (configured.root / key).write_bytes(data[:-1] + b"\0")
    else:
        configured.client.put_object(Bucket=configured.bucket, Key=configured.prefix + key, Body=data[:-1] + b"\0")
    with pytest.raises(StageError) as info:
        steps.run_representations(b, "hb", spec)
    assert str(info.value) == (
        f"{configured.url}{key}: work/hb/chunks/{version}/listing.json: chunks.parquet: blob does not match its digest"
    )
    assert not (b.work / "hb" / "chunks" / version).exists() and not (b.work / "hb" / "representations").exists()


def forge_listing(store: ObjectStore, key: str, path: str, data: bytes) -> None:
    """What a writer of the store without the key does: point a listing's file at other bytes,
    the blob and every digest recomputed."""
    document = json.loads(store.get(key).data)
    document["files"] = [
        {"path": e["path"], "size": len(data), "sha256": put_blob(store, data)} if e["path"] == path else e
        for e in document["files"]
    ]
    if isinstance(store, LocalObjectStore):
        (store.root / key).write_text(json.dumps(document))
    else:
        store.client.put_object(Bucket=store.bucket, Key=store.prefix + key, Body=json.dumps(document).encode())


def test_with_a_key_a_forged_listing_or_pointer_is_refused(
    built_workspace, tmp_path: Path, configured: ObjectStore, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RAGPIPE_BUNDLE_KEY", "a bundle key of at least 32 bytes!!")
    _, spec = built_workspace
    a, b = registered_elsewhere(tmp_path), Workspace(tmp_path / "b")
    steps.run_source_snapshot(a, "hb", spec)
    version = steps.read_stage_record(a, "hb", "source_snapshot").data_version.removeprefix("sha256:")
    pointer = "work/hb/source_snapshot/latest.json"
    original = configured.get(pointer)
    document = json.loads(original.data)
    document["facts"]["documents"] += 1
    forged = json.dumps(document).encode()
    configured.put_if(pointer, forged, original.etag)
    with pytest.raises(StageError, match=f"^{re.escape(configured.url + pointer)}: the seal does not match"):
        steps.run_chunks(b, "hb", spec)
    configured.put_if(pointer, original.data, configured.get(pointer).etag)
    key = f"work/hb/source_snapshot/{version}/listing.json"
    forge_listing(configured, key, "documents.parquet", b"forged")
    with pytest.raises(StageError, match=f"^{re.escape(configured.url + key)}: the seal does not match the record"):
        steps.run_chunks(b, "hb", spec)
    assert not (b.work / "hb" / "source_snapshot" / version).exists()


def test_an_index_built_again_elsewhere_gives_way_to_the_stores(built_workspace, tmp_path: Path, configured):
    """A lance table is not byte-reproducible: a second home that builds the same version again
    ends up with the store's bytes, so every home reads one output under one data version."""
    _, spec = built_workspace
    a, b = registered_elsewhere(tmp_path), Workspace(tmp_path / "b")
    for run in steps.BUILD_STEPS[:6]:
        run(a, "hb", spec)
    for run in steps.BUILD_STEPS[:6]:
        run(b, "hb", spec)  # B downloads the first four and builds both indexes itself
    for stage in ("lexical_index", "vector_index"):
        version = steps.read_stage_record(b, "hb", stage).data_version.removeprefix("sha256:")
        listing = read_listing(configured, f"work/hb/{stage}/{version}/listing.json")
        assert listing == listing_of(folder_files(b.work / "hb" / stage / version)), stage


def test_one_corpus_registered_from_two_machines_is_one_revision(tmp_path: Path, configured):
    registered_elsewhere(tmp_path)
    corpus = write_tree(tmp_path / "on-b" / "handbook", HANDBOOK)  # the same bytes, another path
    record, created = register_revision(Workspace(tmp_path / "b").registry, "hb", corpus, "markdown", "public")
    assert created and record.source_path == str(corpus.resolve())
    other = write_tree(tmp_path / "on-c" / "handbook", {**HANDBOOK, "extra.md": "# Extra\n\nAnother page.\n"})
    with pytest.raises(RevisionError, match="^revision 'hb' is already registered with different content"):
        register_revision(Workspace(tmp_path / "c").registry, "hb", other, "markdown", "public")
    assert not (tmp_path / "c" / "revisions").exists()  # refused by the store before anything local
