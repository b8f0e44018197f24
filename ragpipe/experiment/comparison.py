"""The paired comparison of two runs, and its file.

``compare(pairing, spec)`` computes, per declared metric and per slice (``all`` cases, then each
tag), the direction-normalised deltas ``challenger - incumbent`` (``incumbent - challenger`` for
lower-is-better metrics) with the statistics of ``statistics.paired_stats``. A pair is *scored*
for a metric when both cells completed and both carry the metric; it is *failed* when either cell
failed or was cancelled (it stays in the pairing and is counted, never dropped), and
*unmeasured* when both completed but a side lacks the metric (an unanswerable case has no
ranking metric). ``scored + failed + unmeasured`` always equals the expected pairs of the slice.
A case's delta is the mean of its scored pairs' deltas (its repeats).

The comparison also carries each arm's summary (aggregates, failures by class, p95 latency),
and — when the suite grew with the corpus — ``new_coverage``, the summary of the challenger's
cells on the cases only it can evaluate (``pairing.coverage_changes``), so a gate reads the
comparison file alone. Its ID is ``content_id("comparison", 1, body)``;
``load_comparison`` recomputes it and refuses a file whose content does not match.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_serializer

from ragpipe.experiment.arms import ArmSummary, Coordinates, MetricDecl, summarize
from ragpipe.experiment.pairing import Pair, Pairing, PairingCertificate
from ragpipe.experiment.statistics import ComparisonSpec, DeltaStats, paired_stats
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.models import FrozenModel
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.strict_load import NON_FINITE, StrictLoadError, load_json

ALL = "all"  # the slice of every paired case; a tag slice is named "tag:<tag>"


class ComparisonError(ValueError):
    """A comparison file cannot be read or does not match its ID; the message names the file."""


class MetricComparison(FrozenModel):
    direction: Literal["higher", "lower"]
    unit: str
    k: int | None
    pairs: int
    scored: int
    failed: int
    unmeasured: int
    stats: DeltaStats


class SliceComparison(FrozenModel):
    cases: int
    metrics: dict[str, MetricComparison]


class Comparison(FrozenModel):
    schema_: Literal["ragpipe.comparison/v1"] = Field("ragpipe.comparison/v1", alias="schema")
    spec: ComparisonSpec
    coordinates: Coordinates
    certificate: PairingCertificate
    incumbent: ArmSummary
    challenger: ArmSummary
    slices: dict[str, SliceComparison]
    new_coverage: ArmSummary | None = None

    @model_serializer(mode="wrap")
    def _without_absent_coverage(self, handler):
        """No new coverage is left out of the dump: older comparisons keep their IDs."""
        data = handler(self)
        if isinstance(data, dict) and data.get("new_coverage", 0) is None:
            del data["new_coverage"]
        return data

    def body(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)

    @property
    def comparison_id(self) -> str:
        return content_id("comparison", 1, self.body())

    def as_json(self) -> dict[str, object]:
        """The file's object: the body plus its ID."""
        return {"comparison_id": self.comparison_id, **self.body()}


def _delta(decl: MetricDecl, p: Pair) -> float | None:
    a, b = p.incumbent.metrics.get(decl.name), p.challenger.metrics.get(decl.name)
    if a is None or b is None:
        return None
    return float(b - a) if decl.direction == "higher" else float(a - b)


def _metric(decl: MetricDecl, pairs: list[Pair], spec: ComparisonSpec, slice_name: str) -> MetricComparison:
    failed = unmeasured = 0
    per_case: dict[str, list[float]] = {}
    for p in pairs:
        if not (p.incumbent.completed and p.challenger.completed):
            failed += 1
            continue
        d = _delta(decl, p)
        if d is None:
            unmeasured += 1
        else:
            per_case.setdefault(p.key[0], []).append(d)
    deltas = [math.fsum(v) / len(v) for _, v in sorted(per_case.items())]
    scored = sum(len(v) for v in per_case.values())
    return MetricComparison(
        direction=decl.direction,
        unit=decl.unit,
        k=decl.k,
        pairs=len(pairs),
        scored=scored,
        failed=failed,
        unmeasured=unmeasured,
        stats=paired_stats(deltas, spec, slice_name, decl.name),
    )


