"""Server fixtures: two real bundles of the handbook (the second has one more document), each with
its real evaluation run, published as releases in a fresh workspace whose targets accept the
fixture gate policies; keys for a public and a staff subject."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from ragpipe.kernel.workspace import Workspace
from ragpipe.server.config import KeyEntry, ServeConfig
from ragpipe.server.keys import new_key
from ragpipe_tests.conftest import HANDBOOK, build_all_stages, write_tree
from ragpipe_tests.support.release_fixtures import bundle_of, evaluation_of, fixture_targets, fresh_ws, publish

EXTRA = {"guide/extra.md": "---\ntitle: Extra\n---\n# Extra\n\nA second bundle holds one more note about rollback.\n"}


@pytest.fixture(scope="session")
def second_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("built-b")
    corpus = write_tree(root / "handbook", {**HANDBOOK, **EXTRA})
    _, _, bundle = build_all_stages(root / "home", "hb2", corpus, "markdown")
    return bundle


@dataclass
class Serving:
    ws: Workspace
    targets: Path
    releases: dict[str, str]  # name -> release ID: a1 (bundle A), b1 (bundle B), a2 (bundle A, another revision)
    bundles: dict[str, str]  # release ID -> bundle ID
    keys: dict[str, str]  # subject -> key
    key_entries: tuple[KeyEntry, ...]  # alice: public; bob: public and staff


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


def config_for(serving: Serving, **changes) -> ServeConfig:
    base = {"keys": serving.key_entries, "poll_interval_s": 0.05}
    limits = changes.pop("limits", {})
    return ServeConfig.model_validate({**base, **changes, "limits": limits})
