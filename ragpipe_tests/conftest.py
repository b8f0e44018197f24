"""Shared fixtures: small real corpora and a fully built small workspace (real embedder). The
helpers they call live in ``ragpipe_tests.support`` (tests import them from there, never from here)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.corpora import HANDBOOK, SCOPED_DOCS, write_beir, write_tree

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


@pytest.fixture(scope="session")
def cli():
    """The ``ragpipe`` command as a user runs it (``ragpipe_tests.support.cli.run_cli``)."""
    return run_cli


@pytest.fixture
def handbook(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "handbook", HANDBOOK)


@pytest.fixture(scope="session")
def built_workspace(tmp_path_factory: pytest.TempPathFactory):
    """A workspace with revision 'hb' of the handbook built through every stage (no Dagster)."""
    root = tmp_path_factory.mktemp("built")
    corpus = write_tree(root / "handbook", HANDBOOK)
    ws, spec, _ = build_all_stages(root / "home", "hb", corpus, "markdown")
    return ws, spec


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
