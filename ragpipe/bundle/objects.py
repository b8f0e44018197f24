"""A bundle on object storage: published as immutable objects, made visible by one manifest
object, hydrated into a local folder only after verification (docs/operations.md, "Object
storage").

Layout under the store: every file of a bundle is a content-addressed blob
``blobs/sha256/<hex>`` (``ragpipe.storage.blobs``: create-only, shared by everything holding the
same bytes), and the
bundle is ``bundles/<bundle id hex>/manifest.json`` — the exact manifest bytes, created only after
all of its blobs exist. A reader that finds the manifest therefore finds every blob it names; two
racing publishers of one ID write the same blobs (or leave harmless extra ones) and exactly one
manifest wins. Nothing in the store is trusted: ``hydrate_bundle`` checks each blob's size and
digest against the manifest as it downloads, then the complete ``open_bundle`` verification runs
on the assembled folder before it is published (atomically) under its ID; a local copy is verified
again on every use, and one that fails is set aside and fetched again — the local folder is a
cache, the store is the record.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from ragpipe.bundle.manifest import MANIFEST_NAME, BundleManifest, BundleSemantic, bundle_id_of, manifest_bytes
from ragpipe.bundle.verify import BundleVerificationError, VerifiedBundle, open_bundle
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.publish import PublishOutcome, StepHook, discard, publish_directory
from ragpipe.kernel.seals import SealKey
from ragpipe.storage.blobs import get_blob, put_blob, safe_relative_path, sha256_of
from ragpipe.storage.location import store_from_env
from ragpipe.storage.objects import ObjectStore, StorageError

log = logging.getLogger(__name__)

# The points of ``push_bundle`` where a crash leaves a distinct state in the store.
PUSH_STEPS = ("blob_written", "blobs_written", "manifest_written")


def manifest_key(bundle_hex: str) -> str:
    return f"bundles/{bundle_hex}/{MANIFEST_NAME}"


def push_bundle(store: ObjectStore, bundle: VerifiedBundle, on_step: StepHook | None = None) -> PublishOutcome:
    """Publish ``bundle`` (verified, local) to ``store``: its blobs, then its manifest object.
    ``existing`` if a manifest for its ID was there already (that bundle stays the record). Each
    file is re-read and checked against the manifest as it is sent, so a local copy changed since
    verification is refused, never published."""
    step = on_step or (lambda _: None)
    key = manifest_key(bundle.manifest.bundle_id.hex)
    if store.get(key) is not None:
        return PublishOutcome.existing
    for entry in sorted(bundle.manifest.material.files, key=lambda e: e.path):
        data = (bundle.path / entry.path).read_bytes()
        if len(data) != entry.size or sha256_of(data) != entry.sha256:
            raise BundleVerificationError(bundle.path, [f"{entry.path}: changed since the bundle was verified"])
        put_blob(store, data)
        step("blob_written")
    step("blobs_written")
    created = store.put_new(key, manifest_bytes(bundle.manifest))
    step("manifest_written")
    return PublishOutcome.published if created else PublishOutcome.existing


def _safe_path(where: str, rel: str) -> str:
    """A manifest's file path as a folder-relative path that cannot leave the folder."""
    if not safe_relative_path(rel):
        raise BundleVerificationError(Path(where), [f"{MANIFEST_NAME}: file path {rel!r} leaves the bundle folder"])
    return rel


def _fetch_manifest(store: ObjectStore, bundle_id: str, where: str) -> tuple[bytes, BundleManifest]:
    hex_id = bundle_id.removeprefix("sha256:")
    stored = store.get(manifest_key(hex_id))
    if stored is None:
        raise BundleVerificationError(Path(where), ["not published in the store (no manifest object)"])
    try:
        manifest = BundleManifest.model_validate(json.loads(stored.data.decode("utf-8")))
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise BundleVerificationError(Path(where), [f"{MANIFEST_NAME}: not a valid manifest: {first}"]) from None
    if manifest.bundle_id.hex != hex_id:
        raise BundleVerificationError(Path(where), [f"{MANIFEST_NAME}: names bundle {manifest.bundle_id}"])
    for entry in manifest.material.files:
        _safe_path(where, entry.path)
    return stored.data, manifest


