"""The audit of a set of cases: duplicate and near-duplicate questions, and leakage between splits.

``audit_cases(cases, splits)`` is pure and deterministic (every list sorted), so the same cases
always give the same report, and a dataset version can carry the report's content ID:

* **duplicates**: groups of cases whose questions are equal once normalised (``normal_form``:
  NFKC, case-folded, punctuation and runs of spaces removed);
* **near duplicates**: pairs of cases, not duplicates of each other, whose questions' word
  3-shingles (``shingles``) have a Jaccard similarity of at least ``threshold`` (0.8 by default;
  a question of fewer than three words is one shingle of all its words);
* **leakage**: the duplicate and near-duplicate pairs whose cases sit in different splits — the
  same question asked in ``dev`` and ``holdout`` lets a change tuned on one pass the other;
* **shared sources**: relevant sources (grade >= 1) judged in more than one split. Reported, never
  refused: two different questions about one document are not leakage, but a reviewer drafting
  from one chunk should see it.

``splits`` maps a case ID to its split; cases without one take part in duplicates and near
duplicates only.
"""

from __future__ import annotations

import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping
from itertools import combinations

from pydantic import BaseModel, ConfigDict

from ragpipe.evaluation.suite import Case
from ragpipe.kernel.ids import content_id

NEAR_DUPLICATE_JACCARD = 0.8
SHINGLE_WORDS = 3
_WORD = re.compile(r"\w+")


class NearDuplicate(BaseModel):
    """Two cases whose questions are alike: ``jaccard`` of their shingle sets, to four decimals."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    a: str
    b: str
    jaccard: float


class Leak(BaseModel):
    """A duplicate or near-duplicate pair across two splits (``kind``: duplicate | near_duplicate)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    a: str
    b: str
    kind: str
    splits: tuple[str, str]


class SharedSource(BaseModel):
    """A relevant source judged by cases of more than one split."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str
    splits: tuple[str, ...]
    cases: tuple[str, ...]


class AuditReport(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    cases: int
    threshold: float
    duplicates: tuple[tuple[str, ...], ...]
    near_duplicates: tuple[NearDuplicate, ...]
    leakage: tuple[Leak, ...]
    shared_sources: tuple[SharedSource, ...]

    @property
    def id(self) -> str:
        """Content ID of the report (what a dataset version records as its audit)."""
        return content_id("case-audit", 1, self.model_dump(mode="json"))


def normal_form(question: str) -> str:
    """The question as compared for duplicates: NFKC, case-folded, words joined by one space."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", question).casefold()))


def shingles(question: str, width: int = SHINGLE_WORDS) -> frozenset[str]:
    """The word ``width``-grams of the normalised question (all its words when it has fewer)."""
    words = normal_form(question).split(" ")
    if len(words) <= width:
        return frozenset({" ".join(words)})
    return frozenset(" ".join(words[i : i + width]) for i in range(len(words) - width + 1))


def _duplicate_groups(cases: list[Case]) -> list[tuple[str, ...]]:
    by_form: dict[str, list[str]] = defaultdict(list)
    for case in cases:
        by_form[normal_form(case.query)].append(case.id)
    return sorted(tuple(sorted(ids)) for ids in by_form.values() if len(ids) > 1)


def _near_pairs(cases: list[Case], threshold: float, duplicates: set[frozenset[str]]) -> list[NearDuplicate]:
    """Pairs at or above ``threshold``, counted through an inverted index of shingles (exact: every
    pair sharing a shingle is scored; pairs sharing none have similarity 0)."""
    sets = {case.id: shingles(case.query) for case in cases}
    postings: dict[str, list[str]] = defaultdict(list)
    for case_id in sorted(sets):
        for shingle in sets[case_id]:
            postings[shingle].append(case_id)
    shared: dict[tuple[str, str], int] = defaultdict(int)
    for ids in postings.values():
        for a, b in combinations(ids, 2):
            shared[(a, b)] += 1
    pairs = []
    for (a, b), common in shared.items():
        jaccard = common / (len(sets[a]) + len(sets[b]) - common)
        if jaccard >= threshold and frozenset((a, b)) not in duplicates:
            pairs.append(NearDuplicate(a=a, b=b, jaccard=round(jaccard, 4)))
    return sorted(pairs, key=lambda p: (p.a, p.b))


def _leaks(duplicates: list[tuple[str, ...]], near: list[NearDuplicate], splits: Mapping[str, str]) -> list[Leak]:
    candidates = [(a, b, "duplicate") for group in duplicates for a, b in combinations(group, 2)]
    candidates += [(p.a, p.b, "near_duplicate") for p in near]
    leaks = [
        Leak(a=a, b=b, kind=kind, splits=(splits[a], splits[b]))
        for a, b, kind in candidates
        if a in splits and b in splits and splits[a] != splits[b]
    ]
    return sorted(leaks, key=lambda leak: (leak.a, leak.b))


def _shared_sources(cases: list[Case], splits: Mapping[str, str]) -> list[SharedSource]:
    by_source: dict[str, set[str]] = defaultdict(set)
    for case in cases:
        if case.id in splits:
            for source in case.relevant:
                by_source[source].add(case.id)
    shared = []
    for source, ids in by_source.items():
        used = sorted({splits[i] for i in ids})
        if len(used) > 1:
            shared.append(SharedSource(source=source, splits=tuple(used), cases=tuple(sorted(ids))))
    return sorted(shared, key=lambda s: s.source)


def audit_cases(
    cases: Iterable[Case], splits: Mapping[str, str] | None = None, threshold: float = NEAR_DUPLICATE_JACCARD
) -> AuditReport:
    """The audit of ``cases`` (module docstring); ``splits`` maps case IDs to their split."""
    if not 0 < threshold <= 1:
        raise ValueError(f"near-duplicate threshold must be in (0, 1], got {threshold}")
    ordered = sorted(cases, key=lambda c: c.id)
    splits = splits or {}
    duplicates = _duplicate_groups(ordered)
    duplicate_pairs = {frozenset(pair) for group in duplicates for pair in combinations(group, 2)}
    near = _near_pairs(ordered, threshold, duplicate_pairs)
    return AuditReport(
        cases=len(ordered),
        threshold=threshold,
        duplicates=tuple(duplicates),
        near_duplicates=tuple(near),
        leakage=tuple(_leaks(duplicates, near, splits)),
        shared_sources=tuple(_shared_sources(ordered, splits)),
    )
