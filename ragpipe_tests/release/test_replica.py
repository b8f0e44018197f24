"""What a release names travels through the object store (``ragpipe.release.replica``): a manifest,
its kept gate evidence and its evaluation run, published in one home, are fetched and verified by
another home that holds none of them — on both backends, listed in the publisher's order. What the
store holds forged, with every digest the store checks recomputed, is refused by the readers' own
verification; keys no home writes are never fetched."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragpipe.bundle.objects import push_bundle
from ragpipe.bundle.verify import open_bundle
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import verify_release
from ragpipe.release.bound_run import evaluation_evidence
from ragpipe.release.kept_decision import evidence_path
from ragpipe.release.manifest import ReleaseManifest, list_manifests, load_manifest, manifest_file_bytes
from ragpipe.release.replica import push_run
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.storage.blobs import LISTING, push_files
from ragpipe.storage.objects import ObjectStore
from ragpipe_tests.support.release_fixtures import evaluation_of, publish
from ragpipe_tests.support.storage_fixtures import delete, overwrite, store_env

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


@pytest.fixture
def published(ws: Workspace, bundle: Path, store: ObjectStore, request, monkeypatch) -> str:
    """A release published in ``ws`` with the store configured (bundle and run pushed as the
    ``index_bundle`` and ``evaluation_run`` steps push them); its ID."""
    for name, value in store_env(store, request).items():
        monkeypatch.setenv(name, value)
    push_bundle(store, open_bundle(ws.bundles / bundle.name))
    push_run(ws, ws.home / "evaluations" / evaluation_of(bundle).name)
    return publish(ws, bundle)


def test_another_home_fetches_and_verifies_what_the_release_names(published: str, bundle: Path, tmp_path: Path):
    other = Workspace(tmp_path / "other")
    manifest = load_manifest(ReleaseStore(other), published)
    assert verify_release(other, manifest) == []  # bundle hydrated, evidence and run fetched, all verified
    run = other.home / "evaluations" / manifest.evaluation.run_id
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == sorted(
        p.relative_to(evaluation_of(bundle)) for p in evaluation_of(bundle).rglob("*")
    )
    assert evidence_path(ReleaseStore(other), manifest.gate.decision_id).is_file()
    assert [rid for rid, _ in list_manifests(ReleaseStore(Workspace(tmp_path / "third"))).valid] == [published]


def test_a_forged_manifest_in_the_store_is_refused(published: str, ws: Workspace, store: ObjectStore, tmp_path: Path):
    """Another revision's manifest with its release ID recomputed, under the published name."""
    key = f"releases/manifests/{published.split(':', 1)[1]}.json"
    obj = json.loads(store.get(key).data)
    obj["manifest"]["revision"] = "forged"
    forged = ReleaseManifest.model_validate(obj["manifest"])
    overwrite(store, key, manifest_file_bytes(forged, None))
    with pytest.raises(ReleaseError, match="file name is not the release ID hex"):
        load_manifest(ReleaseStore(Workspace(tmp_path / "other")), published)
    assert load_manifest(ReleaseStore(ws), published).revision == "r1"  # the publisher's copy is its own


def test_a_forged_run_in_the_store_does_not_vouch_for_the_release(
    published: str, ws: Workspace, store: ObjectStore, tmp_path: Path
):
    """The run's bound suite edited, its blob and listing recomputed: the store hands it out (each
    file matches its listing) and the run's own custody refuses it."""
    manifest = load_manifest(ReleaseStore(ws), published)
    run = ws.home / "evaluations" / manifest.evaluation.run_id
    files = {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    files["inputs/suite.jsonl"] = files["inputs/suite.jsonl"].replace(b'"judgments":{', b'"judgments":{"x":1,', 1)
    key = f"evaluations/{manifest.evaluation.run_id}/{LISTING}"
    delete(store, key)  # push_files writes its listing create-only
    assert push_files(store, key, files)
    other = Workspace(tmp_path / "other")
    problems = verify_release(other, manifest)
    assert problems and "differs from the digest of its InputBound record" in problems[0], problems


def test_a_run_id_the_store_holds_with_another_folder_is_refused(published: str, ws: Workspace, bundle: Path):
    run = ws.home / "evaluations" / evaluation_of(bundle).name
    copy = ws.home / "copy"
    shutil.copytree(run, copy)
    (copy / "report.md").write_text("edited\n")
    shutil.rmtree(run)
    copy.rename(run)
    with pytest.raises(ReleaseError, match=f"the store holds another folder for evaluation run {run.name}"):
        push_run(ws, run)


def test_another_home_lists_manifests_in_the_publisher_s_order(
    published: str, ws: Workspace, bundle: Path, tmp_path: Path
):
    """The activation sensor takes the last listed as the newest: a home that fetched every
    manifest at once lists them as they were published, not by name or fetch time."""
    order = [published] + [publish(ws, bundle, f"r{i}") for i in range(2, 6)]
    assert order != sorted(order)  # by name the order would differ: this test can tell
    assert [rid for rid, _ in list_manifests(ReleaseStore(ws)).valid] == order
    assert [rid for rid, _ in list_manifests(ReleaseStore(Workspace(tmp_path / "other"))).valid] == order


def test_only_files_named_as_manifests_are_fetched_from_the_store(published: str, store: ObjectStore, tmp_path: Path):
    """A key the store allows but no home would write (a space, another name) is not copied."""
    for name in ("a b.json", "junk.json", f"{'0' * 64}.txt"):
        overwrite(store, f"releases/manifests/{name}", b"{}")
    other = ReleaseStore(Workspace(tmp_path / "other"))
    listing = list_manifests(other)
    assert ([rid for rid, _ in listing.valid], listing.invalid) == ([published], [])
    assert sorted(p.name for p in other.manifests.iterdir()) == [published.split(":", 1)[1] + ".json"]


def test_a_run_id_that_is_no_store_key_is_a_problem_not_a_crash(published: str, ws: Workspace):
    manifest = load_manifest(ReleaseStore(ws), published)
    bad = manifest.model_copy(update={"evaluation": manifest.evaluation.model_copy(update={"run_id": "run 1"})})
    run, problems = evaluation_evidence(ws, bad)
    assert run is None
    assert problems == [
        f"release {bad.release_id}: evaluation run run 1: cannot be fetched from the store: object key 'evaluations/run 1/listing.json': "
        "segment 'run 1' is not [A-Za-z0-9._=+-]+ (nor empty, nor starting with '.')"
    ]
