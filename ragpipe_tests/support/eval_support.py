"""Shared setup of the evaluation-run tests: a small real bundle and a suite against it.

The bundle is the first 100 documents of the SciFact sample's revision 1 built through every
stage (real tokenizer, embedder, tantivy, lancedb). The suite is the sample's native suite with
tags added (``parity:even`` / ``parity:odd`` by case ID, ``short`` for queries under 60 characters),
one unanswerable case and one case that forbids a document; 68 of its cases judge documents the
bundle lacks and are skipped. Built once per session under pytest's base temp and reused.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.cli import homes_under, run_cli
from ragpipe_tests.support.paths import SAMPLE

DOCS = 100
EVALUABLE = 36 + 2  # sample cases whose judged documents are all in the bundle, plus the two added
SUITE_CASES = 104 + 2
FORBIDDEN = "10450300"  # a document of the bundle that case x-forbidden must never be shown


def _suite_lines() -> list[dict]:
    cases = [json.loads(line) for line in (SAMPLE / "suite.jsonl").read_text(encoding="utf-8").splitlines()]
    for case in cases:
        tags = ["parity:even" if int(case["id"]) % 2 == 0 else "parity:odd"]
        if len(case["query"]) < 60:
            tags.append("short")
        case["tags"] = tags
    cases.append(
        {
            "id": "x-unanswerable",
            "query": "What is the airspeed velocity of an unladen swallow?",
            "target_level": "document",
            "judgments": {},
            "answerability": "unanswerable",
            "tags": ["synthetic"],
        }
    )
    in_bundle = {
        json.loads(line)["_id"] for line in (SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines()[:DOCS]
    }
    model = next(c for c in cases if set(c["judgments"]) <= in_bundle)
    cases.append(
        {
            "id": "x-forbidden",
            "query": model["query"],
            "target_level": "document",
            "judgments": model["judgments"],
            "forbidden_sources": [FORBIDDEN],
            "tags": ["synthetic"],
        }
    )
    return cases


@pytest.fixture(scope="session")
def eval_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(bundle path, native suite path)."""
    root = tmp_path_factory.getbasetemp() / "eval-sample"
    marker = root / "bundle-path"
    if not marker.exists():
        root.mkdir(parents=True, exist_ok=True)
        corpus = root / "rev-1-head.jsonl"
        corpus.write_text(
            "".join((SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:DOCS]),
            encoding="utf-8",
        )
        _, _, bundle = build_all_stages(root / "home", "s1", corpus, "beir")
        suite = root / "suite.jsonl"
        suite.write_text("".join(json.dumps(c) + "\n" for c in _suite_lines()), encoding="utf-8")
        marker.write_text(str(bundle), encoding="utf-8")
    return Path(marker.read_text(encoding="utf-8")), root / "suite.jsonl"


def cli(*args: str, home: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m ragpipe.cli ARGS`` with its own RAGPIPE_HOME."""
    return run_cli(*args, env=homes_under(home), timeout=timeout)
