"""Shared helpers of the release tests: a real small bundle placed in fresh workspaces, manifests."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ragpipe.release.manifest import ReleaseManifest, publish_manifest
from ragpipe.release.store import ReleaseStore
from ragpipe.stages.workspace import Workspace
from ragpipe_tests.conftest import REPO

H = "sha256:" + "1" * 64


def bundle_of(built_workspace) -> Path:
    ws, _ = built_workspace
    (src,) = [p for p in ws.bundles.iterdir() if not p.name.startswith(".")]
    return src


def fresh_ws(root: Path, bundle: Path) -> Workspace:
    """A new workspace under ``root`` holding a copy of ``bundle`` (same directory name)."""
    ws = Workspace(root / "home")
    ws.bundles.mkdir(parents=True)
    shutil.copytree(bundle, ws.bundles / bundle.name, symlinks=True)
    return ws


def bundle_ids(bundle: Path) -> tuple[str, str]:
    m = json.loads((bundle / "manifest.json").read_text())
    return m["bundle_id"], m["material_digest"]


def manifest_for(bundle: Path, revision: str = "r1", *, eligible: bool = True, phase: str | None = None,
                 run_id: str = "run-1", material_digest: str | None = None) -> ReleaseManifest:
    bundle_id, material = bundle_ids(bundle)
    return ReleaseManifest(
        revision=revision, bundle_id=bundle_id, material_digest=material_digest or material,
        query_plan_id=H, answer_plan_id=H, authorization_policy_id=H, gate_policy_id=H,
        evaluation={"spec_id": H, "run_id": run_id, "ledger_head": H},
        comparison_id=None, gate={"decision_id": H, "eligible": eligible, "decisive_phase": phase},
    )


def publish(ws: Workspace, bundle: Path, revision: str = "r1", **kw) -> str:
    return publish_manifest(ReleaseStore(ws), manifest_for(bundle, revision, **kw))[0]


def run_script(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)
