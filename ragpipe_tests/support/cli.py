"""The ``ragpipe`` command as a user runs it: ``python -m ragpipe.cli`` in a child process of this
interpreter, its output captured as text. Every test and support module runs the CLI through
``run_cli`` (tests through the ``cli`` fixture); long-running servers (``ragpipe serve``, builds
followed while they run) are started with ``subprocess.Popen`` where they are watched."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from ragpipe_tests.support.paths import REPO


def homes_under(root: Path) -> dict[str, str]:
    """``RAGPIPE_HOME`` and ``DAGSTER_HOME`` as ``root/ragpipe`` and ``root/dagster``."""
    return {"RAGPIPE_HOME": str(root / "ragpipe"), "DAGSTER_HOME": str(root / "dagster")}


def run_cli(
    *args: str,
    home: Path | None = None,
    env: Mapping[str, str] | None = None,
    inherit: bool = True,
    unset: Iterable[str] = (),
    cwd: Path = REPO,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ragpipe.cli ARGS`` in ``cwd`` (the repository) and wait for it.

    The child's environment is this process's (``inherit``; otherwise nothing but ``env``), then
    ``env``, then ``RAGPIPE_HOME=home`` when ``home`` is given, without the variables in ``unset``.
    ``timeout`` only guards against a hang: it raises ``subprocess.TimeoutExpired``."""
    full = {**(os.environ if inherit else {}), **(env or {})}
    if home is not None:
        full["RAGPIPE_HOME"] = str(home)
    for name in unset:
        full.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "ragpipe.cli", *args], capture_output=True, text=True, env=full, cwd=cwd, timeout=timeout
    )
