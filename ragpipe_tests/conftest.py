"""Shared fixtures: small real corpora and a fully built small workspace (real embedder)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "data" / "scifact-sample"
SCIFACT = REPO.parent / "shared" / "datasets" / "scifact"

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


@pytest.fixture(scope="session")
def built_workspace(tmp_path_factory: pytest.TempPathFactory):
    """A workspace with revision 'hb' of the handbook built through every stage (no Dagster)."""
    from ragpipe.corpus.registry import register_revision
    from ragpipe.pipeline_spec import load_pipeline_spec
    from ragpipe.stages import steps
    from ragpipe.stages.workspace import Workspace

    root = tmp_path_factory.mktemp("built")
    corpus = write_tree(root / "handbook", HANDBOOK)
    ws = Workspace(root / "home")
    spec = load_pipeline_spec()
    register_revision(ws.registry, "hb", corpus, "markdown", "public")
    for run in (
        steps.run_source_snapshot,
        steps.run_chunks,
        steps.run_representations,
        steps.run_embeddings,
        steps.run_lexical_index,
        steps.run_vector_index,
        steps.run_index_bundle,
    ):
        run(ws, "hb", spec)
    return ws, spec


@pytest.fixture
def bundle_copy(built_workspace, tmp_path: Path) -> Path:
    """A private copy of the built bundle (same directory name), safe to tamper with."""
    ws, _ = built_workspace
    (src,) = [p for p in ws.bundles.iterdir() if not p.name.startswith(".")]
    dst = tmp_path / src.name
    shutil.copytree(src, dst, symlinks=True)
    return dst