def hydrate_bundle(
    store: ObjectStore,
    bundle_id: str,
    root: Path,
    material_digest: str | None = None,
    key: SealKey | None | Literal["configured"] = "configured",
    defer_vector_table: bool = False,
) -> VerifiedBundle:
    """The bundle ``bundle_id`` as a verified local folder ``root/<hex>``, downloaded from
    ``store`` unless a local copy verifies. ``material_digest``: the exact material a release
    bound (a manifest with another is refused, so a store cannot substitute a rebuild). Raises
    ``BundleVerificationError`` naming the store and the problem."""
    hex_id = bundle_id.removeprefix("sha256:")
    final = root / hex_id
    where = f"{store.url}{manifest_key(hex_id)}"
    if final.exists():
        try:
            return _expected(open_bundle(final, key=key, defer_vector_table=defer_vector_table), material_digest)
        except BundleVerificationError as exc:
            log.warning("bundle %s: the local copy does not verify (%s); fetching it again", hex_id, exc)
            discard(final)
    raw, manifest = _fetch_manifest(store, bundle_id, where)
    if material_digest is not None and manifest.material_digest != material_digest:
        raise BundleVerificationError(
            Path(where), [f"material digest {manifest.material_digest} is not the expected {material_digest}"]
        )

    def write_data(tmp: Path) -> None:
        for entry in manifest.material.files:
            target = tmp / entry.path  # checked by _fetch_manifest
            try:
                data = get_blob(store, entry.sha256, entry.size, entry.path)
            except StorageError as exc:
                raise BundleVerificationError(Path(where), [str(exc)]) from None
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    def write_manifest(tmp: Path) -> None:
        (tmp / MANIFEST_NAME).write_bytes(raw)

    root.mkdir(parents=True, exist_ok=True)
    publish_directory(
        final, write_data, write_manifest, validate=lambda tmp: open_bundle(tmp, check_name=False, key=key)
    )
    return _expected(open_bundle(final, key=key), material_digest)


def _expected(bundle: VerifiedBundle, material_digest: str | None) -> VerifiedBundle:
    if material_digest is not None and bundle.manifest.material_digest != material_digest:
        raise BundleVerificationError(
            bundle.path, [f"material digest {bundle.manifest.material_digest} is not the expected {material_digest}"]
        )
    return bundle


def open_bundle_here(
    path: Path, material_digest: str | None = None, defer_vector_table: bool = False
) -> VerifiedBundle:
    """``open_bundle(path)`` for a bundle folder named by its ID (``<bundles>/<hex>``). With a
    store configured (``RAGPIPE_STORE``) the folder is a cache of the store's record: a missing or
    damaged copy, or one of another material than ``material_digest`` (what a release bound), is
    (re)fetched (``hydrate_bundle``). Every failure, the store's included, is a
    ``BundleVerificationError``. Without a store the local copy is returned whatever its
    material: the caller compares it with what it expects and says so in its own words."""
    store = store_from_env()
    if store is None:  # nothing to fetch another copy from: the caller judges the material
        return open_bundle(path, defer_vector_table=defer_vector_table)
    try:
        return hydrate_bundle(store, path.name, path.parent, material_digest, defer_vector_table=defer_vector_table)
    except StorageError as exc:
        raise BundleVerificationError(path, [str(exc)]) from None


def adopt_stored(store: ObjectStore, bundle: VerifiedBundle) -> VerifiedBundle:
    """After ``push_bundle`` found the ID published: the store's bundle, which every other machine
    reads. A local build of other material (an index is not byte-reproducible) gives way to it."""
    try:
        _, manifest = _fetch_manifest(
            store, bundle.bundle_id, f"{store.url}{manifest_key(bundle.manifest.bundle_id.hex)}"
        )
        if manifest.material_digest == bundle.manifest.material_digest:
            return bundle
        discard(bundle.path)
        return hydrate_bundle(store, bundle.bundle_id, bundle.path.parent, manifest.material_digest)
    except StorageError as exc:
        raise BundleVerificationError(bundle.path, [str(exc)]) from None


MAX_BUNDLE_MANIFEST_BYTES = 64 * 2**20  # a manifest lists every file of a bundle: a few MiB at most


def bundle_semantic_here(path: Path, bundle_id: str) -> BundleSemantic:
    """The semantic section of bundle ``bundle_id`` whose folder is ``path`` (``<bundles>/<hex>``):
    read from its ``manifest.json`` (from the store when the local copy is missing and one is
    configured) and bound by recomputing the bundle ID from it — the specs it names are the
    bundle's, whatever the state of its other files. ``BundleVerificationError`` otherwise."""
    where = path / MANIFEST_NAME
    try:
        data = read_regular(where, MAX_BUNDLE_MANIFEST_BYTES)
    except FileNotFoundError:
        store = store_from_env()
        if store is None:
            raise BundleVerificationError(path, [f"{MANIFEST_NAME} is missing"]) from None
        try:
            data = _fetch_manifest(store, bundle_id, f"{store.url}{manifest_key(path.name)}")[0]
        except StorageError as exc:
            raise BundleVerificationError(path, [str(exc)]) from None
    except OSError as exc:
        raise BundleVerificationError(path, [f"{MANIFEST_NAME}: cannot read: {exc}"]) from None
    try:
        manifest = BundleManifest.model_validate(json.loads(data.decode("utf-8")))
    except (ValueError, ValidationError, RecursionError) as exc:
        first = str(exc).splitlines()[0]
        raise BundleVerificationError(path, [f"{MANIFEST_NAME}: not a valid manifest: {first}"]) from None
    recomputed = bundle_id_of(manifest.semantic)
    if recomputed != bundle_id:
        raise BundleVerificationError(
            path, [f"{MANIFEST_NAME}: its semantic section is bundle {recomputed}, not {bundle_id}"]
        )
    return manifest.semantic
