"""Rollback chains, --to, refusals, and the garbage-collection roots releases pin."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ragpipe.gc import collect_garbage
from ragpipe.release.activation import activate
from ragpipe.release.history import read_history
from ragpipe.release.pointer import read_pointer
from ragpipe.release.rollback import rollback
from ragpipe.release.roots import pinned_releases, release_roots
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe_tests.support.release_fixtures import bundle_ids, publish

# Fixture releases are gated under fixture policies (release_fixtures.fixture_policy): the targets accept them.
pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


def test_rollback_chain_walks_back_through_activations(ws, bundle: Path):
    a = publish(ws, bundle, "r0")
    b = publish(ws, bundle, "r1", against=a)
    c = publish(ws, bundle, "r2", against=b)
    for rid in (a, b, c):
        activate(ws, rid, "staging")
    first = rollback(ws, "staging")
    assert first.as_dict() == {"target": "staging", "release_id": b, "generation": 4, "previous": c, "changed": True}
    assert rollback(ws, "staging").release_id == a
    with pytest.raises(ReleaseError) as exc:
        rollback(ws, "staging")
    assert str(exc.value) == f"target 'staging' has no earlier release to roll back to (only {a} was active)"
    again = rollback(ws, "staging", to=c)  # --to may go forward again to a rolled-back release
    assert (again.release_id, again.generation, again.previous) == (c, 6, a)
    state, records = read_history(ReleaseStore(ws), "staging")
    assert [(g, rid, action) for g, rid, action in state.activations] == [
        (1, a, "activate"),
        (2, b, "activate"),
        (3, c, "activate"),
        (4, b, "rollback"),
        (5, a, "rollback"),
        (6, c, "rollback"),
    ]
    assert state.states == {a: "rolled_back", b: "rolled_back", c: "active"}
    assert state.stack == (a, c)
    assert rollback(ws, "staging").release_id == a
    pointer = read_pointer(ReleaseStore(ws), "staging")
    assert (pointer.generation, pointer.release_id, pointer.previous) == (7, a, c)


def test_rollback_refusals(ws, bundle: Path):
    with pytest.raises(ReleaseError) as exc:
        rollback(ws, "staging")
    assert str(exc.value) == "target 'staging' has no active release; there is nothing to roll back"
    a, never = publish(ws, bundle, "r1"), publish(ws, bundle, "r3")
    b = publish(ws, bundle, "r2", against=a)
    activate(ws, a, "staging")
    with pytest.raises(ReleaseError) as exc:
        rollback(ws, "staging")
    assert str(exc.value) == f"target 'staging' has no earlier release to roll back to (only {a} was active)"
    activate(ws, b, "staging")
    with pytest.raises(ReleaseError) as exc:
        rollback(ws, "staging", to=never)
    assert (
        str(exc.value)
        == f"release {never} was never active on target 'staging'; rollback only returns to a previously active release"
    )
    with pytest.raises(ReleaseError) as exc:
        rollback(ws, "staging", to=b)
    assert str(exc.value) == f"release {b} is already active on target 'staging'"
    with pytest.raises(ReleaseError) as exc:
        rollback(ws, "staging", to="latest")
    assert str(exc.value) == "release ID 'latest' is not of the form sha256:<64 hex digits>"
    with pytest.raises(ReleaseError) as exc:
        rollback(ws, "qa")
    assert str(exc.value) == "unknown target 'qa': declared targets are production, staging"
    assert read_pointer(ReleaseStore(ws), "staging").release_id == b


def test_rollback_to_a_release_that_no_longer_verifies_is_refused(ws, bundle: Path, tmp_path: Path):
    """The bundle of the release to return to is damaged after that release was superseded."""
    a = publish(ws, bundle, "r1")
    b = publish(ws, bundle, "r2", against=a)
    activate(ws, a, "staging")
    activate(ws, b, "staging")
    victim = ws.bundles / bundle.name / "chunks.parquet"
    victim.unlink()
    with pytest.raises(ReleaseError) as exc:
        rollback(ws, "staging")
    assert str(exc.value) == (
        f"rollback of target 'staging' to release {a} refused: it no longer verifies (pick another with --to):\n"
        f"  bundle {bundle_ids(bundle)[0]}: chunks.parquet: listed in the manifest but missing"
    )
    state, records = read_history(ReleaseStore(ws), "staging")
    assert (records[-1].kind, records[-1].payload["action"], state.active, state.generation) == (
        "rejected",
        "rollback",
        b,
        2,
    )


def test_releases_are_gc_roots(ws, bundle: Path, built_workspace):
    a, unused = publish(ws, bundle, "r1"), publish(ws, bundle, "r3")
    b = publish(ws, bundle, "r2", against=a)
    assert release_roots(ws) == frozenset()
    activate(ws, a, "staging")
    activate(ws, b, "staging")
    assert pinned_releases(ws) == {a, b} and unused not in pinned_releases(ws)  # never active: not a root
    assert release_roots(ws) == {bundle_ids(bundle)[0]}
    orphan = ws.bundles / ("f" * 64)
    shutil.copytree(bundle, orphan)
    report = collect_garbage(ws, extra_roots=release_roots(ws))
    assert [r.path for r in report.removed] == [f"bundles/{'f' * 64}"]
    assert (ws.bundles / bundle.name).is_dir()  # pinned by the active and previously active releases
    ReleaseStore(ws).manifest_path(a).unlink()
    with pytest.raises(ReleaseError) as exc:  # fail closed: no partial root set
        release_roots(ws)
    assert str(exc.value) == f"release {a} not found in {ws.home / 'releases' / 'manifests'}"
