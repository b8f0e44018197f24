"""Server fixtures: two real bundles of the handbook (the second has one more document), each with
its real evaluation run, published as releases in a fresh workspace whose targets accept the
fixture gate policies; keys for a public and a staff subject. ``refresh_of``: a release gated
against another, for a test that activates one release after another (a decision holds only
where the release it was made against is live)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ragpipe.experiment.gate_policy import GatePolicy, parse_policy, policy_document
from ragpipe.kernel.workspace import Workspace
from ragpipe.server.config import KeyEntry, ServeConfig
from ragpipe.server.keys import new_key
from ragpipe_tests.conftest import HANDBOOK, build_all_stages, write_tree
from ragpipe_tests.support.release_fixtures import (
    bundle_of,
    evaluation_of,
    fixture_policy,
    fixture_targets,
    fresh_ws,
    publish,
)

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
    # name -> release ID: a1 (bundle A), b1 (bundle B), a2 (bundle A, another revision); each a
    # bootstrap (it activates only where nothing is live: ``refresh_of`` for one that replaces another)
    releases: dict[str, str]
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


LENIENT_REFRESH = "policy-lenient-refresh.yaml"


def lenient_refresh_policy(serving: Serving) -> GatePolicy:
    """The fixture policy, but tolerating any loss in a refresh (bundle B's run is worse than A's on
    the two fixture cases), written beside the targets file, which staging is made to accept."""
    doc = policy_document(fixture_policy(None))
    doc["refresh"] = {"margin": 1.0}
    doc["regression"]["overall"] = {metric: 1.0 for metric in doc["regression"]["overall"]}
    lenient = parse_policy(doc, "lenient refresh policy")
    (serving.targets.parent / LENIENT_REFRESH).write_text(
        yaml.safe_dump(policy_document(lenient), sort_keys=False), encoding="utf-8"
    )
    targets = yaml.safe_load(serving.targets.read_text(encoding="utf-8"))
    if LENIENT_REFRESH not in targets["targets"]["staging"]["gate_policies"]:
        targets["targets"]["staging"]["gate_policies"].append(LENIENT_REFRESH)
        serving.targets.write_text(yaml.safe_dump(targets, sort_keys=False), encoding="utf-8")
    return lenient


def refresh_of(serving: Serving, bundle: Path, revision: str, against: str) -> str:
    """A release of ``bundle`` (a built bundle: ``bundle_of(built_workspace)`` or ``second_bundle``)
    gated as a refresh against the published release ``against`` under the lenient refresh policy
    — the release that may replace ``against`` on staging where ``against`` is live. Its bundle ID
    joins ``serving.bundles``."""
    release_id = publish(serving.ws, bundle, revision, against=against, policy=lenient_refresh_policy(serving))
    serving.bundles[release_id] = "sha256:" + bundle.name
    return release_id


def b1_after_a1(serving: Serving, second_bundle: Path) -> str:
    """Bundle B's release (revision r2, as ``b1``) gated against a1 — the refresh that may replace a1
    where a1 is live (``b1`` is a bootstrap: it activates only where nothing is)."""
    return refresh_of(serving, second_bundle, "r2", serving.releases["a1"])


def config_for(serving: Serving, **changes) -> ServeConfig:
    base = {"keys": serving.key_entries, "poll_interval_s": 0.05}
    limits = changes.pop("limits", {})
    return ServeConfig.model_validate({**base, **changes, "limits": limits})
