"""``--scifact PATH``: required without a default (no path outside the repository is assumed), checked
to be a BEIR SciFact folder, and optional only where a script falls back to the in-repo sample."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.scifact import add_scifact_argument
from ragpipe_tests.support.paths import REPO


def _parser(fallback: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench")
    add_scifact_argument(parser, fallback=fallback)
    return parser


def _scifact(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_a_missing_scifact_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args([])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "bench: error: the following arguments are required: --scifact"


@pytest.mark.parametrize(("present", "missing"), [((), "corpus.jsonl.gz"), (("corpus.jsonl.gz",), "queries.jsonl")])
def test_a_folder_without_the_corpus_or_the_queries_is_refused_naming_path_and_file(tmp_path, capsys, present, missing):
    folder = _scifact(tmp_path, *present)
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["--scifact", str(folder)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"bench: error: argument --scifact: {folder}: no {missing} (not a BEIR SciFact folder)"
    )


def test_a_scifact_folder_is_accepted_as_a_path(tmp_path):
    folder = _scifact(tmp_path, "corpus.jsonl.gz", "queries.jsonl")
    assert _parser().parse_args(["--scifact", str(folder)]).scifact == folder
    assert _parser(fallback="the sample").parse_args(["--scifact", str(folder)]).scifact == folder


def test_with_a_fallback_the_argument_is_optional_and_none_when_missing():
    assert _parser(fallback="the sample").parse_args([]).scifact is None


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("build_bench", []),
        ("eval_bench", ["--bundle", "b"]),
        ("query_bench", ["--bundle", "b"]),
        ("serve_bench", ["--home", "h"]),
    ],
)
def test_a_benchmark_script_run_without_scifact_stops_before_any_work(script, args):
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{script}", *args], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"{script}.py: error: the following arguments are required: --scifact"
