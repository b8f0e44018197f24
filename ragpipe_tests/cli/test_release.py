"""`ragpipe release …` as a user runs it (subprocess; the app run on its own until cli.py registers it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ragpipe.release.manifest import load_manifest
from ragpipe.release.store import ReleaseStore
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.release_fixtures import H, bundle_ids, bundle_of, fresh_ws, publish

# Fixture releases are gated under fixture policies (release_fixtures.fixture_policy): the targets accept them.
pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")


def release(*args: str, home: Path) -> subprocess.CompletedProcess:
    # $RAGPIPE_TARGETS: accepting_fixture_policies
    return run_cli("release", *args, home=home, env={"COLUMNS": "80"}, timeout=300)


def ok(*args: str, home: Path):
    proc = release(*args, home=home)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


def refused(*args: str, home: Path) -> str:
    """stderr of a refused command: exactly ragpipe's message, nothing printed by a library."""
    proc = release(*args, home=home)
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stdout
    return proc.stderr


def test_release_lifecycle_through_the_cli(built_workspace, tmp_path: Path):
    bundle = bundle_of(built_workspace)
    ws = fresh_ws(tmp_path, bundle)
    home = ws.home
    assert ok("list", "--json", home=home) == []
    assert ok("list", home=home) == "no releases\n"
    assert ok("current", "--json", home=home) == {
        "target": "staging",
        "release_id": None,
        "generation": 0,
        "previous": None,
        "since": None,
        "action": None,
    }
    a = publish(ws, bundle, "r1")
    b = publish(ws, bundle, "r2", against=a)  # gated against a: it may replace a where a is live
    bad = publish(ws, bundle, "r3", eligible=False, phase="coverage")
    bad_decision = load_manifest(ReleaseStore(ws), bad).gate.decision_id
    bundle_id = bundle_ids(bundle)[0]

    assert ok("activate", a[:19].upper().replace("SHA256", "sha256"), "--json", home=home) == {  # a 12-digit prefix
        "target": "staging",
        "release_id": a,
        "generation": 1,
        "previous": None,
        "changed": True,
    }
    assert (
        ok("activate", b, "--target", "staging", home=home)
        == f"activated {b} on staging (generation 2; previous {a})\n"
    )
    assert ok("activate", b, home=home) == f"{b} is already active on staging (generation 2); nothing changed\n"
    current = ok("current", "--json", home=home)
    since = current.pop("since")
    assert current == {"target": "staging", "release_id": b, "generation": 2, "previous": a, "action": "activate"}
    assert ok("current", home=home) == f"staging: {b} (generation 2, activate at {since})\n"

    rows = ok("list", "--json", home=home)
    assert [
        {k: r[k] for k in ("release_id", "revision", "bundle_id", "eligible", "decisive_phase", "active_targets")}
        for r in rows
    ] == [
        {
            "release_id": a,
            "revision": "r1",
            "bundle_id": bundle_id,
            "eligible": True,
            "decisive_phase": None,
            "active_targets": [],
        },
        {
            "release_id": b,
            "revision": "r2",
            "bundle_id": bundle_id,
            "eligible": True,
            "decisive_phase": None,
            "active_targets": ["staging"],
        },
        {
            "release_id": bad,
            "revision": "r3",
            "bundle_id": bundle_id,
            "eligible": False,
            "decisive_phase": "coverage",
            "active_targets": [],
        },
    ]
    assert [r["states"] for r in rows] == [{"staging": "superseded"}, {"staging": "active"}, {}]
    # what each decision was made against, its target metric (paired only in the refresh), why not eligible
    assert [(r["change"], r["incumbent"], r["metric"]["paired"], r["first_reason"]) for r in rows] == [
        ("bootstrap", None, False, None),
        ("refresh", a, True, None),
        ("bootstrap", None, False, "coverage evaluated_cases: 2 is not >= 100"),
    ]
    table = ok("list", home=home)  # IDs as activate takes them: 12 hex digits, no sha256: prefix
    assert "sha256:" not in table and all(re.search(rf"^{rid[7:19]} ", table, re.M) for rid in (a, b, bad))
    # an ineligible release's row says "no (N)"; its reason is line N under the table (80 columns hold it)
    assert re.search(rf"^{bad[7:19]} .* no \(1\) ", table, re.M)
    assert table.splitlines()[-1] == f"(1) {bad[7:19]}: coverage evaluated_cases: 2 is not >= 100"

    assert refused("activate", bad, home=home) == (
        f"error: release {bad} is not eligible for activation (gate decision {bad_decision}: decisive phase coverage)\n"
    )
    assert refused("activate", a, "--target", "production", home=home) == (
        f"error: release {a} needs an approval for target 'production' before activation: "
        f"target 'production' requires an approval, and release {a} has none "
        f"(ragpipe release approve {a} --target production --by NAME --key KEYFILE)\n"
    )
    key = str(Path(os.environ["RAGPIPE_TARGETS"]).parent / "alice.pem")
    approval = ok(
        "approve", a, "--target", "production", "--by", "alice", "--key", key, "--note", "ticket 7", "--json", home=home
    )
    assert {k: approval[k] for k in ("release_id", "target", "by", "note", "record")} == {
        "release_id": a,
        "target": "production",
        "by": "alice",
        "note": "ticket 7",
        "record": 1,
    }
    assert ok("activate", a, "--target", "production", "--json", home=home)["generation"] == 1

    shown = ok("show", a[7:23], "--json", home=home)  # a prefix without sha256:
    assert (
        shown["release_id"] == a
        and shown["manifest"]["revision"] == "r1"
        and shown["manifest"]["gate"]["eligible"] is True
    )
    assert {t: v["state"] for t, v in shown["targets"].items()} == {"production": "active", "staging": "superseded"}
    assert [x["by"] for x in shown["targets"]["production"]["approvals"]] == ["alice"]
    assert f"release {a}" in ok("show", a, home=home)

    assert ok("rollback", "--json", home=home) == {
        "target": "staging",
        "release_id": a,
        "generation": 3,
        "previous": b,
        "changed": True,
    }
    assert (
        refused("rollback", home=home)
        == f"error: target 'staging' has no earlier release to roll back to (only {a} was active)\n"
    )
    assert ok("rollback", "--to", b[7:19], home=home) == f"rolled back staging to {b} (generation 4; previous {a})\n"
    assert refused("rollback", "--target", "production", home=home) == (
        f"error: target 'production' has no earlier release to roll back to (only {a} was active)\n"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (("show", "nope"), "release ID 'nope' is not sha256:<64 hex digits> or a prefix of at least 12 of them"),
        (
            ("show", "sha256:abc"),
            "release ID prefix 'sha256:abc' is too short: give at least 12 hex digits (ragpipe release list)",
        ),
        (
            ("activate", "0123456789ab"),
            "no release ID starts with 0123456789ab in {home}/releases/manifests (ragpipe release list)",
        ),
        (("activate",), "give a release ID or --revision KEY (one of them)"),
        (("activate", H, "--revision", "r1"), "give a release ID or --revision KEY (one of them)"),
        (("activate", H), "release {H} not found in {home}/releases/manifests"),
        (("current", "--target", "qa"), "unknown target 'qa': declared targets are production, staging"),
        (("rollback",), "target 'staging' has no active release; there is nothing to roll back"),
        (
            ("approve", H, "--target", "production", "--by", "Bob Smith", "--key", "k.pem"),
            "approver 'Bob Smith': a name is 1-64 of a-z 0-9 . _ @ - (starting with a letter or digit)",
        ),
        (
            ("approve", H, "--target", "production", "--by", "bob", "--key", "k.pem"),
            "'bob' is not an approver of target 'production' (approvers: alice)",
        ),
    ],
)
def test_cli_errors_are_one_line_and_exit_1(tmp_path: Path, args: tuple[str, ...], message: str):
    home = tmp_path / "home"
    assert refused(*args, home=home) == "error: " + message.format(H=H, home=home) + "\n"


