"""Server fixtures: two real bundles of the handbook (the second has one more document), each with
its real evaluation run, published as releases in a fresh workspace whose targets accept the
fixture gate policies; keys for a public and a staff subject (``ragpipe_tests.support.serving``
holds ``Serving`` and the helpers over it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ragpipe.server.config import KeyEntry
from ragpipe.server.keys import new_key
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import HANDBOOK, write_tree
from ragpipe_tests.support.release_fixtures import (
    bundle_of,
    evaluation_of,
    fixture_targets,
    fresh_ws,
    publish,
)
from ragpipe_tests.support.serving import EXTRA, Serving


@pytest.fixture(scope="session")
def second_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("built-b")
    corpus = write_tree(root / "handbook", {**HANDBOOK, **EXTRA})
    _, _, bundle = build_all_stages(root / "home", "hb2", corpus, "markdown")
    return bundle


@pytest.fixture
def serving(built_workspace, second_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Serving:
    bundle_a = bundle_of(built_workspace)
    ws = fresh_ws(tmp_path, bundle_a)
    shutil.copytree(second_bundle, ws.bundles / second_bundle.name, symlinks=True)
    run = evaluation_of(second_bundle)
    shutil.copytree(run, ws.home / "evaluations" / run.name)
    targets = fixture_targets(tmp_path)
    monkeypatch.setenv("RAGPIPE_TARGETS", str(targets))
    monkeypatch.setenv("RAGPIPE_HOME", str(ws.home))
    releases = {
        "a1": publish(ws, bundle_a, "r1"),
        "b1": publish(ws, second_bundle, "r2"),
        "a2": publish(ws, bundle_a, "r3"),
    }
    ids = {bundle_a: "sha256:" + bundle_a.name, second_bundle: "sha256:" + second_bundle.name}
    bundles = {releases["a1"]: ids[bundle_a], releases["b1"]: ids[second_bundle], releases["a2"]: ids[bundle_a]}
    keys = {subject: new_key(subject) for subject in ("alice", "bob")}
    entries = (
        KeyEntry(id="alice", hash=keys["alice"][1], subject="alice", scopes=("public",)),
        KeyEntry(id="bob", hash=keys["bob"][1], subject="bob", scopes=("public", "staff")),
    )
    return Serving(ws, targets, releases, bundles, {s: k for s, (k, _) in keys.items()}, entries)
