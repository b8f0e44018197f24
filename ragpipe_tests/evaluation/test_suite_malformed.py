"""Malformed suites: each is refused with the file, the line and the rule it breaks, exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragpipe.evaluation.suite import Case, SuiteError
from ragpipe.evaluation.suite_beir import import_beir
from ragpipe.evaluation.suite_load import load_suite

CHUNK = "sha256:" + "ab" * 32
GOOD = {"id": "q1", "query": "what is x?", "target_level": "document", "judgments": {"d1": 1}}


def line(**changes: object) -> str:
    case = {**GOOD, **changes}
    return json.dumps({k: v for k, v in case.items() if v is not DROP})


DROP = object()
DEEP_PREFIX = '{"id": "q1", "query": "x", "target_level": "document", "judgments": {"d1": '

# (file content, line number of the error, rule)
MALFORMED = [
    ("", None, "no cases"),
    (line() + "\n\n" + line(id="q2") + "\n", 2, "blank line (every line must hold one case)"),
    (
        line() + "\n" + '{"id": "q2", ',
        2,
        "not valid JSON: Expecting property name enclosed in double quotes (column 14)",
    ),
    (line() + line(id="q2") + "\n", 1, f"more than one JSON value on the line (column {len(line()) + 1})"),
    (
        '{"id": "q1", "query": "x", "target_level": "document", "judgments": {"d1": NaN}}\n',
        1,
        "non-finite number NaN is not JSON",
    ),
    ('["q1", "x"]\n', 1, "a case must be a JSON object, got array"),
    (
        line()
        + "\n"
        + '{"id": "q2", "query": "x", "target_level": "document", "judgments": {"d1": 1, "d2": 0, "d1": 2}}\n',
        2,
        "judgments.d1: duplicate key (first at column 70)",
    ),
    (
        '{"id": "q1", "id": "q2", "query": "x", "target_level": "document", "judgments": {"d1": 1}}\n',
        1,
        "id: duplicate key (first at column 2)",
    ),
    (  # 100,000 levels: one line, never a RecursionError; the case and judgments are levels 1-2
        DEEP_PREFIX + "[" * 100_000 + "]" * 100_000 + "}}\n",
        1,
        f"nesting deeper than 64 levels (column {len(DEEP_PREFIX) + 63})",
    ),
    (
        line(extra=1) + "\n",
        1,
        "unknown field 'extra' (allowed: id, query, target_level, judgments, tags, answerability, subject, forbidden_sources, "
        "split, filter, expected, acceptable, required_facts, stratum, quality_label, provenance, review)",
    ),
    (line(query=DROP) + "\n", 1, "missing required field 'query'"),
    (line(id=7) + "\n", 1, "'id' must be a string, got number"),
    (line(id="") + "\n", 1, "'id' must be non-empty without control characters, got ''"),
    (line() + "\n" + line(query="  \t") + "\n", 2, "'query' is empty"),
    (line(target_level="passage") + "\n", 1, "'target_level' must be 'document' or 'chunk', got 'passage'"),
    (
        line(judgments={"d1": 1, CHUNK: 2}) + "\n",
        1,
        f"judgments mix levels: '{CHUNK}' is a chunk ID but target_level is 'document'",
    ),
    (
        line(target_level="chunk", judgments={CHUNK: 1, "d1": 0}) + "\n",
        1,
        "judgments mix levels: 'd1' is not a chunk ID (sha256:<64 hex>) but target_level is 'chunk'",
    ),
    (line(judgments=["d1"]) + "\n", 1, "'judgments' must be an object of target IDs to grades, got array"),
    (line(judgments={"d1": "1"}) + "\n", 1, "grade of 'd1' must be a number, got string"),
    (line(judgments={"d1": True}) + "\n", 1, "grade of 'd1' must be a number, got boolean"),
    (line(judgments={"d1": -1}) + "\n", 1, "grade of 'd1' is negative: -1"),
    (
        line(judgments={"d1": 1.5}) + "\n",
        1,
        "grade of 'd1' is not a whole number: 1.5 (trec_eval relevance levels are integers)",
    ),
    (line(judgments={"d1": 1e300}) + "\n", 1, "grade of 'd1' is above 2147483647: 1e+300"),
    (
        '{"id": "q1", "query": "x", "target_level": "document", "judgments": {"d1": Infinity}}\n',
        1,
        "non-finite number Infinity is not JSON",
    ),
    (
        line(judgments={"a\u0007b": 1}) + "\n",
        1,
        "judgment target 'a\\x07b' is not a valid document ID (1-512 characters, no control characters)",
    ),
    (line(tags=["x", "x"]) + "\n", 1, "'tags' lists 'x' twice"),
    (line(tags="x") + "\n", 1, "'tags' must be an array of strings, got string"),
    (line(answerability="maybe") + "\n", 1, "'answerability' must be 'answerable' or 'unanswerable', got 'maybe'"),
    (
        line(answerability="unanswerable", judgments={"d0": 0, "d1": 2}) + "\n",
        1,
        "an unanswerable case has a relevant judgment: 'd1'",
    ),
    (line(subject={"scopes": []}) + "\n", 1, "'subject.scopes' is empty (a subject holds at least one scope)"),
    (
        line(subject={"scopes": ["public"], "principal": "x"}) + "\n",
        1,
        "unknown field 'subject.principal' (allowed: scopes)",
    ),
    (line(subject={"scopes": ["no spaces"]}) + "\n", 1, "'subject.scopes' has an invalid scope name 'no spaces'"),
    (line(forbidden_sources=["d1"]) + "\n", 1, "forbidden source 'd1' is also judged relevant"),
    (line() + "\n" + line(query="other") + "\n", 2, "duplicate case id 'q1' (first on line 1)"),
    (
        line() + "\n" + line(id="q\u0301") + "\n" + line(id="q\u0301", query="y") + "\n",
        3,
        "duplicate case id 'q́' (first on line 2)",
    ),
]


@pytest.mark.parametrize(("content", "number", "rule"), MALFORMED, ids=[m[2][:40] for m in MALFORMED])
def test_malformed_suite_names_file_line_and_rule(tmp_path: Path, content: str, number: int | None, rule: str):
    path = tmp_path / "suite.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    where = f"{path}:{number}" if number is not None else str(path)
    assert str(err.value) == f"{where}: {rule}"


def test_invalid_utf8_names_the_byte(tmp_path: Path):
    path = tmp_path / "suite.jsonl"
    path.write_bytes(line().encode() + b"\n" + b'{"id": "q\xff"}\n')
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert str(err.value) == f"{path}:2: not valid UTF-8 (byte 10)"


def test_duplicate_id_after_nfc_normalisation(tmp_path: Path):
    """'é' precomposed and 'e' + combining accent are one ID once normalised."""
    path = tmp_path / "suite.jsonl"
    path.write_text(line(id="caf\u00e9") + "\n" + line(id="cafe\u0301") + "\n", encoding="utf-8")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert str(err.value) == f"{path}:2: duplicate case id 'café' (first on line 1)"


def test_missing_file(tmp_path: Path):
    with pytest.raises(SuiteError) as err:
        load_suite(tmp_path / "absent.jsonl")
    assert str(err.value) == f"{tmp_path / 'absent.jsonl'}: cannot read suite: No such file or directory"


def test_programmatic_case_obeys_the_same_rules():
    with pytest.raises(ValueError, match=r"grade of 'd1' is negative: -2"):
        Case(id="q", query="x", target_level="document", judgments={"d1": -2})
    with pytest.raises(ValueError, match=r"unknown field 'colour'"):
        Case(id="q", query="x", target_level="document", judgments={}, colour="red")


def beir(tmp_path: Path, queries: str, qrels: str, split: str = "test") -> Path:
    (tmp_path / "qrels").mkdir(exist_ok=True)
    (tmp_path / "queries.jsonl").write_text(queries, encoding="utf-8")
    (tmp_path / "qrels" / f"{split}.tsv").write_text(qrels, encoding="utf-8")
    return tmp_path


QUERIES = '{"_id": "1", "text": "one"}\n{"_id": "2", "text": "two"}\n'
HEADER = "query-id\tcorpus-id\tscore\n"

BEIR_MALFORMED = [
    (
        QUERIES,
        "query-id\tdoc\tscore\n1\td1\t1\n",
        "qrels/test.tsv:1",
        "qrels must be BEIR TSV ('query-id<TAB>corpus-id<TAB>score' header, or rows of those 3 fields without it) "
        "or TREC ('query-id iteration corpus-id relevance')",
    ),
    (QUERIES, "1 0 d1 1\n2 0 d2\n", "qrels/test.tsv:2", "a TREC qrels row needs 4 whitespace-separated fields, got 3"),
    (QUERIES, "1\td1\t1\n2\td2\n", "qrels/test.tsv:2", "a qrels row needs 3 tab-separated non-empty fields, got 2"),
    (QUERIES, "", "qrels/test.tsv", "empty qrels file"),
    (
        '{"_id": "1", "text": "' + "x" * 10_001 + '"}\n',
        HEADER + "1\td1\t1\n",
        "queries.jsonl:1",
        "'query' has 10001 characters, at most 10000 allowed",
    ),
    (QUERIES, HEADER + "1\td1\n", "qrels/test.tsv:2", "a qrels row needs 3 tab-separated non-empty fields, got 2"),
    (
        QUERIES,
        HEADER + "1\td1\thigh\n",
        "qrels/test.tsv:2",
        "score 'high' is not an integer (digits, optionally after '-')",
    ),
    (
        QUERIES,
        HEADER + "1\td1\t1_0\n",
        "qrels/test.tsv:2",
        "score '1_0' is not an integer (digits, optionally after '-')",
    ),
    (
        QUERIES,
        HEADER + "1\td1\t 1\n",
        "qrels/test.tsv:2",
        "score ' 1' is not an integer (digits, optionally after '-')",
    ),
    (QUERIES, HEADER + "1\t d1\t1\n", "qrels/test.tsv:2", "corpus-id ' d1' has surrounding whitespace"),
    (QUERIES, HEADER + "1 \td1\t1\n", "qrels/test.tsv:2", "query-id '1 ' has surrounding whitespace"),
    (QUERIES, HEADER + "1\td1\t1\n2\td2\t-1\n", "qrels/test.tsv:3", "grade of 'd2' is negative: -1"),
    (
        QUERIES,
        HEADER + "1\td1\t1\n1\td1\t2\n",
        "qrels/test.tsv:3",
        "('1', 'd1') graded 2 here and 1 at {root}/qrels/test.tsv:2",
    ),
    (QUERIES, HEADER + "1\td1\t1\n9\td2\t1\n", "qrels/test.tsv:3", "query-id '9' is not in {root}/queries.jsonl"),
    (
        QUERIES + '{"_id": "1", "text": "again"}\n',
        HEADER + "1\td1\t1\n",
        "queries.jsonl:3",
        "duplicate query id '1' (first on line 1)",
    ),
    (
        '{"_id": 1, "text": "one"}\n',
        HEADER + "1\td1\t1\n",
        "queries.jsonl:1",
        "a query must be an object with string '_id' and 'text'",
    ),
    ('{"_id": "1", "text": "  "}\n', HEADER + "1\td1\t1\n", "queries.jsonl:1", "'query' is empty"),
]


@pytest.mark.parametrize(("queries", "qrels", "where", "rule"), BEIR_MALFORMED, ids=[m[3][:40] for m in BEIR_MALFORMED])
def test_malformed_beir_folder(tmp_path: Path, queries: str, qrels: str, where: str, rule: str):
    root = beir(tmp_path, queries, qrels)
    with pytest.raises(SuiteError) as err:
        import_beir(root, "test")
    assert str(err.value) == f"{root}/{where}: {rule.format(root=root)}"


QRELS_FORMS = {
    "beir": HEADER + "1\td1\t1\n1\td2\t2\n2\td3\t1\n",
    "beir-headerless": "1\td1\t1\n1\td2\t2\n2\td3\t1\n",
    "trec": "1 0 d1 1\n1 Q0 d2 2\n2\t0\td3\t1\n",
}


@pytest.mark.parametrize("form", sorted(QRELS_FORMS))
def test_every_qrels_form_gives_the_same_suite(tmp_path: Path, form: str):
    suite = import_beir(beir(tmp_path, QUERIES, QRELS_FORMS[form]), "test")
    assert [(c.id, c.query, dict(c.judgments)) for c in suite.cases] == [
        ("1", "one", {"d1": 1, "d2": 2}),
        ("2", "two", {"d3": 1}),
    ]


def test_trec_qrels_are_read_from_a_txt_file(tmp_path: Path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "queries.jsonl").write_text(QUERIES, encoding="utf-8")
    (tmp_path / "qrels" / "test.txt").write_text(QRELS_FORMS["trec"], encoding="utf-8")
    assert [c.id for c in import_beir(tmp_path, "test").cases] == ["1", "2"]


def test_beir_missing_split(tmp_path: Path):
    root = beir(tmp_path, QUERIES, HEADER + "1\td1\t1\n")
    with pytest.raises(SuiteError) as err:
        load_suite(root, split="dev")
    assert str(err.value) == f"{root}/qrels/dev.tsv: cannot read: No such file or directory"