def test_cli_refuses_a_damaged_history(built_workspace, tmp_path: Path):
    bundle = bundle_of(built_workspace)
    ws = fresh_ws(tmp_path, bundle)
    a = publish(ws, bundle)
    ok("activate", a, home=ws.home)
    history = ws.home / "releases" / "targets" / "staging" / "history.jsonl"
    history.write_bytes(history.read_bytes().replace(b'"by":"cli"', b'"by":"eve"', 1))
    assert refused("list", home=ws.home) == f"error: {history}: record 1: hash does not match the record's content\n"
    assert (
        refused("rollback", home=ws.home) == f"error: {history}: record 1: hash does not match the record's content\n"
    )


def test_gc_keeps_released_bundles_and_stops_on_a_damaged_history(built_workspace, tmp_path: Path):
    """`ragpipe gc`: a bundle only a release pins survives; an unreferenced one goes; a damaged
    release history stops collection before anything is removed."""
    bundle = bundle_of(built_workspace)
    ws = fresh_ws(tmp_path, bundle)
    orphan = ws.bundles / ("e" * 64)
    shutil.copytree(bundle, orphan)
    ok("activate", publish(ws, bundle), home=ws.home)

    def gc(*args: str) -> subprocess.CompletedProcess:
        return run_cli("gc", *args, home=ws.home, timeout=300)

    proc = gc("--json")
    assert proc.returncode == 0, proc.stderr
    assert [(r["kind"], r["path"]) for r in json.loads(proc.stdout)["removed"]] == [("bundle", f"bundles/{'e' * 64}")]
    assert (ws.bundles / bundle.name).is_dir() and not orphan.exists()

    shutil.copytree(bundle, orphan)
    history = ws.home / "releases" / "targets" / "staging" / "history.jsonl"
    history.write_bytes(history.read_bytes().replace(b'"by":"cli"', b'"by":"eve"', 1))
    proc = gc()
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"error: {history}: record 1: hash does not match the record's content\n"
    assert orphan.is_dir()


def test_a_release_id_prefix_must_be_unique(tmp_path: Path):
    """Two manifests whose IDs share the first 12 hex digits: that prefix is refused listing both,
    one digit more names one (prefixes are matched against the manifest file names)."""
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.release.manifest import resolve_release_id
    from ragpipe.release.store import ReleaseError

    store = ReleaseStore(Workspace(tmp_path))
    store.manifests.mkdir(parents=True)
    one, two = "0123456789ab" + "c" * 52, "0123456789ab" + "d" * 52
    for name in (one, two):
        (store.manifests / f"{name}.json").write_text("{}")
    with pytest.raises(ReleaseError) as err:
        resolve_release_id(store, "sha256:0123456789AB")
    assert str(err.value) == (
        f"release ID prefix 0123456789ab is ambiguous: sha256:{one}, sha256:{two} (give more digits)"
    )
    assert resolve_release_id(store, "0123456789abd") == f"sha256:{two}"
    assert resolve_release_id(store, f"sha256:{'e' * 64}") == f"sha256:{'e' * 64}"  # a full ID is taken as given
