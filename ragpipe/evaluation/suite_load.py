"""Reading a suite from disk: a native JSONL file (``suite.py``) or a BEIR folder (``suite_beir.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ragpipe.evaluation.suite import Suite, parse_suite_bytes
from ragpipe.evaluation.suite_beir import import_beir
from ragpipe.evaluation.suite_rules import SuiteError


def load_suite(path: Path, *, split: str | Iterable[str] = "test") -> Suite:
    """A native suite file, or a BEIR folder (``queries.jsonl`` + ``qrels/<split>.tsv``; several
    splits are merged). Raises ``SuiteError`` naming the file, line and rule on bad input."""
    path = Path(path)
    if path.is_dir():
        return import_beir(path, split)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SuiteError(f"{path}: cannot read suite: {e.strerror or e}") from None
    return parse_suite_bytes(data, str(path))
