"""One resolution of "what is live" (``ragpipe.release.live``): every case a hand-edited pointer or a
forged history can present is refused — by ``live_release`` and, as a user meets it, by ``ragpipe
query`` and ``ragpipe release current`` (exit 1, one line naming the rule)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.activation import activate
from ragpipe.release.history import read_history
from ragpipe.release.live import live_release
from ragpipe.release.pointer import Pointer, read_pointer, write_pointer
from ragpipe.release.rollback import rollback
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.release_fixtures import bundle_ids, forge_activation, publish

pytestmark = pytest.mark.usefixtures("accepting_fixture_policies")
NOT_MOVED = "the pointer was not moved by activation or rollback; refusing to serve it"


def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    return run_cli(*args, home=home, env={"COLUMNS": "200"}, timeout=300)


def refused_everywhere(ws: Workspace, target: str, reason: str) -> None:
    """``live_release``, ``release current`` and ``query`` all refuse with exactly ``reason``."""
    with pytest.raises(ReleaseError) as caught:
        live_release(ws, target)
    assert str(caught.value) == reason
    commands = [("release", "current", "--target", target)]
    if target == "staging":  # ragpipe query serves the default target
        commands.append(("query", "rollback"))
    for args in commands:
        proc = cli(*args, home=ws.home)
        assert (proc.returncode, proc.stdout) == (1, ""), (args, proc.stdout)
        assert reason.splitlines()[0] in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_the_live_release_is_what_activation_made_active(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    b = publish(ws, bundle, "r2", against=a)
    activate(ws, a, "staging")
    activate(ws, b, "staging")
    live = live_release(ws, "staging")
    assert (live.release_id, live.target, live.generation, live.action, live.previous) == (
        b,
        "staging",
        2,
        "activate",
        a,
    )
    rollback(ws, "staging")
    live = live_release(ws, "staging")
    assert (live.release_id, live.generation, live.action, live.previous) == (a, 3, "rollback", b)
    proc = cli("query", "rollback", "--k", "1", "--json", home=ws.home)
    assert proc.returncode == 0, proc.stderr
    assert f'"release_id": "{a}"' in proc.stdout


def test_a_pointer_naming_an_ineligible_release_nobody_activated_is_refused(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    ineligible = publish(ws, bundle, "r2", eligible=False, phase="hard")
    activate(ws, a, "staging")
    store = ReleaseStore(ws)
    head = read_pointer(store, "staging").ledger_head
    write_pointer(store, Pointer("staging", ineligible, 1, None, head))  # canonical form, written by hand
    refused_everywhere(
        ws,
        "staging",
        f"target 'staging': the pointer names release {ineligible} at generation 1, "
        f"but the history has {a} at generation 1: {NOT_MOVED}",
    )


def test_a_pointer_naming_the_rolled_back_release_is_refused(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    b = publish(ws, bundle, "r2", against=a)
    activate(ws, a, "staging")
    activate(ws, b, "staging")
    rollback(ws, "staging")
    store = ReleaseStore(ws)
    pointer = read_pointer(store, "staging")
    write_pointer(store, Pointer("staging", b, pointer.generation, a, pointer.ledger_head))
    refused_everywhere(
        ws,
        "staging",
        f"target 'staging': the pointer names release {b} at generation 3, "
        f"but the history has {a} at generation 3: {NOT_MOVED}",
    )


def test_a_pointer_naming_a_release_that_does_not_exist_is_refused(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    activate(ws, a, "staging")
    ghost = "sha256:" + "ab" * 32
    forge_activation(ws, ghost)
    with pytest.raises(ReleaseError, match=f"release {ghost}"):
        live_release(ws, "staging")
    proc = cli("release", "current", home=ws.home)
    assert proc.returncode == 1 and ghost in proc.stderr and "Traceback" not in proc.stderr


def test_an_ineligible_release_with_a_forged_agreeing_history_is_refused(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    ineligible = publish(ws, bundle, "r2", eligible=False, phase="hard")
    activate(ws, a, "staging")
    forge_activation(ws, ineligible)
    with pytest.raises(ReleaseError) as caught:
        live_release(ws, "staging")
    assert str(caught.value).startswith(
        f"target 'staging': release {ineligible} is not eligible for activation (gate decision "
    )
    proc = cli("query", "rollback", home=ws.home)
    assert proc.returncode == 1 and "is not eligible for activation" in proc.stderr


def test_an_unapproved_release_on_a_target_that_requires_approval_is_refused(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    forge_activation(ws, a, "production")
    refused_everywhere(ws, "production", f"target 'production' requires an approval, and release {a} has none")


def test_a_release_whose_bundle_changed_after_activation_is_refused(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    activate(ws, a, "staging")
    chunks = ws.bundles / bundle.name / "chunks.parquet"  # the workspace's copy, not the fixture's
    data = bytearray(chunks.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunks.write_bytes(bytes(data))
    with pytest.raises(ReleaseError) as caught:
        live_release(ws, "staging")
    reason = str(caught.value)
    assert reason.startswith(f"target 'staging': release {a} failed verification: bundle {bundle_ids(bundle)[0]}: ")
    assert "chunks.parquet" in reason
    proc = cli("release", "current", home=ws.home)
    assert proc.returncode == 1 and "failed verification" in proc.stderr


def test_nothing_active_is_reported_not_refused(ws: Workspace):
    proc = cli("release", "current", home=ws.home)
    assert (proc.returncode, proc.stdout) == (0, "staging: no active release\n")
    with pytest.raises(ReleaseError, match="target 'staging' has no active release"):
        live_release(ws, "staging")


def test_release_list_reports_an_invalid_manifest_and_lists_the_others(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    stray = ReleaseStore(ws).manifests / "notes.json"
    stray.write_text("{}", encoding="utf-8")
    proc = cli("release", "list", "--json", home=ws.home)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r.get("release_id") for r in rows] == [a, None]
    assert rows[1] == {
        "file": str(stray),
        "invalid": f"{stray}: not a valid release manifest: expected exactly the keys manifest, release_id",
    }
    proc = cli("release", "list", home=ws.home)
    assert proc.returncode == 0 and "1 releases" in proc.stdout
    assert " ".join(proc.stderr.split()).startswith(f"invalid manifest: {stray}: not a valid release manifest")


def test_a_forged_activation_is_not_laundered_through_a_rollback(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    ineligible = publish(ws, bundle, "r2", eligible=False, phase="hard")
    activate(ws, a, "staging")
    forge_activation(ws, ineligible)  # never gated: the history says it was activated
    rollback(ws, "staging")  # a real rollback back to a
    forge_activation(ws, ineligible, action="rollback")  # and a forged rollback to the forged one
    with pytest.raises(ReleaseError) as caught:
        live_release(ws, "staging")
    assert str(caught.value).startswith(
        f"target 'staging': release {ineligible} is not eligible for activation (gate decision "
    )


def test_a_forged_activation_on_production_is_not_laundered_through_a_rollback(ws: Workspace, bundle: Path):
    a, b = publish(ws, bundle, "r1"), publish(ws, bundle, "r2")
    forge_activation(ws, a, "production")
    forge_activation(ws, b, "production")
    forge_activation(ws, a, "production", action="rollback")
    refused_everywhere(ws, "production", f"target 'production' requires an approval, and release {a} has none")


def test_a_deleted_pointer_with_an_active_history_is_refused_not_empty(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    activate(ws, a, "staging")
    ReleaseStore(ws).pointer_path("staging").unlink()
    with pytest.raises(ReleaseError) as caught:
        live_release(ws, "staging")
    assert str(caught.value) == (
        "target 'staging': the pointer is missing, but the history has a release active: refusing to guess"
    )


def test_a_pointer_whose_previous_differs_from_its_intent_is_refused(ws: Workspace, bundle: Path):
    a = publish(ws, bundle, "r1")
    b = publish(ws, bundle, "r2", against=a)
    activate(ws, a, "staging")
    activate(ws, b, "staging")
    store = ReleaseStore(ws)
    pointer = read_pointer(store, "staging")
    write_pointer(store, Pointer("staging", b, pointer.generation, b, pointer.ledger_head))
    _, records = read_history(store, "staging")
    seq = next(r.seq for r in records if r.hash == pointer.ledger_head)
    refused_everywhere(
        ws,
        "staging",
        f"target 'staging': the pointer says it replaced {b}, but its intent (history record {seq}) replaced {a}: "
        "the pointer was not written by that swap",
    )


def test_a_release_gated_with_lance_scores_is_refused_with_what_to_do(ws: Workspace, bundle: Path):
    """A release evaluated before exact vector scores bound a plan without ``vector_search``: its
    scores cannot be computed any more, so serving it is refused in words, not as a plan mismatch."""
    from ragpipe.release.manifest import evaluation_run_dir, load_manifest
    from ragpipe.release.serving import PLAN_COPY, gated_plan

    a = publish(ws, bundle, "r1")
    manifest = load_manifest(ReleaseStore(ws), a)
    copy = evaluation_run_dir(ws, manifest) / PLAN_COPY
    plan = json.loads(copy.read_text())
    del plan["vector_search"]
    copy.write_text(json.dumps(plan))
    with pytest.raises(ReleaseError) as caught:
        gated_plan(ws, manifest)
    assert str(caught.value) == (
        f"release {a}: it was gated with vector scores from lance's float32 kernels, which this version replaced "
        "by exact scores that are the same on every CPU (docs/retrieval.md, Exact vector scores); build the "
        "revision again to gate and release it with them"
    )
