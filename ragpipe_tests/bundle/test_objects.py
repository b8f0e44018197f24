"""Bundles on object storage, on both backends (``store``: the filesystem and moto's S3 server):
published as blobs then one manifest object, hydrated only after complete verification; a crash
at any step of a push leaves no visible bundle; racing pushers leave one; nothing forged, cut or
missing in the store is ever hydrated."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ragpipe.bundle.manifest import MANIFEST_NAME, manifest_bytes
from ragpipe.bundle.objects import PUSH_STEPS, hydrate_bundle, manifest_key, push_bundle
from ragpipe.bundle.verify import BundleVerificationError, VerifiedBundle, open_bundle
from ragpipe.kernel.publish import PublishOutcome
from ragpipe.storage.blobs import blob_key
from ragpipe.storage.local import LocalObjectStore
from ragpipe.storage.objects import ObjectStore
from ragpipe_tests.bundle.test_forgery import manifest_of, reseal, rewrite_documents
from ragpipe_tests.support.storage_fixtures import store_env


def overwrite(store: ObjectStore, key: str, data: bytes) -> None:
    """What a writer with raw access to the store does (no condition, no check)."""
    if isinstance(store, LocalObjectStore):
        (store.root / key).parent.mkdir(parents=True, exist_ok=True)
        (store.root / key).write_bytes(data)
    else:
        store.client.put_object(Bucket=store.bucket, Key=store.prefix + key, Body=data)


def files_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refusal(store: ObjectStore, bundle: VerifiedBundle, root: Path, **kw) -> str:
    with pytest.raises(BundleVerificationError) as info:
        hydrate_bundle(store, bundle.bundle_id, root, **kw)
    assert not (root / bundle.manifest.bundle_id.hex).exists()  # nothing partial is visible
    return str(info.value)


@pytest.fixture
def bundle(bundle_copy: Path) -> VerifiedBundle:
    return open_bundle(bundle_copy)


def test_a_pushed_bundle_hydrates_byte_for_byte(store: ObjectStore, bundle: VerifiedBundle, tmp_path: Path):
    assert push_bundle(store, bundle) is PublishOutcome.published
    digests = {e.sha256 for e in bundle.manifest.material.files}
    assert store.list("blobs/") == sorted(blob_key(d) for d in digests)
    assert store.list("bundles/") == [manifest_key(bundle.manifest.bundle_id.hex)]
    got = hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache", bundle.manifest.material_digest)
    assert got.path == tmp_path / "cache" / bundle.manifest.bundle_id.hex
    assert files_of(got.path) == files_of(bundle.path)
    assert push_bundle(store, bundle) is PublishOutcome.existing
    # hydrating again uses the verified local copy
    assert hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache").path == got.path


PUSH_SCRIPT = """
import os, signal, sys
from pathlib import Path
from ragpipe.bundle.objects import push_bundle
from ragpipe.bundle.verify import open_bundle
from ragpipe.storage.location import store_from_env

target, seen = sys.argv[2], []
def hook(step):
    seen.append(step)
    if step == target and (step != "blob_written" or seen.count(step) == 3):
        os.kill(os.getpid(), signal.SIGKILL)
