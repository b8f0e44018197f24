"""The rules one suite case must meet, each with its exact message.

``check_case(value)`` takes a decoded JSON value and returns the normalised case fields
(strings NFC, tags / scopes / forbidden sources sorted, grades as ``int``) or raises
``SuiteError(rule)``; the caller prefixes ``<file>:<line>: ``. The rules:

* the value is an object; no unknown field; ``id``, ``query``, ``target_level`` present, and
  ``judgments`` unless ``expected`` or ``acceptable`` is given;
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

The *card* fields are all optional; a card rule's message starts with ``case '<id>': ``:

* ``expected`` / ``acceptable``: distinct targets of the case's level (the judgments' rules), graded
  ``EXPECTED_GRADE`` (2) / ``ACCEPTABLE_GRADE`` (1) and folded into the returned ``judgments``; a
  target in both lists, or graded otherwise in ``judgments``, is refused;
* ``required_facts``: at most ``MAX_REQUIRED_FACTS`` distinct non-empty strings of at most
  ``MAX_FACT_CHARS`` characters, in the order given; ``stratum``: a non-blank name (as a tag);
  ``quality_label``: one of ``QUALITY_LABELS`` (a label a person gave);
* ``provenance``: ``{author: person | model, by, at, model_spec_id}``; ``by`` a name without control
  characters, ``at`` an RFC 3339 UTC timestamp (``Z``), ``model_spec_id`` a content ID, required
  for a model and refused for a person;
* ``review``: ``provisional`` | ``adjudicated``; a model-authored case must state it, any other
  defaults to ``adjudicated``.
"""

from __future__ import annotations

import math
import re
import unicodedata
from datetime import datetime
from typing import Any

from ragpipe.corpus.metadata_filter import FilterError, filter_json, parse_filter
from ragpipe.corpus.models import SCOPE_PATTERN
from ragpipe.kernel.ids import DocumentId

CARD_FIELDS = ("expected", "acceptable", "required_facts", "stratum", "quality_label", "provenance", "review")
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
    *CARD_FIELDS,
)
REQUIRED = ("id", "query", "target_level")
CHUNK_ID = re.compile(r"^sha256:[0-9a-f]{64}\Z")
CONTENT_ID = CHUNK_ID  # a content ID (``kernel.ids.content_id``) has the same form as a chunk ID
MAX_GRADE = 2**31 - 1
MAX_QUERY_CHARS = 10_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Grades of a card's sources, on the scale the suites already use (trec_eval: relevant iff grade
# >= 1; nDCG's gain is the grade): an expected source is highly relevant (2, as TREC's graded
# qrels), an acceptable one relevant (1, the grade of every BEIR/SciFact judgment).
EXPECTED_GRADE = 2
ACCEPTABLE_GRADE = 1
MAX_REQUIRED_FACTS = 32
MAX_FACT_CHARS = 500
MAX_BY_CHARS = 200
QUALITY_LABELS = ("0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE")
AUTHORS = ("person", "model")
REVIEWS = ("provisional", "adjudicated")
DEFAULT_REVIEW = "adjudicated"  # a person-authored (or unattributed) case is what a person wrote
PROVENANCE_FIELDS = ("author", "by", "model_spec_id", "at")
_TIMESTAMP = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d{1,9})?Z\Z")


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


def _target(target: str, level: str, field: str) -> str:
    """``target`` (NFC) if it is a target of ``level``, else SuiteError naming ``field``."""
    mix = "judgments mix levels" if field == "judgments" else f"{field!r} mixes levels"
    noun = "judgment target" if field == "judgments" else f"{field!r} target"
    if level == "document" and CHUNK_ID.match(target):
        raise SuiteError(f"{mix}: {target!r} is a chunk ID but target_level is 'document'")
    if level == "chunk" and not CHUNK_ID.match(target):
        raise SuiteError(f"{mix}: {target!r} is not a chunk ID (sha256:<64 hex>) but target_level is 'chunk'")
    if level == "document" and not DocumentId.pattern.match(target):
        raise SuiteError(f"{noun} {target!r} is not a valid document ID (1-512 characters, no control characters)")
    return target


