"""Exact pairing of an incumbent and a challenger run by ``(case, repeat)``.

``pair(incumbent, challenger)`` refuses, with a ``PairingError`` naming the arm and the cell or
coordinate, in this order: the same run on both sides; arm labels that contradict the roles
(a run labelled ``incumbent`` passed as the challenger, or the reverse); differing comparison
coordinates (first differing field, in declaration order; an arm-only metric such as ANN recall
that only one run declares is left out: ``shared_coordinates``); an arm whose cells are not exactly
its expected cells (a duplicate, a missing or an unexpected cell, a cell of a skipped case);
differing skipped cases; differing expected cells; differing tags of a case.

With ``coverage_change=True`` (decisions that know their change kind) a suite that grows and
shrinks with the corpus pairs too: a case the incumbent skipped because it lacks a judged
document and the challenger evaluates is *new coverage*; a case the incumbent evaluated and the
challenger skipped because the challenger lacks a judged document is *lost coverage* (the missing
documents are listed). Neither is paired; both are listed in the certificate by case ID; a case
skipped for any other difference, or cells that differ otherwise, are still refused.

Failed and cancelled cells stay paired: a pair records both outcomes, and the certificate counts
failures by arm and class. The certificate lists the ordered coordinates (sorted by case ID,
then repeat) and both runs' IDs and ledger heads under their roles, so swapping the arguments
gives a different certificate, never the same comparison with the labels exchanged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pydantic import model_serializer

from ragpipe.evaluation.suite import MISSING_TARGETS, NO_POSITIVE_JUDGMENT
from ragpipe.experiment.arms import ArmRef, ArmRun, CellKey, CellOutcome, Coordinates
from ragpipe.experiment.catalog import ARM_ONLY
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.models import FrozenModel

ROLES = ("incumbent", "challenger")


class PairingError(ValueError):
    """Two runs cannot be paired exactly; the message names the arm and the cell or field."""


def describe(key: CellKey) -> str:
    return f"cell ({key[0]!r}, {key[1]})"


def _label(side: str, arm: ArmRun) -> str:
    return f"{side} run {arm.run_id}"


def check_arm(arm: ArmRun, side: str) -> None:
    """Refuse an arm whose cells are not exactly its expected cells (each once)."""
    who = _label(side, arm)
    expected_counts = Counter(arm.expected)
    dup_expected = sorted(k for k, n in expected_counts.items() if n > 1)
    if dup_expected:
        raise PairingError(
            f"{who}: expected {describe(dup_expected[0])} is listed {expected_counts[dup_expected[0]]} times"
        )
    counts = Counter(c.key for c in arm.cells)
    dups = sorted(k for k, n in counts.items() if n > 1)
    if dups:
        raise PairingError(f"{who}: {describe(dups[0])} appears {counts[dups[0]]} times")
    missing = sorted(set(expected_counts) - set(counts))
    if missing:
        raise PairingError(
            f"{who}: {describe(missing[0])} is missing ({len(missing)} expected cells have no terminal outcome)"
        )
    extra = sorted(set(counts) - set(expected_counts))
    if extra:
        raise PairingError(f"{who}: {describe(extra[0])} is not an expected cell")
    skipped_cells = sorted(k for k in expected_counts if k[0] in arm.skipped)
    if skipped_cells:
        raise PairingError(f"{who}: {describe(skipped_cells[0])} belongs to skipped case {skipped_cells[0][0]!r}")
    bad_repeat = sorted(k for k in expected_counts if k[1] >= arm.coordinates.repeats)
    if bad_repeat:
        raise PairingError(f"{who}: {describe(bad_repeat[0])} has a repeat outside 0..{arm.coordinates.repeats - 1}")


def _check_roles(incumbent: ArmRun, challenger: ArmRun) -> None:
    if incumbent.run_id == challenger.run_id:
        raise PairingError(f"incumbent and challenger are the same run {incumbent.run_id}")
    for side, arm in (("incumbent", incumbent), ("challenger", challenger)):
        other = "challenger" if side == "incumbent" else "incumbent"
        if arm.variant.arm == other:
            raise PairingError(f"{_label(side, arm)} is labelled {other!r}: the arguments are swapped")


def shared_coordinates(incumbent: Coordinates, challenger: Coordinates) -> Coordinates:
    """``incumbent`` without the arm-only metrics (``catalog.ARM_ONLY``: ANN recall) that only one
    of the two runs declares: what a pairing compares. Equal coordinates are their own."""
    one_sided = ARM_ONLY & ({m.name for m in incumbent.metrics} ^ {m.name for m in challenger.metrics})
    if not one_sided:
        return incumbent
    return incumbent.model_copy(update={"metrics": tuple(m for m in incumbent.metrics if m.name not in one_sided)})


def _check_coordinates(incumbent: Coordinates, challenger: Coordinates) -> None:
    # an arm-only metric declared by one run only is that run's own (an exact incumbent, an approximate challenger)
    incumbent, challenger = shared_coordinates(incumbent, challenger), shared_coordinates(challenger, incumbent)
    for name in Coordinates.model_fields:
        a, b = getattr(incumbent, name), getattr(challenger, name)
        if a != b and name == "metrics":
            i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            inc, ch = (ms[i].model_dump() if i < len(ms) else "nothing" for ms in (a, b))
            raise PairingError(f"runs differ in metrics at position {i}: incumbent {inc!r}, challenger {ch!r}")
        if a != b:
            raise PairingError(
                f"runs differ in {name}: incumbent {a!r}, challenger {b!r} (only bundle, plan and arm label may differ)"
            )


def _skip_state(reason: str | None) -> str:
    return "not skipped" if reason is None else f"skipped ({reason})"


def coverage_changes(incumbent: ArmRun, challenger: ArmRun) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """``(new, lost)``: the cases only the challenger evaluates (case -> the incumbent's skip
    reason) and those only the incumbent evaluates (case -> the judged documents the challenger
    lacks). Only a skip for lacking judged documents on one side counts (module docstring)."""
    new, lost = {}, {}
    for case in sorted(set(incumbent.skipped) ^ set(challenger.skipped)):
        if incumbent.skipped.get(case) == MISSING_TARGETS and case in challenger.cases():
            new[case] = MISSING_TARGETS
        elif challenger.skipped.get(case) == MISSING_TARGETS and case in incumbent.cases():
            lost[case] = tuple(sorted(challenger.missing.get(case, ())))
    return new, lost


# A case can be skipped by both arms for two reasons that depend on which documents each holds: a
# case judging only a grade-0 document the challenger adds lacks that document in the incumbent
# (missing) and has no relevant judgment in the challenger. Skipped by both, it is not compared.
BOTH_SKIPPED = frozenset({MISSING_TARGETS, NO_POSITIVE_JUDGMENT})


def _same_skip(a: str | None, b: str | None, coverage_change: bool) -> bool:
    return a == b or (coverage_change and a in BOTH_SKIPPED and b in BOTH_SKIPPED)


def _check_same_cases(incumbent: ArmRun, challenger: ArmRun, new=(), lost=(), coverage_change: bool = False) -> None:
    """Refuse differing skipped cases, expected cells or tags — leaving out the cases of ``new``
    and ``lost`` coverage, which the caller accepts."""
    inc_skipped = {c: r for c, r in incumbent.skipped.items() if c not in new}
    ch_skipped = {c: r for c, r in challenger.skipped.items() if c not in lost}
    case = next(
        (
            c
            for c in sorted(set(inc_skipped) | set(ch_skipped))
            if not _same_skip(inc_skipped.get(c), ch_skipped.get(c), coverage_change)
        ),
        None,
    )
    if case is not None:
        inc, ch = _skip_state(incumbent.skipped.get(case)), _skip_state(challenger.skipped.get(case))
        raise PairingError(f"case {case!r} differs: {inc} by the incumbent, {ch} by the challenger")
    inc_keys = {k for k in incumbent.expected if k[0] not in lost}
    ch_keys = {k for k in challenger.expected if k[0] not in new}
    if inc_keys != ch_keys:
        key = min(inc_keys ^ ch_keys)
        has, lacks = ("incumbent", "challenger") if key in inc_keys else ("challenger", "incumbent")
        raise PairingError(f"{describe(key)} is expected by the {has} but not by the {lacks}")
    cases = sorted({k[0] for k in inc_keys})
    tagged = next(
        (c for c in cases if tuple(sorted(incumbent.tags.get(c, ()))) != tuple(sorted(challenger.tags.get(c, ())))),
        None,
    )
    if tagged is not None:
        raise PairingError(
            f"case {tagged!r} has tags {sorted(incumbent.tags.get(tagged, ()))} in the incumbent, {sorted(challenger.tags.get(tagged, ()))} in the challenger"
        )


class FailureCount(FrozenModel):
    side: str
    failure_class: str
    cells: int


class PairingCertificate(FrozenModel):
    """What was paired: both runs under their roles, the shared coordinates' ID, every paired
    cell in order, the skipped cases, and the failed cells counted by arm and class."""

    incumbent: ArmRef
    challenger: ArmRef
    coordinates_id: str
    cells: tuple[CellKey, ...]
    skipped: tuple[tuple[str, str], ...]
    failures: tuple[FailureCount, ...]
    both_completed: int
    new_coverage: tuple[tuple[str, str], ...] = ()  # (case, the incumbent's skip reason)
    lost_coverage: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (case, judged documents the challenger lacks)

    @model_serializer(mode="wrap")
    def _without_empty_coverage(self, handler):
        """No coverage change is left out of the dump: a comparison made before suites could grow
        keeps its ID."""
        data = handler(self)
        if isinstance(data, dict):
            for key in ("new_coverage", "lost_coverage"):
                if not data.get(key, 1):
                    del data[key]
        return data


@dataclass(frozen=True)
class Pair:
    key: CellKey
    incumbent: CellOutcome
    challenger: CellOutcome


@dataclass(frozen=True)
class Pairing:
    incumbent: ArmRun
    challenger: ArmRun
    pairs: tuple[Pair, ...]
    certificate: PairingCertificate

    @property
    def coordinates(self) -> Coordinates:
        """What both runs declare alike (``shared_coordinates``)."""
        return shared_coordinates(self.incumbent.coordinates, self.challenger.coordinates)

    def case_tags(self, case_id: str) -> tuple[str, ...]:
        return tuple(sorted(set(self.incumbent.tags.get(case_id, ()))))


def coordinates_id(coordinates: Coordinates) -> str:
    return content_id("comparison-coordinates", 1, coordinates.model_dump(mode="json"))


def pair(incumbent: ArmRun, challenger: ArmRun, *, coverage_change: bool = False) -> Pairing:
    """Pair two runs exactly (module docstring) or raise ``PairingError``; ``coverage_change``:
    accept new and lost coverage, listed in the certificate."""
    _check_roles(incumbent, challenger)
    _check_coordinates(incumbent.coordinates, challenger.coordinates)
    check_arm(incumbent, "incumbent")
    check_arm(challenger, "challenger")
    new, lost = coverage_changes(incumbent, challenger) if coverage_change else ({}, {})
    _check_same_cases(incumbent, challenger, new, lost, coverage_change)
    by_inc = {c.key: c for c in incumbent.cells if c.case_id not in lost}
    by_ch = {c.key: c for c in challenger.cells}
    keys = tuple(sorted(by_inc))
    pairs = tuple(Pair(k, by_inc[k], by_ch[k]) for k in keys)
    failures = Counter(
        (side, str(cell.failure_class))
        for p in pairs
        for side, cell in (("incumbent", p.incumbent), ("challenger", p.challenger))
        if not cell.completed
    )
    certificate = PairingCertificate(
        incumbent=incumbent.ref(),
        challenger=challenger.ref(),
        coordinates_id=coordinates_id(shared_coordinates(incumbent.coordinates, challenger.coordinates)),
        cells=keys,
        skipped=tuple(sorted((c, r) for c, r in incumbent.skipped.items() if c not in new)),
        failures=tuple(
            FailureCount(side=s, failure_class=c, cells=n)
            for (s, c), n in sorted(failures.items(), key=lambda kv: (ROLES.index(kv[0][0]), kv[0][1]))
        ),
        both_completed=sum(1 for p in pairs if p.incumbent.completed and p.challenger.completed),
        new_coverage=tuple(sorted(new.items())),
        lost_coverage=tuple(sorted(lost.items())),
    )
    return Pairing(incumbent, challenger, pairs, certificate)
