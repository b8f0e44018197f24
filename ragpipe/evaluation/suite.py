"""Evaluation suites: cases with stable IDs, graded judgments at one target level.

Native format (``*.jsonl``): one JSON object per line, fields ``id``, ``query``, ``target_level``
(``document`` | ``chunk``), ``judgments`` ``{target_id: grade}`` and optionally ``tags``,
``answerability`` (``answerable`` | ``unanswerable``), ``subject`` ``{"scopes": [...]}`` and
``forbidden_sources`` (document IDs the subject must never see), ``split``, ``filter``, and the
*card* (``expected`` / ``acceptable`` sources, ``required_facts``, ``stratum``, ``quality_label``,
``provenance``, ``review``; a ``provisional`` case is one no person has adjudicated yet, e.g. a
model's draft). With ``expected`` or ``acceptable``, ``judgments`` may be left out: those sources
are graded judgments (2 and 1). The rules each case must meet
live in ``suite_rules.py``; a broken rule raises ``SuiteError("<file>:<line>: <rule>")`` and no
suite is returned (nothing partial). Each line is read strictly (``kernel/strict_load.py``): a
key given twice in a case, at any depth (``judgments.d1: duplicate key (first at column 60)``),
nesting deeper than 64 levels and ``NaN``/``Infinity`` are refused like any other broken rule. ``suite_load.load_suite`` reads a file or a BEIR folder
(``suite_beir.py``).

Canonical form: cases sorted by ID, each as an object carrying every field (defaults explicit,
tags/scopes/forbidden sources sorted; ``split``, ``filter`` and the card's fields only when set, so
suites written before them keep their digests). A case's own digest is ``Case.digest`` (kind
``suite-case``, v1). The suite digest is the content ID (kind ``suite``, v1) of
the list of canonical cases, so it does not depend on line order, whitespace, key order or
defaulted fields; ``source`` (where it was read from) is operational and never hashed.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ragpipe.evaluation.suite_rules import (
    ACCEPTABLE_GRADE,
    DEFAULT_REVIEW,
    EXPECTED_GRADE,
    QUALITY_LABELS,
    SuiteError,
    check_case,
)
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.strict_load import StrictLoadError, load_json_line

__all__ = [
    "ACCEPTABLE_GRADE",
    "EXPECTED_GRADE",
    "QUALITY_LABELS",
    "Case",
    "CaseProvenance",
    "CaseStatus",
    "CaseSubject",
    "Suite",
    "SuiteError",
    "check_against_bundle",
    "write_suite",
]

SUITE_ID_KIND = "suite"
SUITE_ID_VERSION = 1
CASE_ID_KIND = "suite-case"  # one case's digest (``Case.digest``): what a judgment or adjudication names
CASE_ID_VERSION = 1
STRATUM_TAG = "stratum:"  # a run tags a case of stratum s ``stratum:s`` (its per-tag slices cover strata)
# Reasons a case is not evaluated against a bundle (stable codes: reports and gates key on them).
MISSING_TARGETS = "missing_judged_targets"
NO_POSITIVE_JUDGMENT = "no_positive_judgment"
RELEVANT_GRADE = 1  # trec_eval relevance_level: a target is relevant iff its grade >= 1


class CaseSubject(BaseModel):
    """The scopes a case is asked under (policy scope-intersection/v1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    scopes: tuple[str, ...]


class CaseProvenance(BaseModel):
    """Who wrote a case: a person, or a model drafting under the spec ``model_spec_id``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    author: Literal["person", "model"]
    by: str
    at: str  # RFC 3339 UTC, as written
    model_spec_id: str | None = None

    def canonical(self) -> dict[str, str]:
        return self.model_dump(exclude_none=True)


class Case(BaseModel):
    """One evaluation case. Built only through the rules of ``suite_rules.check_case``, so a Case
    constructed in code obeys exactly what a suite file must."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str
    query: str
    target_level: Literal["document", "chunk"]
    judgments: dict[str, int]
    tags: tuple[str, ...] = ()
    answerability: Literal["answerable", "unanswerable"] = "answerable"
    subject: CaseSubject | None = None
    forbidden_sources: tuple[str, ...] = ()
    split: tuple[str, ...] = ()  # the dataset splits the judgments come from (BEIR import sets it)
    # a metadata filter the case's query runs under (canonical JSON, ``corpus.metadata_filter``)
    filter: dict[str, Any] | None = None
    # The card (``suite_rules``, "card fields"): ``judgments`` already holds the expected sources
    # at EXPECTED_GRADE and the acceptable ones at ACCEPTABLE_GRADE.
    expected: tuple[str, ...] = ()
    acceptable: tuple[str, ...] = ()
    required_facts: tuple[str, ...] = ()
    stratum: str | None = None
    quality_label: Literal["0_FAIL", "1_PARTIAL", "2_SUBSTANTIAL", "3_AUTHORITATIVE"] | None = None
    provenance: CaseProvenance | None = None
    review: Literal["provisional", "adjudicated"] = DEFAULT_REVIEW

    @model_validator(mode="before")
    @classmethod
    def _rules(cls, data: Any) -> Any:
        if isinstance(data, Case):
            return data
        return check_case(_plain(data))

    @property
    def relevant(self) -> frozenset[str]:
        """Targets with grade >= 1 (trec_eval's relevance level)."""
        return frozenset(t for t, g in self.judgments.items() if g >= RELEVANT_GRADE)

    @property
    def provisional(self) -> bool:
        """A case no person has adjudicated yet (a model's draft): reports mark it, gates may bound it."""
        return self.review == "provisional"

    def run_tags(self) -> list[str]:
        """The tags a run slices this case by: its own, and ``stratum:<name>`` for its stratum."""
        stratum = () if self.stratum is None else (f"{STRATUM_TAG}{self.stratum}",)
        return sorted(set(self.tags) | set(stratum))

    @property
    def digest(self) -> str:
        """The content ID of this case's canonical form (kind ``suite-case``, v1)."""
        return content_id(CASE_ID_KIND, CASE_ID_VERSION, self.canonical())

    def canonical(self) -> dict[str, object]:
        """The case as a plain JSON object with every field explicit (what is hashed and written);
        the card's fields only when set, so a suite without cards keeps its digest."""
        return {
            "id": self.id,
            "query": self.query,
            "target_level": self.target_level,
            "judgments": dict(sorted(self.judgments.items())),
            "tags": list(self.tags),
            "answerability": self.answerability,
            "subject": None if self.subject is None else {"scopes": list(self.subject.scopes)},
            "forbidden_sources": list(self.forbidden_sources),
            # only when set: a suite without splits keeps the digest it had before splits existed
            **({"split": list(self.split)} if self.split else {}),
            # likewise: a suite without filters keeps its digest
            **({"filter": self.filter} if self.filter is not None else {}),
            **self._card(),
        }

    def _card(self) -> dict[str, object]:
        """The card's set fields. ``review`` is written unless it is the default for its author: a
        model-authored case must state it (its canonical form parses back), anyone else's
        ``adjudicated`` is left out."""
        card: dict[str, object] = {
            "expected": list(self.expected),
            "acceptable": list(self.acceptable),
            "required_facts": list(self.required_facts),
            "stratum": self.stratum,
            "quality_label": self.quality_label,
            "provenance": None if self.provenance is None else self.provenance.canonical(),
        }
        out = {k: v for k, v in card.items() if v not in (None, [])}
        by_model = self.provenance is not None and self.provenance.author == "model"
        if by_model or self.review != DEFAULT_REVIEW:
            out["review"] = self.review
        return out


def _plain(data: Any) -> Any:
    """Accept a CaseSubject or CaseProvenance inside programmatic input (the rules work on plain
    JSON values)."""
    if isinstance(data, dict) and isinstance(data.get("subject"), CaseSubject):
        data = {**data, "subject": {"scopes": list(data["subject"].scopes)}}
    if isinstance(data, dict) and isinstance(data.get("provenance"), CaseProvenance):
        data = {**data, "provenance": data["provenance"].canonical()}
    return data


@dataclass(frozen=True)
class Suite:
    """Cases in canonical order (by ID) and their digest; ``source`` is operational only."""

    cases: tuple[Case, ...]
    digest: str
    source: str

    @classmethod
    def of(cls, cases: Iterable[Case], source: str) -> Suite:
        """A suite of ``cases`` (duplicate IDs refused), sorted by ID, with its digest."""
        ordered = sorted(cases, key=lambda c: c.id)
        for a, b in zip(ordered, ordered[1:]):
            if a.id == b.id:
                raise SuiteError(f"{source}: duplicate case id {a.id!r}")
        if not ordered:
            raise SuiteError(f"{source}: no cases")
        return cls(tuple(ordered), suite_digest(ordered), source)

    def by_id(self) -> dict[str, Case]:
        return {c.id: c for c in self.cases}

    def provisional(self) -> tuple[str, ...]:
        """The IDs of the cases no person has adjudicated yet, sorted."""
        return tuple(c.id for c in self.cases if c.provisional)

    def quality_labels(self) -> dict[str, str]:
        """Case ID → the reference ``quality_label`` a person gave, for the cases that have one
        (a judged run's report measures the judge's agreement with them)."""
        return {c.id: c.quality_label for c in self.cases if c.quality_label is not None}

    def cases_of_split(self, split: str) -> tuple[Case, ...]:
        """The cases whose judgments come (also) from ``split``."""
        return tuple(c for c in self.cases if split in c.split)


def suite_digest(cases: Iterable[Case]) -> str:
    """Content ID of the canonical cases, sorted by ID."""
    return content_id(SUITE_ID_KIND, SUITE_ID_VERSION, [c.canonical() for c in sorted(cases, key=lambda c: c.id)])


def parse_suite_bytes(data: bytes, source: str) -> Suite:
    """Parse native JSONL bytes; ``source`` names the file in every error."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline ending the last line
    if not lines:
        raise SuiteError(f"{source}: no cases")
    cases: list[Case] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        case = _parse_line(raw, source, number)
        if case.id in first_line:
            raise SuiteError(f"{source}:{number}: duplicate case id {case.id!r} (first on line {first_line[case.id]})")
        first_line[case.id] = number
        cases.append(case)
    if len(cases) != len(lines):  # a parser that finds fewer cases than lines fails: an explicit invariant
        raise SuiteError(f"{source}: parsed {len(cases)} cases from {len(lines)} lines")
    return Suite.of(cases, source)


def _parse_line(raw: bytes, source: str, number: int) -> Case:
    where = f"{source}:{number}"
    if not raw.strip():
        raise SuiteError(f"{where}: blank line (every line must hold one case)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SuiteError(f"{where}: not valid UTF-8 (byte {e.start + 1})") from None
    try:  # a key given twice (judgments.d1 …), deep nesting, NaN: one line naming it
        value = load_json_line(text, source, number)
    except StrictLoadError as e:
        raise SuiteError(str(e)) from None
    try:
        return Case.model_validate(check_case(value))
    except SuiteError as e:
        raise SuiteError(f"{where}: {e}") from None


def suite_bytes(suite: Suite) -> bytes:
    """Canonical JSONL: one RFC 8785 object per line, cases sorted by ID, newline-terminated."""
    return b"".join(canonical_bytes(c.canonical()) + b"\n" for c in suite.cases)


def write_suite(suite: Suite, path: Path) -> None:
    """Write ``suite`` in canonical JSONL atomically (temp + fsync + rename)."""
    write_file_atomic(Path(path), suite_bytes(suite))


@dataclass(frozen=True)
class CaseStatus:
    """Whether a case can be evaluated against a bundle. ``reason`` is a stable code
    (``missing_judged_targets`` | ``no_positive_judgment``) when it cannot; ``missing`` lists the
    judged targets (sorted) the bundle lacks."""

    case_id: str
    evaluable: bool
    reason: str | None
    missing: tuple[str, ...]


def check_against_bundle(suite: Suite, document_ids: AbstractSet[str], chunk_ids: AbstractSet[str]) -> list[CaseStatus]:
    """One status per case, in suite order. A case any of whose judged targets (any grade) the
    bundle lacks is skipped, never scored as a miss; an answerable case without a judgment of
    grade >= 1 is skipped too (its ranking metrics are undefined). Unanswerable cases are
    evaluable: they are run for safety and answer metrics, and take no ranking metric."""
    out = []
    for case in suite.cases:
        present = document_ids if case.target_level == "document" else chunk_ids
        missing = tuple(sorted(t for t in case.judgments if t not in present))
        if missing:
            out.append(CaseStatus(case.id, False, MISSING_TARGETS, missing))
        elif case.answerability == "answerable" and not case.relevant:
            out.append(CaseStatus(case.id, False, NO_POSITIVE_JUDGMENT, ()))
        else:
            out.append(CaseStatus(case.id, True, None, ()))
    return out
