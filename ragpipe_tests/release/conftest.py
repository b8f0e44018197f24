"""Fixtures every release test module shares: one built bundle per module, a fresh home per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpipe.kernel.workspace import Workspace
from ragpipe_tests.support.release_fixtures import bundle_of, fresh_ws


@pytest.fixture(scope="module")
def bundle(built_workspace) -> Path:
    """The bundle of the session's built sample workspace."""
    return bundle_of(built_workspace)


@pytest.fixture
def ws(bundle: Path, tmp_path: Path) -> Workspace:
    """A fresh home under ``tmp_path`` holding (a copy of) ``bundle`` and nothing else."""
    return fresh_ws(tmp_path, bundle)
