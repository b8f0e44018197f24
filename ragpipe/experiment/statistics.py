"""Paired statistics over per-case deltas, from ``scipy.stats`` (seeded, deterministic).

A delta is direction-normalised (positive: the challenger is better) and per case (the mean over
the case's scored repeats), because cases are the independent units a suite samples.

* Interval: ``scipy.stats.bootstrap`` over the case deltas (resampling whole cases, so each
  resample keeps incumbent and challenger of a case together: a paired bootstrap), statistic the
  mean, two-sided at ``confidence_level``, method ``percentile`` (default) or ``BCa``.
* p-value: ``scipy.stats.permutation_test`` with ``permutation_type="samples"`` on the one sample
  of deltas, which flips each case's sign independently (the paired randomization test: under
  the null the arm labels of a case are exchangeable), statistic the mean, one-sided
  ``alternative="greater"`` (H1: the challenger is better). Exact when 2^n <= ``n_resamples``.
* The generator of each (slice, metric) is seeded with ``[seed, sha256(slice, metric)]``, so a
  statistic never depends on which other metrics or slices were computed, nor in which order.
* Degenerate samples: with fewer than 2 deltas there is no interval and no p-value (None); when
  all deltas are equal the bootstrap distribution is a point mass and the interval is exactly
  ``[d, d]`` (numpy's resampled means would differ from ``d`` in the last bit).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from ragpipe.kernel.models import FrozenModel

BATCH = 1000  # resamples per vectorised batch: bounds memory; results do not depend on it


class ComparisonSpec(FrozenModel):
    """How a comparison computes its statistics; all of it is in the comparison ID."""

    schema_: Literal["ragpipe.comparison_spec/v1"] = Field("ragpipe.comparison_spec/v1", alias="schema")
    seed: int = Field(20240610, ge=0, le=2**53 - 1)
    n_resamples: int = Field(9999, ge=99, le=1_000_000)
    confidence_level: float = Field(0.95, gt=0.5, lt=1)
    ci_method: Literal["percentile", "BCa"] = "percentile"
    tie_tolerance: float = Field(1e-9, ge=0, le=0.5)

    def as_json(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


class DeltaStats(FrozenModel):
    """Statistics of the per-case deltas of one metric on one slice."""

    n: int
    mean: float | None
    median: float | None
    min: float | None
    max: float | None
    wins: int
    ties: int
    losses: int
    ci_low: float | None
    ci_high: float | None
    p_value: float | None


def rng_for(seed: int, slice_name: str, metric: str) -> np.random.Generator:
    key = int.from_bytes(hashlib.sha256(f"{slice_name}\0{metric}".encode()).digest()[:16], "big")
    return np.random.default_rng([seed, key])


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _finite(value: float, what: str) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ArithmeticError(f"{what} is not finite ({value!r})")
    return value


def paired_stats(deltas: Sequence[float], spec: ComparisonSpec, slice_name: str, metric: str) -> DeltaStats:
    """Statistics of ``deltas`` (per-case, direction-normalised) under ``spec``."""
    n = len(deltas)
    tol = spec.tie_tolerance
    counts = {
        "wins": sum(1 for d in deltas if d > tol),
        "ties": sum(1 for d in deltas if -tol <= d <= tol),
        "losses": sum(1 for d in deltas if d < -tol),
    }
    if n == 0:
        return DeltaStats(
            n=0, mean=None, median=None, min=None, max=None, ci_low=None, ci_high=None, p_value=None, **counts
        )
    mean = math.fsum(deltas) / n
    shape = {
        "n": n,
        "mean": mean,
        "median": float(statistics.median(deltas)),
        "min": float(min(deltas)),
        "max": float(max(deltas)),
        **counts,
    }
    if n < 2:
        return DeltaStats(ci_low=None, ci_high=None, p_value=None, **shape)
    what = f"slice {slice_name!r}, metric {metric!r}"
    from scipy import stats  # ~0.6 s to import: only when statistics are computed, not when read

    data = np.asarray(deltas, dtype=np.float64)
    if all(d == deltas[0] for d in deltas):
        low = high = float(deltas[0])
    else:
        boot = stats.bootstrap(
            (data,),
            _mean,
            n_resamples=spec.n_resamples,
            batch=BATCH,
            vectorized=True,
            confidence_level=spec.confidence_level,
            method=spec.ci_method,
            rng=rng_for(spec.seed, slice_name, "ci\0" + metric),
        )
        low = _finite(boot.confidence_interval.low, f"{what}: bootstrap interval")
        high = _finite(boot.confidence_interval.high, f"{what}: bootstrap interval")
    test = stats.permutation_test(
        (data,),
        _mean,
        permutation_type="samples",
        vectorized=True,
        n_resamples=spec.n_resamples,
        batch=BATCH,
        alternative="greater",
        rng=rng_for(spec.seed, slice_name, "p\0" + metric),
    )
    p_value = _finite(test.pvalue, f"{what}: randomization p-value")
    return DeltaStats(ci_low=low, ci_high=high, p_value=min(1.0, p_value), **shape)