def _slice(pairing: Pairing, pairs: list[Pair], spec: ComparisonSpec, slice_name: str) -> SliceComparison:
    metrics = {
        d.name: _metric(d, pairs, spec, slice_name) for d in sorted(pairing.coordinates.metrics, key=lambda m: m.name)
    }
    return SliceComparison(cases=len({p.key[0] for p in pairs}), metrics=metrics)


def compare(pairing: Pairing, spec: ComparisonSpec | None = None) -> Comparison:
    """The comparison of an exact pairing (module docstring)."""
    spec = spec or ComparisonSpec()
    pairs = list(pairing.pairs)
    by_tag: dict[str, list[Pair]] = {}
    for p in pairs:
        for tag in pairing.case_tags(p.key[0]):
            by_tag.setdefault(tag, []).append(p)
    slices = {ALL: _slice(pairing, pairs, spec, ALL)}
    for tag, tagged in sorted(by_tag.items()):
        slices[f"tag:{tag}"] = _slice(pairing, tagged, spec, f"tag:{tag}")
    return Comparison(
        spec=spec,
        coordinates=pairing.coordinates,
        certificate=pairing.certificate,
        incumbent=summarize(pairing.incumbent),
        challenger=summarize(pairing.challenger),
        slices=slices,
        new_coverage=new_coverage_summary(pairing),
    )


def new_coverage_summary(pairing: Pairing) -> ArmSummary | None:
    """The challenger's summary over its new-coverage cases only (None: there are none)."""
    new = {case for case, _ in pairing.certificate.new_coverage}
    if not new:
        return None
    arm = pairing.challenger
    only = arm.model_copy(
        update={
            "expected": tuple(k for k in arm.expected if k[0] in new),
            "cells": tuple(c for c in arm.cells if c.case_id in new),
            "provisional": tuple(c for c in arm.provisional if c in new),
        }
    )
    return summarize(only)


def comparison_bytes(comparison: Comparison) -> bytes:
    return (json.dumps(comparison.as_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def write_comparison(comparison: Comparison, path: Path) -> bool:
    """Write the comparison file atomically; never replace a different file. Returns False when
    an identical file was already there (the comparison is deterministic: a no-op)."""
    data = comparison_bytes(comparison)
    if write_file_atomic(Path(path), data, replace=False):
        return True
    if Path(path).read_bytes() != data:
        raise ComparisonError(f"{path}: already exists with different content (comparisons are never overwritten)")
    return False


def load_comparison(path: Path) -> Comparison:
    """Read and verify a comparison file: schema, finite values, and its ID."""
    try:
        raw = load_json(Path(path).read_bytes().decode("utf-8"), str(path))
    except OSError as exc:
        raise ComparisonError(f"{path}: cannot read comparison: {exc.strerror}") from None
    except StrictLoadError as exc:  # a duplicate key or deep nesting: <file>:<line>: <rule>
        if exc.original is not None:
            raise ComparisonError(f"{path}: not a JSON comparison: {exc.original}") from None
        if exc.kind == NON_FINITE:
            raise ComparisonError(f"{path}: not a JSON comparison: {exc.rule.removesuffix(' is not JSON')}") from None
        raise ComparisonError(str(exc)) from None
    except ValueError as exc:  # not UTF-8
        raise ComparisonError(f"{path}: not a JSON comparison: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("comparison_id"), str):
        raise ComparisonError(f"{path}: not a comparison (no comparison_id)")
    stored = raw.pop("comparison_id")
    try:
        comparison = Comparison.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ComparisonError(
            f"{path}: invalid comparison: {'.'.join(map(str, first['loc']))}: {first['msg']}"
        ) from None
    if comparison.comparison_id != stored:
        raise ComparisonError(
            f"{path}: content does not match its comparison_id {stored} (computed {comparison.comparison_id})"
        )
    return comparison
