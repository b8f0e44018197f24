"""The rules one suite case must meet, each with its exact message.

``check_case(value)`` takes a decoded JSON value and returns the normalised case fields
(strings NFC, tags / scopes / forbidden sources sorted, grades as ``int``) or raises
``SuiteError(rule)``; the caller prefixes ``<file>:<line>: ``. The rules:

* the value is an object; no unknown field; ``id``, ``query``, ``target_level``, ``judgments``
  present;
* ``id`` a non-empty string without control characters; ``query`` not blank and at most
  ``MAX_QUERY_CHARS`` characters (a query is a question, not a document: a 10 MB one once took
  45 s to evaluate);
* ``target_level`` is ``document`` or ``chunk``;
* ``judgments`` an object of targets to grades; a grade is a finite whole number in
  [0, 2^31-1] (trec_eval relevance levels are C ints; JSON ``2.0`` reads as 2, ``true`` is no grade);
* one level only: at ``document`` level no target is a chunk ID (``sha256:<64 hex>``) and each is a
  valid document ID; at ``chunk`` level every target is a chunk ID;
* ``tags``, ``forbidden_sources`` and ``split`` (the dataset splits the case's judgments come from,
  e.g. BEIR's ``train`` / ``test``) are lists of distinct non-empty strings; ``subject`` is
  ``{"scopes": [...]}`` with distinct valid scope names, at least one;
* ``answerability`` is ``answerable`` or ``unanswerable``; an unanswerable case has no judgment of
  grade >= 1; no forbidden source is judged relevant (a contradiction in the suite).
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any

from ragpipe.corpus.metadata_filter import FilterError, filter_json, parse_filter
from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.kernel.ids import DocumentId

FIELDS = (
    "id",
    "query",
    "target_level",
    "judgments",
    "tags",
    "answerability",
    "subject",
    "forbidden_sources",
    "split",
    "filter",
)
REQUIRED = ("id", "query", "target_level", "judgments")
CHUNK_ID = re.compile(r"^sha256:[0-9a-f]{64}\Z")
MAX_GRADE = 2**31 - 1
MAX_QUERY_CHARS = 10_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SuiteError(ValueError):
    """A suite broke a rule; ``str(e)`` is ``<file>:<line>: <rule>`` (or ``<file>: <rule>``)."""


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _nfc(value: str) -> str:
    return unicodedata.normalize("NFC", value)


def _string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise SuiteError(f"'{field}' must be a string, got {_json_type(value)}")
    return _nfc(value)


def _string_set(value: Any, field: str) -> tuple[str, ...]:
    """A list of distinct non-empty strings, returned sorted."""
    if not isinstance(value, (list, tuple)):
        raise SuiteError(f"'{field}' must be an array of strings, got {_json_type(value)}")
    items: list[str] = []
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise SuiteError(f"'{field}' must hold non-empty strings, got {item!r}")
        item = _nfc(item)
        if item in items:
            raise SuiteError(f"'{field}' lists {item!r} twice")
        items.append(item)
    return tuple(sorted(items))


def grade_of(target: str, grade: Any) -> int:
    """A judgment grade as an int, or SuiteError naming the target and the rule."""
    if isinstance(grade, bool) or not isinstance(grade, (int, float)):
        raise SuiteError(f"grade of {target!r} must be a number, got {_json_type(grade)}")
    if isinstance(grade, float) and not math.isfinite(grade):
        raise SuiteError(f"grade of {target!r} is not finite: {grade!r}")
    if grade < 0:
        raise SuiteError(f"grade of {target!r} is negative: {grade!r}")
    if grade != int(grade):
        raise SuiteError(
            f"grade of {target!r} is not a whole number: {grade!r} (trec_eval relevance levels are integers)"
        )
    if grade > MAX_GRADE:
        raise SuiteError(f"grade of {target!r} is above {MAX_GRADE}: {grade!r}")
    return int(grade)


def judgments_of(value: Any, level: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise SuiteError(f"'judgments' must be an object of target IDs to grades, got {_json_type(value)}")
    out: dict[str, int] = {}
    for raw_target, grade in value.items():
        target = _nfc(raw_target)
        if level == "document" and CHUNK_ID.match(target):
            raise SuiteError(f"judgments mix levels: {target!r} is a chunk ID but target_level is 'document'")
        if level == "chunk" and not CHUNK_ID.match(target):
            raise SuiteError(
                f"judgments mix levels: {target!r} is not a chunk ID (sha256:<64 hex>) but target_level is 'chunk'"
            )
        if level == "document" and not DocumentId.pattern.match(target):
            raise SuiteError(
                f"judgment target {target!r} is not a valid document ID (1-512 characters, no control characters)"
            )
        if target in out:
            raise SuiteError(f"judgment target {target!r} appears twice after NFC normalisation")
        out[target] = grade_of(target, grade)
    return out


def _subject(value: Any) -> dict[str, tuple[str, ...]] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SuiteError(f"'subject' must be an object {{\"scopes\": [...]}}, got {_json_type(value)}")
    unknown = sorted(set(value) - {"scopes"})
    if unknown:
        raise SuiteError(f"unknown field 'subject.{unknown[0]}' (allowed: scopes)")
    if "scopes" not in value:
        raise SuiteError("missing required field 'subject.scopes'")
    scopes = _string_set(value["scopes"], "subject.scopes")
    if not scopes:
        raise SuiteError("'subject.scopes' is empty (a subject holds at least one scope)")
    bad = [s for s in scopes if not SCOPE_PATTERN.match(s)]
    if bad:
        raise SuiteError(f"'subject.scopes' has an invalid scope name {bad[0]!r}")
    return {"scopes": scopes}


def check_case(value: Any) -> dict[str, Any]:
    """Normalised fields of one case, or ``SuiteError(rule)`` for the first rule broken."""
    if not isinstance(value, dict):
        raise SuiteError(f"a case must be a JSON object, got {_json_type(value)}")
    unknown = [k for k in value if k not in FIELDS]
    if unknown:
        raise SuiteError(f"unknown field {unknown[0]!r} (allowed: {', '.join(FIELDS)})")
    for field in REQUIRED:
        if field not in value:
            raise SuiteError(f"missing required field {field!r}")
    case_id = _string(value["id"], "id")
    if not case_id or _CONTROL.search(case_id):
        raise SuiteError(f"'id' must be non-empty without control characters, got {case_id!r}")
    query = _string(value["query"], "query")
    if not query.strip():
        raise SuiteError("'query' is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise SuiteError(f"'query' has {len(query)} characters, at most {MAX_QUERY_CHARS} allowed")
    level = value["target_level"]
    if level not in ("document", "chunk"):
        raise SuiteError(f"'target_level' must be 'document' or 'chunk', got {level!r}")
    judgments = judgments_of(value["judgments"], level)
    answerability = value.get("answerability", "answerable")
    if answerability not in ("answerable", "unanswerable"):
        raise SuiteError(f"'answerability' must be 'answerable' or 'unanswerable', got {answerability!r}")
    if answerability == "unanswerable":
        relevant = sorted(t for t, g in judgments.items() if g >= 1)
        if relevant:
            raise SuiteError(f"an unanswerable case has a relevant judgment: {relevant[0]!r}")
    forbidden = _string_set(value.get("forbidden_sources", ()), "forbidden_sources")
    clash = sorted(s for s in forbidden if judgments.get(s, 0) >= 1)
    if clash:
        raise SuiteError(f"forbidden source {clash[0]!r} is also judged relevant")
    return {
        "id": case_id,
        "query": query,
        "target_level": level,
        "judgments": judgments,
        "tags": _string_set(value.get("tags", ()), "tags"),
        "answerability": answerability,
        "subject": _subject(value.get("subject")),
        "forbidden_sources": forbidden,
        "split": _string_set(value.get("split", ()), "split"),
        "filter": _filter(value.get("filter")),
    }


def _filter(value: Any) -> dict[str, Any] | None:
    """A case's metadata filter in canonical JSON (``ragpipe.corpus.metadata_filter``), or None.
    Its fields are checked against a bundle when the case runs (a field the bundle lacks fails
    the cell, naming it), its syntax here."""
    if value is None:
        return None
    try:
        return filter_json(parse_filter(value))
    except FilterError as exc:
        raise SuiteError(f"'filter': {exc}") from None