push_bundle(store_from_env(), open_bundle(Path(sys.argv[1])), on_step=hook)
"""


@pytest.mark.parametrize("step", PUSH_STEPS)
def test_sigkill_at_each_push_step_leaves_no_visible_bundle_or_a_whole_one(
    store: ObjectStore, bundle: VerifiedBundle, tmp_path: Path, step: str, request: pytest.FixtureRequest
):
    env = {**os.environ, **store_env(store, request)}
    proc = subprocess.run(
        [sys.executable, "-c", PUSH_SCRIPT, str(bundle.path), step], env=env, capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr
    if step == "manifest_written":
        hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache")
    else:
        assert store.list("bundles/") == []
        assert "not published in the store" in refusal(store, bundle, tmp_path / "cache")
        assert push_bundle(store, bundle) is PublishOutcome.published  # the rerun completes it
        hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache")


def test_racing_pushers_leave_one_bundle(store: ObjectStore, bundle: VerifiedBundle, tmp_path: Path):
    barrier, outcomes = threading.Barrier(4), []

    def push() -> None:
        barrier.wait()
        outcomes.append(push_bundle(store, bundle))

    threads = [threading.Thread(target=push) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert outcomes.count(PublishOutcome.published) == 1 and len(outcomes) == 4
    assert store.list("bundles/") == [manifest_key(bundle.manifest.bundle_id.hex)]
    hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache")


def test_a_damaged_or_missing_blob_is_never_hydrated(store: ObjectStore, bundle: VerifiedBundle, tmp_path: Path):
    push_bundle(store, bundle)
    entry = next(e for e in bundle.manifest.material.files if e.path == "chunks.parquet")
    data = store.get(blob_key(entry.sha256)).data
    overwrite(store, blob_key(entry.sha256), data[:-1] + bytes([data[-1] ^ 1]))
    assert "chunks.parquet: blob does not match its digest" in refusal(store, bundle, tmp_path / "a")
    overwrite(store, blob_key(entry.sha256), data[: len(data) // 2])
    assert "chunks.parquet: blob does not match its digest" in refusal(store, bundle, tmp_path / "b")
    if isinstance(store, LocalObjectStore):
        (store.root / blob_key(entry.sha256)).unlink()
    else:
        store.client.delete_object(Bucket=store.bucket, Key=store.prefix + blob_key(entry.sha256))
    assert f"{blob_key(entry.sha256)}: chunks.parquet: blob is missing" in refusal(store, bundle, tmp_path / "c")


def test_a_forgery_with_every_digest_recomputed_is_refused(store: ObjectStore, bundle: VerifiedBundle, tmp_path: Path):
    """A forger who can write the store rewrites a document's text, re-lists every file and
    recomputes the material digest and the (unkeyed) seal — the bundle ID is unchanged. A release
    binds the material digest, so hydrating for a release refuses it before downloading a blob."""
    forged = tmp_path / "forged" / bundle.path.name
    shutil.copytree(bundle.path, forged)
    rewrite_documents(forged, lambda doc: doc.model_copy(update={"text": doc.text.replace("a", "A")}))
    reseal(forged)
    forged_manifest = manifest_of(forged)
    assert forged_manifest.bundle_id == bundle.manifest.bundle_id
    for entry in forged_manifest.material.files:
        store.put_new(blob_key(entry.sha256), (forged / entry.path).read_bytes())
    overwrite(store, manifest_key(bundle.manifest.bundle_id.hex), manifest_bytes(forged_manifest))
    expected = bundle.manifest.material_digest
    text = refusal(store, bundle, tmp_path / "cache", material_digest=expected)
    assert f"material digest {forged_manifest.material_digest} is not the expected {expected}" in text


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "lexical/../../x", "a/./b"])
def test_a_manifest_path_that_leaves_the_folder_is_refused(
    store: ObjectStore, bundle: VerifiedBundle, tmp_path: Path, path: str
):
    manifest = bundle.manifest
    files = [e if e.path != "chunks.parquet" else e.model_copy(update={"path": path}) for e in manifest.material.files]
    forged = manifest.model_copy(update={"material": manifest.material.model_copy(update={"files": files})})
    push_bundle(store, bundle)
    overwrite(store, manifest_key(manifest.bundle_id.hex), manifest_bytes(forged))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert f"file path {path!r} leaves the bundle folder" in refusal(store, bundle, tmp_path / "cache")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # refused before anything was written


def test_a_damaged_local_copy_is_set_aside_and_fetched_again(
    store: ObjectStore, bundle: VerifiedBundle, tmp_path: Path
):
    push_bundle(store, bundle)
    copy = hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache")
    (copy.path / "documents.parquet").write_bytes(b"damaged")
    again = hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache")
    assert files_of(again.path) == files_of(bundle.path)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [copy.path.name]


def test_every_truncation_of_the_manifest_object_is_refused(store: ObjectStore, bundle: VerifiedBundle, tmp_path: Path):
    """A store that holds the manifest object cut at any byte (a torn file; on S3 a PUT is whole or
    absent, but a writer with access can put any prefix): never hydrated. Every byte on the folder
    backend; on S3 — the same bytes reach the same parser, at 45 s for every byte — the first and
    last 64 and every 61st between."""
    push_bundle(store, bundle)
    raw = manifest_bytes(bundle.manifest)
    key = manifest_key(bundle.manifest.bundle_id.hex)
    cuts = range(len(raw))
    if not isinstance(store, LocalObjectStore):
        cuts = sorted({*range(64), *range(64, len(raw) - 64, 61), *range(len(raw) - 64, len(raw))})
    for cut in cuts:
        overwrite(store, key, raw[:cut])
        with pytest.raises(BundleVerificationError):
            hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or list((tmp_path / "cache").iterdir()) == []
    overwrite(store, key, raw)
    assert hydrate_bundle(store, bundle.bundle_id, tmp_path / "cache").bundle_id == bundle.bundle_id
    assert MANIFEST_NAME in os.listdir(tmp_path / "cache" / bundle.manifest.bundle_id.hex)
