"""The audit of a set of cases: duplicate and near-duplicate questions, and leakage between splits.

``audit_cases(cases, splits)`` is pure and deterministic (every list sorted), so the same cases
always give the same report, and a dataset version can carry the report's content ID:

* **duplicates**: groups of cases whose questions are equal once normalised (``normal_form``:
  NFKC, case-folded, runs of white space made one space, closing ``.?!`` dropped — every other
  character counts, so ``1+1?`` and ``1-1?`` differ);
* **near duplicates**: pairs of cases, not duplicates of each other, whose normal forms'
  character 4-grams (``shingles``) have a Jaccard similarity of at least ``threshold`` (0.65 by
  default: "What is the capital of France?" / "What is the capital city of France?" 0.73, "What's
  the dose…" / "What is the dose…" 0.68, a SciFact claim and its negation 0.75–0.98; a synonym
  swapped in a short question, "lower" / "reduce the risk of stroke" 0.60, is not caught: the
  audit is lexical). Every pair at or above the threshold is found: candidates come from the
  prefix filter of the all-pairs algorithm (rarest 4-grams first; two sets this similar share a
  4-gram in their prefixes), then each candidate's similarity is computed exactly;
* **leakage**: the duplicate and near-duplicate pairs whose cases sit in different splits — the
  same question asked in ``dev`` and ``holdout`` lets a change tuned on one pass the other;
* **shared sources**: relevant sources (grade >= 1) judged in more than one split. Reported, never
  refused: two different questions about one document are not leakage, but a reviewer drafting
  from one chunk should see it.

``splits`` maps a case ID to its split; cases without one take part in duplicates and near
duplicates only.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from itertools import combinations

from pydantic import BaseModel, ConfigDict

from ragpipe.evaluation.suite import Case
from ragpipe.kernel.ids import content_id

NEAR_DUPLICATE_JACCARD = 0.65
SHINGLE_CHARS = 4
_CLOSING = re.compile(r"[.?!]+\Z")


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
    """The question as compared for duplicates: NFKC, case-folded, white space runs made one
    space, closing sentence punctuation dropped."""
    text = " ".join(unicodedata.normalize("NFKC", question).casefold().split())
    return _CLOSING.sub("", text).rstrip()


def shingles(question: str, width: int = SHINGLE_CHARS) -> frozenset[str]:
    """The character ``width``-grams of the normal form (the whole form when it is shorter)."""
    text = normal_form(question)
    if len(text) <= width:
        return frozenset({text})
    return frozenset(text[i : i + width] for i in range(len(text) - width + 1))


def _duplicate_groups(cases: list[Case]) -> list[tuple[str, ...]]:
    by_form: dict[str, list[str]] = defaultdict(list)
    for case in cases:
        by_form[normal_form(case.query)].append(case.id)
    return sorted(tuple(sorted(ids)) for ids in by_form.values() if len(ids) > 1)


def _prefix_length(size: int, threshold: float) -> int:
    """How many of a set's rarest shingles must be indexed so that any set at least ``threshold``
    similar shares one of them: ``size - ceil(threshold * size) + 1`` (the overlap such a pair
    needs is at least ``ceil(threshold * size)``; a hair below, so rounding never shortens it)."""
    return size - math.ceil(threshold * size - 1e-9) + 1


def _near_pairs(cases: list[Case], threshold: float, duplicates: set[frozenset[str]]) -> list[NearDuplicate]:
    """Every pair at or above ``threshold`` (module docstring: prefix-filtered candidates, each
    scored exactly), in (a, b) order."""
    sets = {case.id: shingles(case.query) for case in cases}
    frequency = Counter(shingle for shingle_set in sets.values() for shingle in shingle_set)
    index: dict[str, list[str]] = defaultdict(list)
    candidates: set[tuple[str, str]] = set()
    for case_id in sorted(sets):
        ordered = sorted(sets[case_id], key=lambda shingle: (frequency[shingle], shingle))
        for shingle in ordered[: _prefix_length(len(ordered), threshold)]:
            candidates.update((other, case_id) for other in index[shingle])
            index[shingle].append(case_id)
    pairs = []
    for a, b in candidates:
        common = len(sets[a] & sets[b])
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
