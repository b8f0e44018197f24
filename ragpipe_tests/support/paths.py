"""Where the repository and its SciFact sample corpus lie."""

from __future__ import annotations

from pathlib import Path

# The repository root (this file is ragpipe_tests/support/paths.py).
REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "scifact-sample"
