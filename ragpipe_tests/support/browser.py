"""A real browser for the lab's tests: Playwright driving Debian's Chromium (``/usr/bin/chromium``).

``lab_browser`` (module scope: one browser per test module) is a persistent context on a fresh
profile, headless, with the flags that keep Chromium off the network and its background services
(no sandbox: tests run as root in a container). No browser is ever downloaded (``playwright
install`` is never run): the Python package brings only its driver. Under CI (``$CI`` set) a
missing browser or driver fails the module, as missing PostgreSQL does
(ragpipe_tests/orchestration/test_postgres_instance.py); elsewhere it is skipped with the reason.
Screenshots go to ``var/test-artifacts/lab/`` (``var/`` is not committed).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragpipe_tests.support.paths import REPO

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
ARTIFACTS = REPO / "var" / "test-artifacts" / "lab"


def unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide a browser (.ci/run installs chromium; pip installs playwright): {reason}")
    pytest.skip(f"no browser for the lab's browser tests: {reason}")


@pytest.fixture(scope="module")
def lab_browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A Playwright ``BrowserContext`` on Chromium with a fresh profile (closed after the module)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        unavailable(f"playwright is not installed: {exc}")
    if not CHROMIUM.is_file():
        unavailable(f"{CHROMIUM} is missing")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=list(FLAGS)
        )
        try:
            yield context
        finally:
            context.close()


def screenshot(page, name: str) -> Path:
    """Save a full-page screenshot of ``page`` as ``var/test-artifacts/lab/<name>.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
