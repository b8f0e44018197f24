"""Release manifests (content ID, atomic publication, fail-closed reading) and the targets config."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.manifest import (
    ReleaseManifest,
    list_manifests,
    load_manifest,
    manifest_file_bytes,
    publish_manifest,
)
from ragpipe.release.store import ReleaseError, ReleaseStore, check_release_id, check_target_name
from ragpipe.release.targets import DEFAULT_TARGETS_PATH, load_targets

A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def body(**over) -> dict:
    base = {
        "schema": "ragpipe.release/v1",
        "revision": "r1",
        "bundle_id": A,
        "material_digest": A,
        "query_plan_id": A,
        "answer_plan_id": A,
        "authorization_policy_id": A,
        "gate_policy_id": A,
        "evaluation": {"spec_id": A, "run_id": "run-1", "ledger_head": A},
        "comparison_id": None,
        "gate": {"decision_id": A, "eligible": True, "decisive_phase": None},
    }
    return {**base, **over}


def test_release_id_is_the_domain_separated_content_id():
    canonical = json.dumps(body(), sort_keys=True, separators=(",", ":")).encode()
    expected = "sha256:" + hashlib.sha256(b"ragpipe/release/v1\0" + canonical).hexdigest()
    assert ReleaseManifest.model_validate(body()).release_id == expected


@pytest.mark.parametrize(
    "change",
    [
        {"revision": "r2"},
        {"bundle_id": B},
        {"material_digest": B},
        {"query_plan_id": B},
        {"answer_plan_id": B},
        {"authorization_policy_id": B},
        {"gate_policy_id": B},
        {"comparison_id": B},
        {"evaluation": {"spec_id": B, "run_id": "run-1", "ledger_head": A}},
        {"evaluation": {"spec_id": A, "run_id": "run-2", "ledger_head": A}},
        {"evaluation": {"spec_id": A, "run_id": "run-1", "ledger_head": B}},
        {"gate": {"decision_id": B, "eligible": True, "decisive_phase": None}},
        {"gate": {"decision_id": A, "eligible": False, "decisive_phase": "coverage"}},
    ],
)
def test_every_bound_field_changes_the_release_id(change: dict):
    assert (
        ReleaseManifest.model_validate(body(**change)).release_id != ReleaseManifest.model_validate(body()).release_id
    )


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"bundle_id": "sha256:xyz"}, "bundle_id"),
        ({"extra": 1}, "extra"),
        ({"gate": {"decision_id": A, "eligible": "yes", "decisive_phase": None}}, "gate.eligible"),
        ({"schema": "ragpipe.release/v2"}, "schema"),
        ({"revision": ""}, "revision"),
    ],
)
def test_malformed_manifest_fields_refused(bad: dict, field: str):
    with pytest.raises(ValidationError) as exc:
        ReleaseManifest.model_validate(body(**bad))
    assert [".".join(map(str, e["loc"])) for e in exc.value.errors()] == [field]


def test_publish_is_atomic_immutable_and_idempotent(tmp_path: Path):
    store = ReleaseStore(Workspace(tmp_path))
    manifest = ReleaseManifest.model_validate(body())
    rid, published = publish_manifest(store, manifest)
    assert published and rid == manifest.release_id
    path = store.manifest_path(rid)
    assert path == tmp_path / "releases" / "manifests" / f"{rid[7:]}.json"
    assert path.read_bytes() == manifest_file_bytes(manifest, None)
    assert json.loads(path.read_bytes()) == {"manifest": body(), "release_id": rid}
    assert publish_manifest(store, manifest) == (rid, False)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp left
    assert load_manifest(store, rid) == manifest
    listing = list_manifests(store)
    assert (listing.valid, listing.invalid, list(listing.published)) == ([(rid, manifest)], [], [rid])
    assert listing.published[rid] == path.stat().st_mtime_ns


def test_reading_recomputes_the_id_and_refuses_edits(tmp_path: Path):
    store = ReleaseStore(Workspace(tmp_path))
    rid, _ = publish_manifest(store, ReleaseManifest.model_validate(body()))
    path = store.manifest_path(rid)
    original = path.read_bytes()
    edited = ReleaseManifest.model_validate(body(revision="evil"))
    path.write_bytes(original.replace(b'"revision":"r1"', b'"revision":"evil"'))
    with pytest.raises(ReleaseError) as exc:
        load_manifest(store, rid)
    assert (
        str(exc.value)
        == f"{path}: release_id {rid} does not match the manifest's content ID {edited.release_id} (manifest edited)"
    )
    path.write_bytes(original.replace(b"{", b"{ ", 1))
    with pytest.raises(ReleaseError) as exc:
        load_manifest(store, rid)
    assert str(exc.value) == f"{path}: bytes are not the canonical rendering of its content (manifest edited)"
    path.write_bytes(original)
    with pytest.raises(ReleaseError) as exc:  # an identical publication must find what is there valid
        path.write_bytes(b"garbage")
        publish_manifest(store, ReleaseManifest.model_validate(body()))
    assert str(exc.value).startswith(f"{path}: not a valid release manifest: ")
    path.write_bytes(original)
    other = store.manifests / f"{'c' * 64}.json"
    other.write_bytes(original)
    stray = store.manifests / "notes.json"
    stray.write_bytes(b"{}")
    listing = list_manifests(store)  # the bad files are reported, the good one still listed
    assert listing.valid == [(rid, ReleaseManifest.model_validate(body()))]
    assert listing.invalid == [
        (other, f"{other}: file name is not the release ID hex {rid[7:]}"),
        (stray, f"{stray}: not a valid release manifest: expected exactly the keys manifest, release_id"),
    ]


def test_missing_and_malformed_release_ids(tmp_path: Path):
    store = ReleaseStore(Workspace(tmp_path))
    with pytest.raises(ReleaseError) as exc:
        load_manifest(store, A)
    assert str(exc.value) == f"release {A} not found in {tmp_path / 'releases' / 'manifests'}"
    with pytest.raises(ReleaseError) as exc:
        check_release_id("../../etc")
    assert str(exc.value) == "release ID '../../etc' is not of the form sha256:<64 hex digits>"
    with pytest.raises(ReleaseError) as exc:
        check_target_name("../prod")
    assert str(exc.value) == "target name '../prod' must match [a-z][a-z0-9_-]{0,62}"


def test_default_targets():
    config = load_targets(DEFAULT_TARGETS_PATH)
    assert config.default_target == "staging"
    assert {n: (t.approval_required, t.auto_activate) for n, t in config.targets.items()} == {
        "staging": (False, True),
        "production": (True, False),
    }
    assert config.get(None)[0] == "staging" and config.get("production")[1].approval_required
    with pytest.raises(ReleaseError) as exc:
        config.get("qa")
    assert str(exc.value) == "unknown target 'qa': declared targets are production, staging"


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "schema: ragpipe.targets/v1\ndefault_target: prod\ntargets:\n  staging: {approval_required: false, auto_activate: true}\n",
            "(top): Value error, default_target 'prod' is not one of the declared targets ['staging']",
        ),
        (
            "schema: ragpipe.targets/v1\ndefault_target: s\ntargets:\n  s: {approval_required: maybe, auto_activate: true}\n",
            "targets.s.approval_required: Input should be a valid boolean, unable to interpret input",
        ),
        (
            "schema: ragpipe.targets/v1\ndefault_target: s\ntargets:\n  s: {approval_required: true, auto_activate: true, x: 1}\n",
            "targets.s.x: Extra inputs are not permitted",
        ),
        (
            "schema: ragpipe.targets/v1\ndefault_target: Bad\ntargets:\n  Bad: {approval_required: true, auto_activate: true}\n",
            "(top): Value error, target name 'Bad' must match [a-z][a-z0-9_-]{0,62}",
        ),
    ],
)
def test_bad_targets_config_names_file_and_rule(tmp_path: Path, text: str, problem: str):
    path = tmp_path / "targets.yaml"
    path.write_text(text)
    with pytest.raises(ReleaseError) as exc:
        load_targets(path)
    assert str(exc.value) == f"{path}: invalid targets config: {problem}"


def test_targets_from_environment(tmp_path: Path, monkeypatch):
    path = tmp_path / "t.yaml"
    path.write_text(
        "schema: ragpipe.targets/v1\ndefault_target: qa\ntargets:\n  qa: {approval_required: false, auto_activate: false}\n"
    )
    monkeypatch.setenv("RAGPIPE_TARGETS", str(path))
    assert load_targets().default_target == "qa"
    monkeypatch.setenv("RAGPIPE_TARGETS", str(tmp_path / "missing.yaml"))
    with pytest.raises(ReleaseError, match=r"missing\.yaml: cannot read targets config: \[Errno 2\]"):
        load_targets()


def test_a_listing_never_follows_a_link_nor_waits_on_a_fifo(tmp_path: Path):
    """Only regular files are read: a FIFO named like a manifest is one invalid row (opened without
    blocking, so a listing — ``release list``, the activation sensor — never hangs on it), a link
    to a valid manifest is one invalid row (never followed), a folder and an oversized file too;
    the valid manifest is still listed. ``load_manifest`` refuses a link in a manifest's place."""
    import os

    from ragpipe.release.manifest import MAX_MANIFEST_BYTES

    store = ReleaseStore(Workspace(tmp_path))
    rid, _ = publish_manifest(store, ReleaseManifest.model_validate(body()))
    path = store.manifest_path(rid)
    fifo, link, folder, huge = (store.manifests / f"{c * 64}.json" for c in "cdef")
    os.mkfifo(fifo)
    outside = tmp_path / "outside.json"
    outside.write_bytes(path.read_bytes())
    link.symlink_to(outside)
    folder.mkdir()
    with open(huge, "wb") as fh:
        fh.truncate(MAX_MANIFEST_BYTES + 1)
    listing = list_manifests(store)
    assert listing.valid == [(rid, ReleaseManifest.model_validate(body()))]
    assert listing.invalid == [
        (fifo, f"{fifo}: cannot read: not a regular file (a FIFO)"),
        (link, f"{link}: cannot read: a symbolic link (never followed)"),
        (folder, f"{folder}: cannot read: not a regular file (a folder)"),
        (huge, f"{huge}: cannot read: {MAX_MANIFEST_BYTES + 1} bytes, more than the {MAX_MANIFEST_BYTES} allowed"),
    ]
    path.unlink()
    path.symlink_to(outside)
    with pytest.raises(ReleaseError) as exc:
        load_manifest(store, rid)
    assert str(exc.value) == f"{path}: cannot read: a symbolic link (never followed)"
