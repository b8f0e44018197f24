"""What the server tests share: ``Serving`` (a fresh workspace with three published releases of
two handbook bundles, keys for a public and a staff subject), releases gated as refreshes of
another (``refresh_of``: a decision holds only where the release it was made against is live) and
the serve config over the keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from ragpipe.experiment.gate_policy import GatePolicy, parse_policy, policy_document
from ragpipe.kernel.workspace import Workspace
from ragpipe.server.config import KeyEntry, ServeConfig
from ragpipe_tests.support.release_fixtures import fixture_policy, publish

# The second bundle's corpus: the handbook and one more note.
EXTRA = {"guide/extra.md": "---\ntitle: Extra\n---\n# Extra\n\nA second bundle holds one more note about rollback.\n"}


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