def judgments_of(value: Any, level: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise SuiteError(f"'judgments' must be an object of target IDs to grades, got {_json_type(value)}")
    out: dict[str, int] = {}
    for raw_target, grade in value.items():
        target = _target(_nfc(raw_target), level, "judgments")
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
    if "judgments" not in value and "expected" not in value and "acceptable" not in value:
        raise SuiteError("missing required field 'judgments' (or 'expected' / 'acceptable')")
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
    judgments = judgments_of(value.get("judgments", {}), level)
    try:  # the card's rules name the case: a card is read (and drafted, adjudicated) case by case
        card = _card(value, level)
        judgments = _fold(judgments, card["expected"], card["acceptable"])
    except SuiteError as exc:
        raise SuiteError(f"case {case_id!r}: {exc}") from None
    answerability = value.get("answerability", "answerable")
    if answerability not in ("answerable", "unanswerable"):
        raise SuiteError(f"'answerability' must be 'answerable' or 'unanswerable', got {answerability!r}")
    if answerability == "unanswerable":
        relevant = sorted(t for t, g in judgments.items() if g >= 1)
        if relevant:
            source = next((f for f in ("expected", "acceptable") if relevant[0] in card[f]), None)
            raise SuiteError(
                f"an unanswerable case has a relevant judgment: {relevant[0]!r}"
                + (f" (from {source!r})" if source else "")
            )
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
        **card,
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


def _targets(value: Any, level: str, field: str) -> tuple[str, ...]:
    """``expected`` / ``acceptable``: distinct targets of the case's level, sorted."""
    return tuple(_target(t, level, field) for t in _string_set(value, field))


def _fold(judgments: dict[str, int], expected: tuple[str, ...], acceptable: tuple[str, ...]) -> dict[str, int]:
    """The effective judgments: ``judgments`` plus each expected source at ``EXPECTED_GRADE`` and
    each acceptable one at ``ACCEPTABLE_GRADE``. A target given two grades is refused; the same
    grade given twice is not (the canonical form lists a source in both places)."""
    both = sorted(set(expected) & set(acceptable))
    if both:
        raise SuiteError(f"target {both[0]!r} is in both 'expected' and 'acceptable' (a target has one grade)")
    out = dict(judgments)
    for field, targets, grade in (("expected", expected, EXPECTED_GRADE), ("acceptable", acceptable, ACCEPTABLE_GRADE)):
        for target in targets:
            if out.get(target, grade) != grade:
                raise SuiteError(
                    f"target {target!r} is {field!r} (grade {grade}) but 'judgments' grades it {out[target]}"
                )
            out[target] = grade
    return out


def _required_facts(value: Any) -> tuple[str, ...]:
    """Distinct non-empty facts, in the order given (a judge answers them by position)."""
    field = "required_facts"
    if not isinstance(value, (list, tuple)):
        raise SuiteError(f"'{field}' must be an array of strings, got {_json_type(value)}")
    if len(value) > MAX_REQUIRED_FACTS:
        raise SuiteError(f"'{field}' has {len(value)} facts, at most {MAX_REQUIRED_FACTS} allowed")
    facts: list[str] = []
    for number, item in enumerate(value, start=1):
        if not isinstance(item, str) or not item.strip():
            raise SuiteError(f"'{field}' must hold non-empty strings, got {item!r}")
        item = _nfc(item)
        if len(item) > MAX_FACT_CHARS:
            raise SuiteError(f"'{field}' fact {number} has {len(item)} characters, at most {MAX_FACT_CHARS} allowed")
        if item in facts:
            raise SuiteError(f"'{field}' lists {item!r} twice")
        facts.append(item)
    return tuple(facts)


def _stratum(value: Any) -> str | None:
    """A name, as a tag is (a non-blank string); the run tags its case ``stratum:<name>``."""
    if value is None:
        return None
    stratum = _string(value, "stratum")
    if not stratum.strip():
        raise SuiteError("'stratum' is empty")
    return stratum


def _timestamp(value: Any, field: str) -> str:
    """An RFC 3339 UTC timestamp, kept as written: ``2026-12-07T21:08:01Z`` or with a fraction."""
    rule = f"'{field}' must be an RFC 3339 UTC timestamp (YYYY-MM-DDTHH:MM:SS[.fraction]Z), got {value!r}"
    match = _TIMESTAMP.match(value) if isinstance(value, str) else None
    if match is None:
        raise SuiteError(rule)
    try:
        datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        raise SuiteError(rule) from None
    return value


def _provenance(value: Any) -> dict[str, str] | None:
    """Who wrote the case: ``author`` person | model, ``by`` (the person, or the model's name),
    ``model_spec_id`` (the content ID of the spec that drafted it; a model's case only) and ``at``."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SuiteError(f"'provenance' must be an object {{author, by, at, model_spec_id}}, got {_json_type(value)}")
    unknown = sorted(set(value) - set(PROVENANCE_FIELDS))
    if unknown:
        raise SuiteError(f"unknown field 'provenance.{unknown[0]}' (allowed: {', '.join(PROVENANCE_FIELDS)})")
    for field in ("author", "by", "at"):
        if field not in value:
            raise SuiteError(f"missing required field 'provenance.{field}'")
    author = value["author"]
    if author not in AUTHORS:
        raise SuiteError(f"'provenance.author' must be 'person' or 'model', got {author!r}")
    by = _string(value["by"], "provenance.by")
    if not by.strip() or _CONTROL.search(by):
        raise SuiteError(f"'provenance.by' must be a non-empty name without control characters, got {by!r}")
    if len(by) > MAX_BY_CHARS:
        raise SuiteError(f"'provenance.by' has {len(by)} characters, at most {MAX_BY_CHARS} allowed")
    out = {"author": author, "by": by, "at": _timestamp(value["at"], "provenance.at")}
    spec_id = value.get("model_spec_id")
    if author == "person":
        if spec_id is not None:
            raise SuiteError("'provenance.model_spec_id' is only for author 'model' (a person wrote this case)")
        return out
    if spec_id is None:
        raise SuiteError("a model-authored case needs 'provenance.model_spec_id' (the content ID of the model's spec)")
    if not isinstance(spec_id, str) or not CONTENT_ID.match(spec_id):
        raise SuiteError(f"'provenance.model_spec_id' must be a content ID (sha256:<64 hex>), got {spec_id!r}")
    return {**out, "model_spec_id": spec_id}


def _card(value: dict[str, Any], level: str) -> dict[str, Any]:
    """The case card's fields, normalised (module docstring). Each is optional; ``review``
    defaults to ``adjudicated`` except for a model-authored case, which must state it."""
    quality = value.get("quality_label")
    if quality is not None and quality not in QUALITY_LABELS:
        raise SuiteError(f"'quality_label' must be one of {', '.join(QUALITY_LABELS)}, got {quality!r}")
    provenance = _provenance(value.get("provenance"))
    review = value.get("review")
    if review is None:
        if provenance is not None and provenance["author"] == "model":
            raise SuiteError("a model-authored case must state 'review' ('provisional' until a person adjudicates it)")
        review = DEFAULT_REVIEW
    elif review not in REVIEWS:
        raise SuiteError(f"'review' must be 'provisional' or 'adjudicated', got {review!r}")
    return {
        "expected": _targets(value.get("expected", ()), level, "expected"),
        "acceptable": _targets(value.get("acceptable", ()), level, "acceptable"),
        "required_facts": _required_facts(value.get("required_facts", ())),
        "stratum": _stratum(value.get("stratum")),
        "quality_label": quality,
        "provenance": provenance,
        "review": review,
    }
