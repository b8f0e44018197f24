"""Import a BEIR folder (``queries.jsonl`` + ``qrels/<split>.tsv``) as a native suite.

The qrels file may take any of the three forms in use (``read_qrels``), recognised by its first
line and then required of every line: BEIR's TSV with its ``query-id  corpus-id  score`` header,
the same TSV without the header, or TREC's ``query-id iteration corpus-id relevance`` (whitespace
separated, the iteration column ignored, as trec_eval ignores it). ``qrels/<split>.txt`` is read
when there is no ``.tsv``.

Every query with at least one qrels row in the chosen split(s) becomes a document-level,
answerable case: ``id`` = the query's ``_id``, ``query`` = its ``text``, ``judgments`` = its qrels
rows (``corpus-id`` -> ``score``). Several splits are merged (e.g. the sample's ``rev-1`` and
``rev-2``); a pair graded differently in two splits is refused. Queries without qrels in the
split are not cases (BEIR evaluates only judged queries). Errors name the file, line and rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ragpipe.evaluation.suite import Case, Suite
from ragpipe.evaluation.suite_rules import SuiteError, check_case, judgments_of
from ragpipe.kernel.strict_load import StrictLoadError, load_json_line

QRELS_HEADER = ["query-id", "corpus-id", "score"]
SCORE = re.compile(r"^-?[0-9]+\Z")


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
            row = load_json_line(line, str(path), number)
        except StrictLoadError as e:
            raise SuiteError(str(e)) from None
        if not isinstance(row, dict) or not isinstance(row.get("_id"), str) or not isinstance(row.get("text"), str):
            raise SuiteError(f"{where}: a query must be an object with string '_id' and 'text'")
        if row["_id"] in queries:
            raise SuiteError(f"{where}: duplicate query id {row['_id']!r} (first on line {queries[row['_id']][0]})")
        queries[row["_id"]] = (number, row["text"])
    return queries


def _qrels_form(path: Path, first: str) -> str:
    """``beir`` (header line), ``beir-headerless`` or ``trec``, from the file's first line."""
    if first.split("\t") == QRELS_HEADER:
        return "beir"
    cells = first.split("\t")
    if len(cells) == 3 and cells[2].strip().lstrip("-").isdigit():
        return "beir-headerless"
    if len(first.split()) == 4:
        return "trec"
    raise SuiteError(
        f"{path}:1: qrels must be BEIR TSV ('query-id<TAB>corpus-id<TAB>score' header, or rows of those "
        "3 fields without it) or TREC ('query-id iteration corpus-id relevance')"
    )


def _qrels_row(form: str, line: str, where: str) -> tuple[str, str, str]:
    if form == "trec":
        cells = line.split()
        if len(cells) != 4:
            raise SuiteError(f"{where}: a TREC qrels row needs 4 whitespace-separated fields, got {len(cells)}")
        return cells[0], cells[2], cells[3]
    cells = line.split("\t")
    if len(cells) != 3 or not cells[0] or not cells[1]:
        raise SuiteError(f"{where}: a qrels row needs 3 tab-separated non-empty fields, got {len(cells)}")
    return cells[0], cells[1], cells[2]


def read_qrels(path: Path, into: dict[str, dict[str, tuple[int, str]]], seen: set[str] | None = None) -> None:
    """Add ``query-id`` -> ``corpus-id`` -> (grade, "<file>:<line>") from a qrels file in any of
    the forms of the module docstring; ``seen`` collects the query IDs the file judges."""
    rows = _lines(path)
    if not rows:
        raise SuiteError(f"{path}: empty qrels file")
    form = _qrels_form(path, rows[0][1])
    for number, line in rows[1:] if form == "beir" else rows:
        where = f"{path}:{number}"
        qid, target, score = _qrels_row(form, line, where)
        for name, value in (("query-id", qid), ("corpus-id", target)):
            if value != value.strip():
                raise SuiteError(f"{where}: {name} {value!r} has surrounding whitespace")
        if not SCORE.match(score):  # int() would also take '1_0', ' 1' or '١'
            raise SuiteError(f"{where}: score {score!r} is not an integer (digits, optionally after '-')")
        value = int(score)
        try:
            ((target, grade),) = judgments_of({target: value}, "document").items()  # NFC, level rules
        except SuiteError as e:
            raise SuiteError(f"{where}: {e}") from None
        if seen is not None:
            seen.add(qid)
        earlier = into.setdefault(qid, {}).get(target)
        if earlier is not None and earlier[0] != grade:
            raise SuiteError(f"{where}: ({qid!r}, {target!r}) graded {grade} here and {earlier[0]} at {earlier[1]}")
        if earlier is None:
            into[qid][target] = (grade, where)


def qrels_path(folder: Path, split: str) -> Path:
    """``qrels/<split>.tsv``, or ``qrels/<split>.txt`` when only that exists."""
    tsv = folder / "qrels" / f"{split}.tsv"
    txt = tsv.with_suffix(".txt")
    return txt if not tsv.exists() and txt.exists() else tsv


def import_beir(folder: Path, split: str | Iterable[str] = "test") -> Suite:
    """The suite of a BEIR folder's judged queries in ``split`` (one name or several, merged)."""
    folder = Path(folder)
    splits = [split] if isinstance(split, str) else list(split)
    if not splits:
        raise SuiteError(f"{folder}: no split named")
    queries = read_queries(folder / "queries.jsonl")
    judged: dict[str, dict[str, tuple[int, str]]] = {}
    split_of: dict[str, set[str]] = {}
    for name in splits:
        seen: set[str] = set()
        read_qrels(qrels_path(folder, name), judged, seen)
        for qid in seen:
            split_of.setdefault(qid, set()).add(name)
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
            "split": sorted(split_of[qid]),
        }
        try:
            cases.append(Case.model_validate(check_case(raw)))
        except SuiteError as e:
            line = queries[qid][0]
            raise SuiteError(f"{folder / 'queries.jsonl'}:{line}: {e}") from None
    return Suite.of(cases, str(folder))
