"""The lab's home (``ragpipe_tests.support.lab_state``), built once per session, and the server
over it as ``ragpipe serve`` runs it, started once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ragpipe.server.app import app_from
from ragpipe_tests.support.browser import lab_browser  # noqa: F401  (the browser fixture)
from ragpipe_tests.support.lab_state import LabState, build_lab_state
from ragpipe_tests.support.served_http import served


@pytest.fixture(scope="session")
def lab_state(tmp_path_factory: pytest.TempPathFactory) -> LabState:
    return build_lab_state(tmp_path_factory.mktemp("lab-state"))


@pytest.fixture(scope="module")
def lab_url(lab_state: LabState) -> Iterator[str]:
    """The base URL of a server over the lab's home (no release served: the lab needs none)."""
    with served(app_from(lab_state.home, lab_state.config(), "staging")) as base:
        yield base
