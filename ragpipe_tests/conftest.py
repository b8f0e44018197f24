"""Shared fixtures: small real corpora and a fully built small workspace (real embedder)."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Fixtures of the release tests (e.g. ``accepting_fixture_policies``), usable from any module.
pytest_plugins = ["ragpipe_tests.support.release_fixtures", "ragpipe_tests.support.storage_fixtures"]


# SIGTERM as the session started (before any test module is imported or any fixture runs).
SESSION_SIGTERM = signal.getsignal(signal.SIGTERM)


@pytest.fixture(autouse=True)
def sigterm_as_the_session_started():
    """Running a Dagster job in process (``execute_in_process``, also inside session and module
    fixtures) leaves SIGTERM mapped to SIGINT's handler (Dagster's ``capture_interrupts``), which
    is "ignore" when the suite runs in the background, as CI does; a multiprocessing pool could
    then never terminate its workers and the suite would hang. Every test body starts, and every
    test ends, with the disposition the session started with."""
    signal.signal(signal.SIGTERM, SESSION_SIGTERM)
    yield
    signal.signal(signal.SIGTERM, SESSION_SIGTERM)


REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "scifact-sample"

HANDBOOK = {
    "guide/intro.md": "---\ntitle: Introduction\n---\n# Introduction\n\nragpipe builds retrieval indexes.\n\n## Goals\n\nExact spans, verified bundles and honest evaluation.\n",
    "guide/ops.md": "---\naccess_scopes: [staff]\nsource_role: runbook\n---\n# Operations\n\nRotate the signing keys every quarter. Keep the activation pointer backed up.\n",
    "notes/ünïcode.txt": "Café crème costs 3 €; naïve résumé — 日本語のテキストも含まれます。\r\nSecond line.\r\n",
    "notes/short.md": "tiny\n",
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    return root


def write_beir(path: Path, docs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return path


@pytest.fixture
def handbook(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "handbook", HANDBOOK)


def build_all_stages(
    home: Path, revision: str, corpus: Path, fmt: str, default_scope: str | None = "public", spec=None
):
    """Register ``corpus`` and run every stage (plain functions, no Dagster); returns (ws, spec, bundle path)."""
    from ragpipe.corpus.registry import register_revision
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.spec import load_pipeline_spec
    from ragpipe.stages import steps

    ws = Workspace(home)
    spec = spec or load_pipeline_spec()
    register_revision(ws.registry, revision, corpus, fmt, default_scope)
    for run in steps.BUILD_STEPS:
        run(ws, revision, spec)
    return ws, spec, ws.located(str(steps.read_stage_record(ws, revision, "index_bundle").facts["bundle_path"]))


@pytest.fixture(scope="session")
def built_workspace(tmp_path_factory: pytest.TempPathFactory):
    """A workspace with revision 'hb' of the handbook built through every stage (no Dagster)."""
    root = tmp_path_factory.mktemp("built")
    corpus = write_tree(root / "handbook", HANDBOOK)
    ws, spec, _ = build_all_stages(root / "home", "hb", corpus, "markdown")
    return ws, spec


# Adversarial authorization fixture: secret documents that would rank first in both channels,
# a secret twin with exactly the text of a public document (equal-score tie across scopes), and
# a document whose text names scopes.
SCOPED_DOCS = [
    {
        "_id": "pub-aspirin",
        "title": "Aspirin and stroke",
        "text": "Low-dose aspirin reduces the risk of a first stroke in older adults. The effect was modest.",
    },
    {
        "_id": "pub-statin",
        "title": "Statins",
        "text": "Statins lower LDL cholesterol and reduce cardiovascular events in high-risk patients.",
    },
    {
        "_id": "pub-twin",
        "title": "Twin",
        "text": "Aspirin twin text: aspirin stroke prevention trial results in the general population.",
    },
    {
        "_id": "pub-scopes",
        "title": "Access scopes",
        "text": "Documents carry access scopes such as secret and staff; a scope decides who may read a document.",
    },
    {
        "_id": "staff-aspirin",
        "title": "Aspirin staff memo",
        "text": "Staff memo: aspirin dosing for stroke patients on the ward.",
        "metadata": {"access_scopes": ["staff"]},
    },
    {
        "_id": "sec-aspirin",
        "title": "Aspirin stroke aspirin stroke",
        "text": "Aspirin stroke aspirin stroke aspirin stroke: the secret aspirin stroke trial data.",
        "metadata": {"access_scopes": ["secret"]},
    },
    {
        "_id": "sec-twin",
        "title": "Twin",
        "text": "Aspirin twin text: aspirin stroke prevention trial results in the general population.",
        "metadata": {"access_scopes": ["secret"]},
    },
]
SECRET_IDS = {"sec-aspirin", "sec-twin"}


@pytest.fixture(scope="session")
def scoped_bundles(tmp_path_factory: pytest.TempPathFactory):
    """(full bundle with public/staff/secret documents, bundle of the public documents only)."""
    root = tmp_path_factory.mktemp("scoped")
    full = write_beir(root / "full.jsonl", SCOPED_DOCS)
    public = write_beir(root / "public.jsonl", [d for d in SCOPED_DOCS if "metadata" not in d])
    _, _, full_bundle = build_all_stages(root / "home", "full", full, "beir")
    _, _, public_bundle = build_all_stages(root / "home", "public", public, "beir")
    return full_bundle, public_bundle


@pytest.fixture
def bundle_copy(built_workspace, tmp_path: Path) -> Path:
    """A private copy of the built bundle (same directory name), safe to tamper with."""
    ws, _ = built_workspace
    (src,) = [p for p in ws.bundles.iterdir() if not p.name.startswith(".")]
    dst = tmp_path / src.name
    shutil.copytree(src, dst, symlinks=True)
    return dst
