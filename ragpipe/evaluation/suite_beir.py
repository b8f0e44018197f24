"""Import a BEIR folder (``queries.jsonl`` + ``qrels/<split>.tsv``) as a native suite.

Every query with at least one qrels row in the chosen split(s) becomes a document-level,
answerable case: ``id`` = the query's ``_id``, ``query`` = its ``text``, ``judgments`` = its qrels
rows (``corpus-id`` -> ``score``). Several splits are merged (e.g. the sample's ``rev-1`` and
``rev-2``); a pair graded differently in two splits is refused. Queries without qrels in the
split are not cases (BEIR evaluates only judged queries). Errors name the file, line and rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ragpipe.evaluation.suite import Case, Suite
from ragpipe.evaluation.suite_rules import SuiteError, check_case, judgments_of

QRELS_HEADER = ["query-id", "corpus-id", "score"]


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every line; undecodable bytes name their line."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SuiteError(f"{path}: cannot read: {e.strerror}") from None
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            out.append((number, raw.decode("utf-8").rstrip("\r")))
        except UnicodeDecodeError as e:
            raise SuiteError(f"{path}:{number}: not valid UTF-8 (byte {e.start + 1})") from None
    if out and out[-1][1] == "":
        out.pop()
    return out


def read_queries(path: Path) -> dict[str, tuple[int, str]]:
    """``_id`` -> (line number, text) from a BEIR ``queries.jsonl``."""
    queries: dict[str, tuple[int, str]] = {}
    for number, line in _lines(path):
        where = f"{path}:{number}"
        if not line.strip():
            raise SuiteError(f"{where}: blank line (every line must hold one query)")
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SuiteError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(row, dict) or not isinstance(row.get("_id"), str) or not isinstance(row.get("text"), str):
            raise SuiteError(f"{where}: a query must be an object with string '_id' and 'text'")
        if row["_id"] in queries:
            raise SuiteError(f"{where}: duplicate query id {row['_id']!r} (first on line {queries[row['_id']][0]})")
        queries[row["_id"]] = (number, row["text"])
    return queries


def read_qrels(path: Path, into: dict[str, dict[str, tuple[int, str]]]) -> None:
    """Add ``query-id`` -> ``corpus-id`` -> (grade, "<file>:<line>") from a BEIR qrels TSV."""
    rows = _lines(path)
    if not rows or rows[0][1].split("\t") != QRELS_HEADER:
        raise SuiteError(f"{path}:1: qrels header must be 'query-id<TAB>corpus-id<TAB>score'")
    for number, line in rows[1:]:
        where = f"{path}:{number}"
        cells = line.split("\t")
        if len(cells) != 3 or not cells[0] or not cells[1]:
            raise SuiteError(f"{where}: a qrels row needs 3 tab-separated non-empty fields, got {len(cells)}")
        qid, target, score = cells
        try:
            value = int(score)
        except ValueError:
            raise SuiteError(f"{where}: score {score!r} is not an integer") from None
        try:
            ((target, grade),) = judgments_of({target: value}, "document").items()  # NFC, level rules
        except SuiteError as e:
            raise SuiteError(f"{where}: {e}") from None
        seen = into.setdefault(qid, {}).get(target)
        if seen is not None and seen[0] != grade:
            raise SuiteError(f"{where}: ({qid!r}, {target!r}) graded {grade} here and {seen[0]} at {seen[1]}")
        if seen is None:
            into[qid][target] = (grade, where)


def import_beir(folder: Path, split: str | Iterable[str] = "test") -> Suite:
    """The suite of a BEIR folder's judged queries in ``split`` (one name or several, merged)."""
    folder = Path(folder)
    splits = [split] if isinstance(split, str) else list(split)
    if not splits:
        raise SuiteError(f"{folder}: no split named")
    queries = read_queries(folder / "queries.jsonl")
    judged: dict[str, dict[str, tuple[int, str]]] = {}
    for name in splits:
        read_qrels(folder / "qrels" / f"{name}.tsv", judged)
    cases = []
    for qid, targets in judged.items():
        first = next(iter(targets.values()))[1]  # the query's first qrels row
        if qid not in queries:
            raise SuiteError(f"{first}: query-id {qid!r} is not in {folder / 'queries.jsonl'}")
        raw = {
            "id": qid,
            "query": queries[qid][1],
            "target_level": "document",
            "judgments": {t: g for t, (g, _) in targets.items()},
        }
        try:
            cases.append(Case.model_validate(check_case(raw)))
        except SuiteError as e:
            line = queries[qid][0]
            raise SuiteError(f"{folder / 'queries.jsonl'}:{line}: {e}") from None
    return Suite.of(cases, str(folder))
